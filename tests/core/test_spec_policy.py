"""The speculation policy (core/spec_policy.py): its cost fit, its choice of drafts, and the engine driven by it
over the scripted fake runner, sync and async — ledgers exact, outputs the model's own, statistics honest."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tandem.core.spec_policy import EXPLORE_EVERY, QUIET, AdaptivePolicy, FixedPolicy, make_policy
from tandem.core.step_cost import BatchLine, StepCost, batch_class
from tandem.speculative_config import SpeculativeConfig
from tests.core.harness import make_engine, make_request, run_to_completion

LATENCY_BOUND = (10e-3, 0.1e-3, 0.01e-3)  # fixed, per token, per drafted token (seconds): drafts nearly free
COMPUTE_BOUND = (0.5e-3, 2e-3, 0.2e-3)  # every row costs four times the fixed part


def _fitted(fixed: float, per_row: float, per_pass: float = 0.0) -> StepCost:
    cost = StepCost()
    for rows, passes in ((4, 0), (8, 1), (16, 3), (32, 0), (4, 2), (8, 3), (16, 0)):
        cost.observe(rows, fixed + per_row * rows + per_pass * passes, passes)
    return cost


def test_drafting_passes_make_a_lone_drafter_dear_and_a_full_batch_cheap():
    """With a pass costing what three rows do, one good request among poor ones does not pay for the head's
    passes alone; four good ones share them and do."""
    good = [_Req(f"g{i}") for i in range(4)]
    poor = [_Req(f"p{i}") for i in range(3)]
    for per_pass, decode, want in (
        (0.0, [good[0], *poor], {"g0": 3}),
        (3e-3, [good[0], *poor], {"g0": 0}),
        (1e-3, good, {r.request_id: 3 for r in good}),
    ):
        pol = _policy(3, 4e-3, 0.5e-3, per_pass)
        for _ in range(30):
            for r in good:
                pol.observe_drafts(r, 3, 3)
            for r in poor:
                pol.observe_drafts(r, 3, 0)
        k = pol.plan([(r, 3) for r in decode])
        assert {rid: k[rid] for rid in want} == want and all(k[r.request_id] == 0 for r in poor if r in decode)


def test_drafts_keep_a_step_within_the_fast_paths_rows():
    """Past ``fast_rows`` (the native decoder stack's) a row costs several times more, a cliff the line does
    not see: cheap, certain drafts still stop at the bound, exploring ones too; a step already past it without
    drafts is priced by the line alone; trees that would cross it are not drafted."""
    decode = [(_Req(f"r{i}"), 3) for i in range(32)]
    pol = _policy(3, 10e-3, 0.01e-3)  # drafts nearly free: every one pays
    pol.fast_rows = 64
    k = pol.plan(decode)
    assert sum(k.values()) == 32 and pol.propose_k >= 1
    pol._verify_next = 1  # an exploring step: all drafts, within the bound
    assert sum(pol.plan(decode).values()) == 32
    wide = [(_Req(f"w{i}"), 3) for i in range(70)]
    assert sum(pol.plan(wide).values()) == 3 * 70
    unfitted = AdaptivePolicy(3, "eagle3", fast_rows=64)  # before the fit every draft is verified: within it
    assert sum(unfitted.plan(decode).values()) == 32
    tree = _tree_policy(10e-3, 0.1e-3, 3.0)
    tree.fast_rows = 16
    limits = [(_Req(f"t{i}"), 3) for i in range(4)]
    for r, _ in limits:
        tree.acceptance.kind_of(r)
    assert not tree._trees_pay(limits, [3] * 4)  # 4 + 4 * 6 rows > 16
    tree.fast_rows = 0
    assert tree._trees_pay(limits, [3] * 4)


class _Req:
    def __init__(self, rid: str, temperature: float = 0.0, remaining: int = 100, seed: int | None = None) -> None:
        self.request_id = rid
        self.sampling_params = type("P", (), {"temperature": temperature, "seed": seed})()
        self._remaining = remaining
        self.drafter_gap = False

    def remaining_tokens(self) -> int:
        return self._remaining


def _policy(k: int, fixed: float, per_row: float, per_pass: float = 0.0) -> AdaptivePolicy:
    pol = AdaptivePolicy(k, "eagle3")
    pol.lines = _lines(_fitted(fixed, per_row, per_pass))
    pol._since_deep = -10_000  # no exploration step in these decisions
    return pol


def _lines(cost: StepCost) -> defaultdict[int, BatchLine]:
    """Every batch class on one fitted line, with no exploration due."""
    return defaultdict(lambda: BatchLine(cost, since_explore=-10_000))


def test_latency_bound_single_stream_takes_every_draft():
    pol = _policy(3, 10e-3, 0.1e-3)
    assert pol.plan([(_Req("a"), 3)]) == {"a": 3} and pol.propose_k == 3


def test_compute_bound_batch_takes_none_and_asks_for_none():
    pol = _policy(3, 1e-3, 1e-3)
    decode = [(_Req(f"r{i}"), 3) for i in range(32)]
    assert set(pol.plan(decode).values()) == {0} and pol.propose_k == 0


def test_a_seeded_sampled_request_is_never_varied():
    pol = _policy(3, 1e-3, 1e-3)
    decode = [(_Req(f"r{i}"), 3) for i in range(32)]
    decode += [(_Req("seeded", temperature=0.8, seed=7), 2), (_Req("seeded-greedy", seed=7), 3)]
    k = pol.plan(decode)
    assert k["seeded"] == 2 and k["seeded-greedy"] == 0 and k["r0"] == 0 and pol.propose_k == 3


def test_a_draft_head_skips_prompts_only_while_settled_on_no_drafts():
    """A head's pass over prompt chunks is skipped once the fitted policy has chosen no drafts ``QUIET`` plans in a
    row (not for a model-free drafter, which has no such pass; not on a close call, which is explored; not after
    one plan without drafts in a drafting phase); a request whose prompt it skipped is never drafted, unless seeded
    (never varied)."""
    decode = [(_Req(f"r{i}"), 3) for i in range(32)]
    pol = _policy(3, 1e-3, 1e-3)  # compute-bound
    ngram = _policy(3, 1e-3, 1e-3)
    ngram.head = False
    for n in range(1, QUIET + 1):
        pol.plan(decode)
        ngram.plan(decode)
        assert pol.propose_k == ngram.propose_k == 0 and ngram.drafter_prefill
        assert pol.drafter_prefill is (n < QUIET)
    pol.lines = _lines(_fitted(10e-3, 0.01e-3))  # drafts pay again: one drafting plan ends the quiet
    assert pol.plan(decode[:1]) == {"r0": 3} and pol.drafter_prefill and pol._quiet == 0
    assert AdaptivePolicy(3, "eagle3").drafter_prefill  # before any plan
    unfitted = AdaptivePolicy(3, "eagle3")
    for _ in range(QUIET):
        unfitted.plan(decode)
    assert unfitted.drafter_prefill  # nothing measured: every draft
    cheap = _policy(3, 10e-3, 0.1e-3)  # latency-bound: drafts pay
    gapped, seeded = _Req("gap"), _Req("seeded", temperature=0.8, seed=7)
    gapped.drafter_gap = seeded.drafter_gap = True
    k = cheap.plan([(_Req("a"), 3), (gapped, 3), (seeded, 3)])
    assert k == {"a": 3, "gap": 0, "seeded": 3} and cheap.drafter_prefill
    # A close call not to draft (a first draft nearly paying): the head keeps its prompts.
    close = _policy(3, 4e-3, 0.5e-3, 0.9e-3)
    close.acceptance.by_class[0] = [0.3, 0.1, 0.1]
    one = [(_Req("x"), 3)]
    close.acceptance.kind_of(one[0][0])
    assert close._allocate(one) == ([0], True)
    for _ in range(QUIET):
        assert close.plan(one) == {"x": 0} and close.drafter_prefill


def _tree_policy(fixed: float, per_row: float, tree_accepted: float) -> AdaptivePolicy:
    pol = AdaptivePolicy(3, "eagle3", tree_nodes=6)
    pol.lines = _lines(_fitted(fixed, per_row))
    pol._since_tree = pol._since_deep = -10_000  # no exploration step in these decisions
    pol.tree_accepted[0] = [tree_accepted, 3.0]
    return pol


def test_trees_are_drafted_when_their_rate_beats_the_chains():
    # Rows nearly free: a tree's extra accepted tokens are worth its 6 rows.
    pol = _tree_policy(10e-3, 0.1e-3, tree_accepted=2.2)
    assert pol.plan([(_Req("a"), 3)]) == {"a": 3} and pol.propose_tree and pol.propose_k == 3
    # Rows dear (the 2-core CPU's case): the chain's 3 rows win over the tree's 6.
    pol = _tree_policy(3e-3, 1e-3, tree_accepted=1.3)
    pol.plan([(_Req("a"), 3)])
    assert not pol.propose_tree and pol.propose_k >= 1  # chains, as many drafts as pay
    # Trees that accept nothing never pay; a compute-bound batch drafts nothing at all.
    pol = _tree_policy(1e-3, 1e-3, tree_accepted=0.0)
    decode = [(_Req(f"r{i}"), 3) for i in range(32)]
    assert set(pol.plan(decode).values()) == {0} and not pol.propose_tree and pol.propose_k == 0


def test_trees_too_dear_even_at_full_acceptance_are_not_explored():
    pol = _tree_policy(3e-3, 0.5e-3, tree_accepted=2.0)
    pol._since_tree = 0
    pol.tree_extra = 50e-3  # a tree step off the fast kernels: ten times a decode
    for _ in range(3 * EXPLORE_EVERY):
        pol.plan([(_Req("a"), 3)])
        assert not pol.propose_tree
    pol.tree_extra = 0.0  # cheap again (a smaller batch): exploring resumes, and trees that pay are chosen
    pol.plan([(_Req("a"), 3)])
    assert pol.propose_tree


def test_tree_verifies_teach_the_tree_estimate_not_the_chains():
    pol = _tree_policy(10e-3, 0.1e-3, tree_accepted=1.0)
    req = _Req("a")
    pol.plan([(req, 3)])
    chain_before = list(pol.acceptance.by_class[0])
    for _ in range(200):
        pol.observe_drafts(req, 3, 3, tree=True)
    assert pol.tree_accepted[0][0] == pytest.approx(3.0, abs=0.01)
    assert pol.acceptance.by_class[0] == chain_before
    # The fixed policy always drafts the trees it was given.
    assert FixedPolicy(3).propose_tree


def test_per_request_choice_follows_acceptance_and_limits():
    pol = _policy(3, 4e-3, 0.5e-3)
    good, bad, short = _Req("good"), _Req("bad"), _Req("short", remaining=2)
    for _ in range(30):
        pol.observe_drafts(good, 3, 3)
        pol.observe_drafts(bad, 3, 0)
        pol.observe_drafts(short, 3, 3)
    decode = [(good, 3), (bad, 3), (short, 1)] + [(_Req(f"x{i}"), 3) for i in range(8)]
    k = pol.plan(decode)
    assert k["good"] == 3 and k["bad"] == 0 and k["short"] == 1  # short: one token of room left for drafts
    # Available drafts bound this step's choice; the proposal for the next step asks for what pays.
    assert pol.plan([(good, 1), (bad, 3)])["good"] == 1 and pol.propose_k == 3


def test_slots_left_empty_count_as_misses_for_the_policy_only():
    """Async scheduling schedules draft slots before the drafts exist; a slot the proposer left empty (prompt
    lookup without a match) yields nothing, so what a scheduled slot is worth counts it as a miss — a request
    whose drafts stop after one is not given three slots — while verified drafts stay all accepted."""
    pol = _policy(3, 4e-3, 0.5e-3)
    stub, full = _Req("stub"), _Req("full")
    for _ in range(30):
        pol.observe_drafts(stub, 1, 1, num_slots=3)  # one draft made, accepted; slots 2 and 3 empty
        pol.observe_drafts(full, 3, 3, num_slots=3)
    assert pol.acceptance.alpha(stub)[0] > 0.9 and pol.acceptance.alpha(stub)[1] < 0.2
    assert pol.acceptance.alpha(full)[1] > 0.9
    k = pol.plan([(stub, 3), (full, 3)] + [(_Req(f"x{i}"), 3) for i in range(8)])
    assert k["stub"] == 1 and k["full"] == 3
    none = _Req("none")  # slots scheduled, nothing drafted at all: a miss at the first slot
    for _ in range(30):
        pol.observe_drafts(none, 0, 0, num_slots=2)
    assert pol.acceptance.alpha(none)[0] < 0.2
    assert pol.verified_k[0] == 30 and pol.verified_k[1] == 30  # the histogram counts verified drafts


def test_acceptance_estimates_are_per_temperature_class():
    pol = AdaptivePolicy(2, "ngram")
    hot = _Req("hot", temperature=1.0)
    for _ in range(200):
        pol.observe_drafts(hot, 2, 0)
    assert pol.acceptance.by_class[2][0] < 0.05 and pol.acceptance.by_class[0] == [0.5, 0.5]  # greedy untouched
    # position 2, never verified after a miss at 1, reads as position 1 in the class (and in the request's mix)
    assert pol.acceptance.by_class[2][1] == pol.acceptance.by_class[2][0]
    assert pol.acceptance.alpha(hot)[0] < 0.05 and pol.acceptance.alpha(hot)[1] < 0.05


def test_a_request_switched_off_is_tried_again():
    pol = _policy(3, 2e-3, 1.5e-3)  # a draft must be accepted with probability > ~0.5 to pay (with the margin)
    for i in range(100):  # the class's estimate: other requests, most drafts accepted
        pol.observe_drafts(_Req(f"o{i}"), 3, 3 if i % 4 else 1)
    req = _Req("r")
    for _ in range(3):
        pol.observe_drafts(req, 3, 0)
    assert pol.plan([(req, 3)])["r"] == 0  # three misses: not worth a row now ...
    ks = [pol.plan([(req, 3)])["r"] for _ in range(40)]
    assert ks[-1] > 0  # ... but its own evidence fades back to its class's estimate


def test_explores_until_the_cost_is_fitted():
    pol = AdaptivePolicy(3, "ngram")
    decode = [(_Req(f"r{i}"), 3) for i in range(4)]
    seen = set()
    for _ in range(2 * EXPLORE_EVERY):
        k = pol.plan(decode)
        rows = len(decode) + sum(k.values())
        seen.add(rows)
        pol.lines[batch_class(4)].cost.observe(rows, 1e-3 + 1e-3 * rows)
    assert pol.lines[batch_class(4)].cost.fitted and len(seen) >= 2 and pol.num_exploration_steps >= 1


def test_explorations_are_one_draft_deep_and_back_off_while_they_confirm_the_choice():
    """Where drafts never pay, an exploration is one drafting pass of one draft a request, verified in the next
    step (which drafts nothing more); the interval between explorations doubles while each finds the same choice,
    up to EXPLORE_MAX."""
    from tandem.core.spec_policy import EXPLORE_MAX

    pol = _policy(3, 1e-3, 1e-3)  # compute-bound: no draft pays
    pol.lines[batch_class(32)].since_explore = 0
    reqs = [_Req(f"r{i}") for i in range(32)]
    explored = []
    for step in range(2200):
        k = pol.plan([(r, 0) for r in reqs])  # no request holds drafts
        if pol.propose_k:
            assert pol.propose_k == 1 and set(k.values()) == {0}
            explored.append(step)
            after = pol.plan([(r, 1) for r in reqs])  # the next step verifies the one draft each, asks for none
            assert set(after.values()) == {1} and pol.propose_k == 0
    gaps = [b - a + 1 for a, b in zip(explored, explored[1:])]  # + the verifying step, planned inside the loop
    assert gaps[:5] == [EXPLORE_EVERY, 2 * EXPLORE_EVERY, 4 * EXPLORE_EVERY, EXPLORE_MAX, EXPLORE_MAX]


def test_a_close_call_not_to_draft_is_explored_often_and_never_backed_off():
    """One stream, a draft row 0.8 ms and a head pass 0.9 ms against a 5.3 ms step: a first draft pays from an
    acceptance of ~0.37 (after MARGIN). An estimate of 0.33 — within its own noise of a true 0.43 — chooses no
    drafts; the estimate learns only from drafts verified, so it is explored every EXPLORE_CLOSE steps and the
    interval does not double. An estimate of 0.1 is no close call: its explorations back off as before."""
    from tandem.core.spec_policy import EXPLORE_CLOSE

    for estimate, want in ((0.33, [EXPLORE_CLOSE] * 6),
                           (0.1, [EXPLORE_EVERY, 2 * EXPLORE_EVERY, 4 * EXPLORE_EVERY])):
        pol = _policy(3, 4.5e-3, 0.8e-3, 0.9e-3)
        pol.lines[batch_class(1)].since_explore = 0
        req = _Req("r")
        pol.acceptance.kind_of(req)
        pol.acceptance.by_class[0] = [estimate] * 3
        explored = []
        for step in range(1000):
            k = pol.plan([(req, 0)])
            if pol.propose_k:
                assert pol.propose_k == 1 and k == {"r": 0}
                explored.append(step)
                assert pol.plan([(req, 1)]) == {"r": 1}  # verified in the next step
        gaps = [b - a + 1 for a, b in zip(explored, explored[1:])]
        assert gaps[:len(want)] == want


def test_a_shallow_choice_is_explored_deeper_and_corrected():
    """Class estimates of draft positions 2 and 3 left low by an earlier workload, and requests that now accept
    every draft: one draft each is the choice, which never verifies position 2, so no evidence could correct it.
    After EXPLORE_EVERY such steps one step drafts and the next verifies as deep as the limits allow, and the
    choice then goes deeper (suffix decoding on prompts it has cached: 328 vs 497 tok/s fixed, before)."""
    pol = _policy(3, 9e-3, 1.1e-3)
    pol._since_deep = 0
    pol.acceptance.by_class[0] = [1.0, 0.45, 0.77]
    pol.acceptance.class_counts[0] = [500, 500, 500]
    reqs = [_Req(f"r{i}") for i in range(4)]
    depths = []
    for _ in range(3 * EXPLORE_EVERY):
        k = pol.plan([(r, 3) for r in reqs])
        for r in reqs:
            pol.observe_drafts(r, k[r.request_id], k[r.request_id])  # every draft verified is accepted
        depths.append(max(k.values()))
    first = depths.index(3)
    assert set(depths[:first]) == {1} and first == EXPLORE_EVERY - 1 and pol.propose_k == 3
    assert set(depths[first + 2:]) == {3}  # the choice itself, from then on (no shallower step left to explore)


def test_config_and_factory():
    assert SpeculativeConfig("ngram", 3).policy == "adaptive"
    with pytest.raises(ValueError, match="speculative_config.policy"):
        SpeculativeConfig("ngram", 3, policy="greedy")
    assert isinstance(make_policy("fixed", 3, "ngram"), FixedPolicy)
    assert isinstance(make_policy("adaptive", 3, "ngram"), AdaptivePolicy)


def _run(async_scheduling: bool, step_cost, policy: str = "adaptive", n: int = 6, max_tokens: int = 150):
    core, runner = make_engine(async_scheduling=async_scheduling, k=3, max_num_seqs=8, max_num_batched_tokens=256,
                               draft_error_rate=0.1, spec_policy=policy, step_cost=step_cost)
    reqs = [make_request(f"r{i}", [1 + i, 2, 3, 4, 5], seed=i, max_tokens=max_tokens) for i in range(n)]
    delivered = run_to_completion(core, reqs)
    return core, runner, delivered


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_engine_latency_bound_speculates(async_scheduling):
    core, _, delivered = _run(async_scheduling, LATENCY_BOUND)
    pol = core.scheduler.spec_policy
    assert any(line.cost.fitted for line in pol.lines.values())
    assert pol.verified_k[3] > 0.8 * sum(pol.verified_k)
    _, _, plain = _run(async_scheduling, LATENCY_BOUND, policy="fixed")
    assert {r: d.tokens for r, d in delivered.items()} == {r: d.tokens for r, d in plain.items()}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_engine_compute_bound_stops_drafting(async_scheduling):
    core, runner, delivered = _run(async_scheduling, COMPUTE_BOUND)
    pol, spec = core.scheduler.spec_policy, core.scheduler.counters.spec
    assert pol.verified_k[0] > 0.8 * sum(pol.verified_k)
    fixed_core, fixed_runner, plain = _run(async_scheduling, COMPUTE_BOUND, policy="fixed")
    assert runner.num_drafted < 0.3 * fixed_runner.num_drafted  # the proposer is not asked for drafts
    assert {r: d.tokens for r, d in delivered.items()} == {r: d.tokens for r, d in plain.items()}
    # Acceptance counts drafts really verified: the slots the policy did not schedule are not rejections.
    assert spec.num_draft_tokens == sum(d.drafts for d in delivered.values())
    assert spec.num_accepted_tokens == sum(d.accepted for d in delivered.values())
    assert spec.acceptance_rate == pytest.approx(fixed_core.scheduler.counters.spec.acceptance_rate, abs=0.15)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_engine_settled_without_drafts_skips_the_heads_prompts(async_scheduling):
    """Compute-bound with a draft head (eagle3's policy over the fake runner): once settled on no drafts, the
    prompts admitted then are marked skipped (``drafter_prefill`` False on their steps) and never drafted;
    outputs stay the model's own, every ledger exact (the harness checks the invariants each step)."""
    core, runner = make_engine(async_scheduling=async_scheduling, k=3, max_num_seqs=4, max_num_batched_tokens=256,
                               draft_error_rate=0.1, spec_policy="adaptive", step_cost=COMPUTE_BOUND,
                               spec_method="eagle3")
    reqs = [make_request(f"r{i}", [1 + i, 2, 3, 4, 5], seed=i, max_tokens=120) for i in range(12)]
    skipped_steps = []
    schedule = core.scheduler.schedule

    def watch():
        so = schedule()
        if not so.drafter_prefill:
            skipped_steps.append(so.step_id)
        return so

    core.scheduler.schedule = watch
    delivered = run_to_completion(core, reqs)
    gapped = [r for r in reqs if r.drafter_gap]
    assert skipped_steps and gapped and gapped[0] is not reqs[0]
    assert all(delivered[r.request_id].drafts == 0 for r in gapped)
    _, _, plain = _run(async_scheduling, COMPUTE_BOUND, policy="fixed", n=12, max_tokens=120)
    assert {r: d.tokens for r, d in delivered.items()} == {r: d.tokens for r, d in plain.items()}


def test_a_one_pass_drafter_pays_its_pass_once_and_explores_every_draft():
    """ngram and suffix make every draft in one lookup: a step that drafts costs one pass whatever its depth,
    so where a head (a pass a draft) stops at one draft they take all three; and their exploration from not
    drafting verifies every draft the limits allow, the deeper rows being what the line must learn."""
    chosen = {}
    for method in ("suffix", "eagle3"):
        pol = AdaptivePolicy(3, method)
        pol.lines = _lines(_fitted(5e-3, 0.4e-3, 0.9e-3))
        pol._since_deep = -10_000
        pol.acceptance.by_class[0] = [0.4, 0.5, 0.6]
        chosen[method] = pol.plan([(_Req("a"), 3)])["a"]
    assert chosen == {"suffix": 3, "eagle3": 1}
    for method, depth in (("suffix", 3), ("eagle3", 1)):
        pol = _policy(3, 1e-3, 1e-3)  # compute-bound: no draft pays
        pol.max_passes = 1 if method == "suffix" else 3
        pol.lines[batch_class(8)].since_explore = 10_000  # an exploration is due
        reqs = [_Req(f"r{i}") for i in range(8)]
        pol.lines[batch_class(8)].was_drafting = False
        pol.plan([(r, 0) for r in reqs])
        assert pol.propose_k == depth
        assert set(pol.plan([(r, depth) for r in reqs]).values()) == {depth}  # all verified next step


def _stepper(pol_args: tuple, now: list[float]):
    """A policy on a fake clock, and ``step(n_reqs, drafts, seconds, prefill=0)``: a step of ``n_reqs`` requests
    (``drafts`` each; ``prefill`` more requests in a prompt chunk) that took ``seconds``, observed."""
    from types import SimpleNamespace

    pol = AdaptivePolicy(*pol_args, clock=lambda: now[0])

    def step(n_reqs: int, drafts: int, seconds: float, prefill: int = 0) -> None:
        ids = [f"r{i}" for i in range(n_reqs)]
        spec = {r: [1] * drafts for r in ids}
        scheduled = {r: 1 + drafts for r in ids} | {f"p{i}": 16 for i in range(prefill)}
        so = SimpleNamespace(scheduled_spec_decode_tokens=spec, sampling_req_ids=set(ids),
                             num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
                             num_tree_rows=0, num_drafts_to_propose=drafts, draft_trees=False)
        now[0] += seconds
        pol.observe_step(so, busy=True)

    return pol, step


def test_each_batch_class_has_its_own_line():
    """A verify row at one stream rides the weight read; at 32 streams it is compute. The slope seen at 32
    streams must not price a lone stream's drafts: each class of batch sizes fits its own line from its steps."""
    now = [0.0]
    pol, step = _stepper((3, "suffix"), now)
    pol.acceptance.by_class[0] = [0.6, 0.6, 0.6]

    for i in range(200):  # 32 streams: 2 ms a row; one stream: 0.3 ms a row on a 5 ms step
        d = i % 4
        step(32, d, 10e-3 + 2e-3 * 32 * (1 + d))
    for i in range(200):
        d = i % 4
        step(1, d, 5e-3 + 0.3e-3 * (1 + d) + (0.5e-3 if d else 0.0))
    lone, wide = pol.lines[batch_class(1)].cost, pol.lines[batch_class(32)].cost
    assert lone.per_row == pytest.approx(0.3e-3, rel=0.1) and wide.per_row == pytest.approx(2e-3, rel=0.1)
    pol._since_deep = -10_000
    for line in pol.lines.values():
        line.since_explore = -10_000
    assert pol.plan([(_Req("a"), 3)]) == {"a": 3}
    assert set(pol.plan([(_Req(f"w{i}"), 3) for i in range(32)]).values()) == {0}


def test_a_batch_larger_than_any_measured_drafts_only_near_certain_drafts_until_its_own_line_is_fitted():
    """A one-stream line (verify rows riding the weight read) would price four streams' rows far too cheap:
    a class with only smaller ones fitted drafts only what is worth ``SURE`` tokens until its own line is
    fitted; then its own decides."""
    pol = AdaptivePolicy(3, "eagle3")
    pol.lines[1] = BatchLine(_fitted(4e-3, 0.4e-3), since_explore=-10_000)
    pol._since_deep = -10_000
    four = [(_Req(f"r{i}"), 3) for i in range(4)]
    assert pol.plan(four) == {r.request_id: 0 for r, _ in four} and pol.propose_k == 0
    assert pol.plan([(_Req("a"), 3)])["a"] > 0  # one stream still drafts on its own line
    sure = _Req("s", temperature=0.5)  # (its own temperature class: the greedy ones learn nothing from it)
    pol.acceptance.kind_of(sure)
    for _ in range(50):  # a request repeating an earlier output: near-certain drafts are taken anyway
        pol.acceptance.observe(sure, 3, 3)
    assert pol.plan([*four[1:], (sure, 3)]) == {"r1": 0, "r2": 0, "r3": 0, "s": 3}
    pol.lines[3] = BatchLine(_fitted(4e-3, 0.5e-3), since_explore=-10_000)  # (a row at least one stream's)
    assert sum(pol.plan(four).values()) > 0 and pol.propose_k > 0


def test_a_bet_within_the_estimates_error_is_not_taken():
    """Four streams, one draft each at the prior's 0.6: with a verify row at 1.2 ms the estimates put the best
    choice 2 % above no drafts — within their own error, so no drafts; at 1.0 ms (+6 %) every draft is taken."""
    four = [(_Req(f"r{i}"), 1) for i in range(4)]
    assert sum(_policy(1, 5e-3, 1.2e-3).plan(four).values()) == 0
    assert sum(_policy(1, 5e-3, 1.0e-3).plan(four).values()) == 4


def test_only_steady_steps_fit_the_line():
    """A step just after requests came or went (a prompt chunk in the step before, or another number of
    requests) carries the host's work for them: at four streams in a server, three requests are seen only at
    those transitions, and their slow, irregular steps fitted a line that made drafts look cheap there. Such a
    step is not fitted; the class borrows four streams' line and drafts nothing."""
    now = [0.0]
    pol, step = _stepper((3, "eagle3"), now)
    for i in range(300):  # four streams, steady: 3 ms + 1 ms a row
        d = i % 3
        step(4, d, 3e-3 + 1e-3 * 4 * (1 + d))
        if i % 20 == 19:  # a request finishes, one arrives: three decode once (slowly, with drafts), a prompt
            step(3, i % 2, 8e-3 + 0.1e-3 * (i % 2))
            step(3, 0, 6e-3, prefill=1)
    four, three = pol.lines[batch_class(4)].cost, pol.lines[batch_class(3)].cost
    assert four.per_row == pytest.approx(1e-3, rel=0.1) and four.fixed == pytest.approx(3e-3, rel=0.1)
    assert three.steps == 0 and not three.fitted
    pol._since_deep = -10_000
    for line in pol.lines.values():
        line.since_explore = -10_000
    pol.acceptance.by_class[0] = [0.55, 0.55, 0.55]
    assert set(pol.plan([(_Req(f"r{i}"), 3) for i in range(3)]).values()) == {0} and pol.propose_k == 0
    step(3, 0, 5e-3)  # the second of two alike steps in a row is steady: it is fitted
    step(3, 0, 5e-3)
    assert pol.lines[batch_class(3)].cost.steps == 1
