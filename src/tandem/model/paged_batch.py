"""Build a :class:`ForwardBatch` from plain per-request descriptions (tests, benchmarks, simple drivers).

The engine's model runner keeps its own persistent device-side batch; this helper is the direct, readable
way to say "request i has ``num_cached`` tokens in these blocks and feeds these new tokens".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class PagedRequest:
    new_tokens: Sequence[int]  # this step's query tokens
    num_cached: int  # tokens already in the cache before this step
    block_ids: Sequence[int]  # the request's block table (must cover num_cached + len(new_tokens))


def build_forward_batch(
    requests: Sequence[PagedRequest],
    block_size: int,
    device: torch.device | str = "cpu",
    last_token_logits_only: bool = False,
) -> ForwardBatch:
    """One flat batch of the requests' new tokens, in order. ``logits_indices`` selects each request's
    last row when ``last_token_logits_only`` (the usual sampling case), else every row (None)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    for n, req in enumerate(requests):
        if not req.new_tokens:
            raise ValueError(f"request {n} has no new tokens")
        seq_len = req.num_cached + len(req.new_tokens)
        if len(req.block_ids) * block_size < seq_len:
            raise ValueError(
                f"request {n}: {len(req.block_ids)} blocks of {block_size} cannot hold {seq_len} tokens"
            )
        for j, tok in enumerate(req.new_tokens):
            pos = req.num_cached + j
            ids.append(int(tok))
            positions.append(pos)
            slots.append(req.block_ids[pos // block_size] * block_size + pos % block_size)
        qsl.append(len(ids))
        seq_lens.append(seq_len)
    width = max(len(r.block_ids) for r in requests)
    tables = [list(r.block_ids) + [0] * (width - len(r.block_ids)) for r in requests]

    def dev(x: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=device)

    logits_indices = dev([q - 1 for q in qsl[1:]]) if last_token_logits_only else None
    return ForwardBatch(
        input_ids=dev(ids),
        positions=dev(positions),
        slot_mapping=dev(slots),
        block_tables=dev(tables),
        query_start_loc=qsl,
        seq_lens=seq_lens,
        logits_indices=logits_indices,
    )
