"""Scheduler unit tests with the scripted fake runner (no torch): chunked prefill, preemption and resume,
stop conditions, abort, prefix caching, placeholders. Every test ends with all blocks free."""

from __future__ import annotations

import pytest

from tandem.core.interface import ModelRunnerOutput
from tandem.core.request import InvariantError, RequestStatus
from tests.core.fake_runner import FakeModel
from tests.core.harness import assert_all_free, make_engine, make_request, record, run_to_completion


def reference_tokens(model: FakeModel, prompt: list[int], n: int, seed: int = 0) -> list[int]:
    ctx, out = list(prompt), []
    for _ in range(n):
        t = model.next_token(seed, ctx)
        out.append(t)
        ctx.append(t)
    return out


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_single_request_matches_model(async_scheduling):
    core, runner = make_engine(async_scheduling=async_scheduling)
    prompt = list(range(1, 11))
    got = run_to_completion(core, [make_request("a", prompt, max_tokens=12)])
    assert got["a"].tokens == reference_tokens(runner.model, prompt, 12)
    assert got["a"].finish_reason == "length" and got["a"].finishes == 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prefill(async_scheduling):
    core, runner = make_engine(async_scheduling=async_scheduling, max_num_batched_tokens=7)
    prompts = {f"r{i}": [1 + (i * 7 + j) % 50 for j in range(20 + i)] for i in range(3)}
    chunks = []

    def watch(step, core, delivered):
        chunks.append(core.scheduler.counters.num_steps)

    reqs = [make_request(rid, p, max_tokens=5) for rid, p in prompts.items()]
    got = run_to_completion(core, reqs, on_step=watch)
    for rid, p in prompts.items():
        assert got[rid].tokens == reference_tokens(runner.model, p, 5)
    # 20+ token prompts under a 7-token budget need several chunks each.
    assert core.scheduler.counters.num_steps >= (20 + 21 + 22) // 7


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_without_chunked_prefill_a_prompt_is_prefilled_whole_or_waits(async_scheduling):
    """vLLM's enable_chunked_prefill=False: the head of the queue waits for a step with room for its whole
    prompt (FCFS: nobody overtakes it), and outputs are those of the model."""
    core, runner = make_engine(async_scheduling=async_scheduling, max_num_batched_tokens=10,
                               enable_chunked_prefill=False)
    prompts = {"r0": list(range(1, 9)), "r1": list(range(11, 19)), "r2": [3, 4]}
    for rid, p in prompts.items():
        core.add_request(make_request(rid, p, max_tokens=4))
    so = core.scheduler.schedule()
    assert so.num_scheduled_tokens == {"r0": 8}  # r1 does not fit whole in the 2 left, r2 may not overtake
    core.scheduler.update_from_output(so, core.executor.execute_model(so).result())
    reqs = [core.scheduler.requests[rid] for rid in ("r0", "r1", "r2")]
    for req in reqs:
        core.scheduler.abort_requests([req.request_id])
    assert_all_free(core)
    core, runner = make_engine(async_scheduling=async_scheduling, max_num_batched_tokens=10,
                               enable_chunked_prefill=False)
    got = run_to_completion(core, [make_request(rid, p, max_tokens=4) for rid, p in prompts.items()])
    for rid, p in prompts.items():
        assert got[rid].tokens == reference_tokens(runner.model, p, 4)


def test_schedule_respects_budgets():
    core, _ = make_engine(async_scheduling=False, max_num_batched_tokens=10, max_num_seqs=2)
    for i in range(4):
        core.add_request(make_request(f"r{i}", list(range(1, 9)), max_tokens=3))
    so = core.scheduler.schedule()
    assert so.total_num_scheduled_tokens <= 10
    assert len(so.num_scheduled_tokens) <= 2
    assert so.num_scheduled_tokens == {"r0": 8, "r1": 2}  # FCFS; r1 gets a chunk
    assert so.sampling_req_ids == {"r0"}
    req0 = core.scheduler.requests["r0"]
    assert req0.num_computed_tokens == 8 and req0.num_output_placeholders == 1
    out = core.executor.execute_model(so).result()
    core.scheduler.update_from_output(so, out)
    assert req0.num_output_placeholders == 0 and req0.num_output_tokens == 1
    core.scheduler.check_invariants()
    core.abort_requests(list(core.scheduler.requests))
    assert_all_free(core)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_preemption_and_resume(async_scheduling):
    # 12 blocks of 4 tokens cannot hold three 10-token prompts growing to 30 tokens: preempt.
    core, runner = make_engine(
        async_scheduling=async_scheduling, num_blocks=12, block_size=4, max_model_len=48
    )
    prompts = {f"r{i}": [1 + (3 * i + j) % 40 for j in range(10)] for i in range(3)}
    reqs = [make_request(rid, p, max_tokens=20) for rid, p in prompts.items()]
    got = run_to_completion(core, reqs)
    assert core.scheduler.counters.num_preemptions > 0
    for rid, p in prompts.items():
        assert got[rid].tokens == reference_tokens(runner.model, p, 20), rid
        assert got[rid].finishes == 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stop_token_and_eos(async_scheduling):
    model = FakeModel()
    prompt = list(range(1, 9))
    ref = reference_tokens(model, prompt, 30)
    stop_at = ref[6]
    first = ref.index(stop_at)
    core, _ = make_engine(async_scheduling=async_scheduling, model=model)
    reqs = [
        make_request("stop", prompt, max_tokens=30, stop_token_ids=[stop_at]),
        make_request("eos", prompt, eos=stop_at, max_tokens=30),
        make_request("ignore", prompt, eos=stop_at, max_tokens=30, ignore_eos=True),
        make_request("min", prompt, eos=stop_at, max_tokens=30, min_tokens=first + 2),
    ]
    got = run_to_completion(core, reqs)
    assert got["stop"].tokens == ref[: first + 1] and got["stop"].finish_reason == "stop"
    assert got["eos"].tokens == ref[: first + 1] and got["eos"].finish_reason == "stop"
    assert got["ignore"].tokens == ref and got["ignore"].finish_reason == "length"
    # min_tokens: a stop token before min_tokens does not stop (the real sampler masks it instead).
    later = [i for i, t in enumerate(ref) if t == stop_at and i > first]
    expect = ref[: later[0] + 1] if later else ref
    assert got["min"].tokens == expect


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_max_model_len(async_scheduling):
    core, runner = make_engine(async_scheduling=async_scheduling, max_model_len=16, k=3)
    prompt = list(range(1, 11))
    got = run_to_completion(core, [make_request("a", prompt, max_tokens=100)])
    assert len(prompt) + len(got["a"].tokens) == 16
    assert got["a"].finish_reason == "length"
    assert got["a"].tokens == reference_tokens(runner.model, prompt, 6)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_abort_waiting_running_and_in_flight(async_scheduling):
    core, _ = make_engine(async_scheduling=async_scheduling, max_num_seqs=2)
    for i in range(4):
        core.add_request(make_request(f"r{i}", list(range(1, 9)), max_tokens=50))
    delivered = {}
    record(delivered, core.step())
    record(delivered, core.step())
    # r0/r1 running (maybe in flight), r2/r3 waiting: abort one of each.
    assert core.abort_requests(["r1", "r3", "nope"]) == ["r1", "r3"]
    while core.has_unfinished_requests():
        record(delivered, core.step())
    assert "r3" not in delivered or not delivered["r3"].tokens
    assert len(delivered["r0"].tokens) == 50 and len(delivered["r2"].tokens) == 50
    assert_all_free(core)


def test_prefix_cache_hit_and_same_output():
    model = FakeModel()
    prompt = [1 + (j * 5) % 60 for j in range(40)]
    outs = {}
    for caching in (False, True):
        core, _ = make_engine(async_scheduling=False, prefix_caching=caching, block_size=4)
        run_to_completion(core, [make_request("first", prompt + [7], max_tokens=4)])
        got = run_to_completion(core, [make_request("second", prompt + [9, 9], max_tokens=6)])
        outs[caching] = got["second"]
    assert outs[True].tokens == outs[False].tokens == reference_tokens(model, prompt + [9, 9], 6)
    assert outs[False].num_cached_tokens == 0
    assert outs[True].num_cached_tokens == 40  # 10 full blocks of the shared prefix


def test_prefix_cache_only_up_to_confirmed_frontier():
    core, _ = make_engine(async_scheduling=True, block_size=4, max_num_batched_tokens=8)
    req = make_request("a", list(range(1, 21)), max_tokens=4)
    core.add_request(req)
    core.step()  # chunk 0..7 launched, nothing back yet
    core.step()  # chunk 8..15 launched, chunk 0..7 back
    pool = core.scheduler.kv.pool
    # Only the first chunk's two blocks came back; the in-flight chunk must not be cached yet.
    assert pool.num_cached_blocks == 2
    assert req.completed_frontier == 8
    run_to_completion(core)


def test_stale_output_after_preemption_changes_nothing():
    core, _ = make_engine(async_scheduling=True, k=2)
    req = make_request("a", list(range(1, 9)), max_tokens=40)
    core.add_request(req)
    for _ in range(4):
        core.step()
    assert req.inflight, "a step should be in flight"
    sched = core.scheduler
    sched.running.remove(req)
    sched._preempt(req)
    assert req.num_output_placeholders == 0 and req.num_computed_tokens == 0
    before = (list(req.output_token_ids), req.num_computed_tokens)
    so, fut = core._queue.popleft()
    outs = sched.update_from_output(so, fut.result())
    assert outs == [] and (list(req.output_token_ids), req.num_computed_tokens) == before
    assert sched.counters.num_stale_outputs == 1
    run_to_completion(core)


def test_invariant_violation_is_reported():
    core, _ = make_engine(async_scheduling=False)
    core.add_request(make_request("a", [1, 2, 3], max_tokens=5))
    so = core.scheduler.schedule()
    bad = ModelRunnerOutput(req_ids=["a"], sampled_token_ids=[[5, 6, 7]])  # 3 tokens, no drafts
    with pytest.raises(InvariantError):
        core.scheduler.update_from_output(so, bad)


def test_bad_requests_rejected_before_entering():
    with pytest.raises(ValueError, match="larger than the KV cache can hold"):
        make_engine(async_scheduling=False, num_blocks=4, block_size=4, max_model_len=64)
    core, _ = make_engine(async_scheduling=False, num_blocks=4, block_size=4, max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len"):
        core.add_request(make_request("long", list(range(1, 17)), max_tokens=1))
    with pytest.raises(ValueError, match="at least one token"):
        make_request("empty", [], max_tokens=1)
    core.add_request(make_request("ok", [1, 2], max_tokens=1))
    with pytest.raises(ValueError, match="already in use"):
        core.add_request(make_request("ok", [1, 2], max_tokens=1))
    got = run_to_completion(core)
    assert len(got["ok"].tokens) == 1


def test_finished_request_status_values():
    assert RequestStatus.FINISHED_ABORTED.finished and not RequestStatus.RUNNING.finished
    assert RequestStatus.FINISHED_LENGTH.finish_reason == "length"
