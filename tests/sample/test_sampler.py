"""Sampler: random sampling distribution, position-keyed determinism, logprobs, mixed batches, CUDA
parity.

Statistical tests use the Bretagnolle–Huber–Carol bound, P(TV(empirical, true) >= eps) <= 2^m exp(-2
n eps^2) for n draws over m categories, solved for a failure probability of 1e-6 per assertion.
"""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sample import (
    RejectionSampler,
    RowSpec,
    Sampler,
    SamplingMetadata,
    compute_logprobs,
    position_key,
    rejection_sample,
)
from tandem.sample.rng import exponential_noise, make_generator
from tandem.sampling_params import SamplingParams


def tv_bound(n: int, categories: int, delta: float = 1e-6) -> float:
    return math.sqrt((categories * math.log(2) + math.log(1 / delta)) / (2 * n))


def build(
    specs: list[tuple[SamplingParams, int, int]], vocab: int, device: str = "cpu"
) -> SamplingMetadata:
    """Rows from (params, seed, position) with a dummy context."""
    rows = [RowSpec(p, [0], [1] * pos, seed=seed, position=pos) for p, seed, pos in specs]
    return SamplingMetadata.build(rows, vocab, device)


def test_random_sampling_follows_processed_distribution() -> None:
    # Each row has its own seed: this is the engine's path (one position-keyed generator per row).
    vocab, n = 6, 20_000
    logits = torch.tensor([1.0, 0.5, -0.5, 2.0, 0.0, -3.0])
    params = SamplingParams(temperature=0.7, top_k=4)
    meta = build([(params, seed, 3) for seed in range(n)], vocab)
    tokens = Sampler()(logits.expand(n, vocab), meta).sampled_token_ids
    expected = (
        (logits / 0.7).masked_fill(logits < 0.0, float("-inf")).softmax(-1)
    )  # top-4: 3, 0, 1, 4
    got = torch.bincount(tokens, minlength=vocab).double() / n
    assert 0.5 * (got - expected.double()).abs().sum().item() < tv_bound(n, vocab)
    assert got[[2, 5]].sum() == 0


def test_same_seed_and_position_give_same_token_in_any_batch() -> None:
    vocab = 1000
    logits_row = torch.zeros(vocab)  # uniform: the token is pure noise
    target = (SamplingParams(temperature=1.0), 1234, 17)
    others = [
        (SamplingParams(temperature=0.0), 1, 0),
        (SamplingParams(temperature=0.5, top_p=0.9), 99, 4),
        (SamplingParams(temperature=1.3, repetition_penalty=1.2, logprobs=2), 1234, 18),
        (SamplingParams(temperature=1.0), 1235, 17),
    ]
    alone = Sampler()(logits_row.unsqueeze(0), build([target], vocab)).sampled_token_ids[0]
    batches = [[target] + others, others + [target], others[:2] + [target] + others[2:][::-1]]
    for specs in batches:
        meta = build(specs, vocab)
        tokens = Sampler()(logits_row.expand(len(specs), vocab), meta).sampled_token_ids
        assert tokens[specs.index(target)] == alone
    # Recompute after preemption: fresh metadata, same answer.
    assert Sampler()(logits_row.unsqueeze(0), build([target], vocab)).sampled_token_ids[0] == alone


def test_positions_and_seeds_give_different_noise() -> None:
    vocab = 1000
    specs = [(SamplingParams(), 7, pos) for pos in range(50)]
    meta = build(specs, vocab)
    assert len(set(meta.generator_keys)) == 50
    tokens = Sampler()(torch.zeros(50, vocab), meta).sampled_token_ids
    assert len(set(tokens.tolist())) > 40  # 50 uniform draws from 1000 collide little
    assert position_key(1, 2) != position_key(2, 1)
    assert position_key(-1, 0) != position_key(1, 0)
    with pytest.raises(ValueError):
        position_key(1, -1)


def test_noise_draw_is_per_row() -> None:
    gens = [
        make_generator(position_key(3, 4), "cpu"),
        None,
        make_generator(position_key(3, 5), "cpu"),
    ]
    noise = exponential_noise(3, 16, gens, torch.device("cpu"))
    alone = torch.empty(16).exponential_(generator=make_generator(position_key(3, 4), "cpu"))
    torch.testing.assert_close(noise[0], alone)
    assert (noise > 0).all() and not torch.equal(noise[0], noise[2])


def test_mixed_greedy_and_random_batch() -> None:
    vocab = 50
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, vocab, generator=gen)
    greedy = SamplingParams(temperature=0.0)
    random = SamplingParams(temperature=1.0)
    specs = [
        (greedy, 0, 0),
        (random, 1, 0),
        (greedy, 2, 0),
        (random, 3, 0),
        (random, 4, 0),
        (greedy, 5, 0),
    ]
    meta = build(specs, vocab)
    tokens = Sampler()(logits, meta).sampled_token_ids
    assert tokens[[0, 2, 5]].tolist() == logits[[0, 2, 5]].argmax(-1).tolist()
    only_random = build([specs[i] for i in (1, 3, 4)], vocab)
    assert (
        tokens[[1, 3, 4]].tolist()
        == Sampler()(logits[[1, 3, 4]], only_random).sampled_token_ids.tolist()
    )
    probs = Sampler().compute_probs(logits, meta)
    torch.testing.assert_close(probs.sum(-1), torch.ones(6))
    assert probs[0].max() == 1.0 and probs[1].max() < 1.0


def test_logprobs_are_raw_log_softmax_with_ranks() -> None:
    vocab = 12
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, vocab, generator=gen)
    specs = [
        (SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=2.0), 0, 0),
        (SamplingParams(temperature=0.8, top_k=3, logprobs=0), 1, 0),
        (SamplingParams(temperature=0.8), 2, 0),
    ]
    meta = build(specs, vocab)
    out = Sampler()(logits, meta)
    assert out.logprobs is not None
    ids, lps, ranks = out.logprobs
    assert ids.shape == (3, 4) and lps.shape == (3, 4)
    raw = logits.log_softmax(-1)
    assert torch.equal(ids[:, 0], out.sampled_token_ids)
    torch.testing.assert_close(lps, raw.gather(1, ids))
    order = raw.argsort(-1, descending=True)
    assert torch.equal(ids[:, 1:], order[:, :3])
    for r in range(3):
        assert ranks[r].item() == order[r].tolist().index(ids[r, 0].item()) + 1


def test_logprob_ranks_with_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    res = compute_logprobs(logits, torch.tensor([2]), 2)
    assert res.selected_token_ranks.tolist() == [1]  # tied with the best: shares rank 1
    res = compute_logprobs(logits, torch.tensor([3]), 0)
    assert res.selected_token_ranks.tolist() == [4] and res.logprob_token_ids.tolist() == [[3]]


def test_no_logprobs_when_nobody_asks() -> None:
    meta = build([(SamplingParams(), 0, 0)], 5)
    assert Sampler()(torch.zeros(1, 5), meta).logprobs is None


def test_input_validation() -> None:
    meta = build([(SamplingParams(), 0, 0)], 5)
    with pytest.raises(ValueError, match="shape"):
        Sampler()(torch.zeros(2, 5), meta)
    with pytest.raises(ValueError, match="vocabulary"):
        build([(SamplingParams(logit_bias={7: 1.0}), 0, 0)], 5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_semantics() -> None:
    """Everything stays on the device; greedy equals the CPU reference; seeded runs reproduce."""
    vocab, dev = 257, "cuda"
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, vocab, generator=gen)
    specs = [
        (
            SamplingParams(
                temperature=0.0, repetition_penalty=1.3, logit_bias={3: 2.0}, logprobs=2
            ),
            0,
            2,
        ),
        (
            SamplingParams(temperature=0.9, top_k=20, top_p=0.8, min_p=0.05, frequency_penalty=0.5),
            1,
            2,
        ),
    ] * 4
    cpu = Sampler()(logits, build(specs, vocab))
    gpu = Sampler()(logits.to(dev), build(specs, vocab, dev))
    assert gpu.sampled_token_ids.device.type == "cuda"
    assert gpu.sampled_token_ids[::2].cpu().tolist() == cpu.sampled_token_ids[::2].tolist()
    again = Sampler()(logits.to(dev), build(specs, vocab, dev))
    assert torch.equal(gpu.sampled_token_ids, again.sampled_token_ids)
    probs = torch.softmax(torch.randn(4, 3, vocab, generator=gen), -1).to(dev)
    drafts = torch.tensor([[1, 2], [3, -1], [-1, -1], [4, 5]], device=dev)
    gens = [make_generator(position_key(b, 0), dev) for b in range(4)]
    out = rejection_sample(
        probs, drafts, None, gens, torch.tensor([True, False, True, False], device=dev)
    )
    assert out.device.type == "cuda" and out.shape == (4, 3)
    rows = [RowSpec(SamplingParams(temperature=0.8), [0], [], seed=9, position=j) for j in range(3)]
    res = RejectionSampler()(
        torch.randn(3, vocab, device=dev),
        SamplingMetadata.build(rows, vocab, dev),
        torch.tensor([[1, 2]], device=dev),
        [2],
    )
    assert res.output_token_ids.device.type == "cuda"
