"""The ``fixed`` speculation policy — every draft the proposer made is verified, the proposer always drafts
``k`` (the behaviour before the adaptive policy, kept for A/B) — and the interface the scheduler calls on any
policy (core/spec_policy.py's ``AdaptivePolicy`` extends it). Pure Python, no torch."""

from __future__ import annotations

from tandem.core.interface import SchedulerOutput
from tandem.core.request import Request
from tandem.core.shadow import Shadows


class FixedPolicy:
    """Every available draft is verified; the proposer always drafts ``k``."""

    name = "fixed"

    def __init__(self, k: int) -> None:
        self.k = k
        self.propose_k = k
        self.propose_tree = True  # with speculative_config.tree: the drafts made this step are a tree
        self.verified_k = [0] * (k + 1)  # decode steps (of one request) by drafts verified
        self.num_exploration_steps = 0
        self.shadows: Shadows | None = None  # a model-free drafter's unverified drafts, scored (core/shadow.py)
        self.shadow_depth = 0
        # Whether a drafter with its own KV runs over prompt chunks on a step that drafts nothing
        # (``SchedulerOutput.drafter_prefill``): always, here.
        self.drafter_prefill = True

    def plan(self, decode: list[tuple[Request, int]]) -> dict[str, int]:
        """Drafts to verify per request this step; ``decode``: (request, drafts available within its limits)
        for every request that decodes this step. Sets ``propose_k``: the drafts made during this step."""
        return {req.request_id: cap for req, cap in decode}

    def observe_drafts(
        self, req: Request, num_valid: int, num_accepted: int, tree: bool = False, num_slots: int | None = None
    ) -> None:
        """A decode step of ``req`` came back: it verified ``num_valid`` drafts (0: none; a tree's depth) and
        accepted ``num_accepted``; ``tree``: the drafts were a tree; ``num_slots``: the draft slots it was
        scheduled (``None``: ``num_valid``; more under async scheduling where the proposer left some empty)."""
        self.verified_k[min(num_valid, self.k)] += 1

    def observe_step(self, so: SchedulerOutput, busy: bool) -> None:
        """Step ``so`` came back; ``busy``: requests are still running (the next step follows at once)."""

    def shadow(self, step_id: int) -> set[str]:
        """Requests whose drafts the worker makes but does not verify during step ``step_id`` (the one just
        planned), to be scored against the tokens they commit next (core/shadow.py)."""
        return set()

    def observe_tokens(self, req: Request, step_id: int, shadow: list[int] | None) -> None:
        """Step ``step_id`` of ``req`` committed its tokens (the request goes on); ``shadow``: the drafts the
        worker made without verifying them, continuing from those tokens (None: none)."""

    def forget(self, request_id: str) -> None:
        """The request is gone."""

    def as_dict(self) -> dict[str, object]:
        return {"policy": self.name, "verified_k": list(self.verified_k),
                "num_exploration_steps": self.num_exploration_steps}
