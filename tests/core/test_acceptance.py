"""The speculation policy's acceptance estimates (core/acceptance.py): a class's running mean until it has seen
enough verifications, and the positions it has never verified read as the one before them."""

from __future__ import annotations

from tandem.core.acceptance import CLASS_PRIOR_COUNT, GLOBAL_WEIGHT, Acceptance
from tandem.core.spec_policy import EXPLORE_EVERY, AdaptivePolicy
from tests.core.test_spec_policy import _lines, _fitted, _Req


def test_a_few_verifications_move_the_class_estimate_from_the_prior():
    acc = Acceptance(4, 0.5)
    req = _Req("r")
    for _ in range(3):
        acc.observe(req, 4, 4)  # every draft accepted, three times
    # the running mean: three hits over the prior's CLASS_PRIOR_COUNT pseudo-verifications at 0.5
    expect = (3 + CLASS_PRIOR_COUNT * 0.5) / (3 + CLASS_PRIOR_COUNT)
    assert all(abs(a - expect) < 1e-12 for a in acc.by_class[0])
    # a moving average once it has seen 1 / GLOBAL_WEIGHT: one miss then moves it by GLOBAL_WEIGHT of the gap
    for _ in range(int(1 / GLOBAL_WEIGHT)):
        acc.observe(req, 1, 1)
    before = acc.by_class[0][0]
    acc.observe(req, 1, 0)
    assert abs(acc.by_class[0][0] - before * (1 - GLOBAL_WEIGHT)) < 1e-12


def test_positions_never_verified_read_as_the_one_before():
    acc = Acceptance(8, 0.5)
    req = _Req("r")
    for _ in range(40):
        acc.observe(req, 4, 4)  # a choice of 4 drafts, all accepted: positions 5-8 never verified
    cls = acc.by_class[0]
    assert cls[0] > 0.8 and cls[4:] == [cls[3]] * 4
    fourth = cls[3]
    acc.observe(req, 8, 4)  # one verify as deep as 8: position 5 refused, 6-8 still never verified
    assert cls[4] < cls[3] and cls[5:] == [cls[4]] * 3
    # the first verification of a position starts its running mean at the position before, not at the prior
    assert abs(cls[4] - fourth * CLASS_PRIOR_COUNT / (1 + CLASS_PRIOR_COUNT)) < 1e-12


def test_a_deep_exploration_that_pays_takes_the_choice_deeper():
    """Suffix decoding at one stream accepted ~0.9 a position at 5-8, yet with those positions at the method's
    prior (never verified by a choice of 4) its rare deep explorations moved them by GLOBAL_WEIGHT each and the
    choice stayed at 4 (BENCHMARKS.md §20). Now one deep exploration whose drafts are all accepted is enough."""
    pol = AdaptivePolicy(8, "suffix")
    pol.lines = _lines(_fitted(4e-3, 0.9e-3))
    reqs = [_Req("a")]
    depths = []
    for _ in range(3 * EXPLORE_EVERY):
        k = pol.plan([(r, 8) for r in reqs])
        for r in reqs:
            got = k[r.request_id]
            pol.observe_drafts(r, got, got)  # every draft verified is accepted
        depths.append(k["a"])
    assert max(depths[-EXPLORE_EVERY:]) == 8 and min(depths[-EXPLORE_EVERY:]) >= 7
