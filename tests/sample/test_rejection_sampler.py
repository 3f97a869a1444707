"""Rejection sampler: exact greedy cases, corner cases, reproducibility and distribution tests.

Statistical tests use the Bretagnolle–Huber–Carol inequality: for n i.i.d. draws from a distribution
on m categories, P(TV(empirical, true) >= eps) <= 2^m exp(-2 n eps^2). ``tv_bound`` solves it for a
failure probability of 1e-6 per assertion, which is of order 1/sqrt(n); with about 30 such
assertions in this file a correct sampler fails with probability below 1e-4 (and, the seeds being
fixed, the outcome is reproducible).
"""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sample import (
    RowSpec,
    Sampler,
    SamplingMetadata,
    make_generator,
    num_accepted,
    position_key,
    rejection_sample,
)
from tandem.sampling_params import SamplingParams

DELTA = 1e-6


def tv_bound(n: int, categories: int, delta: float = DELTA) -> float:
    return math.sqrt((categories * math.log(2) + math.log(1 / delta)) / (2 * n))


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a.double() - b.double()).abs().sum().item()


def empirical(tokens: torch.Tensor, categories: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=categories).double() / tokens.numel()


def random_dist(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """Peaked random distributions (cubing spreads the mass) so that TV(p, q) is large."""
    x = torch.rand(*shape, generator=gen, dtype=torch.float64) ** 3
    return (x / x.sum(-1, keepdim=True)).float()


def no_greedy(batch: int) -> torch.Tensor:
    return torch.zeros(batch, dtype=torch.bool)


# The statistical tests run on the CPU everywhere and on a CUDA device where there is one (the sampler keeps
# everything on the device: its own random numbers, its own kernels).
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


# --------------------------------------------------------------------------------------------------
# greedy: exact outputs


def one_hot_rows(argmaxes: list[int], vocab: int) -> torch.Tensor:
    p = torch.full((len(argmaxes), vocab), 0.5 / (vocab - 1))
    p[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 0.5
    return p


def test_greedy_all_accepted_emits_bonus() -> None:
    p = one_hot_rows([3, 1, 4, 2], 6).unsqueeze(0)
    out = rejection_sample(p, torch.tensor([[3, 1, 4]]), None, None, torch.tensor([True]))
    assert out.tolist() == [[3, 1, 4, 2]]
    assert num_accepted(out).tolist() == [3]


def test_greedy_first_mismatch_emits_argmax() -> None:
    p = one_hot_rows([3, 1, 4, 2], 6).unsqueeze(0)
    out = rejection_sample(p, torch.tensor([[3, 5, 4]]), None, None, torch.tensor([True]))
    assert out.tolist() == [[3, 1, -1, -1]]  # d_3 = 4 would match, but only a prefix counts
    out = rejection_sample(p, torch.tensor([[0, 1, 4]]), None, None, torch.tensor([True]))
    assert out.tolist() == [[3, -1, -1, -1]]
    assert num_accepted(out).tolist() == [0]


def test_greedy_ragged_drafts() -> None:
    p = torch.stack(
        [
            one_hot_rows([3, 1, 4, 2], 6),
            one_hot_rows([5, 0, 0, 0], 6),
            one_hot_rows([2, 2, 2, 2], 6),
        ]
    )
    drafts = torch.tensor([[3, 1, -1], [-1, -1, -1], [2, -1, 2]])  # a -1 ends the drafts for good
    out = rejection_sample(p, drafts, None, None, torch.ones(3, dtype=torch.bool))
    assert out.tolist() == [[3, 1, 4, -1], [5, -1, -1, -1], [2, 2, -1, -1]]
    assert num_accepted(out).tolist() == [2, 0, 1]


def test_greedy_with_draft_probs_ignores_them() -> None:
    p = one_hot_rows([3, 1, 4], 6).unsqueeze(0)
    q = torch.zeros(1, 2, 6)
    q[..., 0] = 1.0  # the draft claims other tokens; greedy verification only compares argmaxes
    out = rejection_sample(p, torch.tensor([[3, 1]]), q, None, torch.tensor([True]))
    assert out.tolist() == [[3, 1, 4]]


def test_no_draft_positions() -> None:
    p = one_hot_rows([2], 5).reshape(1, 1, 5)
    out = rejection_sample(
        p, torch.empty(1, 0, dtype=torch.int64), None, None, torch.tensor([True])
    )
    assert out.tolist() == [[2]]


# --------------------------------------------------------------------------------------------------
# random rows: corner cases


def test_zero_target_probability_is_never_accepted() -> None:
    n, vocab = 2000, 4
    p = torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(n, 2, vocab).contiguous()
    drafts = torch.zeros(n, 1, dtype=torch.int64)
    for q in (None, torch.tensor([0.7, 0.1, 0.1, 0.1]).expand(n, 1, vocab)):
        out = rejection_sample(p, drafts, q, None, no_greedy(n))
        assert (out[:, 1] == -1).all()
        assert set(out[:, 0].tolist()) <= {1, 2}


def test_zero_draft_probability_rejects_and_falls_back_to_target() -> None:
    # q(d) = 0 while p(d) > 0: rejected; the residual max(p - q, 0) still puts mass on d.
    n, vocab = 4000, 4
    p = torch.tensor([0.4, 0.6, 0.0, 0.0]).expand(n, 2, vocab).contiguous()
    q = torch.tensor([0.0, 1.0, 0.0, 0.0]).expand(n, 1, vocab)
    out = rejection_sample(p, torch.zeros(n, 1, dtype=torch.int64), q, None, no_greedy(n))
    assert (out[:, 1] == -1).all()
    assert (out[:, 0] == 0).all()  # residual = [0.4, 0, 0, 0]
    # residual all zero (p == q and q(d) = 0): recovered from p itself.
    p = torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(n, 2, vocab).contiguous()
    out = rejection_sample(p, torch.zeros(n, 1, dtype=torch.int64), p[:, :1], None, no_greedy(n))
    assert (out[:, 1] == -1).all()
    assert set(out[:, 0].tolist()) == {1, 2}


def test_certain_target_always_accepts_one_hot_draft() -> None:
    n = 1000
    p = torch.zeros(n, 3, 5)
    p[:, 0, 2] = 1.0
    p[:, 1, 4] = 1.0
    p[:, 2, 1] = 1.0
    out = rejection_sample(p, torch.tensor([[2, 4]]).expand(n, 2), None, None, no_greedy(n))
    assert (out == torch.tensor([2, 4, 1])).all()


def test_shape_validation() -> None:
    p = torch.full((2, 3, 4), 0.25)
    with pytest.raises(ValueError, match="draft_token_ids"):
        rejection_sample(p, torch.zeros(2, 3, dtype=torch.int64), None, None, no_greedy(2))
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(p, torch.zeros(2, 2, dtype=torch.int64), p, None, no_greedy(2))
    with pytest.raises(ValueError, match="generators"):
        rejection_sample(p, torch.zeros(2, 2, dtype=torch.int64), None, [None], no_greedy(2))


# --------------------------------------------------------------------------------------------------
# distribution tests


def make_chain(
    vocab: int, k: int, gen: torch.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Target and draft "models" with a Markov context: p_1 [V] and P_i [V, V] (row = previous
    token) for
    positions 2..k+1; likewise q_1 and Q_i for positions 2..k."""
    p = [random_dist(vocab, gen=gen)] + [random_dist(vocab, vocab, gen=gen) for _ in range(k)]
    q = [random_dist(vocab, gen=gen)] + [random_dist(vocab, vocab, gen=gen) for _ in range(k - 1)]
    return p, q


def draw_batch(
    p: list[torch.Tensor], q: list[torch.Tensor], n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n drafts sampled from the draft chain, with each row's target and draft distributions given
    its drafts: the context of position i holds d_1..d_{i-1}."""
    k = len(q)
    drafts: list[torch.Tensor] = []
    q_rows: list[torch.Tensor] = []
    p_rows = [p[0].expand(n, -1)]
    for i in range(k):
        qi = q[0].expand(n, -1) if i == 0 else q[i][drafts[-1]]
        drafts.append(torch.multinomial(qi, 1, generator=gen).squeeze(1))
        q_rows.append(qi)
        p_rows.append(p[i + 1][drafts[-1]])
    return torch.stack(drafts, 1), torch.stack(p_rows, 1), torch.stack(q_rows, 1)


def check_chain(
    out: torch.Tensor,
    p: list[torch.Tensor],
    q: list[torch.Tensor],
    one_hot_drafts: bool,
) -> None:
    """The first token follows p_1; every later token, given the previous one x, follows P_{i+1}[x].

    The joint law of (out_i, out_{i+1}) over rows that emitted out_{i+1} is proportional to
    alpha_i(x) * P_{i+1}[x, y], where alpha_i(x) is the probability that the first i drafts are
    accepted and d_i = x: alpha_1(x) = w(p_1, q_1)(x), alpha_i(y) = sum_x alpha_{i-1}(x) w(P_i[x],
    Q_i[x])(y), with w(p, q) = min(p, q) (accept with min(1, p/q) after drawing from q) or q * p for
    one-hot drafts.
    """
    n, vocab = out.shape[0], p[0].numel()

    def weight(pi: torch.Tensor, qi: torch.Tensor) -> torch.Tensor:
        return (qi * pi if one_hot_drafts else torch.minimum(pi, qi)).double()

    first = empirical(out[:, 0], vocab)
    assert tv(first, p[0]) < tv_bound(n, vocab)
    # Far below the distance to the draft distribution: a sampler that returned drafts would fail.
    assert tv(p[0], q[0]) > 10 * tv_bound(n, vocab)
    # Acceptance rate of the first draft: sum_x w(p_1, q_1)(x) (1 - TV(p, q) with draft
    # probabilities).
    alpha = weight(p[0], q[0])
    rate = (out[:, 1] != -1).double().mean().item()
    assert abs(rate - alpha.sum().item()) < math.sqrt(math.log(2 / DELTA) / (2 * n))
    for i in range(1, len(q) + 1):
        has_next = out[:, i] != -1
        pairs = out[has_next, i - 1] * vocab + out[has_next, i]
        expected = (alpha.unsqueeze(1) * p[i].double()).reshape(-1)
        expected /= expected.sum()
        m = int(has_next.sum())
        assert m > 1000
        assert tv(empirical(pairs, vocab * vocab), expected) < tv_bound(m, vocab * vocab)
        if i < len(q):
            alpha = (alpha.unsqueeze(1) * weight(p[i], q[i])).sum(0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_distribution_matches_target(k: int, with_draft_probs: bool, device: str) -> None:
    gen = torch.Generator().manual_seed(1000 * k + with_draft_probs)
    torch.manual_seed(k)  # the sampler's unseeded rows draw from the default generator
    vocab, n = 8, 200_000
    p, q = make_chain(vocab, k, gen)
    if not with_draft_probs:
        # An n-gram proposer guesses well or not at all: draft from a sharpened target mixed with q,
        # so that enough rows reach the deeper positions (one-hot acceptance is only p(d)).
        q = [0.25 * qi + 0.75 * pi**2 / (pi**2).sum(-1, keepdim=True) for pi, qi in zip(p, q)]
    drafts, p_rows, q_rows = draw_batch(p, q, n, gen)
    out = rejection_sample(p_rows.to(device), drafts.to(device), q_rows.to(device) if with_draft_probs else None,
                           None, no_greedy(n).to(device))
    assert out.device.type == device
    check_chain(out.cpu(), p, q, one_hot_drafts=not with_draft_probs)


def reference_top_k_top_p(logits: torch.Tensor, k: int, top_p: float) -> torch.Tensor:
    """Per-row reference: keep the k best, then the smallest best set reaching top_p."""
    out = torch.zeros_like(logits)
    for r, row in enumerate(logits.tolist()):
        order = sorted(range(len(row)), key=lambda t: -row[t])[:k]
        z = [math.exp(row[t]) for t in order]
        total, mass, kept = sum(z), 0.0, []
        for t, zt in zip(order, z):
            kept.append(t)
            mass += zt / total
            if mass >= top_p:
                break
        norm = sum(math.exp(row[t]) for t in kept)
        for t in kept:
            out[r, t] = math.exp(row[t]) / norm
    return out


def test_distribution_follows_processed_target() -> None:
    """Top-k / top-p / temperature shape the target before verification; outputs follow it."""
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    vocab, k, n = 10, 2, 200_000
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.8)
    logits = [torch.randn(1, vocab, generator=gen) * 2] + [
        torch.randn(vocab, vocab, generator=gen) * 2 for _ in range(k)
    ]
    p = []
    for table in logits:
        rows = [RowSpec(params, [0], [], seed=0, position=0) for _ in range(table.shape[0])]
        meta = SamplingMetadata.build(rows, vocab, "cpu")
        processed = Sampler().compute_probs(table, meta)
        torch.testing.assert_close(processed, reference_top_k_top_p(table / 0.8, 5, 0.8))
        p.append(processed.squeeze(0) if table.shape[0] == 1 else processed)
    # Drafts from the unprocessed distributions: they propose tokens the processed target forbids.
    q = [logits[0].squeeze(0).softmax(-1)] + [logits[1].softmax(-1)]
    drafts, p_rows, q_rows = draw_batch(p, q, n, gen)
    out = rejection_sample(p_rows, drafts, q_rows, None, no_greedy(n))
    check_chain(out, p, q, one_hot_drafts=False)
    assert (p[0][out[:, 0]] > 0).all()  # never a token outside the processed support


def test_mixed_greedy_and_random_rows() -> None:
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    vocab, k, n = 8, 2, 100_000
    p, q = make_chain(vocab, k, gen)
    drafts, p_rows, q_rows = draw_batch(p, q, n, gen)
    greedy = torch.arange(n) % 2 == 0
    out = rejection_sample(p_rows, drafts, q_rows, None, greedy)
    # Greedy rows: the reference walk over the argmaxes.
    argmax = p_rows.argmax(-1)
    expected = torch.full((n, k + 1), -1)
    for b in torch.nonzero(greedy).squeeze(1)[:200].tolist():
        j = 0
        while j < k and drafts[b, j] == argmax[b, j]:
            expected[b, j] = drafts[b, j]
            j += 1
        expected[b, j] = argmax[b, j]
        assert out[b].tolist() == expected[b].tolist()
    # Random rows: the first token follows p_1.
    m = int((~greedy).sum())
    assert tv(empirical(out[~greedy, 0], vocab), p[0]) < tv_bound(m, vocab)


# --------------------------------------------------------------------------------------------------
# reproducibility and the glue


def test_seeded_reproducibility_and_batch_independence() -> None:
    gen = torch.Generator().manual_seed(11)
    vocab, k, n = 50, 3, 64
    p = random_dist(n, k + 1, vocab, gen=gen)
    q = random_dist(n, k, vocab, gen=gen)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(n, k)
    drafts[5, 1:] = -1

    def run(order: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        gens = [make_generator(position_key(seeds[b], 0), "cpu") for b in order.tolist()]
        return rejection_sample(p[order], drafts[order], q[order], gens, no_greedy(len(order)))

    seeds = list(range(100, 100 + n))
    base = run(torch.arange(n), seeds)
    assert torch.equal(base, run(torch.arange(n), seeds))
    perm = torch.randperm(n, generator=gen)
    assert torch.equal(base[perm], run(perm, seeds))
    sub = perm[:7]
    assert torch.equal(base[sub], run(sub, seeds))
    other = run(torch.arange(n), [s + 1 for s in seeds])
    assert not torch.equal(base, other)

