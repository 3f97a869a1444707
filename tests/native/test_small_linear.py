"""The few-row product with a bf16 or int8 weight under float32 inputs (a draft head's matrices): equal to the
float32 product over the widened (dequantized) weight, at every row count the kernel takes, with bias and
residual; and the ``native`` linear kernels on such a weight beyond the kernel's rows (a widened copy). The same-dtype products
are checked in tests/model/test_native_decode.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem.model.linear import create_linear_kernels
from tandem.model.quant import Int8Weight
from tandem.native.small_linear import small_linear_kernel

kernel = small_linear_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="native kernels unavailable")


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 64])
@pytest.mark.parametrize("shape", [(96, 64), (40, 24)])  # vectorised and portable inner sizes
def test_bf16_weight_under_float32_inputs(rows: int, shape: tuple[int, int]) -> None:
    assert kernel is not None
    gen = torch.Generator().manual_seed(rows)
    out, inp = shape
    w = torch.randn(out, inp, generator=gen).to(torch.bfloat16)
    x, bias, res = torch.randn(rows, inp, generator=gen), torch.randn(out, generator=gen), torch.randn(rows, out, generator=gen)
    ref = F.linear(x, w.float())
    torch.testing.assert_close(kernel(x, w), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel(x, w, bias), ref + bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel(x, w, None, res), ref + res, rtol=1e-5, atol=1e-5)
    assert kernel(x, w).dtype == torch.float32


def test_mixed_dtypes_the_kernel_refuses() -> None:
    assert kernel is not None
    with pytest.raises(ValueError, match="small linear"):
        kernel(torch.randn(2, 16).bfloat16(), torch.randn(8, 16))  # a float32 weight under bf16 inputs
    with pytest.raises(ValueError, match="small linear"):
        kernel(torch.randn(2, 16), torch.randn(8, 16).half())


def test_native_linear_takes_a_bf16_weight_at_any_row_count() -> None:
    lin = create_linear_kernels("native")
    assert lin.mixed_bf16
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(48, 32, generator=gen).to(torch.bfloat16), requires_grad=False)
    for rows in (1, 7, 64, 65, 150):  # the kernel up to its limit, a widened copy beyond
        x, res = torch.randn(rows, 32, generator=gen), torch.randn(rows, 48, generator=gen)
        torch.testing.assert_close(lin.linear(x, w), F.linear(x, w.float()), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lin.linear_add(res, x, w), res + F.linear(x, w.float()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, 64])
@pytest.mark.parametrize("shape", [(96, 64), (40, 24), (30, 48)])  # vectorised, portable, odd feature count
def test_int8_weight_under_float32_inputs(rows: int, shape: tuple[int, int]) -> None:
    """The sum over q in float32 times each feature's scale: the float32 product over the dequantized
    matrix up to rounding, at every row group the AVX2 tiles take (4 at a time, then 1-3)."""
    assert kernel is not None
    gen = torch.Generator().manual_seed(100 + rows)
    out, inp = shape
    w = Int8Weight.quantize(torch.randn(out, inp, generator=gen) * torch.rand(out, 1, generator=gen))
    x, bias, res = torch.randn(rows, inp, generator=gen), torch.randn(out, generator=gen), torch.randn(rows, out, generator=gen)
    ref = F.linear(x, w.dequantize())
    torch.testing.assert_close(kernel(x, w.q, scale=w.scale), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel(x, w.q, bias, scale=w.scale), ref + bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel(x, w.q, None, res, scale=w.scale), ref + res, rtol=1e-5, atol=1e-5)


def test_int8_quantization_and_its_checks() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(6, 32, generator=gen)
    w[2] = 0.0  # an all-zero row: scale 1, q 0
    q = Int8Weight.quantize(w)
    assert q.q.dtype == torch.int8 and int(q.q.abs().max()) == 127 and q.scale[2] == 1 and not q.q[2].any()
    assert ((q.dequantize() - w).abs() <= q.scale.unsqueeze(1) / 2 + 1e-7).all()
    assert kernel is not None
    with pytest.raises(ValueError, match="needs its scale"):
        kernel(torch.randn(2, 32), q.q)
    with pytest.raises(ValueError, match="needs its scale"):
        kernel(torch.randn(2, 32), torch.randn(6, 32), scale=q.scale)
    with pytest.raises(ValueError, match="scale"):
        kernel(torch.randn(2, 32), q.q, scale=q.scale[:5])
    with pytest.raises(ValueError, match="small linear"):
        kernel(torch.randn(2, 32).bfloat16(), q.q, scale=q.scale)  # int8 only under float32 inputs
    with pytest.raises(ValueError, match="int8"):
        Int8Weight(q.q.float(), q.scale)


def test_native_linear_takes_an_int8_weight_at_any_row_count() -> None:
    lin = create_linear_kernels("native")
    gen = torch.Generator().manual_seed(2)
    w = Int8Weight.quantize(torch.randn(48, 32, generator=gen))
    for rows in (1, 4, 64, 65, 150):  # the kernel up to its limit, a dequantized copy beyond
        x, res = torch.randn(rows, 32, generator=gen), torch.randn(rows, 48, generator=gen)
        ref = F.linear(x, w.dequantize())
        torch.testing.assert_close(lin.linear(x, w), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lin.linear_add(res, x, w), res + ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(30, 1024), (31, 1536), (8, 1032)])  # 3-feature tiles, and a remainder
def test_four_float32_rows_of_many_inputs(shape: tuple[int, int]) -> None:
    """Four float32 rows of 1024+ inputs take three-feature tiles (gemv.h tile_width)."""
    assert kernel is not None
    gen = torch.Generator().manual_seed(shape[0])
    w = torch.randn(*shape, generator=gen)
    x, res = torch.randn(4, shape[1], generator=gen), torch.randn(4, shape[0], generator=gen)
    torch.testing.assert_close(kernel(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(kernel(x, w, None, res), res + F.linear(x, w), rtol=1e-5, atol=1e-4)
