"""The decoder stack in one native call for short steps on the CPU (``native/decode_forward.c``).

A forward whose batch is a few short queries (decode rows and verify rows — a decode row plus k drafts —
for at most ``max_rows`` rows in all: :func:`stack_rows`) is where a CPU spends most of a step outside the weight read: each
of the 30 layers runs ~20 small torch kernels between its four products. :class:`NativeDecode` runs those
steps through one C call over every layer instead, with the paged attention kernel inline, and leaves
every other forward (prefill chunks, wide batches, tensor parallelism, other devices, other attention
backends) to the torch layers, which stay the reference: tests check the two agree.

``TANDEM_NATIVE_DECODE=0`` (or ``TANDEM_NATIVE=0``) turns it off, for A/B measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from tandem import overrides
from tandem.model.attention.paged_cpu import PagedCpuMetadata
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.block_quant_linear import (
    INTERLEAVED_TYPES,
    QUANT_FEW_ROWS,
    QUANT_FEW_ROWS_INTERLEAVED,
    int8_rows,
    sliced_activations,
)
from tandem.model.forward_batch import ForwardBatch, KVCache
from tandem.model.layers import LayerContext
from tandem.model.linear import NATIVE_FEW_ROWS
from tandem.native.decode_forward import (
    DTYPES,
    DecodeForwardKernel,
    LayerTable,
    StackShape,
    decode_forward_kernel,
)
from tandem.native.quant_linear import quant_linear_kernel

if TYPE_CHECKING:
    from tandem.model.transformer import CausalLM


def native_decode_enabled() -> bool:
    return overrides.native_decode_enabled()


def stack_rows(layers: Sequence[object], kernel_rows: int) -> int:
    """Up to how many rows the stack runs a model's step: as far as its products are the few-row kernels the
    torch layers would pick too (block_quant_linear, linear.py). Block-quantized layers: every part
    interleaved and multiplying int8 activations with VNNI, any count the stack takes (``kernel_rows``): the
    torch layers run those products in slices of rows through the same kernel (``int8_rows``), as the stack
    does, so a wider step loses only the torch layers' element-wise kernels (1.02-1.14x at 64-256 rows: a
    verify of 32 x 4 rows 164 -> 156 ms, BENCHMARKS.md §12); every part interleaved otherwise,
    :data:`QUANT_FEW_ROWS_INTERLEAVED` (a 32-way decode step went from 40 to 34 ms in one call, §12), else
    :data:`QUANT_FEW_ROWS`; dense weights :data:`NATIVE_FEW_ROWS`, where oneDNN's GEMM takes over."""
    mats = [getattr(layer, name) for layer in layers for name in ("qkv", "o_proj", "gate_up", "down")]
    if mats and all(isinstance(m, BlockQuantWeight) for m in mats):
        qkernel = quant_linear_kernel()
        interleaved = all(m.all_interleaved for m in mats)
        sliced = qkernel is not None and all(int8_rows(m, qkernel) for m in mats)
        return _block_rows(interleaved, sliced, kernel_rows)
    return min(kernel_rows, NATIVE_FEW_ROWS)


def planned_stack_rows(types: Sequence[str] | None, kernel_rows: int, sliced: bool = False) -> int:
    """:func:`stack_rows` from a model file's tensor index alone (the engine's plan, before any weight is
    loaded): ``types`` the block types kept (every one interleaved at load: block_repack), or ``None`` for
    dense weights; ``sliced``: the interleaved products multiply int8 activations with VNNI (``int8_rows``)."""
    if types is None:
        return min(kernel_rows, NATIVE_FEW_ROWS)
    return _block_rows(bool(types) and all(t in INTERLEAVED_TYPES for t in types), sliced, kernel_rows)


def planned_rows(types: Sequence[str] | None, activations: str) -> int:
    """:func:`planned_stack_rows` with this machine's kernels: the stack's own row limit, and whether the
    interleaved products of ``activations`` run in slices (``sliced_activations``); 0 without the stack's
    kernel. The one place the engine's plan (``native_decode_rows``) and ``tandem config``'s kernels table take
    it from."""
    kernel = decode_forward_kernel()
    if kernel is None:
        return 0
    return planned_stack_rows(types, kernel.max_rows, sliced_activations(activations, quant_linear_kernel()))


def _block_rows(interleaved: bool, sliced: bool, kernel_rows: int) -> int:
    """The stack's rows on block-quantized layers, the one rule :func:`stack_rows` (from the weights) and
    :func:`planned_stack_rows` (from the file's index) share."""
    if interleaved and sliced:
        return kernel_rows
    return min(kernel_rows, QUANT_FEW_ROWS_INTERLEAVED if interleaved else QUANT_FEW_ROWS)


class NativeDecode:
    """Decides per forward whether the native stack applies, and runs it. One per model."""

    def __init__(self, model: CausalLM, kernel: DecodeForwardKernel) -> None:
        args, shard = model.args, model.shard
        layer0 = model.layers[0]
        self.kernel = kernel
        # The layers, not the model: the model holds this object, and a reference back would make a
        # cycle that keeps every dropped model's weights alive until a full garbage collection.
        self._layers = tuple(model.layers)
        self.shape = StackShape(
            hidden=args.hidden_size,
            heads=shard.num_heads,
            kv_heads=shard.num_kv_heads,
            head_dim=args.head_dim,
            inter=shard.ffn_size,
            eps_root=float(model.eps_root),
            qk_eps=float(layer0.eps),
            scale=float(layer0.scale),
            hidden_act=args.hidden_act,
        )
        self.max_rows = stack_rows(self._layers, kernel.max_rows)
        self._table: LayerTable | None = None
        self._table_kv: KVCache | None = None  # the cache the table was built for (kept: the table holds its tensors)

    @classmethod
    def create(cls, model: CausalLM) -> NativeDecode | None:
        """The native path for ``model``, or ``None`` where it can never apply (not the CPU, tensor
        parallel, another dtype, switched off, no compiler)."""
        wanted = native_decode_enabled() if model.native_decode is None else model.native_decode
        if not wanted or model.device.type != "cpu" or model.dtype not in DTYPES:
            return None
        if model.comm.world_size != 1 or model.num_layers == 0:
            return None
        kernel = decode_forward_kernel()
        return None if kernel is None else cls(model, kernel)

    def applies(self, batch: ForwardBatch) -> bool:
        """Whether the batch is a short step the native kernels take: the CPU paged backend, short queries
        only, 1 .. ``max_rows`` rows. (Every KV cache group's metadata splits the batch's queries the same way:
        by their lengths.)"""
        meta = batch.attn_metadata
        return (isinstance(meta, PagedCpuMetadata) and not meta.long_queries and meta.short is not None
                and 1 <= batch.num_tokens <= self.max_rows)

    def _layer_table(self, kv_cache: KVCache) -> LayerTable:
        """Built for the first cache the model runs on, and again only if another one comes (the runner passes
        the same cache every step; its tensors are never replaced)."""
        if self._table is None or kv_cache is not self._table_kv:
            layers = [
                {
                    "qkv": layer.qkv, "qkv_bias": layer.qkv_bias, "qk_norm": layer.qk_norm,
                    "o_proj": layer.o_proj, "o_bias": layer.o_bias, "gate_up": layer.gate_up,
                    "down": layer.down, "post_attn_norm": layer.post_attn_norm,
                    "post_ffn_norm": layer.post_ffn_norm, "group": layer.kv_group, "local": layer.sliding,
                }  # fmt: skip
                for layer in self._layers
            ]
            self._table = self.kernel.layer_table(self.shape, layers, kv_cache.k, kv_cache.v)
            self._table_kv = kv_cache
        return self._table

    def run(
        self,
        batch: ForwardBatch,
        ctx: LayerContext,
        kv_cache: KVCache,
        x: torch.Tensor,
        aux_hidden_layers: Sequence[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The residual stream after the last layer, and after each of ``aux_hidden_layers``."""
        metas = (batch.attn_metadata, *ctx.group_metadata)
        groups = []
        for meta in metas:
            assert isinstance(meta, PagedCpuMetadata) and meta.short is not None
            groups.append((meta.slot_mapping, meta.short))
        table = self._table if kv_cache is self._table_kv else self._layer_table(kv_cache)
        x = x.contiguous()  # the embedding's fresh output: the kernel overwrites it in place
        rows, head_dim = x.shape[0], self.shape.head_dim
        # (cos, sin) pairs as float32 rows
        rot, local = (None if r is None else torch.view_as_real(r).reshape(rows, head_dim).contiguous()
                      for r in (ctx.rotations, ctx.local_rotations))
        aux: list[torch.Tensor | None] | None = None
        captured: dict[int, torch.Tensor] = {}
        if aux_hidden_layers:
            for i in aux_hidden_layers:
                captured.setdefault(i, torch.empty_like(x))
            aux = [captured.get(i) for i in range(len(self._layers))]
        self.kernel(self.shape, table, x, rot, groups, aux, local)
        return x, [captured[i] for i in aux_hidden_layers]
