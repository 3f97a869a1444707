"""A deliberately plain attention backend: one request at a time, explicit scores, float32 softmax.

It is the reference the faster backends are tested against, and a readable statement of what paged
attention computes: gather the request's keys through its block table, score, mask the future, average.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.model.attention.base import (
    AttentionBackend,
    WINDOWED_TREES,
    slots_for_positions,
    tree_visible,
    write_kv,
)
from tandem.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class NaiveRequest:
    row_start: int
    row_end: int
    slots: torch.Tensor  # [seq_len] flat cache slots of the request's whole sequence
    visible: torch.Tensor  # [q_len, seq_len] bool: query j sees key p when p <= its position (in the window)


@dataclass(frozen=True)
class NaiveMetadata:
    slot_mapping: torch.Tensor
    requests: tuple[NaiveRequest, ...]


class NaiveBackend(AttentionBackend):
    name = "naive"

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def build_metadata(self, batch: ForwardBatch, block_size: int, window: int = 0) -> NaiveMetadata:
        device = batch.block_tables.device
        if window and batch.tree_masks is not None:
            raise ValueError(WINDOWED_TREES)
        # The reference backend needs exact lengths on the host: a sync when they live on the device.
        lens = batch.seq_lens if batch.seq_lens_dev is None else batch.seq_lens_dev.tolist()
        requests = []
        for i in range(batch.num_reqs):
            start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
            seq_len = lens[i]
            key_pos = torch.arange(seq_len, device=device)
            slots = slots_for_positions(batch.block_tables[i : i + 1], key_pos, block_size).view(-1)
            query_pos = torch.arange(seq_len - (end - start), seq_len, device=device).unsqueeze(1)
            visible = key_pos <= query_pos
            if window:
                visible &= key_pos > query_pos - window
            if batch.tree_masks is not None:  # of the keys just before a row's own, those its bits set
                visible &= tree_visible(batch.tree_masks[start:end].unsqueeze(1), query_pos - key_pos)
            requests.append(NaiveRequest(start, end, slots, visible))
        return NaiveMetadata(batch.slot_mapping, tuple(requests))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: NaiveMetadata,
        scale: float,
    ) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        kv_heads, head_dim = k_cache.shape[-2:]
        group = q.shape[1] // kv_heads
        out = torch.empty_like(q)
        for r in metadata.requests:
            keys = k_cache.view(-1, kv_heads, head_dim)[r.slots].float()  # [S, kvh, d]
            values = v_cache.view(-1, kv_heads, head_dim)[r.slots].float()
            keys = keys.repeat_interleave(group, dim=1)  # query head h uses KV head h // group
            values = values.repeat_interleave(group, dim=1)
            queries = q[r.row_start : r.row_end].float()  # [q_len, h, d]
            scores = torch.einsum("qhd,shd->hqs", queries, keys) * scale
            scores = scores.masked_fill(~r.visible, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            out[r.row_start : r.row_end] = torch.einsum("hqs,shd->qhd", weights, values).to(q.dtype)
        return out
