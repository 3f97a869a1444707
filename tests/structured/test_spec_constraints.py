"""Constraints that must stay exact under speculation and async scheduling (offline ``LLM``).

- Penalties, bad words, logit bias, allowed token ids: 16 prompts, each with a different non-trivial
  mix, greedy. Every speculation arm (n-gram, the target as its own draft, EAGLE; async off, on and
  deferred) gives the no-speculation tokens, and no output holds a banned word's token sequence. The
  verify rows see the committed outputs plus the draft prefix as context (a draft the penalties turn
  against is rejected there); on the tiny random checkpoint for every arm, and on the real model (8
  prompts) for the arm that rejects most: the target as its own draft, which never sees penalties.
- Logprobs: sample logprobs of the accepted tokens and prompt logprobs are the same, within 1e-4,
  with and without speculation, async off and on.
- Preemption (real model; every proposer on the tiny one in ``test_runner_tiny.py``): JSON-schema
  requests under speculation with a KV cache too small for them are preempted mid-generation, resume
  with a rebuilt grammar state, and give valid JSON equal to the unpreempted run's.
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
from tests.structured.tiny import arms, generate, make_tiny

pytest.importorskip("transformers")
pytest.importorskip("xgrammar")

MODEL = "smollm2-135m-instruct"
N_PROMPTS = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


def _contains(seq: list[int], sub: tuple[int, ...]) -> bool:
    n = len(sub)
    return any(tuple(seq[i : i + n]) == sub for i in range(len(seq) - n + 1))


def _check_bad_words(tokenizer: Any, params: list[SamplingParams], outs: list) -> None:
    for i, (p, out) in enumerate(zip(params, outs)):
        words = tokenize_bad_words(
            p.bad_words, lambda t: tokenizer.encode(t, add_special_tokens=False)
        )
        for w in words:
            assert not _contains(out.token_ids, w), f"#{i}: bad word {w} in {out.text!r}"


def _assert_same(ref: list, outs: list, label: str, min_identical: int) -> None:
    identical = sum(
        assert_greedy_match(r.token_ids, r.logprobs, o.token_ids, label=f"{label} #{i}")
        for i, (r, o) in enumerate(zip(ref, outs))
    )
    assert identical >= min_identical, f"{label}: only {identical} identical"


# -- tiny checkpoint: every arm ------------------------------------------------------------------
TINY_PROMPTS = [
    "abx abx abx ab", "the cat sat on the mat the cat", "hello hello hello", "ba ba ba abx ab",
    "the the the the", "x y z x y z x", "he he he", "one two one two one",
    "qqqq qqqq", "the he the he the", "a b a b a b", "zzz yyy zzz yyy",
    "t t t t t", "cat mat cat mat", "abc abc abc", "hello there the",
]  # fmt: skip
TINY_MIXES: list[dict[str, Any]] = [
    {"repetition_penalty": 1.5},
    {"frequency_penalty": 1.0, "presence_penalty": 0.5},
    {"presence_penalty": 1.5, "bad_words": ["he", "t"]},
    {"bad_words": ["ab", "x"], "frequency_penalty": 0.4},
    {"repetition_penalty": 1.2, "presence_penalty": -0.5, "bad_words": ["the"]},
    {"logit_bias": {64: 3.0, 65: 2.0, 97: -4.0}, "frequency_penalty": 0.6},
    {"repetition_penalty": 0.8, "bad_words": ["a b"]},
    {"allowed_token_ids": list(range(64, 96)), "frequency_penalty": 0.5},
]


def _tiny_params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2,
                       **TINY_MIXES[i % len(TINY_MIXES)])
        for i in range(N_PROMPTS)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_reference(tiny: dict[str, Any]) -> list:
    outs, _, _ = generate(tiny["target"], TINY_PROMPTS, _tiny_params(), max_num_seqs=8)
    return [o.outputs[0] for o in outs]


def test_tiny_penalties_matter_and_bad_words_never_produced(
    tiny: dict[str, Any], tiny_reference: list
) -> None:
    from tandem.model.loader import load_tokenizer

    _check_bad_words(load_tokenizer(str(tiny["target"])), _tiny_params(), tiny_reference)
    plain = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * N_PROMPTS
    outs, _, _ = generate(tiny["target"], TINY_PROMPTS, plain, max_num_seqs=8)
    changed = sum(o.outputs[0].token_ids != r.token_ids for o, r in zip(outs, tiny_reference))
    assert changed >= N_PROMPTS - 2, f"the settings change only {changed} outputs"


@pytest.mark.parametrize(
    "arm", ["nospec-async", "ngram-sync", "ngram-deferred", "draft-async", "eagle-sync",
            "eagle-async", "eagle-deferred"],
)  # fmt: skip
def test_tiny_penalties_spec_equals_no_spec(
    tiny: dict[str, Any], tiny_reference: list, arm: str
) -> None:
    outs, stats, _ = generate(
        tiny["target"], TINY_PROMPTS, _tiny_params(), max_num_seqs=8, **arms(tiny)[arm]
    )
    _assert_same(tiny_reference, [o.outputs[0] for o in outs], arm, N_PROMPTS)
    if arm != "nospec-async":
        assert stats["num_drafts"] > 0
    if arm == "draft-async":
        # The draft does not see penalties or bad words, so it is rejected where they bite.
        assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]


# -- tiny checkpoint: logprobs ---------------------------------------------------------------------
LP_PARAMS = SamplingParams(
    temperature=0.0, max_tokens=20, logprobs=3, prompt_logprobs=2, ignore_eos=True
)


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


@pytest.fixture(scope="module")
def lp_reference(tiny: dict[str, Any]) -> list:
    outs, _, _ = generate(tiny["target"], TINY_PROMPTS[:8], [LP_PARAMS] * 8, async_scheduling=False)
    return outs


@pytest.mark.parametrize("arm", ["ngram-sync", "ngram-deferred", "draft-async", "eagle-async"])
def test_logprobs_identical_under_spec_and_async(
    tiny: dict[str, Any], lp_reference: list, arm: str
) -> None:
    outs, stats, _ = generate(tiny["target"], TINY_PROMPTS[:8], [LP_PARAMS] * 8, **arms(tiny)[arm])
    assert stats["num_drafts"] > 0
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


# -- real model ------------------------------------------------------------------------------------
REAL_MIXES: list[dict[str, Any]] = [
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 0.8, "presence_penalty": 0.4},
    {"presence_penalty": 1.0, "bad_words": ["return", " if"]},
    {"bad_words": ["    ", "(", "def"], "frequency_penalty": 0.3},
    {"repetition_penalty": 1.15, "presence_penalty": -0.5, "bad_words": ["\n\n"]},
    {"logit_bias": {28: 4.0, 30: -5.0}, "frequency_penalty": 0.5},
    {"repetition_penalty": 0.9, "bad_words": ["return None"]},
    {"frequency_penalty": 1.5, "bad_words": ["for i in range"]},
]
REAL_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True, **mix)
    for mix in REAL_MIXES
]
SELF_DRAFT = {"method": "draft_model", "num_speculative_tokens": 3, "model": MODEL}


def _real(params: list[SamplingParams], prompts: list[str], **kw: Any) -> tuple[list, dict]:
    llm = LLM(MODEL, max_num_seqs=16, num_kv_blocks=256, debug_invariants=True, **kw)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.spec_decode_stats()
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        return [o.outputs[0] for o in outs], stats
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_real_model_penalties_self_draft_equals_no_spec() -> None:
    from tandem.model.loader import load_tokenizer

    prompts = list(humaneval_prompts(len(REAL_PARAMS)))
    ref, _ = _real(REAL_PARAMS, prompts, async_scheduling=False)
    _check_bad_words(load_tokenizer(MODEL), REAL_PARAMS, ref)
    outs, stats = _real(REAL_PARAMS, prompts, async_scheduling=True, speculative_config=SELF_DRAFT)
    _assert_same(ref, outs, "self-draft-async", len(REAL_PARAMS) - 1)
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]


PREEMPT_REQS = [requests_50()[i] for i in (0, 33)]  # a person, a weather report (~30-60 tokens)
# Every draft verified: this test is about drafts and grammar state across preemption, not the speculation
# policy's choice (with shadow drafts, the adaptive policy may rightly verify none on these JSON replies).
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "policy": "fixed"}


def _structured_chat(**kw: Any) -> tuple[list, int, dict]:
    llm = LLM(MODEL, debug_invariants=True, max_num_seqs=2, max_model_len=112, **kw)
    try:
        params = [
            SamplingParams(
                temperature=0.0, max_tokens=64, logprobs=2, structured_outputs={"json": schema}
            )
            for _, schema, _ in PREEMPT_REQS
        ]
        outs = llm.chat([m for _, _, m in PREEMPT_REQS], params, use_tqdm=False)
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        return [o.outputs[0] for o in outs], sched.counters.num_preemptions, llm.spec_decode_stats()
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_real_model_preempted_structured_requests_resume_consistently() -> None:
    ref, preemptions, _ = _structured_chat(num_kv_blocks=64, async_scheduling=False)
    assert preemptions == 0
    # 7 blocks of 16 tokens for 2 concurrent requests of ~60 and ~90 tokens: preempted as they grow.
    outs, preemptions, stats = _structured_chat(
        num_kv_blocks=7, async_scheduling=True, speculative_config=NGRAM
    )
    assert preemptions > 0
    assert stats["num_drafts"] > 0
    for i, ((kind, schema, _), r, o) in enumerate(zip(PREEMPT_REQS, ref, outs)):
        assert r.finish_reason == o.finish_reason == "stop", f"#{i} ({kind}): {o.text!r}"
        jsonschema.validate(json.loads(o.text), schema)
        assert_greedy_match(r.token_ids, r.logprobs, o.token_ids, label=f"preempted #{i}")
