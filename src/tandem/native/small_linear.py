"""Python side of ``small_linear.c``: ``y = x @ w^T (+ bias) (+ residual)`` for a few rows, with the
argument checks the C code relies on (CPU tensors of one dtype — or a bf16 weight, or an int8 one with a
scale per output feature, under float32 inputs —, dense rows, the row limit)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from tandem import native

_ABI = 3
DTYPES = (torch.float32, torch.bfloat16)
W_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}  # gemv.h's W_F32, W_BF16, W_INT8
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_LINEAR_ARGS = [
    ctypes.c_int, ctypes.c_int, _ptr, _i64, _i64,  # is_bf16, wdt, x, x_stride, rows
    _ptr, _ptr, _i64, _i64,  # w, scale, out, in
    _ptr, _ptr, _i64, _ptr, _i64, ctypes.c_int,  # bias, residual, res_stride, y, y_stride, threads
]  # fmt: skip


def check_dense(t: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, what: str) -> None:
    """Raise ``ValueError`` unless ``t`` is a contiguous CPU tensor of ``dtype`` and ``shape``."""
    if t.device.type != "cpu" or t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"native kernel: {what} is {t.dtype} {tuple(t.shape)} on {t.device}, "
            f"expected {dtype} {tuple(shape)} on the CPU"
        )
    if not t.is_contiguous():
        raise ValueError(f"native kernel: {what} must be contiguous")


class SmallLinearKernel:
    """``y = x @ w^T (+ bias) (+ residual)`` for 1 .. :attr:`max_rows` rows; float32 or bf16, or float32
    inputs with a bf16 weight, or an int8 one with ``scale`` (:attr:`pairs`)."""

    # (input dtype, weight dtype) pairs the kernel takes
    pairs = frozenset({*((d, d) for d in DTYPES), (torch.float32, torch.bfloat16), (torch.float32, torch.int8)})

    def __init__(self, lib: ctypes.CDLL) -> None:
        if lib.tandem_small_linear_abi() != _ABI:
            raise RuntimeError("small_linear library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self.max_rows = int(lib.tandem_small_linear_max_rows())
        self.vectorized = bool(lib.tandem_small_linear_vectorized())
        self._fn = lib.tandem_small_linear
        self._fn.argtypes = _LINEAR_ARGS
        self._fn.restype = ctypes.c_int

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``scale`` [out] float32: an int8 weight's per-feature scales (required with one, else None)."""
        rows, (out, inp) = x.shape[0], weight.shape
        dtype = x.dtype
        if (dtype, weight.dtype) not in self.pairs or x.dim() != 2 or x.shape[1] != inp:
            raise ValueError(f"small linear: x {x.dtype} {tuple(x.shape)}, weight {weight.dtype} {(out, inp)}")
        if (weight.dtype == torch.int8) != (scale is not None):
            raise ValueError("small linear: an int8 weight needs its scale, and only an int8 weight takes one")
        if scale is not None:
            check_dense(scale, (out,), torch.float32, "scale")
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"small linear: {rows} rows, at most {self.max_rows}")
        if x.device.type != "cpu" or weight.device.type != "cpu" or not weight.is_contiguous():
            raise ValueError("small linear: CPU tensors and a contiguous weight")
        if x.stride(1) != 1:
            x = x.contiguous()
        if bias is not None:
            check_dense(bias, (out,), dtype, "bias")
        if residual is not None and (
            residual.shape != (rows, out) or residual.dtype != dtype or residual.stride(1) != 1
        ):
            raise ValueError(f"small linear: residual {tuple(residual.shape)} for {(rows, out)}")
        y = torch.empty(rows, out, dtype=dtype)
        rc = self._fn(
            int(dtype == torch.bfloat16), W_DTYPES[weight.dtype], x.data_ptr(), x.stride(0),
            rows, weight.data_ptr(), None if scale is None else scale.data_ptr(), out, inp,
            None if bias is None else bias.data_ptr(),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0), y.data_ptr(), y.stride(0),
            torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("small linear: out of scratch memory")
        return y


def small_linear_kernel() -> SmallLinearKernel | None:
    """The compiled few-row product, or ``None`` where native kernels are unavailable."""
    lib = native.load("small_linear")
    return None if lib is None else SmallLinearKernel(lib)
