"""The block-quantized kernels (native/quant.h through native/quant_linear.py) against gguf-py's
``gguf.quants.dequantize`` and a float64 product, for every kernel type, every row count 1-8 (and 16, 64),
and every ISA variant this CPU can run (``portable`` and ``avx2`` on an AVX-512 machine too).

Tolerance: each output is a float32 sum of ``n`` products, accumulated in at most ``n / 8 + 16`` sequential
additions per lane (vector lanes over chunks of 512 inputs, then a horizontal sum), so its rounding error
is at most about ``(n / 8 + 32) * 2**-24 * sum_i |x_i w_i|``: 3.7e-6 of that sum at n = 256 and 9.4e-6 at
n = 1024 (the dequantized weights themselves are the reference's float32 values, up to one rounding of
``d * q + m``, 6e-8 relative). The tests allow ``1.5e-5 * sum_i |x_i w_i|`` (the largest n here is 1024).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem import native
from tandem.model.block_quant import BlockQuantWeight
from tandem.native.quant_linear import quant_linear_kernel
from tests.quant_blocks import KERNEL_TYPES, Q, block_weight, check_product

ISAS = native.runnable_isas()
pytestmark = pytest.mark.skipif(quant_linear_kernel() is None, reason="native kernels unavailable")


_weight = block_weight
_check = check_product


def test_every_isa_variant_is_built_and_reports_itself() -> None:
    seen = {isa: quant_linear_kernel(isa).compiled_isa for isa in ISAS}  # type: ignore[union-attr]
    assert seen["native"] == native.cpu_isa()
    if "portable" in seen:
        assert seen["portable"] == "portable" and seen.get("avx2", "avx2") == "avx2"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda q: q.name)
def test_product_matches_gguf_reference_at_every_row_count(isa: str, qtype: Q) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    inp = 768 if qtype.name.endswith("_K") else 608  # 608 = 512 + 96: a partial chunk
    w = _weight(qtype, 37, inp, seed=int(qtype))  # 37 = 9 tiles of 4 + 1: a partial tile
    ref = w.dequantize()
    assert torch.isfinite(ref).all()
    gen = torch.Generator().manual_seed(int(qtype))
    for rows in (*range(1, 9), 16, 64):
        x = torch.randn(rows, inp, generator=gen)
        _check(kernel(x, w), x, ref)


@pytest.mark.parametrize("isa", ISAS)
def test_rows_lookup_equals_reference_rows(isa: str) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    for qtype in KERNEL_TYPES:
        w = _weight(qtype, 21, 512, seed=3)
        ids = torch.tensor([[4, 0], [20, 4]])
        got = kernel.rows(w, ids)
        assert got.shape == (2, 2, 512)
        torch.testing.assert_close(got, w.dequantize()[ids], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(kernel.row_range(w, 5, 9), w.dequantize()[5:9], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("isa", ISAS)
def test_parts_of_different_types_gain_bias_and_residual(isa: str) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    q, k, v = _weight(Q.Q4_K, 12, 512, 1), _weight(Q.Q8_0, 5, 512, 2), _weight(Q.Q6_K, 7, 512, 3)
    stacked = BlockQuantWeight.stack([q, k, v], "qkv")
    assert stacked.types == ("Q4_K", "Q8_0", "Q6_K") and stacked.shape == (24, 512)
    gain = torch.rand(512) + 0.5
    w = stacked.with_gain(gain)
    ref = torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]) * gain
    torch.testing.assert_close(w.dequantize(), ref)
    gen = torch.Generator().manual_seed(0)
    x, bias, res = torch.randn(3, 512, generator=gen), torch.randn(24, generator=gen), torch.randn(3, 24, generator=gen)
    _check(kernel(x, w), x, ref)
    _check(kernel(x, w, bias, res) - bias - res, x, ref)
    # a strided x (a column slice) is read row by row
    wide = torch.randn(3, 600, generator=gen)
    _check(kernel(wide[:, 40:552], w), wide[:, 40:552], ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_a_row_gives_the_same_bits_alone_and_in_any_batch(isa: str, qtype: Q) -> None:
    """Q4_K and Q6_K: up to four rows run without the dequantized tile on AVX2 (quant.h's kf_gemv), eight with it,
    the same operations in the same order: the same bits."""
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    w = _weight(qtype, 50, 1024, 7)
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(1))
    full = kernel(x, w)
    for r in range(8):
        assert torch.equal(kernel(x[r : r + 1], w), full[r : r + 1])
    assert torch.equal(kernel(x[2:5], w), full[2:5])
    torch.set_num_threads(1)
    try:
        assert torch.equal(kernel(x, w), full)  # and at any thread count
    finally:
        torch.set_num_threads(2)


def test_take_rows_keeps_blocks_and_bad_shapes_name_the_tensor() -> None:
    w = BlockQuantWeight.stack([_weight(Q.Q4_0, 4, 256, 1), _weight(Q.Q5_K, 3, 256, 2)], "m")
    ref = w.dequantize()
    sub = w.take_rows([6, 0, 5, 1, 1])
    assert sub.types == ("Q5_K", "Q4_0", "Q5_K", "Q4_0")
    assert torch.equal(sub.dequantize(), ref[[6, 0, 5, 1, 1]])
    with pytest.raises(ValueError, match="row index"):
        w.take_rows([7])
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight.*Q4_K.*256"):
        BlockQuantWeight.from_raw(np.zeros(144, np.uint8), Q.Q4_K, (1, 96), "blk.0.ffn_up.weight")
    with pytest.raises(ValueError, match=r"x\.weight.*bytes"):
        BlockQuantWeight.from_raw(np.zeros(10, np.uint8), Q.Q8_0, (1, 32), "x.weight")
    with pytest.raises(ValueError, match="float32 activations"):
        kernel = quant_linear_kernel()
        assert kernel is not None
        from tandem.model.block_quant_linear import block_quant_linear

        block_quant_linear(torch.randn(1, 256).bfloat16(), w)
