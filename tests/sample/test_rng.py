"""The sampler's random draws (sample/rng.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from tandem.native.sample_noise import sample_noise_kernel
from tandem.sample import rng
from tandem.sample.rng import (
    RowStream,
    exponential_noise,
    make_generator,
    make_row_rng,
    position_key,
    stream_noise_reference,
    uniform_noise,
)

needs_kernel = pytest.mark.skipif(sample_noise_kernel() is None, reason="no native sample noise kernel")


@contextlib.contextmanager
def _noise_from(source: str) -> Iterator[None]:
    """This process's unseeded noise from ``source`` for the block (as a worker configured with it)."""
    before = dict(rng._configured)
    rng.configure_noise(source)
    try:
        yield
    finally:
        rng._configured.clear()
        rng._configured.update(before)


def test_the_fast_exponential_draw_equals_torch_exponential_bit_for_bit() -> None:
    # Seeded rows (a generator each) and unseeded ones (one batched draw from the default generator): the
    # vectorized draw must give exactly torch's exponential_ numbers, or seeded outputs would change.
    vocab = 49_152
    for seed in range(8):
        key = position_key(seed, 3 * seed)
        mine = exponential_noise(1, vocab, [make_generator(key, "cpu")], torch.device("cpu"))
        theirs = torch.empty(1, vocab).exponential_(generator=make_generator(key, "cpu"))
        assert torch.equal(mine, theirs.clamp_min_(torch.finfo(torch.float32).tiny))
    with _noise_from("torch"):
        torch.manual_seed(11)
        mine = exponential_noise(3, vocab, [None, None, None], torch.device("cpu"))
    torch.manual_seed(11)
    theirs = torch.empty(3, vocab).exponential_()
    assert torch.equal(mine, theirs.clamp_min_(torch.finfo(torch.float32).tiny))
    assert mine.dtype == torch.float32 and bool((mine > 0).all())


@needs_kernel
def test_rows_draw_their_native_streams_in_the_generators_order() -> None:
    """On the CPU with the native kernels a row's source is the stream at its key: the exponentials are elements
    0 .. V - 1 and the uniforms drawn after them the next K (a generator's order), within an ulp of the float64
    reference; the same key gives the same numbers whatever row it sits in, a generator row keeps torch's numbers
    bit for bit, and unseeded rows take streams at keys from the default generator (``manual_seed`` fixes
    them)."""
    cpu = torch.device("cpu")
    assert rng.noise_source("cpu") == "native" and rng.noise_source("meta") == "torch"
    vocab, k = 257, 3
    key_a, key_b = position_key(3, 4), position_key(3, 5)
    assert isinstance(make_row_rng(key_a, cpu), RowStream)
    with _noise_from("torch"):
        assert isinstance(make_row_rng(key_a, cpu), torch.Generator)
    rows = [make_row_rng(key_a, cpu), make_generator(key_b, "cpu"), make_row_rng(key_b, cpu)]
    noise = exponential_noise(3, vocab, rows, cpu)
    u = uniform_noise(3, k, rows, cpu)
    assert torch.allclose(noise[0].double(), stream_noise_reference(key_a, 0, vocab), rtol=5e-7, atol=0.0)
    assert torch.allclose(u[0].double(), stream_noise_reference(key_a, vocab, k, uniform=True), rtol=1e-7, atol=0.0)
    assert torch.allclose(noise[2].double(), stream_noise_reference(key_b, 0, vocab), rtol=5e-7, atol=0.0)
    gen = make_generator(key_b, "cpu")
    assert torch.equal(noise[1], torch.empty(vocab).exponential_(generator=gen).clamp_min_(1.1754944e-38))
    assert torch.equal(u[1], torch.empty(k).uniform_(generator=gen))
    alone = exponential_noise(1, vocab, [make_row_rng(key_b, cpu)], cpu)
    assert torch.equal(alone[0], noise[2])  # the batch does not matter
    torch.manual_seed(5)
    first = exponential_noise(2, vocab, [None, make_row_rng(key_a, cpu)], cpu)
    torch.manual_seed(5)
    key = int(torch.empty(1, dtype=torch.int64).random_()[0])
    assert torch.allclose(first[0].double(), stream_noise_reference(key, 0, vocab), rtol=5e-7, atol=0.0)
    assert torch.equal(first[1], noise[0])
    assert not torch.equal(first[0], exponential_noise(1, vocab, [None], cpu)[0])  # the default generator moved on
    with pytest.raises(ValueError, match="noise source 'gpu'"):
        rng.configure_noise("gpu")


@needs_kernel
def test_the_native_stream_races_to_the_target_distribution() -> None:
    """The exponential race over the native noise picks token j with probability p_j: 200,000 draws of a
    seven-token distribution (a tiny, a zero and a dominant entry), a chi-square test at a 1e-6 false-alarm
    rate (critical value 35.9 for 5 degrees of freedom; the zero entry must never win)."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.0, 0.049, 0.001])
    torch.manual_seed(0)
    counts = torch.zeros(len(p))
    for _ in range(20):
        noise = exponential_noise(10_000, len(p), [None] * 10_000, torch.device("cpu"))  # streams, unseeded
        counts += torch.bincount(rng.race_sample(p.expand(10_000, -1), noise), minlength=len(p)).float()
    assert counts[4] == 0
    expected = p * counts.sum()
    keep = p > 0
    chi2 = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    assert chi2 < 35.9, (chi2, counts.tolist())
