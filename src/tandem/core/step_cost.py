"""The speculation policy's step cost (core/spec_policy.py): ``seconds = fixed + per_row * rows + per_pass *
passes`` for decode steps, fitted by exponentially forgetting least squares. Pure Python, no torch.

Two memories. The slopes (``per_row``, ``per_pass``) need steps of different sizes, and under the policy most
steps are alike — it keeps choosing the same drafts, and the steps that differ are its explorations, up to
``EXPLORE_MAX`` steps apart — so they are fitted over a long memory (``SLOPE_DECAY``), from each step's
difference with the steps just before it. The level moves with the requests' contexts and the machine's speed,
so ``fixed`` puts the line through the mean of the recent steps (``LEVEL_DECAY``). Once fitted, the line stays
fitted: where the steps seen lately are too alike to tell a slope (spread below ``SPREAD``) the slopes stand as
last fitted instead of being guessed from noise, and the policy never falls back to verifying every draft
because its own choice made the steps uniform.

The policy keeps one line per batch class (``batch_class``: 1, 2-3, 4-7, ... decoding requests, ``BatchLine``):
a row's cost is no line across batch sizes (at one stream a verify row rides the weight read, at 32 it is
compute). A class whose slope is not yet settled (known to within ``TRUST`` of a row's time) borrows the line
of the nearest fitted class of more requests (``line_cost``); with only smaller classes fitted the policy takes
only near-certain drafts until its own line is fitted (``fitted_below``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

LEVEL_DECAY = 0.97  # forgetting factor of the level (about 30 steps of memory)
SLOPE_DECAY = 0.995  # forgetting factor of the slopes (about 200 steps)
MIN_FIT_STEPS = 4
SPREAD = 0.05  # relative spread of the rows (std / mean, slope memory) below which no slope is fitted
# Where passes and rows move together (squared correlation above this) the fit cannot tell them apart: the
# passes' share is left at 0, all in per_row (the line before passes were counted).
COLLINEAR = 0.95
# A slope is used once its standard error is at most this fraction of a row's mean time (``_fit_slopes``).
TRUST = 0.1
# A step enters the slopes' memory (and ages it) only where its rows or passes differ from the recent mean by at
# least this much: a step like those before it says nothing of a slope, and counted as memory it pushed out the
# few that did — at one stream, where only the explorations differ, the fitted cost of a draft moved between 1.2
# and 3.2 ms over one server's life (true: ~1.7) and switched drafting off and on (BENCHMARKS.md §19).
INFORMATIVE = 0.5


@dataclass
class Means:
    """Exponentially weighted means of rows ``x``, passes ``z`` and seconds ``y``."""

    n: float = 0.0
    sx: float = 0.0
    sz: float = 0.0
    sy: float = 0.0

    def add(self, decay: float, x: float, z: float, y: float) -> None:
        d = decay
        self.n, self.sx, self.sz, self.sy = d * self.n + 1, d * self.sx + x, d * self.sz + z, d * self.sy + y

    def get(self) -> tuple[float, float, float]:
        return self.sx / self.n, self.sz / self.n, self.sy / self.n


@dataclass
class StepCost:
    """``seconds = fixed + per_row * rows + per_pass * passes`` for decode steps (``passes``: the tokens drafted
    ahead in the step). The slopes: least squares over each step's difference from the recent mean before it
    (rows, passes and seconds), with ``SLOPE_DECAY``'s long memory — a difference within a few steps is blind to
    the level's slow drift, which a long memory of raw steps would read as a slope. The level: ``fixed`` puts
    the line through the mean of the recent steps (``LEVEL_DECAY``)."""

    recent: Means = field(default_factory=Means)  # the level
    # Long-memory weighted count and sums of the differences' squares and products: rows x, passes z, seconds y.
    n: float = 0.0
    dxx: float = 0.0
    dxz: float = 0.0
    dzz: float = 0.0
    dxy: float = 0.0
    dzy: float = 0.0
    dyy: float = 0.0
    steps: int = 0
    fixed: float = 0.0
    per_row: float = 0.0
    per_pass: float = 0.0
    # Enough steps, of different sizes, have been seen to fit the slopes (it stays True from then on).
    fitted: bool = False
    # The slope has been known to within ``TRUST`` of a row's mean time (it stays True from then on).
    settled: bool = False

    def observe(self, rows: int, seconds: float, passes: int = 0) -> None:
        if self.recent.n > 0.0:
            mx, mz, my = self.recent.get()
            x, z, y, d = rows - mx, passes - mz, seconds - my, SLOPE_DECAY
            if abs(x) >= INFORMATIVE or abs(z) >= INFORMATIVE:
                self.n, self.dxx, self.dxz = d * self.n + 1, d * self.dxx + x * x, d * self.dxz + x * z
                self.dzz, self.dxy, self.dzy = d * self.dzz + z * z, d * self.dxy + x * y, d * self.dzy + z * y
                self.dyy = d * self.dyy + y * y
        self.recent.add(LEVEL_DECAY, rows, passes, seconds)
        self.steps += 1
        mx, mz, my = self.recent.get()
        self._fit_slopes(mx, my)
        if self.fitted:
            self.fixed = max(my - self.per_row * mx - self.per_pass * mz, 0.0)

    def _fit_slopes(self, mx: float, my: float) -> None:
        n = self.n
        if self.steps < MIN_FIT_STEPS or n <= 0.0 or (self.dxx / n) ** 0.5 < SPREAD * max(mx, 1e-9):
            return  # too alike to tell a slope: the last one stands (none yet: not fitted)
        vxx, vzz, vxz = self.dxx / n, self.dzz / n, self.dxz / n
        cxy, czy = self.dxy / n, self.dzy / n
        slope, per_pass, inv_xx = cxy / vxx, 0.0, 1.0 / vxx
        if vzz > 0.0 and vxz * vxz < COLLINEAR * vxx * vzz:
            det = vxx * vzz - vxz * vxz
            per_pass = (vxx * czy - vxz * cxy) / det
            if per_pass > 0.0:
                slope, inv_xx = (cxy * vzz - vxz * czy) / det, vzz / det
            else:
                per_pass = 0.0
        # Settled once the slope's standard error (from the residuals) is within ``TRUST`` of a row's mean time:
        # a few steps of a rare batch size, their times moved by whatever else the host did then, can give a
        # slope of any size (``line_cost`` prefers a larger class's line to an unsettled one).
        if not self.settled:
            resid = max(self.dyy / n - slope * cxy - per_pass * czy, 0.0)
            self.settled = resid * inv_xx / n <= (TRUST * my / max(mx, 1.0)) ** 2
        self.per_row = max(slope, 1e-3 * my / max(mx, 1.0))  # noise never makes rows free
        self.per_pass = per_pass
        self.fitted = True

    def seconds(self, rows: float, passes: int = 0) -> float:
        return self.fixed + self.per_row * rows + self.per_pass * passes

    def with_row_floor(self, floor: float) -> StepCost:
        """This line with its row cost at least ``floor``, through the same recent mean step (``fixed`` lowered to
        match): itself where it is not below, or not fitted. The copy is for reading (``line_cost``); it shares
        the memories."""
        if self.per_row >= floor or not self.fitted:
            return self
        mx, mz, my = self.recent.get()
        return replace(self, per_row=floor, fixed=max(my - floor * mx - self.per_pass * mz, 0.0))

    def as_dict(self) -> dict[str, float | int | bool]:
        return {"fitted": self.fitted, "settled": self.settled, "fixed_s": self.fixed, "per_row_s": self.per_row,
                "per_pass_s": self.per_pass, "steps": self.steps}


def batch_class(num_reqs: int) -> int:
    """Which line a step of ``num_reqs`` decoding requests takes: 1, 2-3, 4-7, 8-15, ... requests."""
    return max(num_reqs, 1).bit_length()


@dataclass
class BatchLine:
    """A batch class's step cost, and the speculation policy's schedule of the explorations that feed it."""

    cost: StepCost = field(default_factory=StepCost)
    since_explore: int = 0
    explore_every: int = 0
    was_drafting: bool | None = None  # the choice at the last exploration


def line_cost(lines: dict[int, BatchLine], num_reqs: int) -> StepCost:
    """The cost line of ``num_reqs``'s batch class once it is settled; until then the nearest fitted class of
    *more* requests, if any — a row measured in a larger batch costs at least what it does in this one, while a
    rare batch size's few steps can give any slope — else its own, fitted or not (the policy explores an
    unfitted one every ``MIN_FIT_STEPS`` steps). Never a smaller class's: at one stream a verify row rides the
    weight read (~0.4 ms on a 2-core CPU, against ~1.1 ms at four streams), and that line would buy a larger
    batch drafts that lose (``fitted_below``).

    By the same rule a row never costs less than in a settled smaller class (``with_row_floor``): a settled slope
    can still be read low — ``settled`` bounds its error by a tenth of a row's *mean* time, ~0.2 ms at sixteen
    streams, while the slope itself is ~0.5 ms — and the 16-31-request class's first fit on the Xeon kind read
    0.18 ms a row against the 8-15 class's 0.68-0.82: suffix drafts at ~0.4 acceptance looked cheap and were
    bought at a loss for several runs (BENCHMARKS.md §19, session 30)."""
    c = batch_class(num_reqs)
    own = lines[c].cost
    larger = [k for k, line in lines.items() if k > c and line.cost.fitted]
    chosen = own if own.settled or not larger else lines[min(larger)].cost
    floors = [line.cost.per_row for k, line in lines.items() if k < c and line.cost.settled]
    return chosen.with_row_floor(max(floors)) if floors else chosen


def fitted_below(lines: dict[int, BatchLine], num_reqs: int) -> bool:
    """Whether a class of fewer requests than ``num_reqs``'s has a fitted line (while ``line_cost`` has none for
    it) — then the policy takes only near-certain drafts here until this class's own line is fitted, rather than
    verifying every draft as a server that has measured nothing yet does."""
    c = batch_class(num_reqs)
    return any(k < c and line.cost.fitted for k, line in lines.items())
