"""Shadow drafts (core/shadow.py): a model-free drafter's drafts made on steps that draft nothing, scored against
the tokens then committed — which requests are asked, how a shadow is scored as tokens arrive, and the stale
estimate it corrects in the policy."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tandem import LLM, SamplingParams
import tandem.core.shadow as shadow_module
from tandem.core.acceptance import Acceptance
from tandem.core.shadow import SHADOW_BUDGET, SHADOW_DEPTH, SHADOW_EVERY, Shadows
from tandem.core.spec_policy import AdaptivePolicy
from tests.core.test_spec_policy import _fitted, _lines, _Req
from tests.helpers import humaneval_prompts


class _Out(_Req):
    """A request with an output ledger (what ``Shadows.observe`` reads)."""

    def __init__(self, rid: str, temperature: float = 0.0, remaining: int = 100) -> None:
        super().__init__(rid, temperature, remaining)
        self.output_token_ids: list[int] = []


def _shadows(k: int = 4) -> tuple[Shadows, Acceptance]:
    acc = Acceptance(k, 0.5)
    return Shadows(acc, k), acc


def test_asks_within_the_budget_round_robin_never_twice_while_pending():
    sh, _ = _shadows()
    reqs = [_Out(f"r{i}") for i in range(SHADOW_BUDGET + 3)] + [_Out("last", remaining=1)]
    first = sh.ask(reqs, step_id=1)
    assert first == {f"r{i}" for i in range(SHADOW_BUDGET)}
    second = sh.ask(reqs, step_id=2)  # the rest; the pending ones and one with a single token left are not asked
    assert second == {f"r{i}" for i in range(SHADOW_BUDGET, SHADOW_BUDGET + 3)}
    assert sh.ask(reqs, step_id=3) == set()
    for r in reqs[:SHADOW_BUDGET]:  # their shadows come back empty (sync: nothing learnt), resolved
        sh.observe(r, 1, [])
    assert sh.ask(reqs, step_id=SHADOW_EVERY) == set()  # resolved, but shadowed less than SHADOW_EVERY ago
    assert sh.ask(reqs, step_id=1 + SHADOW_EVERY) == first


def test_a_shadow_is_scored_at_its_first_mismatch_as_tokens_arrive():
    sh, acc = _shadows()
    req = _Out("r")
    acc.kind_of(req)
    assert sh.ask([req], step_id=5) == {"r"}
    req.output_token_ids += [7]
    sh.observe(req, 4, None)  # an earlier step (async: still in flight when 5 was asked): nothing yet
    assert "r" in sh._pending and sh.num_scored == 0
    sh.observe(req, 5, [10, 11, 12, 13])  # step 5 came back with its shadow: drafts after its tokens
    req.output_token_ids += [10]
    sh.observe(req, 6, None)
    assert sh.num_scored == 0  # drafts 2 .. 4 not decided yet
    req.output_token_ids += [11, 99]  # a verify step committing two tokens: draft 3 missed
    sh.observe(req, 7, None)
    assert (sh.num_scored, sh.num_drafts, sh.num_accepted) == (1, 3, 2) and "r" not in sh._pending
    # the class learns (running mean over the prior's pseudo-counts); the request's own counts do not: one
    # lucky shadow must not switch a request to drafting where drafts do not pay
    assert acc.class_counts[0] == [1, 1, 1, 0] and acc._own("r") is None
    assert acc.by_class[0][:3] == [(1 + 2.0) / 5, (1 + 2.0) / 5, 2.0 / 5]


def test_a_shadow_matched_to_its_depth_scores_every_draft():
    sh, acc = _shadows(k=16)
    req = _Out("r")
    acc.kind_of(req)
    sh.ask([req], 1)
    sh.observe(req, 1, list(range(100, 116)))
    req.output_token_ids += list(range(100, 100 + SHADOW_DEPTH + 2))
    sh.observe(req, 2, None)
    assert (sh.num_drafts, sh.num_accepted) == (SHADOW_DEPTH, SHADOW_DEPTH)  # cut at SHADOW_DEPTH


def test_an_empty_shadow_is_a_miss_only_where_an_empty_slot_is_one():
    for empty_is_miss, scored in ((False, 0), (True, 1)):
        sh, acc = _shadows()
        sh.empty_is_miss = empty_is_miss
        req = _Out("r")
        acc.kind_of(req)
        sh.ask([req], 1)
        sh.observe(req, 1, [])
        assert sh.num_scored == scored and "r" not in sh._pending


def test_an_ask_answered_without_a_shadow_is_dropped():
    sh, acc = _shadows()
    req = _Out("r")
    sh.ask([req], 3)
    sh.observe(req, 3, None)  # the step drafted after all: no shadow came back
    assert "r" not in sh._pending and sh.ask([req], 3 + SHADOW_EVERY) == {"r"}
    sh.forget("r")
    assert not sh._pending and not sh._asked


def test_shadows_revive_a_stale_estimate_that_explorations_alone_leave():
    """The case behind shadows: a class estimate learnt where drafts did not pay (0.6 a position) keeps a
    16-stream batch, where they pay only above ~0.7, from drafting at all — and so from learning anything.
    Shadows scored against the committed tokens (here: every draft right) raise it until drafting pays."""
    pol = AdaptivePolicy(3, "suffix")
    pol.lines = _lines(_fitted(10e-3, 1.0e-3, 0.5e-3))
    pol._since_deep = -10_000
    reqs = [_Out(f"r{i}") for i in range(16)]
    for r in reqs:
        pol.acceptance.kind_of(r)
    pol.acceptance.by_class[0] = [0.6, 0.6, 0.6]
    pol.acceptance.class_counts[0] = [500, 500, 500]  # long settled
    decode = [(r, 3) for r in reqs]
    assert sum(pol.plan(decode).values()) == 0 and pol.propose_k == 0
    step = 0
    for _ in range(2000):
        step += 1
        asked = pol.shadow(step)
        for r in reqs:  # the step comes back: one token each; the shadowed ones with their drafts
            nxt = len(r.output_token_ids)
            r.output_token_ids.append(nxt)
            pol.observe_tokens(r, step, [nxt + 1, nxt + 2, nxt + 3] if r.request_id in asked else None)
        if any(pol.plan(decode).values()):
            break
    else:
        raise AssertionError("shadows never made drafting pay")
    assert pol.shadows.num_scored > 0 and pol.shadows.num_accepted == pol.shadows.num_drafts
    assert pol.acceptance.by_class[0][0] > 0.7 and not pol.acceptance.by_request


def test_only_model_free_drafters_are_shadowed():
    assert AdaptivePolicy(3, "ngram").shadows is not None and AdaptivePolicy(3, "suffix").shadow_depth == 3
    assert AdaptivePolicy(3, "eagle3").shadows is None and AdaptivePolicy(3, "eagle3").shadow(1) == set()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_the_engine_scores_each_shadow_against_the_tokens_committed_after_it(method, monkeypatch):
    """On the default model, sync and async, with a policy that never drafts (every step may shadow): each
    shadow the worker returns is scored by how far it matches the request's output from its position on —
    what verifying it would have accepted, greedy — and the outputs stay those of no speculation."""
    monkeypatch.setattr(shadow_module, "SHADOW_EVERY", 2)  # many shadows in a short run
    prompts = [p + p[-200:] for p in humaneval_prompts(4)]  # repeated text: the drafters find matches
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    ref = LLM(max_num_seqs=4, async_scheduling=False)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    ref.shutdown()
    for async_on in (False, True):
        llm = LLM(max_num_seqs=4, async_scheduling=async_on, debug_invariants=True,
                  speculative_config={"method": method, "num_speculative_tokens": 3, "policy": "adaptive"})
        pol = llm.engine.core.scheduler.spec_policy
        sh = pol.shadows
        assert sh is not None and sh.empty_is_miss is async_on
        real_plan, real_observe, real_score = pol.plan, sh.observe, sh._score
        registered, scored = defaultdict(list), defaultdict(list)

        def plan(decode, real_plan=real_plan, pol=pol):
            real_plan(decode)
            pol.propose_k, pol._shadow_candidates = 0, [r for r, _ in decode]
            return {r.request_id: 0 for r, _ in decode}

        def observe(req, step_id, drafts, real_observe=real_observe, sh=sh):
            if drafts is not None and sh._pending.get(req.request_id) == step_id:
                registered[req.request_id].append((len(req.output_token_ids), drafts[: sh.depth]))
            real_observe(req, step_id, drafts)

        def score(req, tried, accepted, real_score=real_score):
            scored[req.request_id].append((tried, accepted))
            real_score(req, tried, accepted)

        pol.plan, sh.observe, sh._score = plan, observe, score
        outs = llm.generate(prompts, params, use_tqdm=False)
        got = {o.request_id: o.outputs[0].token_ids for o in outs}
        assert [o.outputs[0].token_ids for o in outs] == want
        assert llm.spec_decode_stats()["num_draft_tokens"] == 0  # nothing verified
        for rid, regs in registered.items():
            expect = []
            for start, drafts in regs:
                if not drafts:  # the drafter found nothing: a miss where an empty slot is one
                    expect += [(1, 0)] if async_on else []
                    continue
                seen = got[rid][start : start + len(drafts)]
                miss = next((j for j, (a, b) in enumerate(zip(seen, drafts)) if a != b), None)
                if miss is not None:
                    expect.append((miss + 1, miss))
                elif len(seen) == len(drafts):
                    expect.append((len(drafts), len(drafts)))
            assert scored[rid] == expect
        assert sh.num_scored >= 8 and sh.num_accepted > 0
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        llm.shutdown()
