"""Arm C, deferred reconciliation: the worker launches step N+1 from device-corrected inputs without
waiting for step N's accepted counts. Outputs must be identical to async (arm B) and sync (arm A), for
greedy and seeded random sampling, penalties and logprobs, with and without speculation; and the trace
must show that no wait on accepted counts precedes a launch."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tests.helpers import humaneval_prompts, mp_threads

pytestmark = pytest.mark.slow

ARMS = {"A": dict(async_scheduling=False), "B": dict(async_scheduling=True),
        "C": dict(async_scheduling=True, deferred_reconciliation=True)}
PARAMS = [
    SamplingParams(temperature=0, max_tokens=20, logprobs=2),
    SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=20),
    SamplingParams(temperature=0.7, seed=5, max_tokens=20, repetition_penalty=1.2,
                   frequency_penalty=0.3, presence_penalty=0.2),
    SamplingParams(temperature=0, max_tokens=20, stop=["\n\n"], min_tokens=2),
]


def _run(spec, backend: str, arm: str) -> tuple[list, dict]:
    llm = LLM(max_num_seqs=8, speculative_config=spec, executor_backend=backend,
              debug_invariants=True, **ARMS[arm], **mp_threads(backend))
    prompts = list(humaneval_prompts(8))
    outs = llm.generate(prompts, [PARAMS[i % len(PARAMS)] for i in range(len(prompts))],
                        use_tqdm=False)
    got = [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason,
            [sorted(d) for d in (o.outputs[0].logprobs or [])]) for o in outs]
    stats = llm.spec_decode_stats()
    core = llm.engine.core
    assert not core.scheduler.requests and core.scheduler.kv.all_free()
    core.check_idle_invariants()
    llm.shutdown()
    return got, stats


@pytest.mark.parametrize(
    "spec",
    # The fixed policy: the arms' speculation statistics are compared too (the adaptive one decides per step).
    [None, {"method": "ngram", "num_speculative_tokens": 3, "policy": "fixed"},
     {"method": "draft_model", "num_speculative_tokens": 2, "model": "smollm2-135m-instruct-draft", "policy": "fixed"}],
    ids=["none", "ngram", "draft"],
)
def test_arms_give_identical_outputs(spec):
    results = {arm: _run(spec, "uni", arm) for arm in ARMS}
    assert results["A"] == results["B"] == results["C"]


def test_deferred_on_mp_executor():
    spec = {"method": "ngram", "num_speculative_tokens": 3, "policy": "fixed"}
    assert _run(spec, "mp", "C") == _run(spec, "uni", "A")


def test_no_wait_on_accepted_counts_before_launch(tmp_path):
    waits = {}
    for arm in ("B", "C"):
        llm = LLM(max_num_seqs=4, trace_file=str(tmp_path / f"{arm}.json"),
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **ARMS[arm])
        llm.generate(list(humaneval_prompts(4)), SamplingParams(temperature=0, max_tokens=16),
                     use_tqdm=False)
        spans = llm.engine.tracer.spans
        waits[arm] = sum(1 for s in spans if s.name == "wait_accepted_counts")
        reconciles = [s for s in spans if s.name == "reconcile"]
        if arm == "C":
            # Each reconcile of step N happens inside step N+1, after its forward started.
            forwards = {s.args["step"]: s for s in spans if s.name == "forward"}
            for r in reconciles:
                nxt = [f for step, f in forwards.items() if step > r.args["step"]]
                assert nxt and min(nxt, key=lambda f: f.start_ns).start_ns <= r.start_ns
        llm.shutdown()
    assert waits["B"] > 0 and waits["C"] == 0


def test_deferred_needs_async():
    with pytest.raises(ValueError, match="deferred_reconciliation needs async"):
        LLM(async_scheduling=False, deferred_reconciliation=True)
