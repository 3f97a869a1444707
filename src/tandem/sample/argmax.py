"""``argmax`` over the last dimension, fast on the CPU.

torch's ``max(dim=-1).indices`` returns the same index as ``argmax(dim=-1)`` — the first maximal element, a
NaN counting as the maximum in both (tested) — and on the CPU runs 2.5x faster at the sampler's sizes (32 rows
x 49,152 logits: 0.40 against 1.05 ms, torch 2.13, two threads). Every hot argmax of a step (greedy sampling,
the exponential race, the rejection sampler's greedy rows, drafting) goes through here.
"""

from __future__ import annotations

import torch


def argmax_last(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """``x.argmax(dim=-1, keepdim=keepdim)``, bit for bit."""
    return x.max(dim=-1, keepdim=keepdim).indices
