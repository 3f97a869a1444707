"""The speculation policy's step cost (core/step_cost.py): the line and the drafting passes recovered from
noisy steps, and what the fit refuses to guess."""

from __future__ import annotations

import random

import pytest

from tandem.core.step_cost import StepCost


def test_cost_fit_recovers_the_line_and_needs_spread():
    rng = random.Random(0)
    cost = StepCost()
    for _ in range(200):
        rows = rng.choice([8, 16, 32, 64])
        cost.observe(rows, 0.004 + 0.0005 * rows + rng.gauss(0, 1e-5))
    assert cost.fitted
    assert cost.fixed == pytest.approx(0.004, rel=0.02) and cost.per_row == pytest.approx(0.0005, rel=0.02)
    same = StepCost()
    for _ in range(20):
        same.observe(8, 0.01)
    assert not same.fitted  # one size only: the slope is unknown


def test_a_slope_drowned_in_the_steps_noise_is_not_used():
    """Three-request steps of a server, their times moved by a millisecond or two by whatever else the host
    did then: a handful of them gives a slope of any size, fitted but not settled (its standard error beyond
    ``TRUST`` of a row's mean time): a larger class's line is used instead while there is one; a longer run of
    the same steps settles it."""
    from collections import defaultdict

    from tandem.core.step_cost import TRUST, BatchLine, line_cost

    rng = random.Random(0)
    lines: defaultdict[int, BatchLine] = defaultdict(BatchLine)
    noisy = lines[2].cost
    for rows in (3, 9, 3, 9, 3, 6):
        noisy.observe(rows, 0.004 + 0.001 * rows + rng.gauss(0, 2e-3))
    assert noisy.fitted and not noisy.settled and line_cost(lines, 3) is noisy  # nothing larger: its own
    for rows in (4, 8, 12, 4, 8, 12, 4):
        lines[3].cost.observe(rows, 0.005 + 0.001 * rows)
    assert line_cost(lines, 3) is lines[3].cost
    for _ in range(400):
        rows = rng.choice([3, 6, 9])
        noisy.observe(rows, 0.004 + 0.001 * rows + rng.gauss(0, 2e-3))
    assert noisy.settled and noisy.per_row == pytest.approx(0.001, abs=TRUST * 0.002 * 2)
    assert line_cost(lines, 3) is noisy


def test_cost_fit_separates_drafting_passes_from_rows():
    """A draft head's passes cost whatever the rows: the fit finds both where steps vary them apart, and
    leaves the passes at 0 where they always move with the rows (it cannot tell them apart there)."""
    rng = random.Random(1)
    cost = StepCost()
    for _ in range(300):
        rows, passes = rng.choice([4, 8, 12, 16]), rng.choice([0, 1, 2, 3])
        cost.observe(rows, 0.004 + 0.0005 * rows + 0.002 * passes + rng.gauss(0, 1e-5), passes)
    assert cost.per_row == pytest.approx(0.0005, rel=0.03) and cost.per_pass == pytest.approx(0.002, rel=0.03)
    assert cost.fixed == pytest.approx(0.004, rel=0.05)
    assert cost.seconds(8, 2) == pytest.approx(0.004 + 0.004 + 0.004, rel=0.02)
    together = StepCost()
    for _ in range(50):
        verified = rng.choice([0, 3])  # drafts verified and drafted: the passes follow the rows exactly
        together.observe(4 + 4 * verified, 0.004 + 0.0005 * (4 + 4 * verified) + 0.002 * verified, verified)
    assert together.per_pass == 0.0 and together.per_row == pytest.approx(0.0005 + 0.002 / 4, rel=0.01)


def test_the_fit_stays_when_the_steps_turn_alike_and_its_level_follows():
    """The policy's own choice makes its steps alike (no drafts for hundreds of steps): the slope stands as
    fitted — the policy never falls back to verifying every draft — and the level follows the recent steps."""
    cost = StepCost()
    for i in range(40):
        rows = 4 if i % 2 else 8
        cost.observe(rows, 0.005 + 0.001 * rows)
    assert cost.fitted and cost.per_row == pytest.approx(0.001, rel=1e-6)
    for i in range(1000):  # alike, and slower as the contexts grow: 9 ms at 4 rows, then 12
        cost.observe(4, 0.009 + 0.003 * min(i / 500, 1.0))
    assert cost.fitted and cost.per_row == pytest.approx(0.001, rel=0.05)
    assert cost.seconds(4) == pytest.approx(0.012, rel=1e-3)


def test_rare_different_steps_still_give_a_steady_slope():
    """Under the policy most steps are alike and one in 64 (an exploration) differs; step times are noisy (10 %).
    The slopes' long memory keeps the slope within ~10 % most of the time (the level's 30-step memory alone was
    off by 16-20 % at the median and 36-45 % at the 90th percentile on these series)."""
    rng = random.Random(2)
    cost, errors = StepCost(), []
    for i in range(3000):
        rows = 8 if i % 64 == 0 else 4
        cost.observe(rows, (0.004 + 0.0012 * rows) * (1 + rng.gauss(0, 0.1)))
        if i > 300:
            errors.append(abs(cost.per_row / 0.0012 - 1))
    errors.sort()
    assert errors[len(errors) // 2] < 0.12 and errors[len(errors) * 9 // 10] < 0.3


def test_only_steps_that_differ_enter_and_age_the_slopes_memory():
    """One stream, the policy's choice steady: one step in 256 differs (an exploration, one more row), the rest
    are alike, step times noisy (10 %). Alike steps say nothing of the slope; had they aged its memory, it would
    hold the last one or two explorations and the slope would swing with their noise (off by 37 % at the median,
    139 % at the 90th percentile on this series). Counting only steps that differ, it holds every exploration."""
    rng = random.Random(3)
    cost, errors = StepCost(), []
    for i in range(6000):
        rows = 2 if i % 256 == 0 or i < 64 and i % 4 == 0 else 1
        cost.observe(rows, (0.0045 + 0.0008 * rows) * (1 + rng.gauss(0, 0.1)))
        if i > 1000:
            errors.append(abs(cost.per_row / 0.0008 - 1))
    errors.sort()
    assert errors[len(errors) // 2] < 0.1 and errors[len(errors) * 9 // 10] < 0.2
    assert cost.n < 60  # ~16 early steps and ~20 explorations (with their neighbours), not 200 steps' weight


def test_an_unfitted_batch_class_borrows_the_nearest_larger_fitted_line():
    from collections import defaultdict

    from tandem.core.step_cost import BatchLine, batch_class, fitted_below, line_cost

    lines: defaultdict[int, BatchLine] = defaultdict(BatchLine)
    assert not line_cost(lines, 4).fitted and not fitted_below(lines, 4)  # nothing fitted anywhere
    for n, per_row in ((1, 0.4e-3), (32, 2e-3)):
        cost = lines[batch_class(n)].cost
        for rows in (n, 2 * n, 3 * n, 4 * n, n, 2 * n, 4 * n, 3 * n):
            cost.observe(rows, 5e-3 + per_row * rows)
    assert [batch_class(n) for n in (1, 2, 3, 4, 16, 32, 63)] == [1, 2, 2, 3, 5, 6, 6]
    # A larger batch's line, never a smaller one's (its rows rode the weight read: too cheap here).
    assert line_cost(lines, 2) is lines[6].cost and line_cost(lines, 16) is lines[6].cost
    assert line_cost(lines, 40) is lines[6].cost and line_cost(lines, 1).per_row == pytest.approx(0.4e-3)
    assert fitted_below(lines, 16) and not fitted_below(lines, 1)
    # Above every fitted class: its own line, unfitted, with smaller ones fitted (near-certain drafts only).
    assert not line_cost(lines, 64).fitted and fitted_below(lines, 64)


def test_a_row_never_costs_less_than_in_a_settled_smaller_class():
    """The 16-31-request class's first fit on the Xeon kind read 0.18 ms a row, settled, against the 8-15 class's
    ~0.7: its line is read with the smaller class's row cost, through the same recent mean step; a larger row
    cost, an unfitted line and a smaller class's own line are left as they are."""
    from collections import defaultdict

    from tandem.core.step_cost import BatchLine, batch_class, line_cost

    lines: defaultdict[int, BatchLine] = defaultdict(BatchLine)
    for n, per_row in ((8, 0.7e-3), (16, 0.18e-3)):
        cost = lines[batch_class(n)].cost
        for rows in (n, n + n // 2, 2 * n, n + n // 4) * 4:
            cost.observe(rows, 30e-3 + per_row * rows)
        assert cost.settled
    small, big = lines[batch_class(8)].cost, lines[batch_class(16)].cost
    assert big.per_row == pytest.approx(0.18e-3)
    read = line_cost(lines, 16)
    assert read is not big and read.per_row == pytest.approx(0.7e-3) and big.per_row == pytest.approx(0.18e-3)
    mx, _, my = big.recent.get()
    assert read.seconds(mx) == pytest.approx(big.seconds(mx))  # the same step where the steps were
    assert line_cost(lines, 8) is small
    lines[batch_class(40)].cost.observe(40, 0.05)  # one step: not fitted, returned as is
    assert line_cost(lines, 40) is lines[batch_class(40)].cost
