"""Matrix products of the transformer: named formulations, each an ordered list of rules (composition, no
class hierarchy), so CPU-tuned formulations stay optional and each rule reads on its own.

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
(``rule_native_rows``). All are tested against ``torch``.

A rule takes ``(kernels, x, weight, bias, residual)`` and returns the product, or ``None`` to pass it on; a
formulation keeps one rule list per kind of weight (block-quantized, int8, plain), so a product only tries the
rules of its weight's kind, first to last. The last plain rule is always the reference.

Block-quantized matrices (:class:`~tandem.model.block_quant.BlockQuantWeight`, ``quantization="gguf"``) go
through :func:`block_quant_linear` in every formulation: ``torch`` multiplies by the gguf-py reference
dequantization; the others run few rows in the native kernels on the blocks (``native/quant.h``) and many
rows (a prefill chunk) in slices of rows through the same kernels where they take int8 activations with VNNI,
else as float32 GEMMs over tiles of rows dequantized natively, one tile at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from tandem import overrides
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.block_quant_linear import QUANT_FEW_ROWS, QUANT_FEW_ROWS_INTERLEAVED, block_quant_linear
from tandem.model.quant import Int8Weight
from tandem.native.quant_linear import quant_linear_kernel
from tandem.native.small_linear import small_linear_kernel

Tensor = torch.Tensor
Rule = Callable[["LinearKernels", Tensor, "Tensor | Int8Weight | BlockQuantWeight", "Tensor | None", "Tensor | None"],
                "Tensor | None"]

ONEDNN_PACK_ROWS_HINT = 16  # oneDNN chooses the blocked layout for this many rows; measured best for 1-64
ONEDNN_LARGE_OUT = 8192  # fp32 weights with this many output rows (LM heads) are packed even for one row
NATIVE_FEW_ROWS = 8  # fp32 (and bf16 where oneDNN runs bf16) products up to this many rows run natively
CPU_SMALL_ROWS = 32  # bf16 products up to this many rows take ``W @ x^T`` (``rule_cpu_shapes``)


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
    On an AVX2-only CPU its bf16 reorder and inner product refuse to build, so bf16 takes ``rule_cpu_shapes``."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return onednn_available() and probe is not None and bool(probe())


def _version_of(t: Tensor) -> int:
    """The in-place update counter; inference tensors have none (and cannot change outside inference
    mode), so they count as never updated."""
    try:
        return t._version
    except RuntimeError:
        return -1


class LinearKernels:
    """One formulation's rules and the state they share (oneDNN's packed weights, the native kernel)."""

    def __init__(self, name: str, rules: Mapping[type, Sequence[Rule]], *, mixed_bf16: bool = False) -> None:
        self.name = name
        self._rules = {kind: tuple(r) for kind, r in rules.items()}
        self.kernel = small_linear_kernel() if mixed_bf16 else None
        self.quant = quant_linear_kernel()  # block-quantized products (None: native kernels off)
        # Whether bf16 (and int8) weights under float32 inputs run natively (at any row count: beyond the
        # kernel's rows on a widened / dequantized copy).
        self.mixed_bf16 = self.kernel is not None
        self.onednn = onednn_available()
        self.onednn_bf16 = self.onednn and onednn_bf16_available()
        self.packed: dict[int, tuple[Tensor, int, Tensor]] = {}  # id(weight) -> (weight, version, packed)

    def rules(self, weight_kind: type) -> tuple[Rule, ...]:
        """The rules a product on this kind of weight tries, first to last."""
        return self._rules.get(weight_kind) or self._rules[Tensor]

    def _product(self, x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None) -> Tensor:
        rules = self._rules.get(type(weight)) or self._rules[Tensor]
        for rule in rules:
            out = rule(self, x, weight, bias, residual)
            if out is not None:
                return out
        raise AssertionError(f"{self.name}: no rule took the product")  # the reference always does

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ weight^T + bias`` for ``x`` ``[T, in]``; returns a contiguous ``[T, out]``."""
        for rule in self._rules.get(type(weight)) or self._rules[Tensor]:
            out = rule(self, x, weight, bias, None)
            if out is not None:
                return out
        raise AssertionError(f"{self.name}: no rule took the product")  # the reference always does

    def linear_add(self, residual: Tensor, x: Tensor, weight: Tensor) -> Tensor:
        """``residual + x @ weight^T`` with the add fused into the product."""
        return self._product(x, weight, None, residual)


# -- rules ---------------------------------------------------------------------------------------------
def rule_reference(k: LinearKernels, x: Tensor, w: Tensor, bias: Tensor | None, res: Tensor | None) -> Tensor:
    """torch's own product: ``F.linear`` / ``addmm``."""
    return F.linear(x, w, bias) if res is None else torch.addmm(res, x, w.t())


def rule_block_quant_reference(k: LinearKernels, x: Tensor, w: BlockQuantWeight, bias: Tensor | None,
                               res: Tensor | None) -> Tensor:
    """gguf-py's dequantization, then one float32 product."""
    return block_quant_linear(x, w, bias, residual=res, native=False)


def rule_block_quant(k: LinearKernels, x: Tensor, w: BlockQuantWeight, bias: Tensor | None,
                     res: Tensor | None) -> Tensor:
    """The native kernels on the blocks (few rows; many rows in slices where they take int8 activations) or
    natively dequantized tiles (many)."""
    return block_quant_linear(x, w, bias, residual=res, native=k.quant is not None, kernel=k.quant)


def rule_block_quant_rows(k: LinearKernels, x: Tensor, w: BlockQuantWeight, bias: Tensor | None,
                          res: Tensor | None) -> Tensor | None:
    """Few float32 rows (a decode's LM head, a draft head's products) straight into the native kernel on the
    blocks, within :func:`block_quant_linear`'s row limits; anything else passes to :func:`rule_block_quant`."""
    q = k.quant
    if q is None or x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu" or not w.qtypes <= q.supported:
        return None
    if not 1 <= x.shape[0] <= min(QUANT_FEW_ROWS_INTERLEAVED if w.all_interleaved else QUANT_FEW_ROWS, q.max_rows):
        return None
    return q(x, w, None if bias is None else bias.contiguous(), None if res is None else res.contiguous())


def rule_int8_reference(k: LinearKernels, x: Tensor, w: Int8Weight, bias: Tensor | None,
                        res: Tensor | None) -> Tensor:
    """The dequantized matrix."""
    return rule_reference(k, x, w.dequantize(x.dtype), bias, res)


def rule_int8_native(k: LinearKernels, x: Tensor, w: Int8Weight, bias: Tensor | None,
                     res: Tensor | None) -> Tensor | None:
    """An int8 weight (a drafter's, under float32 inputs): the kernel for few rows."""
    kern = k.kernel
    if kern is not None and x.dim() == 2 and 1 <= x.shape[0] <= kern.max_rows and x.dtype == torch.float32:
        return kern(x, w.q, None if bias is None else bias.contiguous(), None if res is None else res.contiguous(),
                    scale=w.scale)
    return None


def rule_cpu_shapes(k: LinearKernels, x: Tensor, w: Tensor, bias: Tensor | None,
                    res: Tensor | None) -> Tensor | None:
    """Few rows of low-precision inputs: ``mv`` for one row (17 instead of 22 ms a SmolLM2 step at 2
    threads, bf16), ``W @ x^T`` up to :data:`CPU_SMALL_ROWS` (21.5 instead of 23.5 ms at 16 rows). float32
    passes (MKL's ``x @ W^T`` is at bandwidth for one or two rows)."""
    rows = x.shape[0]
    if x.dtype == torch.float32 or rows > CPU_SMALL_ROWS:
        return None
    if rows == 1:
        if res is not None:
            return torch.addmv(res[0], w, x[0]).unsqueeze(0)
        return (torch.mv(w, x[0]) if bias is None else torch.addmv(bias, w, x[0])).unsqueeze(0)
    if res is not None:
        return torch.addmm(res.t(), w, x.t()).t().contiguous()
    if bias is None:
        return torch.mm(w, x.t()).t().contiguous()
    return torch.addmm(bias.unsqueeze(1), w, x.t()).t().contiguous()


def _packed_for(k: LinearKernels, x: Tensor, w: Tensor) -> Tensor | None:
    """oneDNN's blocked copy of a frozen CPU parameter, packed on first use and cached with the identity
    and version of the tensor it came from, so an in-place update repacks it (never a stale product).
    Trainable or temporary tensors are never packed: the cache holds one copy per model weight."""
    rows = x.shape[0]
    if not k.onednn or rows == 0 or x.device.type != "cpu":
        return None
    if not isinstance(w, nn.Parameter) or w.requires_grad or x.requires_grad:
        return None
    if x.dtype == torch.float32:
        if rows < 3 and w.shape[0] < ONEDNN_LARGE_OUT:
            return None  # MKL's one- and two-row product is already bandwidth-bound
    elif x.dtype == torch.bfloat16:
        if rows == 1 or not k.onednn_bf16:
            return None  # ``mv`` (rule_cpu_shapes) is as fast and keeps the LM head's fast path
    else:
        return None
    version = _version_of(w)
    hit = k.packed.get(id(w))
    if hit is not None and hit[0] is w and hit[1] == version:
        return hit[2]
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), ONEDNN_PACK_ROWS_HINT)
    k.packed[id(w)] = (w, version, packed)
    return packed


def rule_onednn(k: LinearKernels, x: Tensor, w: Tensor, bias: Tensor | None, res: Tensor | None) -> Tensor | None:
    """oneDNN's linear on the packed weight: MKL's fp32 GEMM is far from bandwidth for 3-64 rows (all 30
    SmolLM2 gate/up products: 20.3 / 27.5 / 28.2 ms at 4 / 8 / 16 rows, 14.1 / 16.4 / 19.9 ms packed)."""
    packed = _packed_for(k, x, w)
    if packed is None:
        return None
    if res is None:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise.binary(x.contiguous(), res.contiguous(), packed, None, "add")


def rule_native_rows(k: LinearKernels, x: Tensor, w: Tensor, bias: Tensor | None,
                     res: Tensor | None) -> Tensor | None:
    """``native/small_linear.c`` (each weight streamed once, bf16 converted in registers). Measured on a
    2-core AVX2 EPYC (all 30 SmolLM2 layers): fp32 18 / 21 / 27 ms at 1 / 4 / 8 rows against oneDNN's 35 /
    29 / 33; bf16 12 / 20 / 29 / 46 / 78 ms at 1 / 4 / 8 / 16 / 32 rows against torch's 16 / 60 / 117 / 229
    / 453 (oneDNN has no bf16 on AVX2). So: up to :data:`NATIVE_FEW_ROWS` rows always, bf16 up to the
    kernel's limit where oneDNN lacks bf16, and a bf16 weight under float32 inputs at any count it takes."""
    kern = k.kernel
    if kern is None or x.dim() != 2 or not 1 <= x.shape[0] <= kern.max_rows:
        return None
    if (x.dtype, w.dtype) not in kern.pairs or x.device.type != "cpu" or w.device.type != "cpu":
        return None
    if w.requires_grad or x.requires_grad or not w.is_contiguous():
        return None
    if x.dtype == w.dtype:
        few = x.shape[0] <= NATIVE_FEW_ROWS
        if not (few or (not k.onednn if x.dtype == torch.float32 else not k.onednn_bf16)):
            return None
    if res is None:
        return kern(x, w, bias) if bias is None or bias.is_contiguous() else None
    if res.dtype != x.dtype or res.dim() != 2:
        return None
    return kern(x, w, None, res.contiguous())


def rule_mixed_widened(k: LinearKernels, x: Tensor, w: Tensor, bias: Tensor | None,
                       res: Tensor | None) -> Tensor | None:
    """A bf16 weight under float32 inputs beyond the kernel's rows (a drafter's prefill): a widened copy."""
    if w.dtype == x.dtype:
        return None
    return rule_reference(k, x, w.to(x.dtype), bias, res)


def rule_bf16_widened(k: LinearKernels, x: Tensor, w: Tensor, bias: Tensor | None,
                      res: Tensor | None) -> Tensor | None:
    """Many bf16 rows where oneDNN has no bf16 (AVX2): torch's own bf16 GEMM runs at a fraction of its
    float32 speed there (a 512-token prefill of SmolLM2: 7.4 s), so the product is computed in float32 on
    a widened copy of the weight (one pass over it, ~1 % of such a product) and rounded."""
    if not (x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 and not k.onednn_bf16
            and x.device.type == "cpu" and not (w.requires_grad or x.requires_grad)):
        return None
    if res is None:
        return F.linear(x.float(), w.float(), None if bias is None else bias.float()).to(torch.bfloat16)
    return torch.addmm(res.float(), x.float(), w.float().t()).to(torch.bfloat16)


# -- formulations --------------------------------------------------------------------------------------
def _formulation(name: str, block_quant: Sequence[Rule], int8: Sequence[Rule], plain: Sequence[Rule],
                 mixed_bf16: bool = False) -> Callable[[], LinearKernels]:
    rules = {BlockQuantWeight: tuple(block_quant), Int8Weight: tuple(int8), Tensor: (*plain, rule_reference)}
    rules[nn.Parameter] = rules[Tensor]

    def make() -> LinearKernels:
        return LinearKernels(name, rules, mixed_bf16=mixed_bf16)

    make.__name__ = f"{name}_linear"
    return make


LINEAR_KERNELS: Mapping[str, Callable[[], LinearKernels]] = MappingProxyType({
    # The reference.
    "torch": _formulation("torch", [rule_block_quant_reference], [rule_int8_reference], []),
    # Shape-aware formulations for few rows of low-precision inputs.
    "cpu": _formulation("cpu", [rule_block_quant_rows, rule_block_quant], [rule_int8_reference], [rule_cpu_shapes]),
    # oneDNN's packed weights first.
    "onednn": _formulation("onednn", [rule_block_quant_rows, rule_block_quant], [rule_int8_reference],
                           [rule_onednn, rule_cpu_shapes]),
    # The native few-row kernel first (the CPU default where it builds).
    "native": _formulation(
        "native", [rule_block_quant_rows, rule_block_quant], [rule_int8_native, rule_int8_reference],
        [rule_native_rows, rule_mixed_widened, rule_bf16_widened, rule_onednn, rule_cpu_shapes], mixed_bf16=True,
    ),
})


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
