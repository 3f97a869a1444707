"""Fuzz the scheduler accounting with the scripted fake runner: 2,000+ random scenarios.

Each scenario draws arrivals, prompt lengths, max_tokens, stop tokens, EOS, aborts, KV pressure (small
pools force preemption), chunked prefill budgets and speculative accepted counts (k drafts with random
corruption, as many verified as the fixed or the adaptive speculation policy chooses), then runs it with
the sync scheduler and with the async scheduler (queue depth 2).
Checked after every step (debug mode): every request and block-pool invariant. Checked at the end: every
surviving request's tokens equal the sync run's and the model's own greedy continuation; each token is
delivered exactly once and in order; one finish per request; all blocks free; no placeholder left.
"""

from __future__ import annotations

import random

import pytest

from tandem.core.request import Request
from tests.core.fake_runner import FakeModel
from tests.core.harness import Delivered, assert_all_free, make_engine, make_request, record

SCENARIOS_PER_CASE = 100
CASES = 21  # 2,100 scenarios, each run twice (sync and async)


def _scenario(rng: random.Random) -> dict:
    block_size = rng.choice([1, 2, 4, 8])
    num_reqs = rng.randint(1, 6)
    max_model_len = rng.choice([24, 48, 96, 512])
    reqs = []
    for i in range(num_reqs):
        plen = rng.randint(1, min(30, max_model_len - 1))
        reqs.append(
            dict(
                rid=f"r{i}",
                prompt=[rng.randint(1, 63) for _ in range(plen)],
                max_tokens=rng.randint(1, 24),
                stop_token_ids=[rng.randint(1, 63)] if rng.random() < 0.3 else [],
                arrival=rng.randint(0, 12),
                abort_at=rng.randint(1, 40) if rng.random() < 0.15 else None,
                seed=rng.randint(0, 3),
            )
        )
    longest = max(len(r["prompt"]) for r in reqs) + 1
    min_blocks = -(-longest // block_size) + 1
    num_blocks = rng.choice([min_blocks, min_blocks + 2, 4 * min_blocks, 512])
    # A request must fit the whole cache alone (the engine enforces max_model_len <= capacity).
    max_model_len = min(max_model_len, num_blocks * block_size)
    return dict(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=rng.randint(1, 6),
        max_num_batched_tokens=rng.choice([4, 8, 16, 64]),
        max_model_len=max_model_len,
        k=rng.choice([0, 0, 1, 2, 3, 5]),
        prefix_caching=rng.random() < 0.7,
        eos_rate=rng.choice([0.0, 0.02, 0.1]),
        draft_error_rate=rng.choice([0.0, 0.3, 0.8]),
        reqs=reqs,
        # The speculation policy, and the step times the fake worker reports (fixed, per token, per draft):
        # latency-bound (drafts pay), compute-bound (they do not), in between.
        spec_policy=rng.choice(["fixed", "adaptive", "adaptive"]),
        step_cost=rng.choice([(1e-2, 1e-4, 1e-5), (1e-3, 1e-3, 1e-4), (4e-3, 5e-4, 2e-4)]),
    )


def _run(sc: dict, async_scheduling: bool) -> tuple[dict[str, Delivered], set[str], int]:
    model = FakeModel(eos_rate=sc["eos_rate"])
    core, _ = make_engine(
        async_scheduling=async_scheduling,
        num_blocks=sc["num_blocks"],
        block_size=sc["block_size"],
        max_num_seqs=sc["max_num_seqs"],
        max_num_batched_tokens=sc["max_num_batched_tokens"],
        max_model_len=sc["max_model_len"],
        k=sc["k"],
        prefix_caching=sc["prefix_caching"],
        model=model,
        draft_error_rate=sc["draft_error_rate"],
        spec_policy=sc["spec_policy"],
        step_cost=sc["step_cost"],
    )
    pending = sorted(sc["reqs"], key=lambda r: r["arrival"])
    delivered: dict[str, Delivered] = {}
    aborted: set[str] = set()
    step = 0
    while pending or core.has_unfinished_requests():
        while pending and pending[0]["arrival"] <= step:
            r = pending.pop(0)
            core.add_request(_request(r))
        for r in sc["reqs"]:
            if r["abort_at"] == step and r["rid"] in core.scheduler.requests:
                core.abort_requests([r["rid"]])
                aborted.add(r["rid"])
        record(delivered, core.step())
        step += 1
        assert step < 5000, "no progress"
    assert_all_free(core)
    core.check_idle_invariants()
    return delivered, aborted, core.scheduler.counters.num_preemptions


def _request(r: dict) -> Request:
    return make_request(
        r["rid"], r["prompt"], seed=r["seed"], max_tokens=r["max_tokens"],
        stop_token_ids=r["stop_token_ids"],
    )


def _expected(model: FakeModel, r: dict, max_model_len: int) -> tuple[list[int], str]:
    ctx, out = list(r["prompt"]), []
    while True:
        t = model.next_token(r["seed"], ctx)
        out.append(t)
        ctx.append(t)
        if t == model.eos_token_id or t in r["stop_token_ids"]:
            return out, "stop"
        if len(out) >= r["max_tokens"] or len(ctx) >= max_model_len:
            return out, "length"


@pytest.mark.parametrize("case", range(CASES))
def test_fuzz_sync_vs_async(case):
    rng = random.Random(1000 + case)
    preemptions = 0
    for _ in range(SCENARIOS_PER_CASE):
        sc = _scenario(rng)
        model = FakeModel(eos_rate=sc["eos_rate"])
        sync, sync_aborted, p1 = _run(sc, async_scheduling=False)
        asyn, async_aborted, p2 = _run(sc, async_scheduling=True)
        preemptions += p1 + p2
        for r in sc["reqs"]:
            rid = r["rid"]
            want, reason = _expected(model, r, sc["max_model_len"])
            for got, aborted in ((sync.get(rid), sync_aborted), (asyn.get(rid), async_aborted)):
                got = got or Delivered()
                if rid in aborted:
                    assert got.tokens == want[: len(got.tokens)], (rid, sc)
                    assert got.finishes == 0
                    continue
                assert got.tokens == want, (rid, got.tokens, want, sc)
                assert got.finish_reason == reason and got.finishes == 1, (rid, sc)
            unconstrained = (
                p1 == p2 == 0
                and sc["spec_policy"] == "fixed"  # adaptive: async decides from statistics one step older
                and not sync_aborted | async_aborted
                and sc["max_num_batched_tokens"] >= sc["max_num_seqs"] * (sc["k"] + 1)
                and len(r["prompt"]) + r["max_tokens"] + sc["k"] + 1 < sc["max_model_len"]
            )
            if unconstrained:
                # Acceptance is a property of the drafts, not of the scheduling mode (as long as no
                # preemption, budget or length guard cut the drafts differently in the two runs).
                assert (sync[rid].drafts, sync[rid].accepted) == (
                    asyn[rid].drafts,
                    asyn[rid].accepted,
                ), (rid, sc)
    assert preemptions > 0 or case % 2  # KV pressure really happens across the cases
