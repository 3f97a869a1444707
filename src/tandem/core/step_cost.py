"""The speculation policy's step cost (core/spec_policy.py): ``seconds = fixed + per_row * rows + per_pass *
passes`` for decode steps, fitted by exponentially forgetting least squares. Pure Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass

COST_DECAY = 0.97  # forgetting factor of the step-cost fit (about 30 steps of memory)
MIN_FIT_STEPS = 4
# Where passes and rows move together (squared correlation above this) the fit cannot tell them apart: the
# passes' share is left at 0, all in per_row (the line before passes were counted).
COLLINEAR = 0.95


@dataclass
class StepCost:
    """``seconds = fixed + per_row * rows + per_pass * passes`` for decode steps, by exponentially forgetting
    least squares (``passes``: the tokens drafted ahead in the step)."""

    n: float = 0.0  # weighted count, and the weighted sums below (x: rows, z: passes, y: seconds)
    sx: float = 0.0
    sz: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxz: float = 0.0
    szz: float = 0.0
    sxy: float = 0.0
    szy: float = 0.0
    steps: int = 0
    fixed: float = 0.0
    per_row: float = 0.0
    per_pass: float = 0.0
    # Enough steps, of different sizes (relative spread of the rows seen, std / mean, >= 5 %), to fit.
    fitted: bool = False

    def observe(self, rows: int, seconds: float, passes: int = 0) -> None:
        d = COST_DECAY
        self.n, self.sx, self.sz, self.sy = d * self.n + 1, d * self.sx + rows, d * self.sz + passes, d * self.sy + seconds
        self.sxx, self.sxz, self.szz = d * self.sxx + rows * rows, d * self.sxz + rows * passes, d * self.szz + passes * passes
        self.sxy, self.szy = d * self.sxy + rows * seconds, d * self.szy + passes * seconds
        self.steps += 1
        n = self.n
        mx, mz, my = self.sx / n, self.sz / n, self.sy / n
        vxx = self.sxx / n - mx * mx
        self.fitted = self.steps >= MIN_FIT_STEPS and max(vxx, 0.0) ** 0.5 >= 0.05 * max(mx, 1e-9)
        if not self.fitted:
            return
        vzz, vxz = max(self.szz / n - mz * mz, 0.0), self.sxz / n - mx * mz
        cxy, czy = self.sxy / n - mx * my, self.szy / n - mz * my
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
        self.fixed = max(my - self.per_row * mx - per_pass * mz, 0.0)

    def seconds(self, rows: float, passes: int = 0) -> float:
        return self.fixed + self.per_row * rows + self.per_pass * passes

    def as_dict(self) -> dict[str, float | int | bool]:
        return {"fitted": self.fitted, "fixed_s": self.fixed, "per_row_s": self.per_row,
                "per_pass_s": self.per_pass, "steps": self.steps}
