"""The CPU default: short queries attend through the native paged-attention kernel, long ones through SDPA.

Decodes and speculative verify rows (at most ``short_query_max`` queries per request) are where the SDPA
backend spends its time on a CPU: it gathers every request's context out of the paged cache into a padded
copy (as many bytes moved as the attention reads), then runs a flash kernel tuned for long queries on 1-4
query rows. ``native/paged_attention.c`` instead reads K/V in place through the block tables, one pass
per (request, KV head), for all short queries of the batch in one call per layer, writing straight into
their output rows. Prefill chunks keep SDPA (:class:`SdpaBackend`'s long-query path), which is efficient
there.

Falls back to :class:`SdpaBackend` entirely when the kernel is unavailable (no compiler,
``TANDEM_NATIVE=0``), for other dtypes, and for tensors off the CPU. Sliding-window layers take the kernel too
(it skips the key chunks before a request's window).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.model.attention.base import SHORT_QUERY_MAX, WINDOWED_TREES, write_kv
from tandem.model.attention.sdpa import LongQuery, SdpaBackend, _attend_long
from tandem.model.forward_batch import ForwardBatch
from tandem.native.paged_attention import (
    DTYPES,
    PagedAttentionIndices,
    PagedAttentionKernel,
    paged_attention_kernel,
)


@dataclass(frozen=True)
class PagedCpuMetadata:
    slot_mapping: torch.Tensor
    num_tokens: int
    short: PagedAttentionIndices | None  # requests whose queries the kernel attends; None = none
    long_queries: tuple[LongQuery, ...]


class PagedCpuBackend(SdpaBackend):
    name = "paged_cpu"

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        short_query_max: int = SHORT_QUERY_MAX,
        kernel: PagedAttentionKernel | None = None,
    ) -> None:
        super().__init__(dtype, short_query_max)
        self._supported = dtype in DTYPES
        self._kernel = kernel
        self._resolved = kernel is not None

    @property
    def kernel(self) -> PagedAttentionKernel | None:
        """The native kernel, built on first use (so a CUDA-only process never compiles it); ``None``
        where it is unavailable, and then every call takes the SDPA path."""
        if not self._resolved:
            self._kernel = paged_attention_kernel() if self._supported else None
            self._resolved = True
        return self._kernel if self._supported else None

    def build_metadata(self, batch: ForwardBatch, block_size: int, window: int = 0) -> object:
        kernel = self._kernel if self._resolved and self._supported else self.kernel
        if batch.block_tables.device.type != "cpu" or kernel is None:
            return super().build_metadata(batch, block_size, window)
        qsl = batch.query_start_loc
        if window and batch.tree_masks is not None:
            raise ValueError(WINDOWED_TREES)
        short: list[int] = []
        longs: list[LongQuery] = []
        for i in range(batch.num_reqs):
            if qsl[i + 1] - qsl[i] <= self.short_query_max:
                short.append(i)
            else:
                longs.append(self._long_query(batch, i, block_size, window))
        ix = None
        if short:
            seq_lens = batch.seq_lens_dev
            if seq_lens is None:  # the host's lengths are exact
                seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64)
            ix = kernel.indices(
                batch.block_tables,
                seq_lens.contiguous(),
                short,
                [qsl[i] for i in short],
                [qsl[i + 1] - qsl[i] for i in short],
                batch.num_tokens,
                window,
                batch.tree_masks,
            )
        return PagedCpuMetadata(batch.slot_mapping, batch.num_tokens, ix, tuple(longs))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: object,
        scale: float,
    ) -> torch.Tensor:
        if not isinstance(metadata, PagedCpuMetadata):
            return super().forward(q, k, v, k_cache, v_cache, metadata, scale)  # type: ignore[arg-type]
        write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if metadata.short is not None:
            assert self._kernel is not None  # resolved by build_metadata, which made ``short``
            self._kernel(q, out, k_cache, v_cache, metadata.short, scale)
        if metadata.long_queries:
            kv_heads, head_dim = k_cache.shape[-2:]
            k_flat = k_cache.view(-1, kv_heads, head_dim)
            v_flat = v_cache.view(-1, kv_heads, head_dim)
            for lq in metadata.long_queries:
                out[lq.row_start : lq.row_end] = _attend_long(q, k, v, k_flat, v_flat, lq, scale)
        return out
