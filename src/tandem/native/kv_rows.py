"""Python side of ``kv_rows.c``: a tree step's accepted K/V rows moved in every layer with one call
(``KVCache.move_rows``; its torch loop is the reference). Takes CPU tensors whose rows are dense: ``[blocks,
block_size, heads, head_dim]`` caches, contiguous, all of one shape and dtype."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from tandem import native

_ABI = 2
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class KVRowsKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.tandem_kv_rows_abi.restype = ctypes.c_int
        if lib.tandem_kv_rows_abi() != _ABI:
            raise RuntimeError("kv_rows library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self._fn = lib.tandem_kv_move_rows
        self._fn.argtypes = [_ptr, _i64, _i64, _i64, _ptr, _ptr, _i64]
        self._fn.restype = ctypes.c_int
        self._branches = lib.tandem_kv_move_branches
        self._branches.argtypes = [_ptr, _i64, _i64, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _ptr, _i64, _i64]
        self._branches.restype = ctypes.c_int

    @staticmethod
    def takes(tensors: Sequence[torch.Tensor]) -> bool:
        """Whether the kernel can move these tensors' rows (else the torch loop does)."""
        first = tensors[0]
        return all(t.device.type == "cpu" and t.is_contiguous() and t.shape == first.shape
                   and t.dtype == first.dtype for t in tensors)

    def __call__(self, tensors: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
        """Row ``src[i]`` to row ``dst[i]`` (flat slots, ``[n]`` int64, distinct destinations) in every tensor;
        all sources of a tensor are read before any destination is written."""
        self.bind(tensors)(src, dst)

    def bind(self, tensors: Sequence[torch.Tensor]) -> BoundRows:
        """The kernel on these tensors for good (see :class:`BoundRows`)."""
        return BoundRows(self, tensors)

    @staticmethod
    def _raise(rc: int, n_rows: int) -> None:
        if rc == -1:
            raise ValueError(f"kv rows kernel: a slot outside 0 .. {n_rows - 1}")
        if rc != 0:
            raise MemoryError("kv rows kernel: no scratch memory")


class BoundRows:
    """The kernel bound to one set of cache tensors (a ``KVCache``'s, fixed for its life): their checks and
    addresses taken once, not on every tree step."""

    def __init__(self, kernel: KVRowsKernel, tensors: Sequence[torch.Tensor]) -> None:
        if not kernel.takes(tensors):
            raise ValueError("kv rows kernel: contiguous CPU tensors of one shape and dtype")
        first = tensors[0]
        self.kernel, self.tensors = kernel, list(tensors)  # (kept alive: the addresses point into them)
        self.n_rows = first.shape[0] * first.shape[1]
        self.block_size = first.shape[1]
        self.row_bytes = first[0, 0].numel() * first.element_size()
        self.bases = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))

    def move_branches(self, tables: torch.Tensor, rows: torch.Tensor, root: torch.Tensor, nodes: torch.Tensor) -> None:
        """:meth:`KVRowsKernel.move_branches` on the bound tensors."""
        batch = nodes.shape[0]
        if (nodes.dim() != 2 or tuple(rows.shape) != (batch,) or tuple(root.shape) != (batch,) or tables.dim() != 2
                or any(t.dtype != torch.int64 or t.device.type != "cpu" for t in (tables, rows, root, nodes))):
            raise ValueError(f"kv rows kernel: branches of {tuple(nodes.shape)} nodes need int64 CPU rows and roots "
                             f"[{batch}] and tables [*, W]")
        tables, rows, root, nodes = (t.contiguous() for t in (tables, rows, root, nodes))
        rc = self.kernel._branches(self.bases, len(self.tensors), self.n_rows, self.row_bytes, self.block_size,
                                   tables.data_ptr(), tables.shape[0], tables.shape[1], rows.data_ptr(),
                                   root.data_ptr(), nodes.data_ptr(), batch, nodes.shape[1])
        self.kernel._raise(rc, self.n_rows)

    def __call__(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """:meth:`KVRowsKernel.__call__` on the bound tensors."""
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(f"kv rows kernel: src {tuple(src.shape)} and dst {tuple(dst.shape)} must be [n]")
        src, dst = src.to(torch.int64).contiguous(), dst.to(torch.int64).contiguous()
        rc = self.kernel._fn(self.bases, len(self.tensors), self.n_rows, self.row_bytes, src.data_ptr(),
                             dst.data_ptr(), src.numel())
        self.kernel._raise(rc, self.n_rows)


def kv_rows_kernel() -> KVRowsKernel | None:
    """The compiled kernel, or ``None`` where native kernels are unavailable (see :mod:`tandem.native`)."""
    lib = native.load("kv_rows")
    return None if lib is None else KVRowsKernel(lib)
