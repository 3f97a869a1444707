"""Shadow drafts: what a model-free drafter would have drafted while the speculation policy chose no drafts,
scored against the tokens the request then committed. Pure Python, no torch.

Why. The policy learns a draft position's acceptance only from drafts verified there, so while it drafts
nothing its estimates stand still: an estimate from a phase where drafts did not pay (suffix decoding's cache
still cold, BENCHMARKS.md §19) can keep a later phase, where they would, without drafts for good — each rare
exploration moving it only part of the way — and making estimates forget lets one lucky exploration switch
drafting back on where it loses. A drafter without a model (prompt lookup, suffix decoding) costs next to
nothing to run, so the worker runs it for a few requests on steps that draft nothing (``SchedulerOutput
.shadow_req_ids``) and returns what it would have drafted (``ModelRunnerOutput.shadow_token_ids``); nothing is
verified. When the request's next tokens are committed, draft j is counted accepted if it equals the token
committed at its position and drafts 1 .. j-1 were.

That is the acceptance the verification would have measured, at any temperature: these drafters' drafts are
one token each (q one-hot), which the rejection sampler accepts with probability p(draft) — and the token the
request commits at that position is drawn from p (rejection sampling keeps the target's distribution), so it
equals the draft with the same probability. Greedy, it is the exact outcome. The estimate is unbiased and needs
no verify row.

Only the request's temperature class learns from a shadow, not the request's own counts: one request's few
shadows are a noisy sample, and with them a single lucky shadow (3 of 3 at T 0.7) lifted that request's estimate
past the bar and bought verify rows that then lost (suffix, 16 streams, T 0.7, in one process: 470–541 tok/s
against 534–547 before shadows; teaching the class only, 534–544; BENCHMARKS.md §19). The class estimate averages
every request's. Running the
drafter is not free either (~0.45 ms a call for 8 requests at 32 streams, mostly per call), and the class needs
no more than a sample now and then, so a request is shadowed at most once every ``SHADOW_EVERY`` steps (its
shadow resolves at the first mismatch), at most ``SHADOW_BUDGET`` requests a step, at most ``SHADOW_DEPTH``
drafts deep.

An empty shadow (the drafter found nothing) is a miss at the first position where the policy counts an empty
draft slot as one (async scheduling, where slots are scheduled before drafts exist), and says nothing otherwise
(a synchronous step schedules no slot for a request without drafts).
"""

from __future__ import annotations

from tandem.core.acceptance import Acceptance
from tandem.core.request import Request

SHADOW_BUDGET = 8  # requests shadowed in one step, at most
SHADOW_DEPTH = 8  # drafts a shadow makes, at most
SHADOW_EVERY = 32  # steps from one shadow of a request to its next, at least


class Shadows:
    def __init__(self, acceptance: Acceptance, k: int) -> None:
        self.acceptance = acceptance
        self.depth = min(k, SHADOW_DEPTH)
        self.empty_is_miss = False  # set by the scheduler: async scheduling counts an empty slot as a miss
        # request id -> the step it was asked in (an int), or (output position of its first draft, drafts)
        self._pending: dict[str, int | tuple[int, list[int]]] = {}
        self._asked: dict[str, int] = {}  # request id -> the step its last shadow was asked in
        self._next = 0  # round-robin start over the decoding requests
        self.num_scored = 0  # shadows resolved (statistics)
        self.num_drafts = 0  # shadow drafts scored (statistics)
        self.num_accepted = 0  # of them, matching the committed tokens

    def ask(self, requests: list[Request], step_id: int) -> set[str]:
        """Up to ``SHADOW_BUDGET`` of ``requests`` (decoding this step, none drafting for the next) to shadow
        during step ``step_id``: those without a shadow pending, round-robin."""
        out: set[str] = set()
        n = len(requests)
        if not n:
            return out
        start = self._next % n
        for i in range(n):
            req = requests[(start + i) % n]
            rid = req.request_id
            if rid in self._pending or req.remaining_tokens() <= 1:
                continue
            if rid in self._asked and step_id < self._asked[rid] + SHADOW_EVERY:
                continue
            self._pending[rid] = self._asked[rid] = step_id
            out.add(req.request_id)
            if len(out) >= SHADOW_BUDGET:
                self._next = start + i + 1
                break
        return out

    def observe(self, req: Request, step_id: int, drafts: list[int] | None) -> None:
        """Step ``step_id`` of ``req`` was committed (its tokens appended); ``drafts``: the shadow it returned,
        continuing from the tokens so far (None: none)."""
        rid = req.request_id
        rec = self._pending.get(rid)
        if drafts is not None and rec == step_id:
            if not drafts:
                del self._pending[rid]
                if self.empty_is_miss:
                    self._score(req, 1, 0)
                return
            rec = self._pending[rid] = (len(req.output_token_ids), drafts[: self.depth])
        elif isinstance(rec, int):
            if rec <= step_id:  # asked, and that step came back without one (it drafted after all)
                del self._pending[rid]
            return
        if rec is None:
            return
        start, shadow = rec
        got = req.output_token_ids[start : start + len(shadow)]
        for j, tok in enumerate(got):
            if tok != shadow[j]:
                self._score(req, j + 1, j)
                del self._pending[rid]
                return
        if len(got) == len(shadow):
            self._score(req, len(shadow), len(shadow))
            del self._pending[rid]

    def _score(self, req: Request, tried: int, accepted: int) -> None:
        self.acceptance.observe(req, tried, accepted, own_counts=False)
        self.num_scored += 1
        self.num_drafts += tried
        self.num_accepted += accepted

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._asked.pop(request_id, None)

    def as_dict(self) -> dict[str, int]:
        return {"num_shadows": self.num_scored, "num_shadow_drafts": self.num_drafts,
                "num_shadow_accepted": self.num_accepted}
