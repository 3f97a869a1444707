"""The product on interleaved Q4_0 / Q4_1 / Q8_0 rows (native/quant_r16.h, and with int8 activations
native/quant_r16_i8.h) against gguf-py's dequantization and a float64 product, for every row count 1-8 (and
16, 64) and every ISA variant this CPU can run; row lookups; the same bits for a row alone, in a batch and
at any thread count.

Tolerance (as tests/native/test_quant_linear.py): per block four chains of 8 products, two adds, then one
or two FMAs into the output's accumulator per block, so an output of n inputs sees at most n / 32 * 2 + 10
roundings: 74 at n = 1024, 4.4e-6 of ``sum_i |x_i w_i|``; the tests allow 1.5e-5 of it (Q4_1's offset
term m * sum(x) rounds like a product of the same magnitudes).
"""

from __future__ import annotations

import pytest
import torch

from tandem import native
from tandem.native.quant_linear import quant_linear_kernel
from tests.quant_blocks import Q, block_weight, check_product

ISAS = native.runnable_isas()
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]
pytestmark = pytest.mark.skipif(quant_linear_kernel() is None, reason="native kernels unavailable")


_weight = block_weight
_check = check_product


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_interleaved_product_matches_gguf_reference_at_every_row_count(isa: str, qtype: Q) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    w = _weight(qtype, 53, 1024, seed=int(qtype)).with_gain(torch.rand(1024) + 0.5)  # 48 interleaved + 5
    r = w.repacked()
    assert r.layouts == (f"{qtype.name}x16", qtype.name)
    ref = w.dequantize()
    gen = torch.Generator().manual_seed(int(qtype))
    for rows in (*range(1, 9), 16, 64):
        x = torch.randn(rows, 1024, generator=gen)
        _check(kernel(x, r), x, ref)
    bias, res = torch.randn(53, generator=gen), torch.randn(3, 53, generator=gen)
    x = torch.randn(3, 1024, generator=gen)
    _check(kernel(x, r, bias, res) - bias - res, x, ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_row_gives_the_same_bits_alone_in_a_batch_and_at_any_thread_count(isa: str, qtype: Q) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    w = _weight(qtype, 64, 576, 7).repacked()
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(1))
    full = kernel(x, w)
    for r in range(9):
        assert torch.equal(kernel(x[r : r + 1], w), full[r : r + 1])
    assert torch.equal(kernel(x[2:5], w), full[2:5])
    assert torch.equal(kernel(x[1:8], w), full[1:8])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(kernel(x, w), full)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("isa", ISAS)
def test_row_lookups_on_interleaved_parts_equal_the_reference_rows(isa: str) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    for qtype in TYPES:
        w = _weight(qtype, 40, 256, 3)
        r = w.repacked()
        ids = torch.tensor([[39, 0], [17, 33]])
        assert torch.equal(kernel.rows(r, ids), kernel.rows(w, ids))
        torch.testing.assert_close(kernel.rows(r, ids), w.dequantize()[ids], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(kernel.row_range(r, 10, 37), w.dequantize()[10:37], rtol=1e-6, atol=1e-7)


def _activation_bound(x: torch.Tensor, w: torch.Tensor, levels: int) -> torch.Tensor:
    """|error| bound of an int8 product: per 32-input block the inputs err by at most max|x| / 254 (one
    level) or max|x| / 254 / 254 (two: the residual, <= max|x| / 254, quantized again), times sum |w| over
    the block; plus the float32 bound."""
    amax = x.double().abs().reshape(x.shape[0], -1, 32).amax(-1)  # [rows, blocks]
    wsum = w.double().abs().reshape(w.shape[0], -1, 32).sum(-1)  # [out, blocks]
    step = 1 / 254 if levels == 1 else 1 / 254 / 254
    return 1.01 * step * (amax @ wsum.T) + 1.5e-5 * (x.double().abs() @ w.double().abs().T)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activations", ["int8", "int8x2"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_int8_activations_within_their_quantization_bound(isa: str, activations: str, qtype: Q) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    w = _weight(qtype, 48, 576, seed=int(qtype)).with_gain(torch.rand(576) + 0.5)
    r = w.repacked().with_activations(activations)
    ref = w.dequantize()
    gen = torch.Generator().manual_seed(5)
    for rows in (1, 2, 3, 4, 5, 8, 16):
        x = torch.randn(rows, 576, generator=gen)
        err = (kernel(x, r).double() - x.double() @ ref.double().T).abs()
        assert bool((err <= _activation_bound(x, ref, 1 if activations == "int8" else 2)).all())
    x = torch.randn(9, 576, generator=gen)
    full = kernel(x, r)
    assert all(torch.equal(kernel(x[i : i + 1], r), full[i : i + 1]) for i in range(9))  # batch-invariant
    assert torch.equal(kernel(x[3:7], r), full[3:7])
    threads = torch.get_num_threads()  # rows prepared by one thread or split over several: the same bits
    torch.set_num_threads(1)
    try:
        assert torch.equal(kernel(x, r), full)
    finally:
        torch.set_num_threads(threads)


def test_int8x2_is_two_orders_closer_than_int8() -> None:
    kernel = quant_linear_kernel()
    assert kernel is not None
    w = _weight(Q.Q4_1, 64, 1024, seed=9).repacked()
    x = torch.randn(4, 1024, generator=torch.Generator().manual_seed(2))
    ref = x.double() @ w.dequantize().double().T
    err = {a: float((kernel(x, w.with_activations(a)).double() - ref).abs().max()) for a in ("float32", "int8", "int8x2")}
    assert err["int8x2"] * 100 < err["int8"] and err["float32"] < err["int8x2"]
    assert kernel.vnni == ("avx512_vnni" in native._cpu_flags().split() and native.cpu_isa() == "avx512")


@pytest.mark.parametrize("isa", ISAS)
def test_each_variant_says_where_int8_activations_run(isa: str) -> None:
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    want = {"portable": "portable", "avx2": "avx2"}.get(kernel.compiled_isa, "vnni" if kernel.vnni else "portable")
    assert kernel.int8_path == want and kernel.int8_simd == (want != "portable")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_int8_extreme_integers_do_not_saturate(isa: str, qtype: Q) -> None:
    """The AVX2 path sums byte products in 16 bits (vpmaddubsw): the largest weights (Q4: nibble 15; Q8_0: -128
    and 127, -128's magnitude 128 as an unsigned byte) against inputs that all quantize to +-127 give the
    exact product, as every other path does."""
    import numpy as np

    from tandem.model.block_quant import BlockQuantWeight
    from tests.quant_blocks import random_blocks

    raw = random_blocks(qtype, 32, 256, np.random.default_rng(3))
    block, nbytes = {Q.Q4_0: (32, 18), Q.Q4_1: (32, 20), Q.Q8_0: (32, 34)}[qtype]
    blocks = raw.reshape(-1, nbytes)
    head = 4 if qtype == Q.Q4_1 else 2
    if qtype == Q.Q8_0:
        blocks[0::2, head:] = 0x80  # -128 everywhere in even blocks, 127 in odd ones
        blocks[1::2, head:] = 0x7F
    else:
        blocks[:, head:] = 0xFF  # every nibble 15
    w = BlockQuantWeight.from_raw(raw, qtype, (32, 256), f"w.{qtype.name}")
    kernel = quant_linear_kernel(isa)
    assert kernel is not None
    ref = w.dequantize()
    x = torch.ones(4, 256)
    x[1] = -1.0
    x[2, ::2] = -1.0
    x[3] = torch.linspace(-1, 1, 256)
    for act in ("int8", "int8x2"):
        got = kernel(x, w.repacked().with_activations(act))
        err = (got.double() - x.double() @ ref.double().T).abs()
        assert bool((err <= _activation_bound(x, ref, 1 if act == "int8" else 2)).all()), (act, float(err.max()))


@pytest.mark.parametrize("activations", ["float32", "int8x2"])
def test_many_rows_run_in_slices_of_the_kernel_where_activations_are_int8(activations: str) -> None:
    """A prefill-sized product (more rows than the kernel takes at once): with int8 activations on VNNI it runs
    in slices of rows through the same kernel, so every row has the bits it has alone, bias and residual
    included; otherwise dequantized tiles + float32 GEMM (within the reference's tolerance)."""
    from tandem.model.block_quant_linear import QUANT_FEW_ROWS_INTERLEAVED, block_quant_linear, int8_rows

    kernel = quant_linear_kernel()
    assert kernel is not None
    w = _weight(Q.Q4_1, 48, 576, seed=4).repacked().with_activations(activations)
    gen = torch.Generator().manual_seed(6)
    rows = 2 * QUANT_FEW_ROWS_INTERLEAVED + 9
    x, bias, res = torch.randn(rows, 576, generator=gen), torch.randn(48, generator=gen), torch.randn(rows, 48, generator=gen)
    y = block_quant_linear(x, w, bias, residual=res, kernel=kernel)
    assert int8_rows(w, kernel) == (activations == "int8x2" and kernel.vnni)
    if int8_rows(w, kernel):
        for r in (0, 63, 64, 130, rows - 1):
            assert torch.equal(y[r : r + 1], kernel(x[r : r + 1], w, bias, res[r : r + 1].contiguous()))
    _check(y - bias - res, x, w.dequantize())
