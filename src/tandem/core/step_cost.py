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
compute). A class not yet fitted borrows the nearest fitted class's line (``line_cost``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEVEL_DECAY = 0.97  # forgetting factor of the level (about 30 steps of memory)
SLOPE_DECAY = 0.995  # forgetting factor of the slopes (about 200 steps)
MIN_FIT_STEPS = 4
SPREAD = 0.05  # relative spread of the rows (std / mean, slope memory) below which no slope is fitted
# Where passes and rows move together (squared correlation above this) the fit cannot tell them apart: the
# passes' share is left at 0, all in per_row (the line before passes were counted).
COLLINEAR = 0.95


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
    steps: int = 0
    fixed: float = 0.0
    per_row: float = 0.0
    per_pass: float = 0.0
    # Enough steps, of different sizes, have been seen to fit the slopes (it stays True from then on).
    fitted: bool = False

    def observe(self, rows: int, seconds: float, passes: int = 0) -> None:
        if self.recent.n > 0.0:
            mx, mz, my = self.recent.get()
            x, z, y, d = rows - mx, passes - mz, seconds - my, SLOPE_DECAY
            self.n, self.dxx, self.dxz = d * self.n + 1, d * self.dxx + x * x, d * self.dxz + x * z
            self.dzz, self.dxy, self.dzy = d * self.dzz + z * z, d * self.dxy + x * y, d * self.dzy + z * y
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
        slope, per_pass = cxy / vxx, 0.0
        if vzz > 0.0 and vxz * vxz < COLLINEAR * vxx * vzz:
            det = vxx * vzz - vxz * vxz
            per_pass = (vxx * czy - vxz * cxy) / det
            if per_pass > 0.0:
                slope = (cxy * vzz - vxz * czy) / det
            else:
                per_pass = 0.0
        self.per_row = max(slope, 1e-3 * my / max(mx, 1.0))  # noise never makes rows free
        self.per_pass = per_pass
        self.fitted = True

    def seconds(self, rows: float, passes: int = 0) -> float:
        return self.fixed + self.per_row * rows + self.per_pass * passes

    def as_dict(self) -> dict[str, float | int | bool]:
        return {"fitted": self.fitted, "fixed_s": self.fixed, "per_row_s": self.per_row,
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
    """The cost line of ``num_reqs``'s batch class; until it is fitted (the policy explores it every
    ``MIN_FIT_STEPS`` steps till then), the nearest fitted class's."""
    c = batch_class(num_reqs)
    own = lines[c].cost
    if own.fitted:
        return own
    fitted = [(abs(k - c), k) for k, line in lines.items() if line.cost.fitted]
    return lines[min(fitted)[1]].cost if fitted else own
