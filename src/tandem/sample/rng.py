"""Position-keyed randomness for sampling.

Every random draw for a row comes from a fresh ``torch.Generator`` seeded with ``position_key(seed,
position)``: a splitmix64 mix of the request's seed and the index of the output token the row
samples. Nothing else enters the key, so a seeded request produces the same tokens

- whatever other rows share the batch, and in whatever order (each row has its own generator),
- after preemption and recompute (the same output position gets the same key again),
- with async scheduling on or off (the key does not depend on the step number),
- with or without speculative decoding for greedy requests (argmax needs no randomness), and for
  random requests on every step that verifies no draft (see ``rejection.py``: the recovered/bonus
  noise is drawn first, exactly like the plain sampler's noise).

It is reproducible on one device type and torch version: a CUDA generator produces other numbers
than a CPU generator with the same seed. Random requests with drafts follow the same distribution
with or without speculation, but not the same tokens (the acceptance test consumes randomness the
plain sampler does not).

Fixed draw order (part of the reproducibility contract):

- plain sampling, row at output position t: one ``exponential_`` of ``V`` float values from
  ``generator(seed, t)``, then ``argmax(probs / noise)``;
- a verify step whose first verify row samples position t: ``generator(seed, t)`` draws the ``V``
  exponential values for the final (recovered or bonus) token first, then ``K`` uniforms for the
  acceptance tests, where K is the width of the draft tensor (the runner should keep it at
  ``num_speculative_tokens`` so that the uniforms do not depend on the batch).

Generators are cheap host objects (tens of microseconds on CPU); the per-row draw is one small
kernel per random row. Rows without a generator (``None``) share one batched draw from the device's
default generator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tandem.sample.argmax import argmax_last

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele et al. 2014): a bijective 64-bit mixer with good avalanche."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def position_key(seed: int, position: int) -> int:
    """The generator seed for (request seed, output position), in [0, 2**64).

    Mixing the seed before xoring the position keeps nearby seeds and nearby positions from sharing
    streams (a plain ``seed + position`` would make (s, t + 1) and (s + 1, t) identical).
    """
    if position < 0:
        raise ValueError(f"position must be non-negative, got {position}")
    return splitmix64(splitmix64(seed & _MASK64) ^ (position & _MASK64))


def make_generator(key: int, device: torch.device | str) -> torch.Generator:
    """A fresh generator on ``device`` seeded with ``key`` (from :func:`position_key`)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(key)
    return gen


def exponential_noise(
    num_rows: int,
    vocab_size: int,
    generators: Sequence[torch.Generator | None],
    device: torch.device,
) -> torch.Tensor:
    """Exp(1) noise ``[num_rows, vocab_size]`` float32: row i from ``generators[i]`` (one draw of
    ``vocab_size`` values), rows whose generator is None from one batched default-generator draw.

    Clamped away from 0: ``p / 0`` would be inf (or NaN for a masked token with p = 0), and
    ``argmax`` treats NaN as the maximum, which would pick a token of probability zero.
    """
    noise = torch.empty(num_rows, vocab_size, dtype=torch.float32, device=device)
    _fill(noise, generators, _exponential_)
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)


def _exponential_(t: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """``t.exponential_(generator=gen)``, the same numbers, faster on the CPU. There torch's ``exponential_``
    took 0.75-1.3 ms for a 49,152-token vocabulary (torch 2.13), paid by every sampled row; its numbers are
    ``-log1p(-u)`` of float64 uniforms ``u``, and drawing those uniforms as one tensor and transforming them
    vectorized gives the same bits in a third of the time (BENCHMARKS.md §22: sampled decoding 1.12x faster
    at one stream, 1.29x at 32). ``tests/sample/test_rng.py`` checks the equality, so a torch that draws
    differently fails there instead of silently changing seeded outputs."""
    if t.device.type != "cpu":
        return t.exponential_(generator=gen)
    u = torch.empty(t.shape, dtype=torch.float64).uniform_(generator=gen)
    return t.copy_(u.neg_().log1p_().neg_())


def uniform_noise(
    num_rows: int,
    width: int,
    generators: Sequence[torch.Generator | None],
    device: torch.device,
) -> torch.Tensor:
    """U[0, 1) noise ``[num_rows, width]`` float32, drawn like :func:`exponential_noise`."""
    noise = torch.empty(num_rows, width, dtype=torch.float32, device=device)
    if width > 0:
        _fill(noise, generators, lambda t, g: t.uniform_(generator=g))
    return noise


def race_sample(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Exponential race: ``argmax(probs / E)`` with E ~ Exp(1) i.i.d. picks token j with probability
    ``probs_j / sum(probs)`` (E_j / p_j is Exp(rate p_j); the smallest of them wins). Unnormalised
    ``probs`` are fine; zero entries never win."""
    return argmax_last(probs / noise)


_Draw = Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]


def _fill(noise: torch.Tensor, generators: Sequence[torch.Generator | None], draw: _Draw) -> None:
    if len(generators) != noise.shape[0]:
        raise ValueError(f"generators: expected {noise.shape[0]} entries, got {len(generators)}")
    if any(gen is None for gen in generators):
        # One batched draw for all rows (no host index tensor to copy); seeded rows overwrite it.
        draw(noise, None)
    for i, gen in enumerate(generators):
        if gen is not None:
            draw(noise[i], gen)
