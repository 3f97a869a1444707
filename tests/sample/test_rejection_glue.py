"""The rejection sampler's glue (``RejectionSampler``, sample/rejection.py): verify-row logits and metadata to the
rule — requests without drafts, logprobs, seeded generators, the all-greedy fast path, and the rows read in
place of a padded copy. The rule itself: test_rejection_sampler.py (whose statistical helpers these share)."""

from __future__ import annotations

import pytest
import torch

from tandem.sample import (
    RejectionSampler,
    RowSpec,
    Sampler,
    SamplingMetadata,
    greedy_verify,
    greedy_verify_rows,
    num_accepted,
    rejection_sample,
    rng,
)
from tandem.sample.rejection import rejection_sample_rows
from tandem.sample.rng import make_row_rng, position_key
from tandem.sampling_params import SamplingParams
from tests.sample.test_rejection_sampler import empirical, reference_top_k_top_p, tv, tv_bound


def verify_rows(
    params: SamplingParams, seed: int, committed: list[int], drafts: list[int]
) -> list[RowSpec]:
    return [
        RowSpec(params, [1, 2, 3], committed + drafts[:j], seed=seed, position=len(committed) + j)
        for j in range(len(drafts) + 1)
    ]


def test_glue_without_drafts_equals_plain_sampler() -> None:
    """A request with no draft in a verify batch gets the token the plain sampler gives it."""
    vocab = 1000
    params = SamplingParams(temperature=1.0, top_k=500, repetition_penalty=1.3)
    other = SamplingParams(temperature=0.7)
    rows = verify_rows(other, 1, [5], [7, 8]) + verify_rows(params, 42, [9, 9, 4], [])
    logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(0))
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    drafts = torch.tensor([[7, 8], [-1, -1]])
    out = RejectionSampler()(logits, meta, drafts, [2, 0]).output_token_ids
    alone = SamplingMetadata.build(rows[-1:], vocab, "cpu")
    assert out[1, 0] == Sampler()(logits[-1:], alone).sampled_token_ids[0]
    assert out[1, 1:].tolist() == [-1, -1]


def test_glue_greedy_and_logprobs() -> None:
    vocab = 16
    greedy = SamplingParams(temperature=0.0, logprobs=2)
    logits = torch.full((4, vocab), -1.0)
    for r, t in enumerate([3, 5, 7, 9]):
        logits[r, t] = 4.0
    rows = verify_rows(greedy, 0, [1], [3, 6]) + verify_rows(greedy, 0, [2], [])
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    res = RejectionSampler()(logits, meta, torch.tensor([[3, 6], [-1, -1]]), [2, 0])
    assert res.output_token_ids.tolist() == [[3, 5, -1], [9, -1, -1]]
    assert res.logprobs is not None
    assert res.logprobs.logprob_token_ids[:, 0].tolist() == [3, 5, 0, 9]  # row 2: padding
    torch.testing.assert_close(res.logprobs.logprobs[0, 0], logits[0].log_softmax(-1)[3])


def test_glue_distribution_with_seeded_generators() -> None:
    """Through the glue with per-request position-keyed generators: the first token follows the
    processed
    target p_1 (top-k) although the drafts are one-hot (n-gram style) guesses."""
    vocab, n = 8, 20_000
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0, top_k=5)
    logits1 = torch.randn(vocab, generator=gen) * 1.5
    rows: list[RowSpec] = []
    logits = []
    draft_ids = torch.randint(0, vocab, (n, 2), generator=gen)
    for b in range(n):
        rows += verify_rows(params, b, [], draft_ids[b].tolist())
        logits += [logits1, torch.randn(vocab, generator=gen), torch.randn(vocab, generator=gen)]
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    out = RejectionSampler()(torch.stack(logits), meta, draft_ids, [2] * n).output_token_ids
    target = reference_top_k_top_p(logits1.unsqueeze(0), 5, 1.0).squeeze(0)
    assert tv(empirical(out[:, 0], vocab), target) < tv_bound(n, vocab)
    again = RejectionSampler()(torch.stack(logits), meta, draft_ids, [2] * n).output_token_ids
    assert torch.equal(out, again)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_fast_path_equals_one_hot_rule(seed: int) -> None:
    """All-greedy batches skip the [B, K+1, V] distributions (``greedy_verify`` on argmax ids): the
    outputs and logprobs equal the general rule on the one-hot of the processed argmax, with
    penalties moving that argmax, ragged drafts and requests without drafts."""
    gen = torch.Generator().manual_seed(seed)
    vocab, k = 12, 3
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5, logprobs=1)
    num_drafts = [3, 1, 0, 2]
    drafts = torch.full((4, k), -1)
    rows = []
    for b, n in enumerate(num_drafts):
        d = torch.randint(0, vocab, (n,), generator=gen).tolist()
        drafts[b, :n] = torch.tensor(d, dtype=torch.int64)
        rows += verify_rows(params, b, [b % vocab, 5], d)
    logits = torch.randn(len(rows), vocab, generator=gen)
    # Make some drafts the argmax so that acceptances happen.
    r = 0
    for b, n in enumerate(num_drafts):
        for j in range(n):
            if torch.rand((), generator=gen) < 0.6:
                logits[r + j, drafts[b, j]] += 6.0
        r += n + 1
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    fast = RejectionSampler()(logits, meta, drafts, num_drafts)
    # The general rule on the one-hot distributions.
    probs = Sampler().compute_probs(logits, meta)
    starts = [sum(n + 1 for n in num_drafts[:b]) for b in range(4)]
    index = torch.tensor([[s + min(j, n) for j in range(k + 1)] for s, n in zip(starts, num_drafts)])
    ref = rejection_sample(probs[index], drafts, None, None, torch.ones(4, dtype=torch.bool))
    assert fast.output_token_ids.tolist() == ref.tolist()
    assert num_accepted(fast.output_token_ids).sum() > 0
    assert fast.logprobs is not None and fast.logprobs.logprob_token_ids.shape[0] == len(rows)
    ids = Sampler().greedy_token_ids(logits, meta)[index]
    assert greedy_verify(ids, drafts).tolist() == ref.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_greedy_rule_on_host_lists_equals_the_tensor_rule(seed: int) -> None:
    """The CPU's host-list greedy rule (``greedy_verify_rows``) makes the tensor rule's decisions: ragged
    draft counts, a -1 inside the drafts (only the prefix before it counts), slots past a request's count
    ignored, requests without drafts, every draft accepted (bonus) and none."""
    gen = torch.Generator().manual_seed(seed)
    k, batch, vocab = 4, 6, 5
    num_drafts = torch.randint(0, k + 1, (batch,), generator=gen).tolist()
    drafts = torch.randint(-1, vocab, (batch, k), generator=gen)
    rows = sum(n + 1 for n in num_drafts)
    ids = torch.randint(0, vocab, (rows,), generator=gen)
    r = 0
    for b, n in enumerate(num_drafts):  # most drafts equal to the argmax, so that prefixes get accepted
        for j in range(n):
            if torch.rand((), generator=gen) < 0.7 and drafts[b, j] >= 0:
                ids[r + j] = drafts[b, j]
        r += n + 1
    starts = [sum(n + 1 for n in num_drafts[:b]) for b in range(batch)]
    index = torch.tensor([[s + min(j, n) for j in range(k + 1)] for s, n in zip(starts, num_drafts)])
    slots = torch.arange(k)
    masked = torch.where(slots < torch.tensor(num_drafts).unsqueeze(1), drafts, -1)
    ref = greedy_verify(ids[index], masked).tolist()
    assert greedy_verify_rows(ids.tolist(), drafts.tolist(), num_drafts, k) == ref


def test_greedy_verify_shape_check() -> None:
    with pytest.raises(ValueError, match="target_ids"):
        greedy_verify(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, dtype=torch.int64))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_glue_reads_rows_in_place_equal_to_padded_rule(seed: int, with_draft_probs: bool) -> None:
    """The glue hands the rule the verify rows with an index instead of a padded [B, K+1, V] copy: the
    tokens equal the rule on the padded distributions, bit for bit — seeded random requests beside a greedy
    one, ragged drafts, a request without drafts, with and without draft probabilities."""
    gen = torch.Generator().manual_seed(seed)
    vocab, k = 16, 3
    num_drafts = [3, 0, 1, 2, 3]
    params = [SamplingParams(temperature=0.8, seed=seed * 10 + b) for b in range(len(num_drafts))]
    params[3] = SamplingParams(temperature=0.0)
    drafts = torch.full((len(num_drafts), k), -1)
    rows = []
    for b, n in enumerate(num_drafts):
        d = torch.randint(0, vocab, (n,), generator=gen).tolist()
        drafts[b, :n] = torch.tensor(d, dtype=torch.int64)
        rows += verify_rows(params[b], b, [b % vocab, 7], d)
    logits = torch.randn(len(rows), vocab, generator=gen) * 2
    q = torch.softmax(torch.randn(len(num_drafts), k, vocab, generator=gen), dim=-1) if with_draft_probs else None
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    out = RejectionSampler()(logits, meta, drafts, num_drafts, q).output_token_ids
    starts = [sum(n + 1 for n in num_drafts[:b]) for b in range(len(num_drafts))]
    index = torch.tensor([[s + min(j, n) for j in range(k + 1)] for s, n in zip(starts, num_drafts)])
    greedy = [meta.is_greedy[s] for s in starts]
    gens = [None if g else make_row_rng(meta.generator_keys[s], "cpu") for g, s in zip(greedy, starts)]
    ref = rejection_sample(Sampler().compute_probs(logits, meta)[index], drafts, q, gens, torch.tensor(greedy))
    assert out.tolist() == ref.tolist()
    assert (out[1, 1:] == -1).all() and out[1, 0] >= 0  # no drafts: one token


@pytest.mark.parametrize("seed", range(6))
def test_the_host_rule_equals_the_tensor_rule(seed: int) -> None:
    """``rejection_sample_rows`` (the CPU's acceptance tests on host lists) against the tensor rule on the same
    rows and the same sources, token for token: ragged drafts, a -1 inside a request's drafts, greedy requests
    beside random ones, a request with no drafts, rows whose whole mass is on the draft (a rejection there
    draws from p itself) and sharp rows that accept often."""
    gen = torch.Generator().manual_seed(seed)
    vocab, width = 12, 3
    num_drafts = [3, 0, 2, 3, 1, 3]
    greedy = [False, False, True, False, False, seed % 2 == 0]
    drafts = torch.randint(0, vocab, (len(num_drafts), width), generator=gen)
    drafts[3, 1] = -1  # only its first draft counts
    rows = sum(n + 1 for n in num_drafts)
    logits = torch.randn(rows, vocab, generator=gen) * (1 + 4 * torch.rand(rows, 1, generator=gen))
    p_rows = torch.softmax(logits, dim=-1)
    starts = [sum(n + 1 for n in num_drafts[:b]) for b in range(len(num_drafts))]
    for b, s in enumerate(starts):  # drafts often the row's likeliest token; one row all on its draft
        for j in range(num_drafts[b]):
            if torch.rand((), generator=gen) < 0.5:
                drafts[b, j] = int(p_rows[s + j].argmax())
    p_rows[starts[4]] = 0.0  # (unnormalised: a rejection leaves nothing else, so the final is drawn from p)
    p_rows[starts[4], int(drafts[4, 0])] = 0.6
    p_rows[starts[0] + 1] = torch.nn.functional.one_hot(drafts[0, 1], vocab).float() * 0.999 + 0.0001 / vocab
    padded = torch.stack([p_rows[[s + min(j, n) for j in range(width + 1)]] for s, n in zip(starts, num_drafts)])
    masked = torch.where(torch.arange(width) < torch.tensor(num_drafts).unsqueeze(1), drafts, -1)
    keys = [position_key(seed * 7 + b, 3) for b in range(len(num_drafts))]
    for native in (True, False):
        if native and rng.noise_source("cpu") != "native":
            continue
        sources = lambda: [None if g else rng.make_row_rng(k, "cpu", native) for g, k in zip(greedy, keys)]  # noqa: E731
        host = rejection_sample_rows(p_rows, drafts.tolist(), num_drafts, width, sources(), greedy)
        ref = rejection_sample(padded, masked, None, sources(), torch.tensor(greedy))
        assert host.tolist() == ref.tolist(), native
