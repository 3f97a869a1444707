"""Continuous batching on the real default model: batched == alone, with chunked prefill and with
preemption forced by a small KV cache; prefix caching; seeded sampling; bad input."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tests.helpers import assert_greedy_match, humaneval_prompts

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return list(humaneval_prompts(16))


@pytest.fixture(scope="module")
def alone(prompts) -> list:
    llm = LLM(max_num_seqs=1, async_scheduling=False, debug_invariants=True)
    outs = [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0] for p in prompts]
    llm.shutdown()
    return outs


def _check(batched, alone, label):
    identical = 0
    for i, (b, a) in enumerate(zip(batched, alone)):
        identical += assert_greedy_match(
            a.token_ids, a.logprobs, b.outputs[0].token_ids, label=f"{label} prompt {i}"
        )
    assert identical >= len(alone) - 2  # near-ties are rare: a regression would break many


def test_batched_equals_alone(prompts, alone):
    llm = LLM(max_num_seqs=16, debug_invariants=True)
    _check(llm.generate(prompts, GREEDY, use_tqdm=False), alone, "batched")
    llm.shutdown()


def test_chunked_prefill_equals_alone(prompts, alone):
    llm = LLM(max_num_seqs=16, max_num_batched_tokens=64, debug_invariants=True)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert max(len(o.prompt_token_ids) for o in outs) > 64  # prefill really was chunked
    _check(outs, alone, "chunked")
    llm.shutdown()


def test_preemption_equals_alone(prompts, alone):
    # 40 blocks of 16 tokens hold ~3 requests at once: 16 running requests must preempt.
    llm = LLM(max_num_seqs=16, num_kv_blocks=40, max_model_len=640, debug_invariants=True)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.core.scheduler.counters.num_preemptions > 0
    _check(outs, alone, "preempted")
    sched = llm.engine.core.scheduler
    assert sched.kv.all_free() and not sched.requests
    llm.shutdown()


def test_prefix_caching_hits_and_same_output():
    base = " ".join(humaneval_prompts(3)[:3])
    results = {}
    for caching in (False, True):
        llm = LLM(enable_prefix_caching=caching, max_num_seqs=4)
        tok = llm.get_tokenizer()
        prefix = tok.encode(base)[:200]
        first = {"prompt_token_ids": prefix + tok.encode("\n# first")}
        second = {"prompt_token_ids": prefix + tok.encode("\ndef second():")}
        llm.generate(first, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        out = llm.generate(second, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
        results[caching] = out
        llm.shutdown()
    assert results[False].num_cached_tokens == 0
    assert results[True].num_cached_tokens >= 192
    assert results[True].outputs[0].token_ids == results[False].outputs[0].token_ids


def test_seeded_sampling_alone_and_in_mixed_batch():
    prompts = list(humaneval_prompts(6))
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    llm = LLM(max_num_seqs=8)
    alone = llm.generate(prompts[0], seeded, use_tqdm=False)[0].outputs[0].token_ids
    mixed_params = [seeded] + [
        SamplingParams(temperature=t, max_tokens=12 + i) for i, t in enumerate([0, 1.0, 0.5, 0, 1.2])
    ]
    mixed = llm.generate(prompts[:1] + prompts[1:6], mixed_params, use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone
    # And with the batch in another order.
    again = llm.generate(prompts[1:6] + prompts[:1], mixed_params[1:] + [seeded], use_tqdm=False)
    assert again[-1].outputs[0].token_ids == alone
    other = llm.generate(prompts[0], seeded.clone(seed=99), use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone
    llm.shutdown()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(top_k=-3), "top_k"),
        (dict(n=0), "n"),
        (dict(bogus=1), "bogus"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_prompts_rejected_before_entering_engine():
    llm = LLM(max_num_seqs=4, num_kv_blocks=8, max_model_len=128)
    ok = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", ok, use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 200}, ok, use_tqdm=False)
    with pytest.raises(ValueError, match="larger than the KV cache"):
        LLM(num_kv_blocks=4, max_model_len=128)
    # Nothing leaked into the engine, and the next request is served normally.
    sched = llm.engine.core.scheduler
    assert not sched.requests and sched.kv.all_free()
    out = llm.generate("def add(a, b):", ok, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4
    llm.shutdown()
