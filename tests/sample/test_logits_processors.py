"""Logits processors on small hand-made logits, against straightforward per-row references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.sample import (
    RowSpec,
    Sampler,
    SamplingMetadata,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
)
from tandem.sampling_params import SamplingParams

NEG_INF = float("-inf")


def meta_for(params: list[SamplingParams], vocab: int, **row_kwargs: object) -> SamplingMetadata:
    rows = [
        RowSpec(
            p,
            row_kwargs.get("prompt", [0]),  # type: ignore[arg-type]
            row_kwargs.get("outputs", []),  # type: ignore[arg-type]
            seed=i,
            position=int(row_kwargs.get("position", 0)),  # type: ignore[call-overload]
            eos_token_ids=row_kwargs.get("eos", ()),  # type: ignore[arg-type]
        )
        for i, p in enumerate(params)
    ]
    return SamplingMetadata.build(rows, vocab, "cpu")


def reference_top_k_top_p(row: list[float], k: int, p: float) -> list[float]:
    """Probabilities after keeping the k best tokens, then the smallest best set with mass >= p."""
    order = sorted(range(len(row)), key=lambda t: -row[t])[: k if k > 0 else len(row)]
    z = {t: math.exp(row[t]) for t in order}
    total, mass, kept = sum(z.values()), 0.0, []
    for t in order:
        kept.append(t)
        mass += z[t] / total
        if mass >= p:
            break
    norm = sum(z[t] for t in kept)
    return [z[t] / norm if t in kept else 0.0 for t in range(len(row))]


def test_greedy_is_argmax_and_ignores_temperature_filters() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [3.0, 0.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0.0, top_k=2, top_p=0.1, min_p=0.9)] * 2
    meta = meta_for(params, 4)
    assert meta.all_greedy and meta.top_k is None and meta.temperature is None
    assert Sampler()(logits, meta).sampled_token_ids.tolist() == [1, 0]
    probs = Sampler().compute_probs(logits, meta)
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_temperature() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.5, 0.5, 3.0, 1.0]])
    meta = meta_for([SamplingParams(temperature=0.5), SamplingParams(temperature=2.0)], 4)
    probs = Sampler().compute_probs(logits, meta)
    expected = torch.stack([(logits[0] / 0.5).softmax(-1), (logits[1] / 2.0).softmax(-1)])
    torch.testing.assert_close(probs, expected)
    torch.testing.assert_close(
        apply_temperature(logits, torch.tensor([0.5, 2.0])), logits / torch.tensor([[0.5], [2.0]])
    )


def test_top_k_keeps_ties_at_threshold() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2]), None)
    assert out.tolist() == [[NEG_INF, 3.0, 2.0, 2.0, NEG_INF]]


def test_top_p_hand_made() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.25, 0.15]])
    logits = probs.log()
    # p = 0.6: 0.5 alone is not enough, 0.5 + 0.25 is.
    out = apply_top_k_top_p(logits, None, torch.tensor([0.6]))
    assert torch.isinf(out[0, [0, 3]]).all() and torch.isfinite(out[0, [1, 2]]).all()
    # A tiny p keeps the best token only.
    out = apply_top_k_top_p(logits, None, torch.tensor([0.01]))
    assert torch.isfinite(out[0]).tolist() == [False, True, False, False]


def test_top_k_top_p_per_row_values_in_one_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 12, generator=gen) * 2
    settings_ = [(3, 1.0), (-1, 0.7), (5, 0.5), (-1, 1.0), (1, 0.9)]
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=p) for k, p in settings_]
    meta = meta_for(params, 12)
    probs = Sampler().compute_probs(logits, meta)
    for r, (k, p) in enumerate(settings_):
        expected = torch.tensor(reference_top_k_top_p(logits[r].tolist(), k, p))
        torch.testing.assert_close(probs[r], expected)


@settings(max_examples=80, deadline=None)
@given(
    data=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=2, max_size=10),
    k=st.integers(1, 12),
    p=st.floats(0.05, 1.0),
)
def test_top_k_top_p_properties(data: list[float], k: int, p: float) -> None:
    """The kept set is a best set within the top k (ties at the k-th value allowed), reaches mass p
    of the
    top-k distribution, and is minimal: without its worst token it would not reach p."""
    k = min(k, len(data))
    logits = torch.tensor([data])
    kept = torch.isfinite(apply_top_k_top_p(logits, torch.tensor([k]), torch.tensor([p])))[0]
    kth = sorted(data, reverse=True)[k - 1]
    in_top_k = logits[0] >= kth
    assert not (kept & ~in_top_k).any()
    worst = logits[0][kept].min()
    assert kept[logits[0] > worst].all()
    probs = logits[0].masked_fill(~in_top_k, NEG_INF).softmax(-1)
    mass = probs[kept].sum().item()
    assert mass >= p - 1e-5
    assert mass - probs[kept].min().item() < p + 1e-5


def test_min_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    out = apply_min_p(probs.log(), torch.tensor([0.2, 0.9]))
    assert torch.isfinite(out).tolist() == [[True, True, True, False], [True] * 4]
    meta = meta_for([SamplingParams(min_p=0.2)], 4)
    torch.testing.assert_close(
        Sampler().compute_probs(probs[:1].log(), meta), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95
    )


def reference_penalties(
    logits: list[float], prompt: list[int], outputs: list[int], p: SamplingParams
) -> list[float]:
    out = []
    for t, x in enumerate(logits):
        if t in prompt or t in outputs:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        count = outputs.count(t)
        x -= p.frequency_penalty * count
        x -= p.presence_penalty * (count > 0)
        out.append(x)
    return out


def test_penalties_match_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = 10
    cases = [
        (SamplingParams(repetition_penalty=1.5), [1, 2, 2], [3, 3, 1]),
        (SamplingParams(frequency_penalty=0.7), [4], [5, 5, 5, 6]),
        (SamplingParams(presence_penalty=-0.5), [], [7, 7, 0]),
        (
            SamplingParams(repetition_penalty=0.8, frequency_penalty=1.0, presence_penalty=2.0),
            [9, 8],
            [8, 2, 2],
        ),
        (SamplingParams(), [1, 2], [3]),  # no penalty in a batch with penalties
    ]
    logits = torch.randn(len(cases), vocab, generator=gen) * 3
    rows = [RowSpec(p, prompt, outs, seed=0, position=len(outs)) for p, prompt, outs in cases]
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    assert not meta.no_penalties and meta.penalties is not None
    got = Sampler.processed_logits(logits, meta)
    for r, (p, prompt, outs) in enumerate(cases):
        expected = torch.tensor(reference_penalties(logits[r].tolist(), prompt, outs, p))
        torch.testing.assert_close(got[r], expected)
    pen = meta.penalties
    direct = apply_penalties(
        logits,
        prompt_mask=pen.prompt_mask,
        output_counts=pen.output_counts,
        presence=pen.presence,
        frequency=pen.frequency,
        repetition=pen.repetition,
    )
    torch.testing.assert_close(direct, got)


def test_penalties_accept_tensor_contexts_and_ignore_placeholders() -> None:
    p = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    logits = torch.tensor([[2.0, 1.5, 0.0, 0.0]])
    row = RowSpec(p, torch.tensor([3]), torch.tensor([0, -1, 0]), seed=0, position=3)
    meta = SamplingMetadata.build([row], 4, "cpu")
    assert Sampler.processed_logits(logits, meta).tolist() == [[0.0, 1.5, 0.0, 0.0]]
    assert Sampler()(logits, meta).sampled_token_ids.tolist() == [1]  # the penalty moved the argmax


def test_logit_bias_and_allowed_token_ids() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3)
    params = [
        SamplingParams(temperature=0.0, logit_bias={0: 5.0, 3: -1.5}),
        SamplingParams(temperature=0.0, allowed_token_ids=[1, 2]),
        SamplingParams(temperature=1.0, allowed_token_ids=[0, 3], logit_bias={0: 3.0}),
    ]
    meta = meta_for(params, 4)
    processed = Sampler.processed_logits(logits, meta)
    assert processed.tolist() == [
        [5.0, 1.0, 2.0, 1.5],
        [NEG_INF, 1.0, 2.0, NEG_INF],
        [3.0, NEG_INF, NEG_INF, 3.0],
    ]
    assert Sampler()(logits, meta).sampled_token_ids[:2].tolist() == [0, 2]
    probs = Sampler().compute_probs(logits, meta)
    torch.testing.assert_close(probs[2], torch.tensor([0.5, 0.0, 0.0, 0.5]))
    assert logits.tolist() == [[0.0, 1.0, 2.0, 3.0]] * 3  # inputs untouched


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0, 3.0]] * 4)
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    p_ignore = p.clone(ignore_eos=True)
    rows = [
        RowSpec(p, [0], [], seed=0, position=0, eos_token_ids=(2,)),  # masked: EOS 2 and stop 3
        RowSpec(p, [0], [1], seed=0, position=1, eos_token_ids=(2,)),  # still one short
        RowSpec(p, [0], [1, 1], seed=0, position=2, eos_token_ids=(2,)),  # min_tokens reached
        RowSpec(p_ignore, [0], [], seed=0, position=0, eos_token_ids=(2,)),  # EOS is no stop here
    ]
    meta = SamplingMetadata.build(rows, 5, "cpu")
    assert Sampler()(logits, meta).sampled_token_ids.tolist() == [4, 4, 2, 2]
    processed = Sampler.processed_logits(logits, meta)
    assert torch.isinf(processed[0, [2, 3]]).all() and torch.isinf(processed[3, 3])


def test_min_tokens_with_only_banned_tokens_allowed_is_rejected() -> None:
    p = SamplingParams(min_tokens=1, allowed_token_ids=[2], stop_token_ids=[2])
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingMetadata.build([RowSpec(p, [0], [], seed=0, position=0)], 4, "cpu")


def test_fast_path_flags() -> None:
    meta = meta_for([SamplingParams(temperature=0.0)] * 2, 8)
    assert meta.all_greedy and not meta.all_random and meta.no_penalties
    assert meta.no_top_k and meta.no_top_p and meta.no_min_p and meta.max_num_logprobs is None
    assert meta.penalties is None and meta.logit_bias is None and meta.allowed is None
    meta = meta_for([SamplingParams(temperature=1.0, top_k=100)], 8)  # top_k >= V is no filter
    assert meta.all_random and meta.no_top_k and meta.temperature is None
    meta = meta_for([SamplingParams(temperature=0.7, logprobs=3), SamplingParams(logprobs=1)], 8)
    assert meta.max_num_logprobs == 3 and meta.temperature is not None
