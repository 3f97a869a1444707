"""Matrix products of the transformer, behind a small registry so CPU-tuned formulations stay optional.

Every projection is ``y = x @ W^T (+ bias)`` or, where a residual add follows, ``y = r + x @ W^T``.
``torch`` is the reference (``F.linear`` / ``addmm``). ``cpu`` computes the same product but, for
low-precision weights and decode-sized inputs, picks the formulation torch's CPU kernels run fastest
(measured on the 2-core dev machine, all 30 layers of SmolLM2-135M plus its LM head, bf16):
``mv`` for a single row (17 ms instead of 22 ms per step at 2 threads) and ``W @ x^T`` for a few rows
(21.5 ms instead of 23.5 ms at 16 rows). float32 goes to the reference: MKL's ``x @ W^T`` is at memory
bandwidth for one or two rows (on some CPUs). ``onednn`` runs oneDNN's linear on weights re-laid out
once into its blocked format: MKL's fp32 GEMM is far from bandwidth for 3-64 rows (the verify rows of
speculative decoding, a 16-way decode batch): all 30 SmolLM2 gate/up projections took 20.3 / 27.5 / 28.2 ms
at 4 / 8 / 16 rows against 14.1 / 16.4 / 19.9 ms packed (12 ms is the one-row, bandwidth-bound time), and
bf16 9.6-10 ms packed against 12-14 ms for 2-16 rows. ``native`` (the CPU default where the C kernels
build) computes few-row products in ``native/small_linear.c`` and leaves the rest to ``onednn``
(:class:`NativeLinear`). All are tested against ``torch``.

Block-quantized matrices (:class:`~tandem.model.block_quant.BlockQuantWeight`, ``quantization="gguf"``) go
through :func:`block_quant_linear` in every formulation: ``torch`` multiplies by the gguf-py reference
dequantization; the others run few rows in the native kernels on the blocks (``native/quant.h``) and many
rows (a prefill chunk) as float32 GEMMs over tiles of rows dequantized natively, one tile at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tandem import overrides
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.block_quant_linear import block_quant_linear
from tandem.model.quant import Int8Weight
from tandem.native.small_linear import small_linear_kernel


class LinearKernels(Protocol):
    name: str

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ weight^T + bias`` for ``x`` ``[T, in]``; returns a contiguous ``[T, out]``."""
        ...

    def linear_add(
        self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        """``residual + x @ weight^T`` with the add fused into the product."""
        ...


class TorchLinear:
    """The reference formulation."""

    name = "torch"
    native_quant = False  # block-quantized products: the gguf-py reference

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if isinstance(weight, BlockQuantWeight):
            return block_quant_linear(x, weight, bias, native=self.native_quant)
        if isinstance(weight, Int8Weight):  # the reference: the dequantized matrix
            return F.linear(x, weight.dequantize(x.dtype), bias)
        return F.linear(x, weight, bias)

    def linear_add(
        self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        """``residual + x @ weight^T`` with the add fused into the product."""
        if isinstance(weight, BlockQuantWeight):
            return block_quant_linear(x, weight, residual=residual, native=self.native_quant)
        if isinstance(weight, Int8Weight):
            return torch.addmm(residual, x, weight.dequantize(x.dtype).t())
        return torch.addmm(residual, x, weight.t())


class CpuLinear(TorchLinear):
    """Shape-aware formulations for few rows of low-precision inputs; all else uses the reference."""

    name = "cpu"
    native_quant = True

    def __init__(self, small_rows: int = 32) -> None:
        self.small_rows = small_rows

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if isinstance(weight, (BlockQuantWeight, Int8Weight)):
            return TorchLinear.linear(self, x, weight, bias)
        rows = x.shape[0]
        if x.dtype == torch.float32:
            return F.linear(x, weight, bias)
        if rows == 1:
            if bias is None:
                return torch.mv(weight, x[0]).unsqueeze(0)
            return torch.addmv(bias, weight, x[0]).unsqueeze(0)
        if rows <= self.small_rows:
            if bias is None:
                return torch.mm(weight, x.t()).t().contiguous()
            return torch.addmm(bias.unsqueeze(1), weight, x.t()).t().contiguous()
        return F.linear(x, weight, bias)

    def linear_add(
        self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        if isinstance(weight, (BlockQuantWeight, Int8Weight)):
            return TorchLinear.linear_add(self, residual, x, weight)
        rows = x.shape[0]
        if x.dtype == torch.float32:
            return torch.addmm(residual, x, weight.t())
        if rows == 1:
            return torch.addmv(residual[0], weight, x[0]).unsqueeze(0)
        if rows <= self.small_rows:
            return torch.addmm(residual.t(), weight, x.t()).t().contiguous()
        return torch.addmm(residual, x, weight.t())


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's packed-weight linear (every x86 CPU build does)."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


def onednn_bf16_available() -> bool:
    """Whether oneDNN can run bf16 products on this CPU: it needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT.
    On an AVX2-only CPU its bf16 reorder and inner product refuse to build, so bf16 takes ``CpuLinear``."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return onednn_available() and probe is not None and bool(probe())


def _version_of(t: torch.Tensor) -> int:
    """The in-place update counter; inference tensors have none (and cannot change outside inference
    mode), so they count as never updated."""
    try:
        return t._version
    except RuntimeError:
        return -1


class OneDnnLinear(CpuLinear):
    """oneDNN's linear over weights packed once into its blocked layout; the rest as :class:`CpuLinear`.

    A weight is packed on first use and cached with the identity and version of the tensor it came from,
    so an in-place update of the weight repacks it (never a stale product). Only frozen CPU parameters
    are packed (trainable or temporary tensors take the :class:`CpuLinear` path), so the cache holds one
    packed copy per model weight: the price is that memory, once.
    """

    name = "onednn"
    PACK_ROWS_HINT = 16  # oneDNN chooses the blocked layout for this many rows; measured best for 1-64
    LARGE_OUT = 8192  # fp32 weights with this many output rows (LM heads) are packed even for one row

    def __init__(self, small_rows: int = 32) -> None:
        super().__init__(small_rows)
        self._enabled = onednn_available()
        self._bf16 = self._enabled and onednn_bf16_available()
        self._packed: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def _packed_for(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        if isinstance(weight, BlockQuantWeight):
            return None  # CpuLinear's path: block_quant_linear
        rows = x.shape[0]
        if not self._enabled or rows == 0 or x.device.type != "cpu":
            return None
        if not isinstance(weight, nn.Parameter) or weight.requires_grad or x.requires_grad:
            return None
        if x.dtype == torch.float32:
            if rows < 3 and weight.shape[0] < self.LARGE_OUT:
                return None  # MKL's one- and two-row product is already bandwidth-bound
        elif x.dtype == torch.bfloat16:
            if rows == 1 or not self._bf16:
                return None  # ``mv`` (CpuLinear) is as fast and keeps the LM head's fast path
        else:
            return None
        version = _version_of(weight)
        hit = self._packed.get(id(weight))
        if hit is not None and hit[0] is weight and hit[1] == version:
            return hit[2]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.PACK_ROWS_HINT)
        self._packed[id(weight)] = (weight, version, packed)
        return packed

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        packed = self._packed_for(x, weight)
        if packed is None:
            return super().linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")

    def linear_add(
        self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        packed = self._packed_for(x, weight)
        if packed is None:
            return super().linear_add(residual, x, weight)
        return torch.ops.mkldnn._linear_pointwise.binary(
            x.contiguous(), residual.contiguous(), packed, None, "add"
        )


class NativeLinear(OneDnnLinear):
    """Few-row products through ``native/small_linear.c`` (each weight streamed once, bf16 converted in
    registers); the rest as :class:`OneDnnLinear`.

    Measured on a 2-core AVX2 EPYC (all 30 SmolLM2 layers' products): fp32 18 / 21 / 27 ms at 1 / 4 / 8
    rows against oneDNN's 35 / 29 / 33 (MKL's one-row ``mv`` at 11 GB/s); bf16 12 / 20 / 29 / 46 / 78 ms
    at 1 / 4 / 8 / 16 / 32 rows against torch's 16 / 60 / 117 / 229 / 453 (oneDNN has no bf16 on AVX2).
    So: up to ``FEW_ROWS`` rows always, and bf16 up to the kernel's limit where oneDNN lacks bf16.
    Mixed: a bf16 weight under float32 inputs (a drafter's matrices, ``speculative_config.draft_dtype``)
    runs natively up to the kernel's row limit, on a widened copy beyond it; so does an int8 one
    (:class:`~tandem.model.quant.Int8Weight`, dequantized beyond it).
    Frozen CPU weights only (the kernel has no autograd).
    """

    name = "native"
    FEW_ROWS = 8

    def __init__(self, small_rows: int = 32) -> None:
        super().__init__(small_rows)
        self._kernel = small_linear_kernel()

    @property
    def mixed_bf16(self) -> bool:
        """Whether bf16 (and int8) weights under float32 inputs run natively (:meth:`linear` accepts them
        at any row count: beyond the kernel's rows on a widened / dequantized copy)."""
        return self._kernel is not None

    def _native_rows(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        k = self._kernel
        if k is None or x.dim() != 2 or not 1 <= x.shape[0] <= k.max_rows:
            return False
        if not k.accepts(x.dtype, weight.dtype) or x.device.type != "cpu" or weight.device.type != "cpu":
            return False
        if weight.requires_grad or x.requires_grad or not weight.is_contiguous():
            return False
        if x.dtype != weight.dtype:
            return True  # a bf16 weight under float32 inputs: the kernel, whatever the row count
        if x.dtype == torch.float32:
            return x.shape[0] <= self.FEW_ROWS or not self._enabled
        # bf16: beyond a few rows only where oneDNN cannot run bf16 (it is faster where it can).
        return x.dtype == torch.bfloat16 and (x.shape[0] <= self.FEW_ROWS or not self._bf16)

    def _widen(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Many bf16 rows where oneDNN has no bf16 (AVX2): torch's own bf16 GEMM runs at a fraction of
        its float32 speed there (a 512-token prefill of SmolLM2: 7.4 s), so the product is computed in
        float32 on a widened copy of the weight (one pass over it, ~1 % of such a product) and rounded."""
        return (
            x.dtype == torch.bfloat16
            and weight.dtype == torch.bfloat16
            and not self._bf16
            and x.device.type == "cpu"
            and not (weight.requires_grad or x.requires_grad)
        )

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor | Int8Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if isinstance(weight, Int8Weight):
            return self._int8(x, weight, bias=bias)
        if isinstance(weight, BlockQuantWeight):
            return block_quant_linear(x, weight, bias, native=self.native_quant)
        if self._native_rows(x, weight) and (bias is None or bias.is_contiguous()):
            assert self._kernel is not None
            return self._kernel(x, weight, bias)
        if weight.dtype != x.dtype:  # many rows on a bf16 weight: a widened copy (a prefill chunk)
            return F.linear(x, weight.to(x.dtype), bias)
        if self._widen(x, weight):
            b = None if bias is None else bias.float()
            return F.linear(x.float(), weight.float(), b).to(torch.bfloat16)
        return super().linear(x, weight, bias)

    def _int8(
        self, x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """An int8 weight (a drafter's, under float32 inputs): the kernel for few rows, else a float32
        product on the dequantized matrix (a prefill chunk)."""
        k = self._kernel
        if k is not None and x.dim() == 2 and 1 <= x.shape[0] <= k.max_rows and x.dtype == torch.float32:
            res = None if residual is None else residual.contiguous()
            return k(x, weight.q, None if bias is None else bias.contiguous(), res, scale=weight.scale)
        w = weight.dequantize(x.dtype)
        if residual is not None:
            return torch.addmm(residual, x, w.t())
        return F.linear(x, w, bias)

    def linear_add(
        self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | Int8Weight
    ) -> torch.Tensor:
        if isinstance(weight, Int8Weight):
            return self._int8(x, weight, residual=residual)
        if isinstance(weight, BlockQuantWeight):
            return block_quant_linear(x, weight, residual=residual, native=self.native_quant)
        if self._native_rows(x, weight) and residual.dtype == x.dtype and residual.dim() == 2:
            assert self._kernel is not None
            return self._kernel(x, weight, None, residual.contiguous())
        if weight.dtype != x.dtype:
            return torch.addmm(residual, x, weight.to(x.dtype).t())
        if self._widen(x, weight):
            out = torch.addmm(residual.float(), x.float(), weight.float().t())
            return out.to(torch.bfloat16)
        return super().linear_add(residual, x, weight)


LINEAR_KERNELS: Mapping[str, Callable[[], LinearKernels]] = MappingProxyType(
    {"torch": TorchLinear, "cpu": CpuLinear, "onednn": OneDnnLinear, "native": NativeLinear}
)


def default_linear_kernels(device: torch.device | str) -> str:
    """``native`` on CPU where the native kernels build, else ``onednn`` (``cpu`` where the build lacks
    oneDNN); the plain reference elsewhere
    (cuBLAS handles small shapes). ``TANDEM_LINEAR_KERNELS`` names another (for A/B measurements)."""
    override = overrides.linear_kernels()
    if override:
        if override not in LINEAR_KERNELS:
            raise ValueError(
                f"TANDEM_LINEAR_KERNELS={override!r}; registered: {sorted(LINEAR_KERNELS)}"
            )
        return override
    if torch.device(device).type != "cpu":
        return "torch"
    if small_linear_kernel() is not None:
        return "native"
    return "onednn" if onednn_available() else "cpu"


def create_linear_kernels(name: str) -> LinearKernels:
    try:
        return LINEAR_KERNELS[name]()
    except KeyError:
        raise ValueError(
            f"unknown linear kernels {name!r}; registered: {sorted(LINEAR_KERNELS)}"
        ) from None
