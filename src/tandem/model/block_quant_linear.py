"""Matrix products on block-quantized weights (:class:`~tandem.model.block_quant.BlockQuantWeight`), used
by every linear formulation in linear.py, and the kernel plan ``tandem config`` shows for them.

Few rows (a decode, a verify, a draft head) run the native kernels on the blocks (``native/quant.h``). Many
rows (a prefill chunk) run in slices of rows through the same kernel where it multiplies int8 activations
with VNNI (:func:`int8_rows`); elsewhere they multiply tiles of rows dequantized natively into float32 with
torch's GEMM, one tile at a time, so the weights are never resident in float32. The reference is gguf-py's
dequantization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem.model.block_quant import BlockQuantWeight
from tandem.model.block_repack import REPACK_TYPES
from tandem.native import quant_linear as _quant_linear  # the module: it imports this package (a cycle)

QUANT_FEW_ROWS = 16  # up to this many rows a block-quantized product runs in the native kernel
# ... and up to this many when every part is interleaved (block_repack): at 24-64 rows the interleaved int8
# product was 2.5-4x faster than dequantized tiles + GEMM (SmolLM2's gate_up / down, 2 threads), and a row
# keeps its bits in any batch up to it (a verify of 8 requests x 4 rows is one such batch)
QUANT_FEW_ROWS_INTERLEAVED = 64
INTERLEAVED_TYPES = frozenset(t.name for t in REPACK_TYPES)
QUANT_TILE_FLOATS = 1 << 22  # float32 elements of one dequantized tile of a many-row product (16 MB)


def block_quant_linear(
    x: torch.Tensor,
    weight: BlockQuantWeight,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    native: bool = True,
    kernel: _quant_linear.QuantLinearKernel | None = None,
) -> torch.Tensor:
    """``(residual +) (x * gain) @ W^T (+ bias)`` for a block-quantized ``W`` and float32 ``x``.

    ``native`` False: the reference (gguf-py's dequantization, one float32 product). Else the native kernel
    for up to :data:`QUANT_FEW_ROWS` rows (:data:`QUANT_FEW_ROWS_INTERLEAVED` on interleaved parts), and for
    more rows that kernel in slices of rows where it takes int8 activations with VNNI (:func:`int8_rows`), or
    tiles of ``W``'s rows dequantized natively into float32 and multiplied by torch's GEMM (the weights are
    never resident in float32); without a compiler the reference. ``kernel``: the native kernels the caller
    resolved once (else looked up)."""
    if x.dtype != torch.float32:
        raise ValueError(f"block-quantized weight {weight.name!r}: float32 activations, got {x.dtype}")
    if kernel is None and native:
        kernel = _quant_linear.quant_linear_kernel()
    if kernel is not None and weight.qtypes <= kernel.supported and x.device.type == "cpu":
        few = QUANT_FEW_ROWS_INTERLEAVED if weight.all_interleaved else QUANT_FEW_ROWS
        if x.dim() == 2 and 1 <= x.shape[0] <= min(few, kernel.max_rows):
            res = None if residual is None else residual.contiguous()
            return kernel(x, weight, None if bias is None else bias.contiguous(), res)
        if x.dim() == 2 and int8_rows(weight, kernel):  # slices of rows through the same kernel
            return _in_slices(x, weight, bias, residual, kernel, min(few, kernel.max_rows))
        xg = x if weight.gain is None else x * weight.gain
        out_features, inp = weight.shape
        step = max(64, QUANT_TILE_FLOATS // inp)
        if step >= out_features:  # one tile: the product (and the residual add) straight into the result
            w = kernel.row_range(weight, 0, out_features)
            if residual is not None and x.dim() == 2:
                y = torch.addmm(residual, xg, w.t()) if bias is None else torch.addmm(residual + bias, xg, w.t())
                return y
            y = F.linear(xg, w, bias)
            return y if residual is None else y.add_(residual)
        y = torch.empty(*x.shape[:-1], out_features, dtype=torch.float32)
        for start in range(0, out_features, step):
            stop = min(start + step, out_features)
            tile = kernel.row_range(weight, start, stop)
            y[..., start:stop] = F.linear(xg, tile, None if bias is None else bias[start:stop])
    else:
        y = F.linear(x, weight.dequantize(torch.float32), bias)
    return y if residual is None else y.add_(residual)


def int8_rows(weight: BlockQuantWeight, kernel: _quant_linear.QuantLinearKernel) -> bool:
    """Whether a many-row product of ``weight`` runs in slices of rows through the few-row kernel: where every
    part is interleaved and multiplies int8 activations with VNNI (one or two levels). There the integer dot
    products take ~2x the multiply-adds of float32 FMAs an instruction, so a prefill chunk's products beat
    dequantized tiles + torch's float32 GEMM (BENCHMARKS.md §13), and every row has the bits it would have
    alone (a prompt's rows equal the same tokens decoded one by one). Not on AVX2's int8 path (vpmaddubsw:
    1.4-1.9x float32's few-row products, not 2x): 1,024 rows' products in its slices only match the tiles
    (46.7 against 47.9 ms over three of the model's shapes; before its sums were kept in registers a whole
    1,024-token prefill ran 310-350 tokens/s in slices against 490-510: BENCHMARKS.md §24), so there a prompt's
    products are float32 GEMMs as without int8 activations."""
    return weight.all_interleaved and sliced_activations(weight.activations, kernel)


def sliced_activations(activations: str, kernel: _quant_linear.QuantLinearKernel | None) -> bool:
    """:func:`int8_rows` for interleaved parts multiplying ``activations``, as the engine's plan knows it before
    any weight is loaded."""
    return activations != "float32" and kernel is not None and kernel.vnni


def _in_slices(x: torch.Tensor, weight: BlockQuantWeight, bias: torch.Tensor | None,
               residual: torch.Tensor | None, kernel: _quant_linear.QuantLinearKernel, rows: int) -> torch.Tensor:
    """``(residual +) x @ W^T (+ bias)`` ``rows`` rows at a time through the few-row kernel."""
    x = x.contiguous()
    b = None if bias is None else bias.contiguous()
    r = None if residual is None else residual.contiguous()
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    for start in range(0, x.shape[0], rows):
        stop = min(start + rows, x.shape[0])
        kernel(x[start:stop], weight, b, None if r is None else r[start:stop], out_t=y[start:stop])
    return y


def block_quant_plan(types: list[str], activations: str = "float32") -> dict[str, object]:
    """What runs a block-quantized product of each stored type, by row count, on this machine: the one
    place that maps (format, rows, ISA) to a kernel (shown by ``tandem config``)."""
    from tandem import native

    kernel = _quant_linear.quant_linear_kernel()
    isa = native.default_isa()
    compiled = kernel.compiled_isa if kernel is not None else None
    plan: dict[str, object] = {"isa": isa, "compiled": compiled, "activations": activations}
    from tandem.model.native_decode import planned_rows  # (it imports this module)

    stack = planned_rows(types, activations)
    how = {"vnni": "VNNI", "avx2": "AVX2 vpmaddubsw"}.get(kernel.int8_path if kernel else "", "portable C")
    for t in types:
        if kernel is None:
            plan[t] = {"any rows": "torch: gguf-py dequantization + float32 GEMM (no native kernels)"}
            continue
        if t == "Q5_0":  # BlockQuantWeight.repacked: exactly the same weights, 34 bytes a block
            plan[t] = {"at load": "widened to Q8_0 (exact), whole groups of 16 rows; then as Q8_0"}
            continue
        if t not in INTERLEAVED_TYPES:
            few = "dequantize to L1 + float32 FMA"
        elif activations == "float32":
            few = "interleaved 16 rows at a time (block_repack), mask + convert + float32 FMA"
        else:
            few = f"interleaved 16 rows at a time (block_repack), {activations} activations, int8 dot products ({how})"
        n = QUANT_FEW_ROWS_INTERLEAVED if t in INTERLEAVED_TYPES else QUANT_FEW_ROWS
        plan[t] = {f"1-{n} rows": f"native quant.h ({compiled}): {few}"}
        if stack:
            plan[t][f"1-{stack} rows, whole stack"] = f"native decode_forward ({compiled}) on the same kernel"
        if t in INTERLEAVED_TYPES and sliced_activations(activations, kernel):
            plan[t][f">{n} rows"] = f"native quant.h in slices of {n} rows (the same kernel, VNNI)"
        else:
            plan[t][f">{n} rows"] = "native dequantized tiles of rows + torch float32 GEMM"
    return plan

