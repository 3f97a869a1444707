"""Python side of ``paged_attention.c``: argument checks and the ctypes call.

The kernel reads raw memory, so this wrapper checks what the C code assumes (CPU tensors, dtypes, the
row/head layout, contiguous caches and tables, index dtypes) before every call; the C side clamps every
index it reads from the tables to the tensors' bounds.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from tandem import native

_ABI = 4
_c_i64, _c_ptr = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = [
    ctypes.c_int, _c_ptr, _c_i64, _c_ptr, _c_i64,  # is_bf16, q, q_row_stride, out, out_row_stride
    _c_ptr, _c_ptr, _c_i64, _c_i64,  # k_cache, v_cache, num_blocks, block_size
    _c_ptr, _c_i64, _c_ptr,  # block_tables, bt_stride, seq_lens
    _c_ptr, _c_ptr, _c_ptr, _c_i64,  # req, q_start, q_len, num_reqs
    _c_i64, _c_i64, _c_i64, ctypes.c_float,  # heads, kv_heads, head_dim, scale
    _c_i64, _c_ptr, ctypes.c_int,  # window (0: none), tree_masks (None: causal), threads
]
DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class PagedAttentionIndices:
    """The per-forward index tensors, checked once (:meth:`PagedAttentionKernel.indices`) and shared by
    every layer. The tensors are kept here so their memory outlives every call that reads it."""

    block_tables: torch.Tensor  # [B, W] int64, dense rows
    seq_lens: torch.Tensor  # [B] int64, exact lengths
    req: torch.Tensor  # [n] int64 batch rows to attend
    q_start: torch.Tensor  # [n] int64 first query row of each
    q_len: torch.Tensor  # [n] int64 query rows of each
    num_rows: int  # T, the query rows of the forward
    window: int = 0  # a sliding window (each query sees its last ``window`` positions); 0 = none
    tree_masks: torch.Tensor | None = None  # [T] int64 (ForwardBatch.tree_masks); None = causal
    num_reqs: int = 0  # the batch rows to attend (``req``'s length; set by ``PagedAttentionKernel.indices``)


class PagedAttentionKernel:
    """``out[rows of request r] = attention(q rows, the request's paged K/V)`` for short queries."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        if lib.tandem_paged_attention_abi() != _ABI:
            raise RuntimeError("paged_attention library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self._fn = lib.tandem_paged_attention
        self._fn.argtypes = _ARGTYPES
        self._fn.restype = ctypes.c_int

    @staticmethod
    def indices(
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        req: torch.Tensor | list[int],
        q_start: torch.Tensor | list[int],
        q_len: torch.Tensor | list[int],
        num_rows: int,
        window: int = 0,
        tree_masks: torch.Tensor | None = None,
    ) -> PagedAttentionIndices:
        """``block_tables`` ``[B, W]`` and ``seq_lens`` ``[B]`` (exact lengths) index batch rows;
        ``req``/``q_start``/``q_len`` ``[n]`` name the requests to attend (batch row, first query row,
        query count) among ``num_rows`` query rows; ``tree_masks`` ``[num_rows]`` for a tree step
        (``ForwardBatch.tree_masks``: at most 64 query rows a request). Checked here, once per forward. The three may be host
        lists (the usual case: the batch's layout is known on the host); then their bounds are checked
        in Python, which saves the tensor reductions a check of tensors costs."""
        if block_tables.dim() != 2 or block_tables.stride(1) != 1:
            raise ValueError("paged attention kernel: block_tables must be [B, W] with dense rows")
        host = isinstance(req, list) and isinstance(q_start, list) and isinstance(q_len, list)
        if host:
            lists = (req, q_start, q_len)
            req, q_start, q_len = (torch.tensor(v, dtype=torch.int64) for v in lists)
        else:
            req, q_start, q_len = (torch.as_tensor(v) for v in (req, q_start, q_len))
        vectors = (seq_lens, req, q_start, q_len)
        for t in (block_tables, *vectors):
            if t.device.type != "cpu" or t.dtype != torch.int64:
                raise ValueError("paged attention kernel: index tensors must be int64 on the CPU")
        if any(t.dim() != 1 or not t.is_contiguous() for t in vectors):
            raise ValueError("paged attention kernel: index vectors must be 1-D and contiguous")
        if not (req.shape == q_start.shape == q_len.shape):
            raise ValueError("paged attention kernel: req, q_start and q_len differ in length")
        if req.shape[0]:
            if host:  # the bounds from the lists: no tensor reductions
                r, s, n = lists
                bounds = (min(s), min(n), max(a + b for a, b in zip(s, n)), min(r), max(r))
            else:
                bounds = (int(q_start.min()), int(q_len.min()), int((q_start + q_len).max()),
                          int(req.min()), int(req.max()))  # fmt: skip
            start, count, end, lo, hi = bounds
            if start < 0 or count < 1 or end > num_rows:
                raise ValueError(f"paged attention kernel: query rows outside [0, {num_rows})")
            if lo < 0 or hi >= min(block_tables.shape[0], seq_lens.shape[0]):
                raise ValueError("paged attention kernel: req names a row outside the tables")
        if window < 0:
            raise ValueError(f"paged attention kernel: window must be >= 0, got {window}")
        if tree_masks is not None:
            if tree_masks.dtype != torch.int64 or tree_masks.device.type != "cpu" or tuple(tree_masks.shape) != (num_rows,):
                raise ValueError(f"paged attention kernel: tree_masks must be int64 [{num_rows}] on the CPU")
            if req.shape[0] and (max(lists[2]) if host else int(q_len.max())) > 64:
                raise ValueError("paged attention kernel: a tree step takes at most 64 query rows a request")
            tree_masks = tree_masks.contiguous()
        return PagedAttentionIndices(block_tables, seq_lens, req, q_start, q_len, num_rows, window, tree_masks,
                                     int(req.shape[0]))

    def __call__(
        self,
        q: torch.Tensor,
        out: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        ix: PagedAttentionIndices,
        scale: float,
    ) -> None:
        """``q``/``out`` ``[T, heads, head_dim]`` (rows may be strided, heads and dims dense); caches
        ``[num_blocks, block_size, kv_heads, head_dim]``. Writes the rows of ``ix``'s requests."""
        heads, head_dim = q.shape[1:]
        num_blocks, block_size, kv_heads, _ = k_cache.shape
        self._check(q, out, k_cache, v_cache)
        if q.shape[0] != ix.num_rows:
            raise ValueError(f"paged attention kernel: q has {q.shape[0]} rows, indices {ix.num_rows}")
        bt = ix.block_tables
        rc = self._fn(
            int(q.dtype == torch.bfloat16), q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0),
            k_cache.data_ptr(), v_cache.data_ptr(), num_blocks, block_size,
            bt.data_ptr(), bt.stride(0), ix.seq_lens.data_ptr(),
            ix.req.data_ptr(), ix.q_start.data_ptr(), ix.q_len.data_ptr(), ix.num_reqs,
            heads, kv_heads, head_dim, scale, ix.window,
            None if ix.tree_masks is None else ix.tree_masks.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("paged attention kernel could not allocate its scratch memory")

    @staticmethod
    def _check(q, out, k_cache, v_cache) -> None:
        if q.device.type != "cpu" or k_cache.device.type != "cpu":
            raise ValueError("paged attention kernel: tensors must be on the CPU")
        if q.dtype not in DTYPES or not (out.dtype == k_cache.dtype == v_cache.dtype == q.dtype):
            raise ValueError(f"paged attention kernel: dtypes must match and be one of {DTYPES}")
        heads, head_dim = q.shape[1:]
        kv_heads = k_cache.shape[2]
        if heads % kv_heads or k_cache.shape[3] != head_dim or k_cache.shape != v_cache.shape:
            raise ValueError(
                f"paged attention kernel: q heads {heads}x{head_dim}, cache {tuple(k_cache.shape)}"
            )
        if q.stride(2) != 1 or q.stride(1) != head_dim or out.stride(2) != 1 or out.stride(1) != head_dim:
            raise ValueError("paged attention kernel: q/out heads and dims must be dense")
        if out.shape != q.shape:
            raise ValueError("paged attention kernel: out must have q's shape")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("paged attention kernel: caches must be contiguous")


def paged_attention_kernel() -> PagedAttentionKernel | None:
    """The compiled kernel, or ``None`` where native kernels are unavailable (see :mod:`tandem.native`)."""
    lib = native.load("paged_attention")
    return None if lib is None else PagedAttentionKernel(lib)
