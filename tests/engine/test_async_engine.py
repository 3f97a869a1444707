"""Async scheduling on the real default model: greedy outputs with async on equal async off for 32
HumanEval prompts at concurrency 8, on the ``uni`` and ``mp`` executors, with prefix caching, with
preemptions forced by a small KV cache, and with random aborts mid-flight (near-tie rule applies).
Every run checks all invariants after every step (debug mode) and ends with all blocks free."""

from __future__ import annotations

import random

import pytest

from tandem import LLM, SamplingParams
from tandem.core.request import Request
from tests.helpers import assert_greedy_match, humaneval_prompts, mp_threads

pytestmark = pytest.mark.slow

N_PROMPTS = 32
MAX_TOKENS = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)


def _run(**kwargs) -> tuple[list, LLM]:
    llm = LLM(max_num_seqs=8, debug_invariants=True, **kwargs, **mp_threads(kwargs.get("executor_backend")))
    outs = llm.generate(list(humaneval_prompts(N_PROMPTS)), GREEDY, use_tqdm=False)
    return [o.outputs[0] for o in outs], llm


@pytest.fixture(scope="module")
def reference() -> list:
    outs, llm = _run(async_scheduling=False)
    llm.shutdown()
    return outs


def _compare(outs, reference, label):
    identical = sum(
        assert_greedy_match(r.token_ids, r.logprobs, o.token_ids, label=f"{label} #{i}")
        for i, (r, o) in enumerate(zip(reference, outs))
    )
    assert identical >= len(reference) - 2


def _assert_clean(llm: LLM) -> None:
    core = llm.engine.core
    assert not core.scheduler.requests and core.scheduler.kv.all_free()
    core.check_idle_invariants()


@pytest.mark.parametrize(
    "backend, async_on", [("uni", True), ("mp", False), ("mp", True)], ids=["uni-on", "mp-off", "mp-on"]
)
def test_async_equals_sync(reference, backend, async_on):
    outs, llm = _run(async_scheduling=async_on, executor_backend=backend)
    assert llm.async_scheduling.resolved is async_on
    _compare(outs, reference, f"{backend} async={async_on}")
    # Second pass: the same prompts again hit the prefix cache and must not change a token.
    again = llm.generate(list(humaneval_prompts(N_PROMPTS)), GREEDY, use_tqdm=False)
    assert sum(o.num_cached_tokens for o in again) > 0
    _compare([o.outputs[0] for o in again], reference, f"{backend} cached")
    _assert_clean(llm)
    llm.shutdown()


@pytest.mark.parametrize("async_on", [False, True], ids=["off", "on"])
def test_preemption_small_kv_cache(reference, async_on):
    outs, llm = _run(async_scheduling=async_on, num_kv_blocks=36, max_model_len=576)
    assert llm.engine.core.scheduler.counters.num_preemptions > 0
    _compare(outs, reference, f"preempted async={async_on}")
    _assert_clean(llm)
    llm.shutdown()


@pytest.mark.parametrize("backend", ["uni", "mp"])
def test_random_aborts_mid_flight(reference, backend):
    llm = LLM(max_num_seqs=8, async_scheduling=True, executor_backend=backend, debug_invariants=True,
              **mp_threads(backend))
    core, tok = llm.engine.core, llm.tokenizer
    eos = tok.eos_token_ids
    rng = random.Random(7)
    prompts = humaneval_prompts(N_PROMPTS)
    for i, p in enumerate(prompts):
        core.add_request(Request(str(i), tok.encode(p), GREEDY, eos_token_ids=eos, seed=i))
    to_abort = set(rng.sample(range(N_PROMPTS), 10))
    delivered: dict[str, list[int]] = {str(i): [] for i in range(N_PROMPTS)}
    finished: set[str] = set()
    aborted: set[str] = set()
    step = 0
    while core.has_unfinished_requests():
        step += 1
        for o in core.step():
            assert o.req_id not in finished and o.req_id not in aborted
            delivered[o.req_id].extend(o.new_token_ids)
            if o.finish_reason is not None:
                finished.add(o.req_id)
        for i in sorted(to_abort):
            rid = str(i)
            live = core.scheduler.requests.get(rid)
            # Abort while a step for it is in flight, after it produced a few tokens.
            if live is not None and live.inflight and len(delivered[rid]) >= rng.randint(1, 8):
                core.abort_requests([rid])
                aborted.add(rid)
                to_abort.discard(i)
    assert aborted, "no abort happened mid-flight"
    for i, ref in enumerate(reference):
        got = delivered[str(i)]
        if str(i) in aborted:
            assert_greedy_match(ref.token_ids[: len(got)], ref.logprobs, got, label=f"aborted #{i}")
        else:
            assert str(i) in finished
            assert_greedy_match(ref.token_ids, ref.logprobs, got, label=f"survivor #{i}")
    _assert_clean(llm)
    llm.shutdown()
