"""The few-row product with a bf16 weight under float32 inputs (a draft head's matrices): equal to the
float32 product over the widened weight, at every row count the kernel takes, with bias and residual; and
:class:`NativeLinear` on such a weight beyond the kernel's rows (a widened copy). The same-dtype products
are checked in tests/model/test_native_decode.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem.model.linear import NativeLinear
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
    lin = NativeLinear()
    assert lin.mixed_bf16
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(48, 32, generator=gen).to(torch.bfloat16), requires_grad=False)
    for rows in (1, 7, 64, 65, 150):  # the kernel up to its limit, a widened copy beyond
        x, res = torch.randn(rows, 32, generator=gen), torch.randn(rows, 48, generator=gen)
        torch.testing.assert_close(lin.linear(x, w), F.linear(x, w.float()), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lin.linear_add(res, x, w), res + F.linear(x, w.float()), rtol=1e-5, atol=1e-5)
