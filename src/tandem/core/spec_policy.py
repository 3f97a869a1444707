"""The speculation policy: how many drafts each request verifies this step, and how many the proposer drafts
for the next one. Pure Python, no torch.

Decisions read *confirmed* statistics only — accepted counts the scheduler has committed and the times at
which steps came back — so async scheduling (which schedules before the previous step returns) sees the same
kind of information as sync, one step older.

``fixed`` verifies every draft the proposer made (``num_speculative_tokens``; the behaviour before the
policy, kept for A/B). ``adaptive`` (the default) maximizes the step's expected goodput — output tokens per
second — from two estimates:

- **acceptance** (core/acceptance.py): per request and draft position j, the probability ``a_j`` that draft j
  is accepted given drafts 1 .. j-1 were, from the request's own fading counts mixed with its temperature
  class's estimate. Draft j of a request is worth ``g = a_1 * ... * a_j`` expected tokens.
- **cost**: the engine's step period — wall-clock seconds between two steps coming back while requests keep
  running: the forward, sampling, drafting, the host's scheduling and output handling, whatever the
  executor — is ``fixed + per_row * n + per_pass * m`` for a decode step of ``n`` logits rows (one per request
  plus one per verified draft) that drafts ``m`` tokens ahead (``num_drafts_to_propose``: a draft head's
  sequential passes), fitted over steady decode-only steps (no prompt chunk in it or in the step before, as
  many requests as that one: ``observe_step``) by core/step_cost.py: the slopes by least squares over a long
  memory of each step's difference from the steps just before it, the level over the last ~30 steps; once
  fitted it stays fitted (the slopes stand while the steps are alike).
  ``per_pass`` is what drafting costs whatever the rows (a head pass over the batch, its LM head); it is what
  makes a step's first draft slots dear and the rest cheap. A drafter making every draft in one lookup
  (``ONE_PASS_METHODS``) counts one pass for a step that drafts at all: its cost, with the switch from plain
  sampling to verification, is a step's, not a draft's (suffix, one stream: ~1.3 ms for the first draft, ~0.4
  for each further one). Where the steps seen cannot tell it from ``per_row`` (passes and rows moving
  together) it is left at 0. One line per batch class (``step_cost.batch_class``), each with its own
  explorations: at one stream a verify row rides the weight read (~0.4 ms), at 32 it is compute (~1.1 ms), and
  a single line carried a 32-stream slope into a one-stream phase whose alike steps never refitted it. ``n`` counts scheduled slots: where the worker
  does not feed the ones the proposer left empty (async on the CPU, worker/input_prep.py), the fit prices a
  scheduled slot at its average cost, empty ones included, and the acceptance estimate counts an empty slot as
  a miss (``observe_drafts``), so both are per scheduled slot.

A step of ``B`` decoding requests yields ``B`` tokens in ``fixed + per_row * B`` seconds without drafts. Draft
slots are taken best first (largest ``g``); of those prefixes the policy keeps the one with the highest expected
tokens per second, the drafts' own costs (their rows, and the passes their deepest slot needs) counted at
``MARGIN`` times their estimate so near-even bets lose, and (more than one request) taken only where the best
beats no drafts by ``MIN_GAIN``. When drafts do not pay — the batch is compute-bound, acceptance is low, drafting
passes cost more than the tokens they add — every request gets ``k = 0`` and the proposer is not run (a drafter
with its own KV runs over prompt chunks only — and, once the choice is settled (``QUIET`` plans in a row without
drafts), not over them either: ``drafter_prefill``, below). A row count past ``fast_rows`` (the native decoder
stack's, ``EnginePlan.native_decode_rows``: 256 on the default model with int8 activations, 64 with float32 ones) moves
the whole step to the torch layers, a step the line does not price (1.02-1.14x at 64-256 rows with int8
activations, BENCHMARKS.md §12; more with float32 ones, whose wide products are dequantized tiles + GEMM): drafts
never take a step past it (a step already past it without drafts is priced by the line alone), nor do trees.
(While the stack stopped at 64 rows everywhere, a batch of 64 requests never drafted: at 64 greedy streams
suffix decoding's all-accepted drafts were left, 0.99x no speculation against a fixed k = 1's 1.06x; with
room to 256 rows the adaptive policy reads 1.16x there, §19.) Until a cost line is fitted every draft is verified (the fixed behaviour; one draft a request instead left
the deeper positions' acceptance unlearnt, and one stream stopped drafting); a batch class whose own slope is not
settled takes the line of the nearest fitted class of more requests (``step_cost.line_cost``); where only smaller
classes are fitted, until its own line is, only near-certain drafts (``SURE``): a smaller batch's verify rows ride
its weight read. The fit needs steps of different sizes: every ``EXPLORE_EVERY`` decode steps (more often before
the first fit) one step does the opposite of the choice — no drafts, or what one drafting pass makes (one draft a
request; a one-pass drafter's every draft), verified in the next step — so the estimate never freezes. While
explorations keep finding the same choice (drafting or not), their interval doubles, up to ``EXPLORE_MAX``: where
drafts never pay exploring is what speculation costs — but not after a *close call* not to draft (the best first
draft worth within ``CLOSE`` of paying) by a drafter with a model: its acceptance estimate learns only from drafts
verified (a model-free one's also from shadows, below), so one that noise took below the line would stay there
(one stream at 0.7 with eagle3 drafted in its first run, then stopped, where a draft a step paid 8 %:
BENCHMARKS.md §19); a close call is explored every ``EXPLORE_CLOSE`` steps, where an exploration costs next to
nothing. Acceptance needs exploring too: a draft position's estimate
learns only from drafts verified there, so a choice shallower than the limits allow would keep a low estimate of
the deeper positions forever (one left by an earlier workload). After ``EXPLORE_EVERY`` steps of such a choice one
step drafts as deep as the limits allow and the next verifies it all; the interval doubles, up to ``EXPLORE_MAX``,
while the choice stays shallow.

A drafter without a model (``ONE_PASS_METHODS``) also learns while nothing is drafted: on a step that drafts
nothing a few requests are *shadowed* (core/shadow.py) — the worker runs the drafter for them without verifying,
and their drafts are scored against the tokens the requests then commit, an unbiased measure of what verifying
them would have accepted (the temperature class's estimate learns from it, not the request's own counts) — so
an estimate from an earlier phase does not keep a later one from drafting.

With draft trees (``speculative_config.tree``) the policy also chooses, per step, whether the drafts made in it
are trees or chains (core/tree_choice.py).

A draft head's pass over prompt chunks is what an EAGLE-3 engine still paid while the policy drafted nothing
(~1.6 % of the work at four sampled streams on the Zen 3 kind, ~25 ms a pass: BENCHMARKS.md §19, session 29).
``drafter_prefill`` is False while the choice not to draft is settled (``HEAD_METHODS``; ``QUIET`` plans in a row
on a fitted line drafted and verified nothing, with no close call): the runner skips the head over the prompt
chunks admitted then, the scheduler marks those requests (``Request.drafter_gap``) and ``plan`` never drafts for
them — each draft would attend over a gap the size of the prompt, and its misses would lower the class's estimate
for every other request. A request admitted while drafts do not pay is thus not drafted if they come to pay
before it finishes: what that forgoes is bounded by its length, and it is never slower than no speculation.

A seeded sampled request is never varied (the random numbers it consumes depend on its k). Acceptance
statistics count drafts actually verified, so ``acceptance_rate`` stays honest under any k.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from tandem.core.acceptance import TEMPERATURE_CLASSES, Acceptance
from tandem.core.fixed_policy import FixedPolicy
from tandem.core.interface import SchedulerOutput
from tandem.core.request import Request
from tandem.core.shadow import Shadows
from tandem.core.step_cost import MIN_FIT_STEPS, BatchLine, batch_class, fitted_below, line_cost
from tandem.core.tree_choice import TreeChoice

POLICIES = ("adaptive", "fixed")
# Prior conditional acceptance per draft position, by method, before anything is measured.
METHOD_PRIOR = {"ngram": 0.5, "suffix": 0.5, "draft_model": 0.6, "eagle": 0.6, "eagle3": 0.6, "mtp": 0.6}
# Drafters that make all their drafts in one pass whatever the depth (a lookup in the tokens): for them a step's
# ``passes`` is 1 where it drafts at all, so ``per_pass`` prices drafting at all, not each draft.
ONE_PASS_METHODS = frozenset({"ngram", "suffix"})
# Drafters whose own KV the runner fills with a pass over every prompt chunk (a draft head): that pass is skipped
# while the policy has settled on no drafts (``drafter_prefill``).
HEAD_METHODS = frozenset({"eagle", "eagle3", "mtp"})
EXPLORE_EVERY = 64
EXPLORE_MAX = 512  # the exploration interval, doubled while explorations confirm the choice, stops here
# Drafts' costs are counted at this factor: the fit does not see a row count that leaves a faster kernel path,
# nor a draft head's catching up after steps without drafts; near-even bets lose.
MARGIN = 1.15
# Drafts of a batch must beat no drafts' expected rate by this fraction (after MARGIN): closer bets lost at 4
# streams; at one stream (verify rows riding the weight read) they were worth taking.
MIN_GAIN = 0.05
SURE = 0.9  # a class with only smaller ones measured drafts what is worth this many tokens (``_sure``)
# A choice of no drafts where the best first draft is worth within this fraction of what would make it pay (after
# MARGIN) is a close call: explored every EXPLORE_CLOSE steps, never backed off (``plan``).
CLOSE = 0.2
EXPLORE_CLOSE = 16
# Plans in a row without drafts (no close call) after which a draft head skips prompt chunks (``drafter_prefill``):
# one plan without drafts inside a drafting phase (an exploration, a dip of the estimate) must not leave the requests
# admitted then undrafted for good.
QUIET = 16


class AdaptivePolicy(TreeChoice, FixedPolicy):
    name = "adaptive"

    def __init__(self, k: int, method: str, clock: Callable[[], float] = time.perf_counter,
                 tree_nodes: int = 0, fast_rows: int = 0) -> None:
        super().__init__(k)
        self.clock = clock
        self.fast_rows = fast_rows  # drafts keep a step within this many rows (0: no bound)
        self.max_passes = 1 if method in ONE_PASS_METHODS else k  # drafting passes of a step, at most
        self.head = method in HEAD_METHODS
        self._quiet = 0  # plans in a row that drafted and verified nothing, fitted, no close call
        self._last: float | None = None  # when the previous step came back, while requests kept running
        self._last_decode_reqs = 0  # the previous step's requests where it was decode-only (else 0)
        prior = METHOD_PRIOR.get(method, 0.5)
        self.acceptance = Acceptance(k, prior)
        self.lines: defaultdict[int, BatchLine] = defaultdict(lambda: BatchLine(explore_every=EXPLORE_EVERY))
        # exploring: the drafts a request the next step verifies, whatever it would choose (0: none asked for)
        self._verify_next = 0
        # steps since the choice was as deep as the limits allow (or since the last deep exploration), and the
        # interval at which a shallower choice is explored deeper (see plan)
        self._since_deep = 0
        self._deep_every = EXPLORE_EVERY
        # A drafter without a model is run for a few requests on steps that draft nothing, its drafts scored
        # against the tokens then committed: acceptance learnt without verifying (core/shadow.py).
        if method in ONE_PASS_METHODS:
            self.shadows = Shadows(self.acceptance, k)
            self.shadow_depth = self.shadows.depth
        self._shadow_candidates: list[Request] = []
        self._init_trees(k, prior, tree_nodes, MARGIN, EXPLORE_EVERY)

    def _allocate(self, decode: list[tuple[Request, int]]) -> tuple[list[int], bool]:
        """Drafts per request (up to its limit) maximizing expected tokens per second: of the prefixes of the
        slots best first, the one with the highest rate, the drafts' rows and passes counted at ``MARGIN``; and
        whether the best first draft is worth within ``CLOSE`` of what would make it pay (a close call)."""
        cost = line_cost(self.lines, len(decode))
        slot_cost, pass_cost = MARGIN * cost.per_row, MARGIN * cost.per_pass
        tokens, seconds = float(len(decode)), cost.seconds(len(decode))
        best_rate, best_n, passes = tokens / seconds, 0, 0
        floor = best_rate * slot_cost  # a slot worth no more never raises the rate (nor do later ones)
        cands, g1 = [], 0.0  # g1: the best first draft's worth
        for i, (req, limit) in enumerate(decode):
            g, alpha = 1.0, self.acceptance.alpha(req)[:limit]
            g1 = max(g1, alpha[0]) if alpha else g1
            for j, a in enumerate(alpha):
                g *= a
                if g <= floor:
                    break
                cands.append((-g, j, i))
        cands.sort()  # best first; a request's slots in order (g falls with j)
        room = self._room(len(decode))
        plain_rate = best_rate
        close = g1 >= (1.0 - CLOSE) * plain_rate * (slot_cost + pass_cost)
        for taken, (neg_g, j, _) in enumerate(cands, 1):
            if -neg_g <= best_rate * slot_cost or taken > room:  # this slot and every later one lower the rate
                break
            tokens -= neg_g
            depth = min(j + 1, self.max_passes)
            seconds += slot_cost + pass_cost * max(depth - passes, 0)
            passes = max(passes, depth)
            if tokens / seconds > best_rate:
                best_rate, best_n = tokens / seconds, taken
        if len(decode) > 1 and best_rate < (1.0 + MIN_GAIN) * plain_rate:  # within the estimates' error
            best_n = 0
        chosen = [0] * len(decode)
        for _, _, i in cands[:best_n]:
            chosen[i] += 1
        return chosen, close

    def _sure(self, limits: list[tuple[Request, int]]) -> list[int]:
        """Each request's leading drafts worth at least ``SURE`` expected tokens, within the fast path: no cost
        line needed, a near-certain draft pays at any batch size (suffix decoding repeating an earlier output)."""
        out = []
        for req, limit in limits:
            g, n = 1.0, 0
            for a in self.acceptance.alpha(req)[:limit]:
                g *= a
                if g < SURE:
                    break
                n += 1
            out.append(n)
        return [min(w, f) for w, f in zip(out, self._fill(limits))]

    def _room(self, rows: int) -> float:
        """Draft rows a step of ``rows`` rows may add within the fast path (unbounded past it, or without one)."""
        return self.fast_rows - rows if 0 < rows <= self.fast_rows else float("inf")

    def _fill(self, limits: list[tuple[Request, int]], depth: int | None = None) -> list[int]:
        """Every draft the limits allow (at most ``depth`` a request), within the fast path's rows (level by
        level across the requests)."""
        depth = self.k if depth is None else depth
        full = [min(lim, depth) for _, lim in limits]
        left = self._room(len(limits))
        if sum(full) <= left:
            return full
        out = [0] * len(full)
        for level in range(depth):
            for i, lim in enumerate(full):
                if left <= 0:
                    return out
                if lim > level:
                    out[i] += 1
                    left -= 1
        return out

    def plan(self, decode: list[tuple[Request, int]]) -> dict[str, int]:
        self.drafter_prefill = True
        if not decode:
            return {}
        self.acceptance.step += 1
        line = self.lines[batch_class(len(decode))]
        cost = line_cost(self.lines, len(decode))
        seeded = [self.acceptance.kind_of(req)[1] for req, _ in decode]
        # Limits without the drafts' availability: what is worth drafting now for the next step.
        # (A request whose prompt the head skipped is never drafted: its drafts would attend over the gap.)
        limits = [(req, 0 if req.drafter_gap and not s else max(0, min(self.k, req.remaining_tokens() - 1)))
                  for (req, _), s in zip(decode, seeded)]
        full = self._fill(limits)
        close = False  # the best first draft near paying (``_allocate``)
        if cost.fitted:
            want, close = self._allocate(limits)
        elif fitted_below(self.lines, len(decode)):  # only smaller batches measured: their rows were cheaper
            want = self._sure(limits)
        else:  # nothing measured yet: every draft (the deeper positions' acceptance is learnt from them too)
            want = full
        verify = None  # this step's verified drafts where they are not ``want`` (an exploration's)
        line.since_explore += 1
        self._since_deep += 1
        # A close call not to draft: the acceptance estimate that made it learns only from drafts verified (no
        # shadows: a drafter with a model), so one that fell below the line by chance would stay there; explored
        # often, never backed off.
        close_call = close and not any(want) and self.shadows is None
        every = line.explore_every if line.cost.fitted else MIN_FIT_STEPS
        if close_call:
            every = min(every, EXPLORE_CLOSE)
        due = line.since_explore >= every
        if want == full:  # as deep as the limits allow: nothing left unexplored below
            self._since_deep, self._deep_every = 0, EXPLORE_EVERY
        if self._verify_next:
            verify = self._fill(limits, self._verify_next)
            self._verify_next = 0
        elif due and line.cost.steps >= MIN_FIT_STEPS:
            line.since_explore = 0
            self.num_exploration_steps += 1
            drafting = any(want)
            same = drafting == line.was_drafting
            line.explore_every = min(2 * line.explore_every, EXPLORE_MAX) if same and not close_call else EXPLORE_EVERY
            line.was_drafting = drafting
            if drafting:
                want = [0] * len(decode)  # one step without drafts ...
            else:  # ... or drafts now, verified next step: what one drafting pass makes (see plan)
                self._verify_next = self.k if self.max_passes == 1 else 1
                want = self._fill(limits, self._verify_next)
        elif any(want) and self._since_deep >= self._deep_every:
            # Drafting, but shallower than the limits allow, for a while: a deeper position's estimate is learnt
            # only from drafts verified there, so a low one would never be corrected (a class estimate from an
            # earlier workload). Every draft now, all verified in the next step; the interval doubles while the
            # choice stays shallow.
            self._since_deep, self._deep_every = 0, min(2 * self._deep_every, EXPLORE_MAX)
            self.num_exploration_steps += 1
            self._verify_next, want = self.k, full
        # A seed asks for reproducible outputs: which random numbers a sampled request consumes depends on its
        # k, so a seeded one is never varied (every draft, as under "fixed").
        want = [self.k if s else w for s, w in zip(seeded, want)]
        if self.tree_nodes:
            self.propose_tree = self._trees_pay(limits, want) or any(seeded)  # (a seed: never varied either)
            if self.propose_tree and cost.fitted:  # a tree verifies every level a request may still use
                want = [max(w, lim) for w, (_, lim) in zip(want, limits)]
        self.propose_k = max(want)
        # Settled on no drafts (fitted, no close call, nothing drafted or verified for QUIET plans in a row): a
        # draft head's pass over the prompt chunks admitted now is skipped too; those requests are never drafted
        # (``Request.drafter_gap``).
        quiet = not self.propose_k and not close_call and verify is None and cost.fitted
        self._quiet = self._quiet + 1 if quiet else 0
        self.drafter_prefill = not (self.head and self._quiet >= QUIET)
        self._shadow_candidates = [req for req, _ in decode] if self.shadows is not None and not self.propose_k else []
        if verify is not None:
            want = [self.k if s else w for s, w in zip(seeded, verify)]
        return {req.request_id: min(w, cap) for (req, cap), w in zip(decode, want)}

    def observe_drafts(
        self, req: Request, num_valid: int, num_accepted: int, tree: bool = False, num_slots: int | None = None
    ) -> None:
        self.verified_k[min(num_valid, self.k)] += 1
        # A scheduled slot the proposer left empty (async: slots are scheduled before the drafts exist), reached
        # with every draft before it accepted, yielded nothing: a miss for what a slot is worth here, though
        # no rejection in the reported statistics (they count verified drafts only).
        empty = num_slots is not None and not tree and num_accepted == num_valid < min(num_slots, self.k)
        if num_valid <= 0 and not empty:
            return
        if tree:
            self._observe_tree_verify(req, num_valid, num_accepted)
            return
        self.acceptance.observe(req, num_valid + empty, num_accepted)

    def observe_step(self, so: SchedulerOutput, busy: bool) -> None:
        now = self.clock()
        spec, sampling = so.scheduled_spec_decode_tokens, so.sampling_req_ids
        # Decode-only steps (every request: one token plus its drafts) fit the cost of a logits row — steady ones
        # only: the step before was one too, of as many requests. A step just after requests came or went carries
        # the host's work for them (a server's responses finished, prompts admitted), and a batch size seen only
        # at those transitions (four streams ramping up and down) fitted a line of their noise — a level of 6-9
        # ms and a row at a quarter of its cost at three requests, where four streams' line read 3.5 ms and 0.6 ms
        # — which bought drafts at every transition (BENCHMARKS.md §19).
        n_reqs = len(so.num_scheduled_tokens)
        decode_only = all(n == 1 + len(spec.get(r, ())) and r in sampling for r, n in so.num_scheduled_tokens.items())
        steady, self._last_decode_reqs = decode_only and self._last_decode_reqs == n_reqs, n_reqs if decode_only else 0
        if self._last is not None and steady:
            rows, seconds = so.total_num_scheduled_tokens + so.num_tree_rows, now - self._last
            cost = self.lines[batch_class(n_reqs)].cost
            passes = min(so.num_drafts_to_propose or 0, self.max_passes)
            if so.num_tree_rows or so.draft_trees:
                self._observe_tree_step(cost, rows, passes, seconds)
            else:
                cost.observe(rows, seconds, passes)
        self._last = now if busy else None

    def shadow(self, step_id: int) -> set[str]:
        if not self._shadow_candidates or self.shadows is None:
            return set()
        ids = self.shadows.ask(self._shadow_candidates, step_id)
        self._shadow_candidates = []
        return ids

    def observe_tokens(self, req: Request, step_id: int, shadow: list[int] | None) -> None:
        if self.shadows is not None:
            self.shadows.observe(req, step_id, shadow)

    def forget(self, request_id: str) -> None:
        self.acceptance.forget(request_id)
        if self.shadows is not None:
            self.shadows.forget(request_id)

    def as_dict(self) -> dict[str, object]:
        out = super().as_dict()
        out["cost"] = {f"{1 << (c - 1)}-{(1 << c) - 1} requests": line.cost.as_dict()
                       for c, line in sorted(self.lines.items())}
        if self.shadows is not None:
            out.update(self.shadows.as_dict())
        out["acceptance_by_temperature"] = {name: list(a) for name, a in zip(TEMPERATURE_CLASSES, self.acceptance.by_class)}
        out.update(self._tree_dict())
        return out


def make_policy(name: str, k: int, method: str, clock: Callable[[], float] = time.perf_counter,
                tree_nodes: int = 0, fast_rows: int = 0) -> FixedPolicy:
    if name not in POLICIES:
        raise ValueError(f"speculative_config.policy must be one of {POLICIES}, got {name!r}")
    return AdaptivePolicy(k, method, clock, tree_nodes, fast_rows) if name == "adaptive" else FixedPolicy(k)
