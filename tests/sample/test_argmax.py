"""``argmax_last`` is ``argmax(dim=-1)`` bit for bit: ties (the first maximum), NaN (counts as the maximum),
all ``-inf`` rows, ``keepdim``, every float dtype the sampler sees."""

from __future__ import annotations

import pytest
import torch

from tandem.sample.argmax import argmax_last


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_equals_argmax_on_ties_nans_and_infinities(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        x = torch.randint(0, 4, (9, 257), generator=gen).to(dtype)  # many ties
        if trial % 3 == 0:
            x[0, 17] = float("nan")
            x[0, 200] = float("nan")
        if trial % 4 == 0:
            x[1] = float("-inf")
        x[2, -1] = float("inf")
        assert torch.equal(argmax_last(x), x.argmax(dim=-1))
        assert torch.equal(argmax_last(x, keepdim=True), x.argmax(dim=-1, keepdim=True))
    big = torch.randn(32, 49152, generator=gen)
    assert torch.equal(argmax_last(big), big.argmax(dim=-1))
