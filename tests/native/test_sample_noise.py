"""The native sampling noise (``native/sample_noise.c``) against its reference (``rng.stream_noise_reference``): every
ISA variant this CPU runs and any thread count the same bits, within an ulp of the reference; its moments those of
Exp(1)."""

from __future__ import annotations

import shutil

import pytest
import torch

from tandem import native
from tandem.native.sample_noise import SampleNoiseKernel
from tandem.sample.rng import stream_noise_reference

needs_cc = pytest.mark.skipif(native._compiler() is None and shutil.which("gcc") is None, reason="no C compiler")


def _kernel(isa: str) -> SampleNoiseKernel:
    lib = native.load("sample_noise", isa)
    assert lib is not None
    return SampleNoiseKernel(lib)


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("key", [0, 1, 0x9E3779B97F4A7C15, (1 << 64) - 1])
def test_every_variant_draws_the_reference_numbers(isa: str, key: int) -> None:
    # Rows of 5,000: two of the kernel's 4,096-element tasks, the second ragged; each row its key and offset.
    kernel = _kernel(isa)
    keys, offsets = [key, key ^ 1, key], [0, 17, 5000]
    out = kernel(torch.empty(3, 5000), keys, offsets, num_threads=1)
    for r in range(3):
        assert torch.allclose(out[r].double(), stream_noise_reference(keys[r], offsets[r], 5000), rtol=5e-7, atol=0.0)
    assert float(out.min()) > 0.0 and float(out.max()) <= 16.7  # u in (0, 1): E in (0, 24 log 2]
    u = kernel(torch.empty(3, 5000), keys, offsets, uniform=True, num_threads=1)
    assert torch.equal(u[0].double(), stream_noise_reference(key, 0, 5000, uniform=True))  # exact in float32
    for threads in (2, 3):  # which thread computes an element changes nothing
        assert torch.equal(kernel(torch.empty(3, 5000), keys, offsets, num_threads=threads), out)
    same = _kernel("native")(torch.empty(3, 5000), keys, offsets)
    assert torch.equal(same, out)  # every ISA variant the same bits


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
def test_the_noise_has_exp1_moments(isa: str) -> None:
    """Mean 1 and variance 1 over a million draws (standard errors 0.001 and 0.003: the bounds are > 5 of
    them), P(E > 3) = e^-3 and no two neighbouring keys' streams alike (each bound at least 5 standard errors)."""
    kernel = _kernel(isa)
    out = kernel(torch.empty(20, 50_000), [42 + r for r in range(20)], [0] * 20)
    assert abs(float(out.mean()) - 1.0) < 0.006
    assert abs(float(out.var()) - 1.0) < 0.05
    assert abs(float((out > 3).float().mean()) - 0.049787) < 0.0015
    other = kernel(torch.empty(20, 50_000), [43 + r for r in range(20)], [0] * 20)
    assert abs(float(torch.corrcoef(torch.stack([out.flatten(), other.flatten()]))[0, 1])) < 0.005


@needs_cc
def test_bad_arguments_are_refused() -> None:
    kernel = _kernel("native")
    with pytest.raises(ValueError, match="contiguous 2-d float32"):
        kernel(torch.empty(2, 8, dtype=torch.float64), [1, 2], [0, 0])
    with pytest.raises(ValueError, match="contiguous 2-d float32"):
        kernel(torch.empty(8, 2).t(), [1, 2], [0, 0])
    with pytest.raises(ValueError, match="key -1"):
        kernel(torch.empty(2, 8), [1, -1], [0, 0])
    with pytest.raises(ValueError, match="1 keys and 2 offsets for 2 rows"):
        kernel(torch.empty(2, 8), [1], [0, 0])
    with pytest.raises(ValueError, match="negative offset"):
        kernel(torch.empty(2, 8), [1, 2], [0, -3])
