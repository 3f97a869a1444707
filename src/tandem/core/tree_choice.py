"""The speculation policy's choice between draft trees and chains (core/spec_policy.py; ``speculative_config.tree``).
Pure Python, no torch.

Per step, whether the drafts made in it are trees or chains: trees when their expected rate beats the chains' by
the policy's ``MARGIN`` under the same cost fit (a tree verify is ``1 + max_nodes`` rows, plus what tree steps cost
beyond the line — their drafting — as a moving average of their residuals, tree steps being kept out of the line's
fit; its accepted tokens a moving average per temperature class, started at ``TREE_GAIN_PRIOR`` times the chain's
prior). ``fixed`` always drafts trees.
"""

from __future__ import annotations

from tandem.core.acceptance import TEMPERATURE_CLASSES, Acceptance
from tandem.core.request import Request
from tandem.core.step_cost import BatchLine, StepCost, line_cost

# Before a tree is verified: a tree's accepted tokens relative to the chain's (the shipped heads' measure on the
# report split, BENCHMARKS.md §21: 1.24-1.31x).
TREE_GAIN_PRIOR = 1.25
TREE_EXTRA_WEIGHT = 0.2  # EWMA weight of one tree step's cost beyond the fitted line
TREE_WEIGHT = 0.03  # EWMA weight of one tree verify in its temperature class's accepted tokens (they are rare)


class TreeChoice:
    """Mixed into ``AdaptivePolicy``: its acceptance, cost lines, drafting passes and fast-path room."""

    acceptance: Acceptance
    lines: dict[int, BatchLine]
    max_passes: int

    def _room(self, rows: int) -> float:
        raise NotImplementedError

    def _init_trees(self, k: int, prior: float, tree_nodes: int, margin: float, explore_every: int) -> None:
        # Draft trees (``tree_nodes`` > 0): per temperature class, (accepted, verified depth) of a tree verify,
        # as moving averages, started from the chain prior's expected tokens times TREE_GAIN_PRIOR.
        self.tree_nodes = tree_nodes
        self._tree_margin, self._tree_explore_every = margin, explore_every
        chain = sum(prior ** (j + 1) for j in range(k))
        self.tree_accepted = [[min(k, chain * TREE_GAIN_PRIOR), float(k)] for _ in TEMPERATURE_CLASSES]
        self._since_tree = explore_every - 8  # a first tree step soon after the line is fitted
        # What a step that drafts or verifies trees costs beyond the fitted line for its rows (the trees' own
        # drafting, their masks): a moving average of those steps' residuals. They stay out of the line's fit.
        self.tree_extra = 0.0

    def _trees_pay(self, limits: list[tuple[Request, int]], want: list[int]) -> bool:
        """Whether the next step verifies trees rather than the chains ``want`` chose (or no drafts, which
        ``want`` then is): the expected tokens per second of each under the fitted cost (a tree's ``tree_nodes``
        rows and its cost beyond them, its accepted tokens by temperature class). Until the line is fitted,
        chains (tree steps stay out of its fit). Every ``EXPLORE_EVERY`` steps without trees (the first soon
        after the fit) one with them, so their estimates never freeze — unless trees could not win even if
        they accepted every level (their cost alone rules them out: no exploration step is spent on them)."""
        cost = line_cost(self.lines, len(limits))
        if not cost.fitted:
            return False
        self._since_tree += 1
        n = len(limits)
        chain_tokens, tree_tokens, best_tokens, tree_rows = float(n), float(n), float(n), n
        for (req, limit), w in zip(limits, want):
            alpha, g = self.acceptance.alpha(req), 1.0
            for j in range(w):
                g *= alpha[j]
                chain_tokens += g
            if limit:
                acc, depth = self.tree_accepted[self.acceptance.kinds[req.request_id][0]]
                tree_tokens += acc * min(1.0, limit / max(depth, 1e-9))
                best_tokens += limit
                tree_rows += self.tree_nodes
        chain_rate = chain_tokens / cost.seconds(n + sum(want), min(max(want, default=0), self.max_passes))
        tree_seconds = cost.seconds(tree_rows, self.max_passes) + self.tree_extra
        if best_tokens / tree_seconds <= chain_rate or tree_rows - n > self._room(n):
            return False
        if tree_tokens / tree_seconds > self._tree_margin * chain_rate or self._since_tree >= self._tree_explore_every:
            self._since_tree = 0
            return True
        return False

    def _observe_tree_verify(self, req: Request, num_valid: int, num_accepted: int) -> None:
        """A tree's acceptance is not a chain's per-position one: its own estimate."""
        t = self.tree_accepted[self.acceptance.kind_of(req)[0]]
        t[0] += TREE_WEIGHT * (num_accepted - t[0])
        t[1] += TREE_WEIGHT * (num_valid - t[1])

    def _observe_tree_step(self, cost: StepCost, rows: int, passes: int, seconds: float) -> None:
        """A step that drafted or verified trees: its cost beyond the fitted line (kept out of the line's fit)."""
        if cost.fitted:
            self.tree_extra += TREE_EXTRA_WEIGHT * (seconds - cost.seconds(rows, passes) - self.tree_extra)

    def _tree_dict(self) -> dict[str, object]:
        if not self.tree_nodes:
            return {}
        accepted = {name: t[0] for name, t in zip(TEMPERATURE_CLASSES, self.tree_accepted)}
        return {"tree_accepted_by_temperature": accepted, "tree_extra_s": self.tree_extra}
