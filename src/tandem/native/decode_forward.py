"""Python side of ``decode_forward.c`` (the whole decoder stack for short steps): argument checks and the
ctypes call.

The kernels read raw memory, so everything the C code assumes is checked here: CPU tensors of one dtype,
dense layouts, the row count, and, for the stack, every layer's weight shapes (once, when the layer
table is built: :meth:`DecodeForwardKernel.layer_table`). Slots and block-table entries are clamped in C.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from tandem import native
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.quant import Int8Weight
from tandem.native.paged_attention import PagedAttentionIndices
from tandem.native.small_linear import DTYPES, W_DTYPES, check_dense

_ABI = 7
# qkv, qkv_bias, qk_norm, o_proj, o_bias, gate_up, down, k_cache, v_cache, then the int8 weights' scales
# (qkv, o_proj, gate_up, down; 0 for other weights), then the block-quantized matrices' descriptors (same
# order; 0 for other weights), then post_attn_norm, post_ffn_norm (0: none), the layer's KV cache group and
# whether it takes the local RoPE rotations
LAYER_PTRS = 21
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}
_MATRICES = ("qkv", "o_proj", "gate_up", "down")
_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_FORWARD_ARGS = [
    ctypes.c_int, ctypes.c_int, _i64, _ptr, _ptr, _i64, _i64,  # is_bf16, act, num_layers, layer_ptrs, x, rows, hidden
    _i64, _i64, _i64, _i64, _f32, _f32,  # heads, kv_heads, head_dim, inter, eps_root, qk_eps
    _ptr, _ptr, _i64, _i64,  # rot, rot_local, num_blocks, block_size
    _ptr, _i64, _f32, _ptr, ctypes.c_int,  # groups, num_groups, scale, aux, threads
]  # fmt: skip
_HEAD_ARGS = [
    ctypes.c_int, ctypes.c_int, _ptr, _ptr, _ptr, _i64,  # is_bf16, wdt, layer_ptrs, x, attn_in, in_width
    _i64, _i64, _i64, _i64, _i64, _i64, _f32,  # rows, hidden, heads, kv_heads, head_dim, inter, eps_root
    _ptr, _ptr, _i64, _i64,  # rot, slots, num_blocks, block_size
    _ptr, _i64, _ptr, _ptr,  # block_tables, bt_stride, seq_lens, req
    _ptr, _ptr, _i64, _f32, _ptr, ctypes.c_int,  # q_start, q_len, num_reqs, scale, tree_masks, threads
]  # fmt: skip


@dataclass(frozen=True)
class StackShape:
    """The per-layer sizes the kernel needs (one rank's whole model)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps_root: float  # sqrt(hidden * rms_norm_eps), as the model dtype rounds it
    qk_eps: float  # the per-head q/k RMSNorm epsilon (Qwen3, Gemma 3)
    scale: float  # attention softmax scale
    hidden_act: str = "silu"  # the gate's activation: a key of ACTIVATIONS


@dataclass(frozen=True)
class LayerTable:
    """Addresses of every layer's weights and caches, checked once; keeps the tensors alive."""

    ptrs: torch.Tensor  # [num_layers, LAYER_PTRS] int64
    tensors: tuple[torch.Tensor, ...]
    dtype: torch.dtype  # activations and caches
    num_blocks: int
    block_size: int
    weight_dtype: torch.dtype | None = None  # None: ``dtype``
    qkv_in: int = 0  # the qkv product's input width
    int8: bool = False  # whether any matrix is int8 (has scales)
    block_quant: bool = False  # whether any matrix is GGUF block-quantized (has a descriptor)
    num_groups: int = 1  # the KV cache groups the layers name (one more than the highest)

    @cached_property
    def weights(self) -> torch.dtype:
        return self.weight_dtype or self.dtype


class DecodeForwardKernel:
    """``x <- layers(x)`` for at most :attr:`max_rows` short-query rows, one native call per forward."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        if lib.tandem_decode_forward_abi() != _ABI:
            raise RuntimeError("decode_forward library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self.max_rows = int(lib.tandem_decode_forward_max_rows())
        self._fn = lib.tandem_decode_forward
        self._fn.argtypes = _FORWARD_ARGS
        self._fn.restype = ctypes.c_int
        self._head_fn = lib.tandem_head_layer
        self._head_fn.argtypes = _HEAD_ARGS
        self._head_fn.restype = ctypes.c_int
        self._tokens_fn = lib.tandem_head_tokens
        self._tokens_fn.argtypes = [_ptr, _i64, _i64, _ptr, _f32, _ptr, _ptr, ctypes.c_int, _ptr, _i64, _ptr, _i64,
                                    _ptr, _ptr, _ptr, ctypes.c_int]
        self._tokens_fn.restype = ctypes.c_int
        self._pair_fn = lib.tandem_head_rms_pair
        self._pair_fn.argtypes = [_ptr, _ptr, _i64, _i64, _ptr, _ptr, _f32, _ptr]
        self._pair_fn.restype = None

    @staticmethod
    def layer_table(
        shape: StackShape,
        layers: Sequence[dict[str, torch.Tensor | Int8Weight | BlockQuantWeight | None]],
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        in_width: int | None = None,
    ) -> LayerTable:
        """Check every layer's weights (``qkv``, ``qkv_bias``, ``qk_norm``, ``o_proj``, ``o_bias``,
        ``gate_up``, ``down``; biases and norms may be ``None``; optional ``post_attn_norm`` and
        ``post_ffn_norm``, Gemma 3's sandwich gains) and caches; return their addresses. Optional ``group``
        (the layer's KV cache group, an index into the call's ``groups``; default 0) and ``local`` (whether it
        takes the local RoPE rotations; default False).
        ``in_width``: the qkv product's input width (a head layer's attention input; default hidden).
        The weights share one dtype (``LayerTable.weight_dtype``), except that under float32
        activations any of the four matrices may be int8 (:class:`Int8Weight`; its scales addressed
        after the caches) or GGUF block-quantized (:class:`BlockQuantWeight`; its descriptor addressed after
        the scales; a type without a native dequantizer is refused); the caches (and ``LayerTable.dtype``) may be float32 under bf16 weights (a
        head layer)."""
        s = shape
        special = (Int8Weight, BlockQuantWeight)
        plain = [lw[n] for lw in layers for n in _MATRICES if not isinstance(lw[n], special)]
        dtype = plain[0].dtype if plain else torch.bfloat16  # type: ignore[union-attr]
        if not plain and any(isinstance(lw[n], special) for lw in layers for n in _MATRICES):
            dtype = k_caches[0].dtype  # every matrix int8 / block-quantized: the activations' dtype
        if dtype not in DTYPES:
            raise ValueError(f"native decode: dtype {dtype} not in {DTYPES}")
        width, attn = (s.heads + 2 * s.kv_heads) * s.head_dim, s.heads * s.head_dim
        shapes = {
            "qkv": (width, in_width or s.hidden), "qkv_bias": (width,),
            "qk_norm": (s.heads + s.kv_heads, s.head_dim),
            "o_proj": (s.hidden, attn), "o_bias": (s.hidden,), "gate_up": (2 * s.inter, s.hidden),
            "down": (s.hidden, s.inter),
        }  # fmt: skip
        cache_shape = tuple(k_caches[0].shape)
        if len(cache_shape) != 4 or cache_shape[2:] != (s.kv_heads, s.head_dim):
            raise ValueError(f"native decode: cache shape {cache_shape} for {s.kv_heads}x{s.head_dim}")
        rows, keep, int8, blocks = [], [], False, False
        for i, lw in enumerate(layers):
            row, scales, descs = [], {n: 0 for n in _MATRICES}, {n: 0 for n in _MATRICES}
            for name, want in shapes.items():
                t = lw[name]
                if t is None:
                    if name in ("qkv_bias", "qk_norm", "o_bias"):
                        row.append(0)
                        continue
                    raise ValueError(f"native decode: layer {i} has no {name}")
                if isinstance(t, BlockQuantWeight):
                    if k_caches[0].dtype != torch.float32 or tuple(t.shape) != want:
                        raise ValueError(
                            f"native decode: layer {i} {name}: block-quantized {tuple(t.shape)} (want {want}), "
                            "float32 activations only"
                        )
                    from tandem.native.quant_linear import quant_linear_kernel

                    qk = quant_linear_kernel()
                    if qk is None or not qk.supports(t):
                        raise ValueError(f"native decode: layer {i} {name}: no native kernel for {t.types}")
                    descs[name] = t.descriptor.data_ptr()
                    keep.append(t)
                    row.append(0)
                    blocks = True
                    continue
                t_dtype = dtype if name in _MATRICES else k_caches[0].dtype
                if isinstance(t, Int8Weight):
                    if name not in _MATRICES or k_caches[0].dtype != torch.float32:
                        raise ValueError(f"native decode: layer {i} {name}: int8 only for matrices, float32 activations")
                    check_dense(t.scale, want[:1], torch.float32, f"layer {i} {name} scale")
                    scales[name] = t.scale.data_ptr()
                    keep.append(t.scale)
                    t, t_dtype, int8 = t.q, torch.int8, True
                check_dense(t, want, t_dtype, f"layer {i} {name}")
                row.append(t.data_ptr())
                keep.append(t)
            for name, cache in (("k cache", k_caches[i]), ("v cache", v_caches[i])):
                check_dense(cache, cache_shape, k_caches[0].dtype, f"layer {i} {name}")
                row.append(cache.data_ptr())
                keep.append(cache)
            extra = []
            for name in ("post_attn_norm", "post_ffn_norm"):
                t = lw.get(name)
                if t is not None:
                    check_dense(t, (s.hidden,), k_caches[0].dtype, f"layer {i} {name}")
                    keep.append(t)
                extra.append(0 if t is None else t.data_ptr())
            group = lw.get("group", 0)
            if not isinstance(group, int) or group < 0:
                raise ValueError(f"native decode: layer {i} group must be an int >= 0, got {group!r}")
            extra += [group, int(bool(lw.get("local", False)))]
            rows.append(row + list(scales.values()) + list(descs.values()) + extra)
        ptrs = torch.tensor(rows, dtype=torch.int64)
        if k_caches[0].dtype != dtype and (k_caches[0].dtype, dtype) != (torch.float32, torch.bfloat16):
            raise ValueError(f"native decode: {dtype} weights over a {k_caches[0].dtype} cache")
        # (biases and norms are checked in the activations' dtype, the one the C code reads them in)
        return LayerTable(
            ptrs, tuple(keep), k_caches[0].dtype, cache_shape[0], cache_shape[1], dtype, shapes["qkv"][1], int8,
            blocks, int(ptrs[:, 19].max().item()) + 1,
        )

    def __call__(
        self,
        shape: StackShape,
        table: LayerTable,
        x: torch.Tensor,
        rotations: torch.Tensor,
        groups: Sequence[tuple[torch.Tensor, PagedAttentionIndices]],
        aux: Sequence[torch.Tensor | None] | None = None,
        local_rotations: torch.Tensor | None = None,
    ) -> None:
        """Run every layer over ``x`` ``[T, hidden]`` in place (the residual stream after the last layer).
        ``rotations``: ``[T, head_dim]`` float32 (cos, sin) pairs (``local_rotations``: those of the layers
        marked local; default ``rotations``); ``groups``: each KV cache group's ``[T]`` int64 slot mapping and
        attention indices (with its window), one per group the table's layers name; ``aux[i]``: a
        ``[T, hidden]`` tensor to receive the stream after layer ``i``, or ``None``."""
        s, rows = shape, x.shape[0]
        if table.weights != table.dtype or (table.int8 and table.dtype != torch.float32):
            raise ValueError("native decode: the stack needs weights in the activations' dtype (or int8 under float32)")
        if s.hidden_act not in ACTIVATIONS:
            raise ValueError(f"native decode: hidden_act {s.hidden_act!r} not in {sorted(ACTIVATIONS)}")
        if len(groups) != table.num_groups:
            raise ValueError(f"native decode: {len(groups)} KV cache groups, the layers name {table.num_groups}")
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"native decode: {rows} rows (at most {self.max_rows})")
        check_dense(x, (rows, s.hidden), table.dtype, "x")
        local_rotations = rotations if local_rotations is None else local_rotations
        for name, rot in (("rotations", rotations), ("local_rotations", local_rotations)):
            check_dense(rot, (rows, s.head_dim), torch.float32, name)
        fields = []
        for g, (slots, ix) in enumerate(groups):
            if rows != ix.num_rows:
                raise ValueError(f"native decode: {rows} rows, group {g}'s indices {ix.num_rows}")
            check_dense(slots, (rows,), torch.int64, f"group {g} slot_mapping")
            bt = ix.block_tables
            fields.append([  # decode_forward.c GROUP_FIELDS, in its order
                bt.data_ptr(), bt.stride(0), ix.seq_lens.data_ptr(), ix.req.data_ptr(), ix.q_start.data_ptr(),
                ix.q_len.data_ptr(), ix.num_reqs, slots.data_ptr(), ix.window,
                0 if ix.tree_masks is None else ix.tree_masks.data_ptr(),
            ])  # fmt: skip
        group_table = torch.tensor(fields, dtype=torch.int64)
        num_layers = table.ptrs.shape[0]
        aux_ptrs = None
        if aux is not None:
            if len(aux) != num_layers:
                raise ValueError(f"native decode: {len(aux)} aux outputs for {num_layers} layers")
            for i, a in enumerate(aux):
                if a is not None:
                    check_dense(a, (rows, s.hidden), table.dtype, f"aux output {i}")
            aux_ptrs = torch.tensor([0 if a is None else a.data_ptr() for a in aux], dtype=torch.int64)
        rc = self._fn(
            int(table.dtype == torch.bfloat16), ACTIVATIONS[s.hidden_act], num_layers, table.ptrs.data_ptr(),
            x.data_ptr(), rows, s.hidden, s.heads, s.kv_heads, s.head_dim, s.inter, s.eps_root, s.qk_eps,
            rotations.data_ptr(), local_rotations.data_ptr(), table.num_blocks, table.block_size,
            group_table.data_ptr(), len(groups), s.scale, None if aux_ptrs is None else aux_ptrs.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("native decode: out of scratch memory")

    def head_layer(
        self,
        shape: StackShape,
        table: LayerTable,
        x: torch.Tensor,
        attn_in: torch.Tensor,
        rotations: torch.Tensor,
        slot_mapping: torch.Tensor,
        ix: PagedAttentionIndices,
    ) -> None:
        """One layer (``table`` of one row) over the residual stream ``x`` ``[T, hidden]`` in place, its
        attention input given (``attn_in`` ``[T, in_width]``, already normed): a draft head's layer."""
        s, rows = shape, x.shape[0]
        if table.ptrs.shape[0] != 1:
            raise ValueError(f"native head layer: a table of one layer, got {table.ptrs.shape[0]}")
        if not 1 <= rows <= self.max_rows or rows != ix.num_rows:
            raise ValueError(f"native head layer: {rows} rows (at most {self.max_rows}, indices {ix.num_rows})")
        in_width = attn_in.shape[1] if attn_in.dim() == 2 else -1
        check_dense(x, (rows, s.hidden), table.dtype, "x")
        check_dense(attn_in, (rows, in_width), table.dtype, "attn_in")
        if table.qkv_in != in_width:
            raise ValueError(f"native head layer: attn_in width {in_width}, qkv takes {table.qkv_in}")
        check_dense(rotations, (rows, s.head_dim), torch.float32, "rotations")
        check_dense(slot_mapping, (rows,), torch.int64, "slot_mapping")
        bt = ix.block_tables
        rc = self._head_fn(
            int(table.dtype == torch.bfloat16), W_DTYPES[table.weights], table.ptrs.data_ptr(),  # int8: by scales
            x.data_ptr(), attn_in.data_ptr(), in_width, rows, s.hidden, s.heads, s.kv_heads, s.head_dim,
            s.inter, s.eps_root, rotations.data_ptr(), slot_mapping.data_ptr(), table.num_blocks,
            table.block_size, bt.data_ptr(), bt.stride(0), ix.seq_lens.data_ptr(), ix.req.data_ptr(),
            ix.q_start.data_ptr(), ix.q_len.data_ptr(), ix.num_reqs, s.scale,
            None if ix.tree_masks is None else ix.tree_masks.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("native head layer: out of scratch memory")

    def head_rms_pair(self, a: torch.Tensor, b: torch.Tensor, wa: torch.Tensor, wb: torch.Tensor, eps: float
                      ) -> torch.Tensor:
        """``[rms_norm(a) * wa, rms_norm(b) * wb]`` side by side, ``[rows, 2 * hidden]`` (float32 rows): EAGLE-3's
        attention input from the tokens' embeddings ``a`` and the features ``b``."""
        rows, hidden = a.shape[0], a.shape[-1]
        for t, name in ((a, "a"), (b, "b")):
            check_dense(t, (rows, hidden), torch.float32, name)
        for t, name in ((wa, "wa"), (wb, "wb")):
            check_dense(t, (hidden,), torch.float32, name)
        out = torch.empty(rows, 2 * hidden)
        self._pair_fn(a.data_ptr(), b.data_ptr(), rows, hidden, wa.data_ptr(), wb.data_ptr(), eps, out.data_ptr())
        return out

    def head_tokens(self, h: torch.Tensor, norm: torch.Tensor | None, eps: float,
                    lm_head: torch.Tensor | Int8Weight | BlockQuantWeight, draft_map: torch.Tensor | None,
                    logits: torch.Tensor | None = None) -> torch.Tensor:
        """A draft head's greedy drafts ``[rows]`` (target ids) from its outputs ``h`` ``[rows, hidden]``
        (float32): the final ``norm`` (or none), the draft LM head ``[vd, hidden]`` (float32, bf16,
        :class:`Int8Weight` or GGUF blocks), the first maximal logit, ``draft_map``. ``logits`` ``[rows, vd]``:
        filled too."""
        out = torch.empty(h.shape[0], dtype=torch.int64)
        self._lm_head_call(h, norm, eps, lm_head, draft_map, 1, out, None, logits)
        return out

    def head_top_k(self, h: torch.Tensor, norm: torch.Tensor | None, eps: float,
                   lm_head: torch.Tensor | Int8Weight | BlockQuantWeight, k: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """A draft tree level's candidates: the ``k`` most probable draft ids of each row of ``h`` (as
        :meth:`head_tokens` computes the logits), best first, and their log-probabilities, each
        ``[rows, k]`` (float32, int64 draft ids)."""
        rows = h.shape[0]
        lp, ids = torch.empty(rows, k), torch.empty(rows, k, dtype=torch.int64)
        self._lm_head_call(h, norm, eps, lm_head, None, k, ids, lp, None)
        return lp, ids

    def _lm_head_call(self, h: torch.Tensor, norm: torch.Tensor | None, eps: float,
                      lm_head: torch.Tensor | Int8Weight | BlockQuantWeight, draft_map: torch.Tensor | None, k: int,
                      out_ids: torch.Tensor, out_lp: torch.Tensor | None, logits: torch.Tensor | None) -> None:
        rows, hidden = h.shape[0], h.shape[-1]
        check_dense(h, (rows, hidden), torch.float32, "h")
        if norm is not None:
            check_dense(norm, (hidden,), torch.float32, "norm")
        int8, blocks = isinstance(lm_head, Int8Weight), isinstance(lm_head, BlockQuantWeight)
        desc = None
        if blocks:
            from tandem.native.quant_linear import quant_linear_kernel

            qk = quant_linear_kernel()
            if qk is None or not qk.supports(lm_head) or lm_head.in_features != hidden:
                raise ValueError(f"native head tokens: an LM head of {lm_head.layouts} over {lm_head.in_features}")
            desc, w = lm_head.descriptor, None
            vd = lm_head.shape[0]
        else:
            w = lm_head.q if int8 else lm_head
            vd = w.shape[0]
            check_dense(w, (vd, hidden), w.dtype, "lm_head")
            if w.dtype not in W_DTYPES or (w.dtype == torch.int8) != int8:
                raise ValueError(f"native head tokens: an LM head of {w.dtype}")
        if draft_map is not None:
            check_dense(draft_map, (vd,), torch.int64, "draft_map")
        if logits is not None:
            check_dense(logits, (rows, vd), torch.float32, "logits")
        rc = self._tokens_fn(
            h.data_ptr(), rows, hidden, None if norm is None else norm.data_ptr(), eps,
            None if w is None else w.data_ptr(), lm_head.scale.data_ptr() if int8 else None,
            0 if w is None else W_DTYPES[w.dtype], None if desc is None else desc.data_ptr(), vd,
            None if draft_map is None else draft_map.data_ptr(), k, out_ids.data_ptr(),
            None if out_lp is None else out_lp.data_ptr(), None if logits is None else logits.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"native head tokens: {rows} rows (1 .. 64), top {k} of {vd}") if rc == -1 else (
                MemoryError("native head tokens: out of scratch memory"))


def decode_forward_kernel() -> DecodeForwardKernel | None:
    """The compiled stack kernel, or ``None`` where native kernels are unavailable."""
    lib = native.load("decode_forward")
    return None if lib is None else DecodeForwardKernel(lib)
