"""N-gram prompt lookup: propose the tokens that followed the most recent earlier occurrence of the
context's longest suffix n-gram (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``).

Device-native: it searches the runner's device token history (``InputBatch.tokens``, which already
holds the tokens just accepted) with batched tensor ops and returns a [B, k] draft tensor, so neither the
engine nor the worker needs a host copy of the context. Contexts are right-aligned into a common window
(``W`` = the longest host-known context, an upper bound) so every suffix ends in the last column. On the CPU
the same search runs in one native call (``native/ngram_lookup.c``: ~30 tensor ops cost ~0.3 ms a step at four
requests), these ops its reference and the path elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.config import SpeculativeConfig
from tandem.native.ngram_lookup import ngram_lookup_kernel
from tandem.spec_decode.proposer import ProposeInput, Proposer

_PAD = -1


class NgramProposer(Proposer):
    method = "ngram"
    SUPPORTS_ASYNC_SCHEDULING = True
    device_native = True

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int) -> None:
        super().__init__(num_speculative_tokens)
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes must satisfy 1 <= min ({min_n}) <= max ({max_n})")
        self.min_n, self.max_n = min_n, max_n

    @classmethod
    def build(cls, config: SpeculativeConfig, **_: Any) -> NgramProposer:
        return cls(config.num_speculative_tokens, config.ngram_min, config.ngram_max)

    def propose(self, inp: ProposeInput) -> torch.Tensor:
        # Upper bound on the context length, known on the host: the mirror lags at most one verify.
        width = max(st.num_tokens for st in inp.states) + inp.sampled.shape[1]
        batch = inp.input_batch
        width = min(width, batch.width - 1)
        kernel = ngram_lookup_kernel() if batch.tokens.device.type == "cpu" else None
        if kernel is not None:
            return kernel(batch.tokens, batch.num_tokens, inp.slots, width, self.min_n, self.max_n, inp.max_drafts,
                          self.k)
        lengths = batch.num_tokens.index_select(0, inp.slots)
        rows = batch.tokens.index_select(0, inp.slots)[:, :width]
        return propose_ngram(rows, lengths, self.min_n, self.max_n, inp.max_drafts, self.k)


def propose_ngram(
    tokens: torch.Tensor,  # [B, W] each row's history left-aligned (valid prefix = lengths)
    lengths: torch.Tensor,  # [B] int64
    min_n: int,
    max_n: int,
    max_drafts: torch.Tensor,  # [B] int64
    k: int,
) -> torch.Tensor:
    """Batched prompt lookup on the device; returns [B, k] drafts padded with -1."""
    b, width = tokens.shape
    device = tokens.device
    if b == 0 or width == 0:
        return torch.full((b, k), _PAD, dtype=torch.int64, device=device)
    # Right-align: column c of ``ctx`` holds token (length - width + c) of the row, or _PAD before it.
    src = torch.arange(width, device=device).unsqueeze(0) + (lengths.unsqueeze(1) - width)
    ctx = torch.where(src >= 0, tokens.gather(1, src.clamp(min=0)), torch.full_like(src, _PAD))
    found = torch.full((b,), -1, dtype=torch.int64, device=device)  # continuation start column
    for n in range(max_n, min_n - 1, -1):
        if n >= width:
            continue
        windows = ctx.unfold(1, n, 1)[:, :-1]  # [B, width - n, n]: every earlier n-gram
        suffix = ctx[:, width - n :].unsqueeze(1)  # [B, 1, n]
        starts = torch.arange(windows.shape[1], device=device)
        valid = starts.unsqueeze(0) >= (width - lengths).unsqueeze(1)  # window inside the context
        match = (windows == suffix).all(-1) & valid & (lengths > n).unsqueeze(1)
        last = torch.where(match, starts, -1).max(dim=1).values  # most recent occurrence
        found = torch.where((found < 0) & (last >= 0), last + n, found)
    cols = found.unsqueeze(1) + torch.arange(k, device=device)
    ok = (found >= 0).unsqueeze(1) & (cols < width) & (torch.arange(k, device=device) < max_drafts.unsqueeze(1))
    drafts = ctx.gather(1, cols.clamp(min=0, max=width - 1))
    return torch.where(ok, drafts, torch.full_like(drafts, _PAD))
