"""Constraints that must stay exact under speculation and async scheduling (offline ``LLM``).

- Penalties, bad words and logit bias: 16 prompts with non-trivial settings, greedy; ngram and
  draft-model speculation with async off, on and deferred give the no-speculation tokens (near-tie
  rule of ``tests/helpers.py``), and no output contains a banned word's token sequence.
- Logprobs: greedy sample logprobs of the accepted tokens and prompt logprobs are the same, within
  1e-4, with and without speculation, async off and on.
- Preemption: structured requests under speculation with a KV cache far too small for all of them
  are preempted mid-generation, resume with a rebuilt grammar state and still produce valid JSON
  equal to the unpreempted run's.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tandem import LLM, SamplingParams
from tandem.sample.bad_words import tokenize_bad_words
from tests.helpers import assert_greedy_match, humaneval_prompts
from tests.structured.schemas import requests_50

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
SELF_DRAFT = {"method": "draft_model", "num_speculative_tokens": 3, "model": MODEL}
N_PROMPTS = 16
MAX_TOKENS = 32


def _penalty_params(i: int) -> SamplingParams:
    """A different, non-trivial mix per prompt (always greedy, logprobs for the near-tie rule)."""
    mixes: list[dict[str, Any]] = [
        {"repetition_penalty": 1.3},
        {"frequency_penalty": 0.8, "presence_penalty": 0.4},
        {"presence_penalty": 1.0, "bad_words": ["return", " if"]},
        {"bad_words": ["    ", "(", "def"], "frequency_penalty": 0.3},
        {"repetition_penalty": 1.15, "presence_penalty": -0.5, "bad_words": ["\n\n"]},
        {"logit_bias": {28: 4.0, 30: -5.0}, "frequency_penalty": 0.5},
        {"repetition_penalty": 0.9, "bad_words": ["return None"]},
        {"frequency_penalty": 1.5, "bad_words": ["for i in range"]},
    ]
    return SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True, **mixes[i % len(mixes)]
    )


PARAMS = [_penalty_params(i) for i in range(N_PROMPTS)]
ARMS = {
    "ngram-sync": {"speculative_config": NGRAM, "async_scheduling": False},
    "ngram-async": {"speculative_config": NGRAM, "async_scheduling": True},
    "ngram-deferred": {
        "speculative_config": NGRAM, "async_scheduling": True, "deferred_reconciliation": True,
    },
    "self-draft-async": {"speculative_config": SELF_DRAFT, "async_scheduling": True},
}


def _run(**kw: Any) -> tuple[list, dict]:
    llm = LLM(MODEL, max_num_seqs=8, debug_invariants=True, **kw)
    try:
        outs = llm.generate(list(humaneval_prompts(N_PROMPTS)), PARAMS, use_tqdm=False)
        stats = llm.spec_decode_stats()
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        return [o.outputs[0] for o in outs], stats
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def reference() -> list:
    outs, _ = _run(async_scheduling=False)
    return outs


def _contains(seq: list[int], sub: tuple[int, ...]) -> bool:
    n = len(sub)
    return any(tuple(seq[i : i + n]) == sub for i in range(len(seq) - n + 1))


def test_bad_words_never_produced(reference: list) -> None:
    from tandem.model.loader import load_tokenizer

    tok = load_tokenizer(MODEL)
    for i, (p, out) in enumerate(zip(PARAMS, reference)):
        words = tokenize_bad_words(p.bad_words, lambda t: tok.encode(t, add_special_tokens=False))
        for w in words:
            assert not _contains(out.token_ids, w), f"#{i}: bad word {w} in {out.text!r}"


@pytest.mark.parametrize("arm", list(ARMS))
def test_penalties_and_bad_words_spec_equals_no_spec(reference: list, arm: str) -> None:
    outs, stats = _run(**ARMS[arm])
    identical = sum(
        assert_greedy_match(r.token_ids, r.logprobs, o.token_ids, label=f"{arm} #{i}")
        for i, (r, o) in enumerate(zip(reference, outs))
    )
    assert identical >= N_PROMPTS - 2
    assert stats["num_drafts"] > 0
    if arm == "self-draft-async":
        # The draft does not see penalties or bad words, so it is sometimes rejected; the verify
        # rows see them with the draft prefix as context, which is what keeps the tokens exact.
        assert stats["num_accepted_tokens"] < stats["num_draft_tokens"]


# -- logprobs -------------------------------------------------------------------------------------
LP_PARAMS = SamplingParams(
    temperature=0.0, max_tokens=24, logprobs=3, prompt_logprobs=2, ignore_eos=True
)
LP_ARMS = {
    "nospec-async": {"async_scheduling": True},
    "ngram-sync": {"speculative_config": NGRAM, "async_scheduling": False},
    "ngram-async": {"speculative_config": NGRAM, "async_scheduling": True},
    "ngram-deferred": {
        "speculative_config": NGRAM, "async_scheduling": True, "deferred_reconciliation": True,
    },
}


def _lp_run(**kw: Any) -> list:
    llm = LLM(MODEL, max_num_seqs=8, **kw)
    try:
        return llm.generate(list(humaneval_prompts(8)), LP_PARAMS, use_tqdm=False)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def lp_reference() -> list:
    return _lp_run(async_scheduling=False)


def _close(a: dict, b: dict, where: str, token: int | None = None) -> None:
    """Same entries up to 1e-4 (top-n membership may differ only between near-equal tokens)."""
    assert len(a) == len(b), where
    if token is not None:
        assert token in a and token in b, where
    for tid in set(a) & set(b):
        assert abs(a[tid].logprob - b[tid].logprob) < 1e-4, f"{where}: token {tid}"
    for tid in set(a) ^ set(b):
        lp = a[tid].logprob if tid in a else b[tid].logprob
        others = b if tid in a else a
        assert min(abs(lp - x.logprob) for x in others.values()) < 1e-4, f"{where}: {tid}"


@pytest.mark.parametrize("arm", list(LP_ARMS))
def test_logprobs_identical_under_spec_and_async(lp_reference: list, arm: str) -> None:
    outs = _lp_run(**LP_ARMS[arm])
    for i, (r, o) in enumerate(zip(lp_reference, outs)):
        rc, oc = r.outputs[0], o.outputs[0]
        if not assert_greedy_match(rc.token_ids, rc.logprobs, oc.token_ids, label=f"{arm} #{i}"):
            continue  # diverged at a proven near-tie: the logprobs after it describe other text
        assert len(rc.logprobs) == len(oc.logprobs) == len(rc.token_ids)
        for j, (a, b) in enumerate(zip(rc.logprobs, oc.logprobs)):
            _close(a, b, f"{arm} #{i} token {j}", rc.token_ids[j])
        assert r.prompt_logprobs is not None and o.prompt_logprobs is not None
        assert len(r.prompt_logprobs) == len(o.prompt_logprobs) == len(r.prompt_token_ids)
        assert r.prompt_logprobs[0] is None and o.prompt_logprobs[0] is None
        for j, (a, b) in enumerate(zip(r.prompt_logprobs[1:], o.prompt_logprobs[1:])):
            _close(a, b, f"{arm} #{i} prompt token {j + 1}", r.prompt_token_ids[j + 1])


# -- preemption -----------------------------------------------------------------------------------
PREEMPT_REQS = [requests_50()[i] for i in range(0, 50, 3)]  # 17 requests, every schema


def _structured_chat(**kw: Any) -> tuple[list, int, dict]:
    llm = LLM(MODEL, debug_invariants=True, **kw)
    try:
        params = [
            SamplingParams(
                temperature=0.0, max_tokens=96, logprobs=2, structured_outputs={"json": schema}
            )
            for _, schema, _ in PREEMPT_REQS
        ]
        outs = llm.chat([m for _, _, m in PREEMPT_REQS], params, use_tqdm=False)
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        return [o.outputs[0] for o in outs], sched.counters.num_preemptions, llm.spec_decode_stats()
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def structured_reference() -> list:
    ref, preemptions, _ = _structured_chat(max_num_seqs=8, async_scheduling=False)
    assert preemptions == 0
    return ref


@pytest.mark.parametrize("spec", ["ngram", "self-draft"])
def test_preempted_structured_request_resumes_consistently(
    structured_reference: list, spec: str
) -> None:
    cfg = NGRAM if spec == "ngram" else SELF_DRAFT
    ref = structured_reference
    # 24 blocks of 16 tokens for 8 concurrent requests of ~150 tokens each: constant preemption.
    outs, preemptions, stats = _structured_chat(
        max_num_seqs=8, num_kv_blocks=24, max_model_len=384, async_scheduling=True,
        speculative_config=cfg,
    )
    assert preemptions > 0
    assert stats["num_drafts"] > 0
    for i, ((kind, schema, _), r, o) in enumerate(zip(PREEMPT_REQS, ref, outs)):
        assert o.finish_reason == "stop", f"#{i} ({kind}): {o.text!r}"
        jsonschema.validate(json.loads(o.text), schema)
        assert_greedy_match(r.token_ids, r.logprobs, o.token_ids, label=f"{spec} #{i}")
