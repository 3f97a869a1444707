"""The attention-backend interface: how a layer attends its queries to a paged KV cache.

A backend is stateless. Once per forward, :meth:`AttentionBackend.build_metadata` turns the batch's host-side
bookkeeping (query lengths, sequence lengths) and its device-side block tables into whatever index tensors
and masks the backend needs; every layer then reuses that metadata, so layers never sync with the host.
Each layer call first writes this step's K/V into the cache by ``slot_mapping``, then attends.

Shapes: ``q`` ``[T, num_heads, head_dim]``, ``k``/``v`` ``[T, num_kv_heads, head_dim]``, caches
``[num_blocks, block_size, num_kv_heads, head_dim]``; the output is ``[T, num_heads, head_dim]``.
Query j of request i sits at position ``seq_lens[i] - query_len(i) + j`` and sees keys ``0 ..`` that position
(a tree step, ``ForwardBatch.tree_masks``: of the 64 keys up to its own only those its bits set);
with a sliding ``window`` w > 0 only the last w of them: keys ``position - w + 1 .. position`` (Gemma 3's local
layers; the same bound as transformers' and llama.cpp's). Keys before the window are never read, so the KV
manager may hand their blocks back (core/kv_cache_manager.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from tandem.model.forward_batch import ForwardBatch
from tandem.speculative_config import MAX_SPECULATIVE_TOKENS

# A request's queries up to this many are "short" (a decode row plus up to speculative_config's
# MAX_SPECULATIVE_TOKENS drafts): the CPU's native paged kernel and decoder stack take them. At 17 (the bound when
# drafts stopped at 16) a 24-draft verify (suffix decoding's default) left both: one stream, 18 rows, 32 instead
# of 20 ms a forward (BENCHMARKS.md §20).
SHORT_QUERY_MAX = 1 + MAX_SPECULATIVE_TOKENS


class AttentionBackend(ABC):
    """Paged-KV attention. Implementations must agree with :class:`NaiveBackend` (tests check this)."""

    name: str = "abstract"

    @abstractmethod
    def build_metadata(self, batch: ForwardBatch, block_size: int, window: int = 0) -> Any:
        """Everything the layers need for this batch, computed once per forward (no per-layer work);
        ``window`` > 0: for layers that attend to that many last positions."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: Any,
        scale: float,
    ) -> torch.Tensor:
        """Write ``k``/``v`` into the caches, then return attention output ``[T, num_heads, head_dim]``."""


# Tree steps follow slots, not positions, so a sliding window would cut at the wrong key: every backend's
# ``build_metadata`` raises this when a windowed layer gets ``tree_masks``.
WINDOWED_TREES = "tree steps (tree_masks) are not supported on sliding-window layers"


def tree_visible(bits: torch.Tensor, back: torch.Tensor) -> torch.Tensor:
    """Tree steps (``ForwardBatch.tree_masks``): whether a query row with mask ``bits`` may see the key ``back``
    keys before its own (bit ``back`` below 64, else always; a negative ``back``, a later key, is for the causal
    mask to hide). Broadcasts; ``bits`` int64."""
    shifted = torch.bitwise_right_shift(bits, back.clamp(min=0, max=63))
    return (back >= 64) | (shifted & 1).bool()


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store row t of ``k``/``v`` at flat slot ``slot_mapping[t]`` of the caches (in place).

    Writing by absolute slot makes rollback free: a rejected draft's entry is overwritten by the next write
    to the same position.
    """
    kv_heads, head_dim = k_cache.shape[-2:]
    if k.shape[1:] != (kv_heads, head_dim):
        raise ValueError(f"k has shape {tuple(k.shape)}, cache expects [T, {kv_heads}, {head_dim}]")
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def slots_for_positions(
    block_tables: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Flat cache slot of each position through each row's block table.

    ``block_tables`` ``[B, max_blocks]``, ``positions`` ``[B, L]`` (or ``[L]``, shared by all rows) ->
    ``[B, L]``. Padding positions past a row's table map to its last column (any valid slot will do:
    callers mask them out).
    """
    if positions.dim() == 1:
        positions = positions.unsqueeze(0).expand(block_tables.shape[0], -1)
    block_idx = torch.div(positions, block_size, rounding_mode="floor").clamp_(
        max=block_tables.shape[1] - 1
    )
    blocks = torch.gather(block_tables, 1, block_idx)
    return blocks * block_size + positions % block_size
