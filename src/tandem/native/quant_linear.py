"""Python side of ``quant_linear.c``: products and row lookups on GGUF block-quantized matrices
(:class:`~tandem.model.block_quant.BlockQuantWeight`), with the checks the C code relies on."""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

import torch

from tandem import native

if TYPE_CHECKING:  # tandem.model imports this module (model/linear.py): importing it back here would be a cycle
    from tandem.model.block_quant import BlockQuantWeight

_ABI = 2
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class QuantLinearKernel:
    """``y = (x * gain) @ W^T (+ bias) (+ residual)`` for 1 .. :attr:`max_rows` float32 rows, and row
    lookups (:meth:`rows`), on one ISA variant's library."""

    def __init__(self, lib: ctypes.CDLL, isa: str) -> None:
        if lib.tandem_quant_linear_abi() != _ABI:
            raise RuntimeError("quant_linear library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self.isa = isa
        self.max_rows = int(lib.tandem_quant_linear_max_rows())
        lib.tandem_quant_linear_isa.restype = ctypes.c_char_p
        self.compiled_isa = lib.tandem_quant_linear_isa().decode()  # avx512 / avx2 / portable
        lib.tandem_quant_linear_i8_simd.restype = ctypes.c_char_p
        # where int8 activations run: "vnni" (AVX-512 VNNI), "avx2" (vpmaddubsw) or "portable" (scalar C)
        self.int8_path = lib.tandem_quant_linear_i8_simd().decode()
        self.int8_simd = self.int8_path != "portable"
        self.vnni = self.int8_path == "vnni"
        self._supported = lib.tandem_quant_supported
        self._supported.argtypes = [_i64]
        self._fn = lib.tandem_quant_linear
        self._fn.argtypes = [_ptr, _ptr, _i64, _i64, _ptr, _ptr, _i64, _ptr, _i64, ctypes.c_int]
        self._fn.restype = ctypes.c_int
        self._rows = lib.tandem_quant_rows
        self._rows.argtypes = [_ptr, _ptr, _i64, _i64, _ptr, ctypes.c_int]
        self._rows.restype = ctypes.c_int
        # GGML type ids with a kernel here (ids are small; 64 covers every type gguf-py knows)
        self.supported = frozenset(t for t in range(64) if self._supported(t))

    def supports(self, weight: BlockQuantWeight) -> bool:
        return weight.qtypes <= self.supported

    def _check(self, weight: BlockQuantWeight) -> None:
        if weight.device.type != "cpu":
            raise ValueError("quant linear: CPU weights only")
        from tandem.model.block_quant import type_name

        bad = [type_name(p.qtype) for p in weight.parts if not self._supported(p.qtype)]
        if bad:
            raise ValueError(f"quant linear: no kernel for {bad} (tensor {weight.name!r})")

    def __call__(
        self,
        x: torch.Tensor,
        weight: BlockQuantWeight,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        out_t: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``out_t``: where to write ``y`` (``[rows, out_features]`` float32 with unit column stride, e.g. a slice
        of a bigger result's rows); else a new tensor."""
        rows = x.shape[0] if x.dim() == 2 else -1
        out, inp = weight.shape
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != inp or x.device.type != "cpu":
            raise ValueError(f"quant linear: x {x.dtype} {tuple(x.shape)} for a [{out}, {inp}] float32 product")
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"quant linear: {rows} rows, at most {self.max_rows}")
        if weight.device.type != "cpu":
            raise ValueError("quant linear: CPU weights only")
        if x.stride(1) != 1:
            x = x.contiguous()
        if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (out,) or not bias.is_contiguous()):
            raise ValueError(f"quant linear: bias {bias.dtype} {tuple(bias.shape)} for {out} outputs")
        if residual is not None and (
            tuple(residual.shape) != (rows, out) or residual.dtype != torch.float32 or residual.stride(1) != 1
        ):
            raise ValueError(f"quant linear: residual {tuple(residual.shape)} for {(rows, out)}")
        if out_t is None:
            y = torch.empty(rows, out, dtype=torch.float32)
        elif out_t.dtype != torch.float32 or tuple(out_t.shape) != (rows, out) or out_t.stride(1) != 1:
            raise ValueError(f"quant linear: out {out_t.dtype} {tuple(out_t.shape)} for {(rows, out)}")
        else:
            y = out_t
        rc = self._fn(
            weight.descriptor.data_ptr(), x.data_ptr(), x.stride(0), rows,
            None if bias is None else bias.data_ptr(), None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0), y.data_ptr(), y.stride(0), torch.get_num_threads(),
        )  # fmt: skip
        if rc == -2:
            raise MemoryError("quant linear: out of scratch memory")
        if rc == -3:
            self._check(weight)  # names the types without a kernel
        if rc != 0:
            raise RuntimeError(f"quant linear: kernel returned {rc}")
        return y

    def rows(self, weight: BlockQuantWeight, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape; clamped into the matrix) dequantized to float32, without the gain:
        ``[*ids.shape, in]`` (an embedding lookup)."""
        if weight.device.type != "cpu":
            raise ValueError("quant linear: CPU weights only")
        flat = ids.reshape(-1).to(device="cpu", dtype=torch.int64).contiguous()
        out = torch.empty(flat.numel(), weight.in_features, dtype=torch.float32)
        if flat.numel():
            rc = self._rows(weight.descriptor.data_ptr(), flat.data_ptr(), 0, flat.numel(), out.data_ptr(),
                            torch.get_num_threads())
            if rc == -3:
                self._check(weight)  # names the types without a kernel
            if rc != 0:
                raise RuntimeError(f"quant rows: kernel returned {rc}")
        return out.reshape(*ids.shape, weight.in_features)

    def row_range(self, weight: BlockQuantWeight, start: int, stop: int) -> torch.Tensor:
        """Rows ``start .. stop`` dequantized to float32 ``[stop - start, in]`` (without the gain): a tile of
        a many-row product."""
        self._check(weight)
        out = torch.empty(stop - start, weight.in_features, dtype=torch.float32)
        rc = self._rows(weight.descriptor.data_ptr(), None, start, stop - start, out.data_ptr(),
                        torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"quant rows: kernel returned {rc}")
        return out


@functools.cache
def _kernel(isa: str) -> QuantLinearKernel | None:
    lib = native.load("quant_linear", isa)
    return None if lib is None else QuantLinearKernel(lib, isa)


def quant_linear_kernel(isa: str | None = None) -> QuantLinearKernel | None:
    """The compiled kernels for ``isa`` (default :func:`tandem.native.default_isa`), or ``None`` where native
    kernels are unavailable."""
    if not native.enabled():
        return None
    return _kernel(isa or native.default_isa())
