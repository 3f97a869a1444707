"""Position-keyed randomness for sampling.

Every random draw for a row comes from a fresh source keyed by ``position_key(seed, position)``: a
splitmix64 mix of the request's seed and the index of the output token the row samples. Nothing else
enters the key, so a seeded request produces the same tokens

- whatever other rows share the batch, and in whatever order (each row has its own source),
- after preemption and recompute (the same output position gets the same key again),
- with async scheduling on or off (the key does not depend on the step number),
- with or without speculative decoding for greedy requests (argmax needs no randomness), and for
  random requests on every step that verifies no draft (see ``rejection.py``: the recovered/bonus
  noise is drawn first, exactly like the plain sampler's noise).

A row's source (:func:`make_row_rng`) is, per the engine's resolved ``sampling_noise``
(``ExecutionPlan``, shown by ``tandem config``):

- ``native`` (the CPU with the native kernels, the default there): a :class:`RowStream`, the counter-based
  stream of ``native/sample_noise.c`` at the key — every ISA variant the same bits, ~0.04 ms for a row's
  49,152 exponentials where torch's generator takes ~0.25 ms (BENCHMARKS.md §22); its reference is
  :func:`stream_noise_reference`;
- ``torch`` (other devices, native kernels off): a ``torch.Generator`` seeded with the key (tens of
  microseconds to make on the CPU); its exponentials are torch's ``exponential_`` numbers (on the CPU drawn
  as float64 uniforms and transformed vectorized: the same bits in a third of the time).

Outputs are reproducible under one source, device type and torch version: the two sources draw other
numbers for the same key, as a CUDA generator does from a CPU one. Random requests with drafts follow the
same distribution with or without speculation, but not the same tokens (the acceptance test consumes
randomness the plain sampler does not).

Fixed draw order (part of the reproducibility contract):

- plain sampling, row at output position t: ``V`` exponentials from ``source(seed, t)``, then
  ``argmax(probs / noise)``;
- a verify step whose first verify row samples position t: ``source(seed, t)`` draws the ``V``
  exponential values for the final (recovered or bonus) token first, then ``K`` uniforms for the
  acceptance tests, where K is the width of the draft tensor (the runner should keep it at
  ``num_speculative_tokens`` so that the uniforms do not depend on the batch). A :class:`RowStream` hands
  out its elements in that order as a generator does (the uniforms are elements ``V`` .. ``V + K - 1``).

Rows without a source (``None``: greedy rows, and callers that want unseeded noise) share one batched draw:
natively, streams at keys drawn from torch's default generator (so ``torch.manual_seed`` still fixes them);
else one draw from the device's default generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from tandem import overrides
from tandem.native.sample_noise import sample_noise_kernel
from tandem.sample.argmax import argmax_last

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment
NOISE_SOURCES = ("native", "torch")
_configured: dict[str, str] = {}  # set by configure_noise in a worker: the engine's resolved choice


def splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele et al. 2014): a bijective 64-bit mixer with good avalanche."""
    z = (x + _GOLDEN) & _MASK64
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


class RowStream:
    """A row's randomness on the native path: the counter-based stream at ``key`` (native/sample_noise.c), read
    from ``offset`` on; each draw moves the offset past what it took, as a generator's state moves."""

    __slots__ = ("key", "offset")

    def __init__(self, key: int) -> None:
        self.key, self.offset = key, 0


RowRng = torch.Generator | RowStream


def configure_noise(source: str) -> None:
    """Fix this process's noise source to the engine's resolved one (``ExecutionPlan.sampling_noise``; a worker,
    before it samples)."""
    if source not in NOISE_SOURCES:
        raise ValueError(f"sampling noise source {source!r}; one of {NOISE_SOURCES}")
    _configured["noise"] = source


def noise_source(device: torch.device | str) -> str:
    """Where sampled rows' random numbers come from on ``device``: ``"native"`` (the CPU, native kernels on and the
    noise kernel built) or ``"torch"`` (generators) — as configured in a worker, else by default, or
    ``TANDEM_SAMPLING_NOISE=torch`` asks for generators (``native``: the default where it can run)."""
    asked = _configured.get("noise")
    if asked is None:
        asked = overrides.sampling_noise()
        if asked is not None and asked not in NOISE_SOURCES:
            raise ValueError(f"TANDEM_SAMPLING_NOISE={asked!r}; one of {NOISE_SOURCES}")
    if torch.device(device).type != "cpu" or asked == "torch":
        return "torch"
    return "native" if sample_noise_kernel() is not None else "torch"


def make_row_rng(key: int, device: torch.device | str, native: bool | None = None) -> RowRng:
    """A fresh source for a row keyed ``key`` on ``device``: a :class:`RowStream` where the noise source is native
    (``native``: that answer, when the caller has it), else a seeded generator."""
    if native is None:
        native = noise_source(device) == "native"
    return RowStream(key) if native else make_generator(key, device)


def exponential_noise(
    num_rows: int,
    vocab_size: int,
    generators: Sequence[RowRng | None],
    device: torch.device,
) -> torch.Tensor:
    """Exp(1) noise ``[num_rows, vocab_size]`` float32: row i from ``generators[i]`` (``vocab_size`` values), rows
    whose source is None from one batched draw.

    Clamped away from 0: ``p / 0`` would be inf (or NaN for a masked token with p = 0), and
    ``argmax`` treats NaN as the maximum, which would pick a token of probability zero.
    """
    noise = torch.empty(num_rows, vocab_size, dtype=torch.float32, device=device)
    _fill(noise, generators, _exponential_, uniform=False)
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)


def uniform_noise(
    num_rows: int,
    width: int,
    generators: Sequence[RowRng | None],
    device: torch.device,
) -> torch.Tensor:
    """U[0, 1) noise ``[num_rows, width]`` float32, drawn like :func:`exponential_noise` (a stream's uniforms lie in
    (0, 1))."""
    noise = torch.empty(num_rows, width, dtype=torch.float32, device=device)
    if width > 0:
        _fill(noise, generators, lambda t, g: t.uniform_(generator=g), uniform=True)
    return noise


def stream_noise_reference(key: int, offset: int, count: int, uniform: bool = False) -> torch.Tensor:
    """Elements ``offset`` .. ``offset + count - 1`` of the stream at ``key`` in float64, from Python integers: element
    n is ``u = (2 k + 1) / 2**24`` with ``k`` the top 23 bits of ``splitmix64(key + n * golden)`` (the splitmix64
    stream at ``key``), as ``-log(u)`` or (``uniform``) ``u``. What ``native/sample_noise.c`` computes in float32;
    slow (a Python loop), for tests."""
    out = []
    for n in range(offset, offset + count):
        u = (2 * (splitmix64((key + n * _GOLDEN) & _MASK64) >> 41) + 1) / 2**24
        out.append(u if uniform else -math.log(u))
    return torch.tensor(out, dtype=torch.float64)


def _exponential_(t: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """``t.exponential_(generator=gen)``, the same numbers, faster on the CPU. There torch's ``exponential_``
    took 0.75-1.3 ms for a 49,152-token vocabulary (torch 2.13); its numbers are ``-log1p(-u)`` of float64
    uniforms ``u``, and drawing those uniforms as one tensor and transforming them vectorized gives the same bits
    in a third of the time (BENCHMARKS.md §22). ``tests/sample/test_rng.py`` checks the equality, so a torch
    that draws differently fails there instead of silently changing seeded outputs."""
    if t.device.type != "cpu":
        return t.exponential_(generator=gen)
    u = torch.empty(t.shape, dtype=torch.float64).uniform_(generator=gen)
    return t.copy_(u.neg_().log1p_().neg_())


def race_sample(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Exponential race: ``argmax(probs / E)`` with E ~ Exp(1) i.i.d. picks token j with probability
    ``probs_j / sum(probs)`` (E_j / p_j is Exp(rate p_j); the smallest of them wins). Unnormalised
    ``probs`` are fine; zero entries never win."""
    return argmax_last(probs / noise)


_Draw = Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]


def _fill(noise: torch.Tensor, generators: Sequence[RowRng | None], draw: _Draw, uniform: bool) -> None:
    rows, cols = noise.shape
    if len(generators) != rows:
        raise ValueError(f"generators: expected {rows} entries, got {len(generators)}")
    unseeded = [i for i, g in enumerate(generators) if g is None]
    native = any(isinstance(g, RowStream) for g in generators) or (unseeded and noise_source(noise.device) == "native")
    kernel = sample_noise_kernel() if native else None
    if kernel is not None and not kernel.takes(noise):
        kernel = None
    if unseeded and kernel is None:
        draw(noise, None)  # one batched draw for all rows (no host index to copy); the others overwrite theirs
    streams: list[tuple[int, RowStream]] = [(i, g) for i, g in enumerate(generators) if isinstance(g, RowStream)]
    if unseeded and kernel is not None:  # streams at keys from the default generator (manual_seed fixes them)
        keys = torch.empty(len(unseeded), dtype=torch.int64).random_().tolist()
        streams += [(i, RowStream(k)) for i, k in zip(unseeded, keys)]
    if streams:
        if kernel is None:
            raise ValueError(f"a native row stream for noise on {noise.device} without the native sample noise "
                             "kernel (make_row_rng chooses by noise_source)")
        whole = len(streams) == rows and all(i == j for j, (i, _) in enumerate(streams))
        out = noise if whole else torch.empty(len(streams), cols, dtype=torch.float32)
        kernel(out, [s.key for _, s in streams], [s.offset for _, s in streams], uniform=uniform)
        if not whole:
            noise[torch.tensor([i for i, _ in streams])] = out
        for _, s in streams:
            s.offset += cols
    for i, gen in enumerate(generators):
        if isinstance(gen, torch.Generator):
            draw(noise[i], gen)
