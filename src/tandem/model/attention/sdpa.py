"""The default attention backend: ``torch.nn.functional.scaled_dot_product_attention`` over gathered KV.

Requests are grouped so a layer makes few SDPA calls whatever the batch size:
- all single-token queries (decodes) form ONE padded call: their keys are gathered through the block tables
  into ``[B, max_len]`` and padding is masked; the query heads sharing a KV head are folded into the query
  axis, so grouped-query attention needs no K/V repetition;
- short multi-token queries (verifying k drafts, small chunks) form a second padded call with a causal mask;
- long queries (prefill chunks) get one call each; a fresh prefill (nothing cached before it) attends to its
  own K/V directly with ``is_causal`` and skips the gather.
- tree steps (``ForwardBatch.tree_masks``) add each row's mask of the keys just before its own.
Every index tensor and mask is built once per forward in :meth:`SdpaBackend.build_metadata`. With a sliding
window the masks also hide keys before each query's window, and a fresh prefill takes an explicit mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.model.attention.base import (
    AttentionBackend,
    SHORT_QUERY_MAX,
    WINDOWED_TREES,
    slots_for_positions,
    tree_visible,
    write_kv,
)
from tandem.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class PaddedGroup:
    """Requests attended together: queries padded to ``max_q`` rows, keys to ``max_len`` slots."""

    num_reqs: int
    max_q: int
    # When ``q_rows`` is None the group's queries are rows row_start : row_start + num_reqs * max_q.
    row_start: int
    q_rows: torch.Tensor | None  # [num_reqs * max_q] rows of q (padding repeats a real row)
    out_rows: torch.Tensor | None  # [n] output rows filled from ...
    out_src: torch.Tensor | None  # [n] ... these flat rows of the padded result
    slots: torch.Tensor  # [num_reqs * max_len] flat cache slots
    max_len: int
    mask: torch.Tensor | None  # additive [num_reqs, 1, max_q, max_len]; None = nothing to mask


@dataclass(frozen=True)
class LongQuery:
    """One request with a long query (a prefill chunk)."""

    row_start: int
    row_end: int
    slots: torch.Tensor | None  # [keys] cache slots; None = fresh prefill, attend to this step's K/V
    mask: torch.Tensor | None  # additive [q_len, keys]; None = fresh prefill without a window (is_causal)


@dataclass(frozen=True)
class SdpaMetadata:
    slot_mapping: torch.Tensor
    num_tokens: int
    groups: tuple[PaddedGroup, ...]
    long_queries: tuple[LongQuery, ...]
    # The batch is exactly one group laid out in row order: its result is the output, no scatter.
    single_group: bool


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def __init__(self, dtype: torch.dtype = torch.float32, short_query_max: int = SHORT_QUERY_MAX) -> None:
        self.mask_dtype = dtype  # additive masks must match the query dtype
        self.short_query_max = short_query_max

    def build_metadata(self, batch: ForwardBatch, block_size: int, window: int = 0) -> SdpaMetadata:
        qsl = batch.query_start_loc
        if window and batch.tree_masks is not None:
            raise ValueError(WINDOWED_TREES)
        decode: list[int] = []
        short: list[int] = []
        long_: list[int] = []
        for i in range(batch.num_reqs):
            q_len = qsl[i + 1] - qsl[i]
            (decode if q_len == 1 else short if q_len <= self.short_query_max else long_).append(i)
        groups = []
        for reqs in (decode, short):
            if reqs:
                groups.append(self._padded_group(batch, reqs, block_size, window))
        longs = tuple(self._long_query(batch, i, block_size, window) for i in long_)
        single = len(groups) == 1 and not longs and groups[0].q_rows is None
        return SdpaMetadata(batch.slot_mapping, batch.num_tokens, tuple(groups), longs, single)

    def _padded_group(
        self, batch: ForwardBatch, reqs: list[int], block_size: int, window: int = 0
    ) -> PaddedGroup:
        qsl, device = batch.query_start_loc, batch.block_tables.device
        q_lens = [qsl[i + 1] - qsl[i] for i in reqs]
        seqs = [batch.seq_lens[i] for i in reqs]
        n, max_q, max_len = len(reqs), max(q_lens), max(seqs)
        in_order = reqs == list(range(reqs[0], reqs[0] + n))
        contiguous = in_order and min(q_lens) == max_q
        q_rows = out_rows = out_src = None
        if not contiguous:
            rows = [qsl[i] + min(j, q - 1) for i, q in zip(reqs, q_lens) for j in range(max_q)]
            dst = [qsl[i] + j for i, q in zip(reqs, q_lens) for j in range(q)]
            src = [g * max_q + j for g, q in enumerate(q_lens) for j in range(q)]
            q_rows, out_rows, out_src = (torch.tensor(x, device=device) for x in (rows, dst, src))
        tables = batch.block_tables
        if not (in_order and n == batch.num_reqs):
            tables = tables.index_select(0, torch.tensor(reqs, device=device))
        if window:
            return self._windowed_group(batch, reqs, q_lens, tables, block_size, window, q_rows, out_rows, out_src)
        key_pos = torch.arange(max_len, device=device)
        slots = slots_for_positions(tables, key_pos, block_size).reshape(-1)
        mask = None
        if batch.seq_lens_dev is not None or max_q > 1 or min(seqs) != max_len:
            seq_t = self._seq_tensor(batch, reqs)
            context = seq_t - torch.tensor(q_lens, device=device)
            # [n, max_q]: query j of a request sees keys up to context + j.
            last_visible = context.unsqueeze(1) + torch.arange(max_q, device=device)
            visible = (key_pos <= last_visible.unsqueeze(2)) & (key_pos < seq_t.view(n, 1, 1))
            if batch.tree_masks is not None:  # [n, max_q] bits, padding rows repeating a real row's
                first_row = qsl[reqs[0]]
                rows = q_rows if q_rows is not None else torch.arange(first_row, first_row + n * max_q, device=device)
                bits = batch.tree_masks.index_select(0, rows).view(n, max_q, 1)
                visible &= tree_visible(bits, last_visible.unsqueeze(2) - key_pos)
            mask = _additive(visible.unsqueeze(1), self.mask_dtype)
        row_start = qsl[reqs[0]]
        return PaddedGroup(n, max_q, row_start, q_rows, out_rows, out_src, slots, max_len, mask)

    @staticmethod
    def _seq_tensor(batch: ForwardBatch, reqs: list[int]) -> torch.Tensor:
        """The exact sequence lengths of ``reqs`` as a tensor (on the device when the host has only upper
        bounds: no sync)."""
        device = batch.block_tables.device
        if batch.seq_lens_dev is not None:
            return batch.seq_lens_dev.index_select(0, torch.tensor(reqs, device=device))
        return torch.tensor([batch.seq_lens[i] for i in reqs], device=device)

    def _windowed_group(
        self,
        batch: ForwardBatch,
        reqs: list[int],
        q_lens: list[int],
        tables: torch.Tensor,
        block_size: int,
        window: int,
        q_rows: torch.Tensor | None,
        out_rows: torch.Tensor | None,
        out_src: torch.Tensor | None,
    ) -> PaddedGroup:
        """A padded group under a sliding window: each request gathers only the keys its queries can see,
        from its first query's window start, ``window + max_q - 1`` slots at most however long the
        sequence (computed from the exact lengths, on the device when the host has upper bounds)."""
        device = batch.block_tables.device
        n, max_q = len(reqs), max(q_lens)
        seq_t = self._seq_tensor(batch, reqs)
        context = seq_t - torch.tensor(q_lens, device=device)
        first = (context - window + 1).clamp_(min=0)
        width = min(max(batch.seq_lens[i] for i in reqs), window + max_q - 1)
        key_pos = first.unsqueeze(1) + torch.arange(width, device=device)  # [n, width]
        slots = slots_for_positions(tables, key_pos, block_size).reshape(-1)
        last_visible = (context.unsqueeze(1) + torch.arange(max_q, device=device)).unsqueeze(2)
        keys = key_pos.unsqueeze(1)  # [n, 1, width]
        visible = (keys <= last_visible) & (keys > last_visible - window) & (keys < seq_t.view(n, 1, 1))
        mask = _additive(visible.unsqueeze(1), self.mask_dtype)
        row_start = batch.query_start_loc[reqs[0]]
        return PaddedGroup(n, max_q, row_start, q_rows, out_rows, out_src, slots, width, mask)

    def _long_query(self, batch: ForwardBatch, i: int, block_size: int, window: int = 0) -> LongQuery:
        # Long queries are prefill chunks, whose lengths the host always knows exactly.
        start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
        seq_len, q_len = batch.seq_lens[i], end - start
        device = batch.block_tables.device
        query_pos = torch.arange(seq_len - q_len, seq_len, device=device).unsqueeze(1)
        tree = None if batch.tree_masks is None else batch.tree_masks[start:end]
        if q_len == seq_len and tree is None:
            if not window or q_len <= window:  # the window hides nothing
                return LongQuery(start, end, None, None)
            key_pos = torch.arange(seq_len, device=device)
            visible = (key_pos <= query_pos) & (key_pos > query_pos - window)
            return LongQuery(start, end, None, _additive(visible, self.mask_dtype))
        # With a window, keys before the first query's window are never visible: gather from there.
        first = max(0, seq_len - q_len - window + 1) if window else 0
        key_pos = torch.arange(first, seq_len, device=device)
        slots = slots_for_positions(batch.block_tables[i : i + 1], key_pos, block_size).view(-1)
        visible = key_pos <= query_pos
        if window:
            visible &= key_pos > query_pos - window
        if tree is not None:
            visible &= tree_visible(tree.unsqueeze(1), query_pos - key_pos)
        return LongQuery(start, end, slots, _additive(visible, self.mask_dtype))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: SdpaMetadata,
        scale: float,
    ) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        kv_heads, head_dim = k_cache.shape[-2:]
        k_flat, v_flat = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
        if metadata.single_group:
            return _attend_group(q, k_flat, v_flat, metadata.groups[0], scale)
        out = torch.empty_like(q)
        for group in metadata.groups:
            res = _attend_group(q, k_flat, v_flat, group, scale)
            if group.out_rows is None:
                out[group.row_start : group.row_start + res.shape[0]] = res
            else:
                assert group.out_src is not None
                out.index_copy_(0, group.out_rows, res.index_select(0, group.out_src))
        for lq in metadata.long_queries:
            out[lq.row_start : lq.row_end] = _attend_long(q, k, v, k_flat, v_flat, lq, scale)
        return out


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, float("-inf")
    )


def _attend_group(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, g: PaddedGroup, scale: float
) -> torch.Tensor:
    """Padded attention of one group; returns ``[num_reqs * max_q, heads, head_dim]`` in padded order."""
    heads, head_dim = q.shape[1:]
    kv_heads = k_flat.shape[1]
    n, max_q = g.num_reqs, g.max_q
    if g.q_rows is None:
        qg = q[g.row_start : g.row_start + n * max_q]
    else:
        qg = q.index_select(0, g.q_rows)
    keys = k_flat.index_select(0, g.slots).view(n, g.max_len, kv_heads, head_dim).transpose(1, 2)
    values = v_flat.index_select(0, g.slots).view(n, g.max_len, kv_heads, head_dim).transpose(1, 2)
    if max_q == 1:
        # Fold the query heads of each KV head into the query axis: [n, kv_heads, heads/kv_heads, d].
        qf = qg.view(n, kv_heads, heads // kv_heads, head_dim)
        res = F.scaled_dot_product_attention(qf, keys, values, attn_mask=g.mask, scale=scale)
        return res.reshape(n, heads, head_dim)
    qg = qg.view(n, max_q, heads, head_dim).transpose(1, 2)
    res = F.scaled_dot_product_attention(
        qg, keys, values, attn_mask=g.mask, scale=scale, enable_gqa=True
    )
    return res.transpose(1, 2).reshape(n * max_q, heads, head_dim)


def _attend_long(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    lq: LongQuery,
    scale: float,
) -> torch.Tensor:
    """Attention of one long query; returns ``[q_len, heads, head_dim]``. The tensors get a batch axis: on the
    CPU, torch's fused (flash) kernel takes 4-D inputs only, and 3-D ones fall back to the unfused math path
    (scores materialized, masked, softmaxed: 3-6x slower at 512-2,048 tokens, BENCHMARKS.md §11)."""
    ql = q[lq.row_start : lq.row_end].transpose(0, 1).unsqueeze(0)
    if lq.slots is None:
        keys, values = k[lq.row_start : lq.row_end], v[lq.row_start : lq.row_end]
    else:
        keys, values = k_flat.index_select(0, lq.slots), v_flat.index_select(0, lq.slots)
    res = F.scaled_dot_product_attention(
        ql,
        keys.transpose(0, 1).unsqueeze(0),
        values.transpose(0, 1).unsqueeze(0),
        attn_mask=lq.mask,
        is_causal=lq.mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return res[0].transpose(0, 1)
