"""The sampler's random draws (sample/rng.py)."""

from __future__ import annotations

import torch

from tandem.sample.rng import exponential_noise, make_generator, position_key


def test_the_fast_exponential_draw_equals_torch_exponential_bit_for_bit() -> None:
    # Seeded rows (a generator each) and unseeded ones (one batched draw from the default generator): the
    # vectorized draw must give exactly torch's exponential_ numbers, or seeded outputs would change.
    vocab = 49_152
    for seed in range(8):
        key = position_key(seed, 3 * seed)
        mine = exponential_noise(1, vocab, [make_generator(key, "cpu")], torch.device("cpu"))
        theirs = torch.empty(1, vocab).exponential_(generator=make_generator(key, "cpu"))
        assert torch.equal(mine, theirs.clamp_min_(torch.finfo(torch.float32).tiny))
    torch.manual_seed(11)
    mine = exponential_noise(3, vocab, [None, None, None], torch.device("cpu"))
    torch.manual_seed(11)
    theirs = torch.empty(3, vocab).exponential_()
    assert torch.equal(mine, theirs.clamp_min_(torch.finfo(torch.float32).tiny))
    assert mine.dtype == torch.float32 and bool((mine > 0).all())
