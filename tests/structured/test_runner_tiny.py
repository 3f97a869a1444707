"""Structured outputs through the whole engine on a tiny random checkpoint (seconds, no real model).

A random model has no idea of any format, so every valid output here is the grammar's doing. The
regex forces alternating "ab"/"ba" pairs and a final "c"; the prompt repeats "abx", so the n-gram
proposer keeps drafting an "x" that the grammar refuses: those drafts are cut and counted. Greedy
tokens are identical with and without speculation, async off, on and deferred; random sampling
(seeded) stays inside the grammar; a KV cache too small for the batch preempts requests, which
resume with a rebuilt matcher and the unpreempted tokens; bad words hold under speculation too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tandem import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("xgrammar")

REGEX = r"(ab|ba){2,5}c"
PROMPTS = ["abx abx abx ab", "the cat sat on the mat abx", "ba ba ba abx ab", "hello there"] * 2
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.model.test_loader_hf import save_tiny

    directory, _ = save_tiny(tmp_path_factory.mktemp("tiny"), "llama")
    return directory


def _params(temperature: float = 0.0, **kw: Any) -> SamplingParams:
    return SamplingParams(
        temperature=temperature, seed=7, max_tokens=24, structured_outputs={"regex": REGEX}, **kw
    )


def _generate(model: Path, params: list[SamplingParams], **kw: Any) -> tuple[list, dict, int]:
    llm = LLM(str(model), max_num_seqs=4, debug_invariants=True, **kw)
    try:
        outs = llm.generate(PROMPTS[: len(params)], params, use_tqdm=False)
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        stats = llm.spec_decode_stats()
        return [o.outputs[0] for o in outs], stats, sched.counters.num_preemptions
    finally:
        llm.shutdown()


ARMS: dict[str, dict[str, Any]] = {
    "nospec-async": {"async_scheduling": True},
    "ngram-sync": {"speculative_config": NGRAM, "async_scheduling": False},
    "ngram-async": {"speculative_config": NGRAM, "async_scheduling": True},
    "ngram-deferred": {
        "speculative_config": NGRAM, "async_scheduling": True, "deferred_reconciliation": True,
    },
}


@pytest.fixture(scope="module")
def greedy_reference(tiny_dir: Path) -> list:
    outs, _, _ = _generate(tiny_dir, [_params()] * len(PROMPTS), async_scheduling=False)
    for o in outs:
        assert re.fullmatch(REGEX, o.text), o.text
        assert o.finish_reason == "stop"
    return outs


@pytest.mark.parametrize("arm", list(ARMS))
def test_greedy_identical_and_invalid_drafts_counted(
    tiny_dir: Path, greedy_reference: list, arm: str
) -> None:
    outs, stats, _ = _generate(tiny_dir, [_params()] * len(PROMPTS), **ARMS[arm])
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]
    if arm.startswith("ngram"):
        assert stats["num_drafts"] > 0
        assert stats["num_invalid_spec_tokens"] > 0


def test_invalid_drafts_same_count_async_off_and_on(tiny_dir: Path) -> None:
    params = [_params()] * len(PROMPTS)
    counts = [
        _generate(tiny_dir, params, **ARMS[arm])[1] for arm in ("ngram-sync", "ngram-deferred")
    ]
    assert counts[0] == counts[1]


@pytest.mark.parametrize("arm", ["ngram-sync", "ngram-async"])
def test_random_sampling_stays_in_grammar(tiny_dir: Path, arm: str) -> None:
    params = [_params(temperature=1.0).clone(seed=i) for i in range(len(PROMPTS))]
    outs, _, _ = _generate(tiny_dir, params, **ARMS[arm])
    for o in outs:
        assert re.fullmatch(REGEX, o.text), o.text


def test_preemption_resumes_grammar(tiny_dir: Path, greedy_reference: list) -> None:
    # 6 blocks of 4 tokens for 4 concurrent requests of ~25 tokens: preemption all the time.
    params = [_params()] * len(PROMPTS)
    outs, stats, preemptions = _generate(
        tiny_dir, params, speculative_config=NGRAM, async_scheduling=True, num_kv_blocks=12,
        block_size=4, max_model_len=48,
    )
    assert preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]


def test_draft_model_as_its_own_draft(tiny_dir: Path, greedy_reference: list) -> None:
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": str(tiny_dir)}
    outs, stats, _ = _generate(
        tiny_dir, [_params()] * len(PROMPTS), speculative_config=spec, async_scheduling=True
    )
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]
    # Valid drafts are exactly the constrained target's choices; the rest were cut, not rejected.
    assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]
    assert stats["num_invalid_spec_tokens"] > 0


def test_bad_words_and_penalties_under_speculation(tiny_dir: Path) -> None:
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, bad_words=["ab", "t"],
                       repetition_penalty=1.3, frequency_penalty=0.4),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, bad_words=["x", "q"],
                       presence_penalty=0.7),
    ] * 4
    ref, _, _ = _generate(tiny_dir, params, async_scheduling=False)
    for arm in ("ngram-sync", "ngram-deferred"):
        outs, stats, _ = _generate(tiny_dir, params, **ARMS[arm])
        assert [o.token_ids for o in outs] == [o.token_ids for o in ref], arm
    for p, o in zip(params, ref):
        for word in p.bad_words:
            assert word not in o.text, (word, o.text)
