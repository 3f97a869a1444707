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
    # A tree step (ForwardBatch.tree_masks): the parent row of each new token after the first (the root);
    # parent[j - 1] < j. None: a chain (each row after the one before).
    parents: Sequence[int] | None = None


def tree_bits(parents: Sequence[int]) -> list[int]:
    """Each tree row's ``ForwardBatch.tree_masks`` entry (row 0 the root; ``parents[j - 1]``: row j's parent):
    bit b set where the key b before the row's own is visible — itself, its ancestors and the context before
    the root — as a signed 64-bit value. At most 64 rows."""
    if len(parents) >= 64:
        raise ValueError(f"parents: a tree step holds at most 64 rows, got {len(parents) + 1}")
    rows: list[int] = [1]  # bit r: row r is the row itself or an ancestor
    for j, par in enumerate(parents, start=1):
        if not 0 <= par < j:
            raise ValueError(f"parents: row {j}'s parent {par} must be a row before it")
        rows.append(rows[par] | 1 << j)
    out = []
    for j, r in enumerate(rows):
        back = sum(1 << (j - a) for a in range(j + 1) if r >> a & 1)
        bits = (back | (((1 << 64) - 1) << (j + 1))) & ((1 << 64) - 1)  # every key before the root: the context
        out.append(bits - (1 << 64) if bits >> 63 else bits)
    return out


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
    masks: list[int] = []
    trees = any(r.parents is not None for r in requests)
    for n, req in enumerate(requests):
        if not req.new_tokens:
            raise ValueError(f"request {n} has no new tokens")
        seq_len = req.num_cached + len(req.new_tokens)
        if len(req.block_ids) * block_size < seq_len:
            raise ValueError(
                f"request {n}: {len(req.block_ids)} blocks of {block_size} cannot hold {seq_len} tokens"
            )
        if req.parents is not None and len(req.parents) != len(req.new_tokens) - 1:
            raise ValueError(f"request {n}: {len(req.parents)} parents for {len(req.new_tokens)} rows")
        bits = tree_bits(req.parents) if req.parents is not None else None
        for j, tok in enumerate(req.new_tokens):
            pos = req.num_cached + j  # the row's slot in the sequence; in a tree its position is the root's + depth
            ids.append(int(tok))
            positions.append(pos if bits is None else req.num_cached + (bits[j] & ((2 << j) - 1)).bit_count() - 1)
            slots.append(req.block_ids[pos // block_size] * block_size + pos % block_size)
        if trees:  # a chain beside trees: every row sees every key up to its own
            masks.extend(bits if bits is not None else [-1] * len(req.new_tokens))
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
        tree_masks=dev(masks) if trees else None,
    )
