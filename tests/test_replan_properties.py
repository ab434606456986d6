"""Invariants (hypothesis): histogram quantiles, and the policy's guarantees over any proposal sequence."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from recommender.replan.observation import Histogram
from recommender.replan.policy import PastRun, Policy, decide
from test_replan_support import fake_plan


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_quantile_is_monotone_and_inside_the_finite_edges(counts, q1, q2):
    edges = tuple(0.5 * 2 ** i for i in range(len(counts))) + (math.inf,)
    cum, acc = [], 0.0
    for c in counts + [0]:
        acc += c
        cum.append(acc)
    h = Histogram(edges, tuple(cum), 0.0)
    if h.count == 0:
        assert math.isnan(h.quantile(q1))
        return
    lo, hi = sorted((q1, q2))
    assert h.quantile(lo) <= h.quantile(hi) + 1e-12
    assert 0.0 <= h.quantile(hi) <= edges[-2]
    assert h.plus(h).minus(h) == h


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.booleans()), min_size=1, max_size=40),
       st.integers(1, 4), st.sampled_from([None, 1, 3]))
def test_policy_never_flaps_inside_the_cooldown(steps, windows, cap):
    """Any sequence of (planner's replica count, model says the current plan is at risk) at 5-min runs over
    5-min windows: at risk, a different proposal is always taken (a failing plan is never kept); without a
    risk the plan never grows, changes only outside the cooldown, after `windows` agreeing windows, within
    the step cap."""
    pol = Policy(scale_down_windows=windows, max_replica_change=cap, cooldown_s=1800.0)
    current = fake_plan(10, 10.0)
    past: list[PastRun] = []
    last_change_t = -math.inf
    for i, (want, risk) in enumerate(steps):
        now = 300.0 * i
        d = decide(pol, current=current, proposed=fake_plan(want, float(want)), risks=["risk"] if risk else [],
                   past=list(reversed(past)), now_s=now, window=(now - 300.0, now))
        before, after = current.top.replicas, d.plan.top.replicas
        if risk and want != before:
            assert d.changed and (after == want or (cap is not None and after < before))
        if d.changed:
            assert after != before
            if not risk:
                assert after < before and now - last_change_t >= pol.cooldown_s
                streak = 0
                for r in reversed(past):
                    if r.decision == "changed" or r.wanted != "down":
                        break
                    streak += 1
                assert streak + 1 >= windows
                if cap is not None:
                    assert before - after <= cap
            last_change_t = now
            current = d.plan
        past.append(PastRun(now, "changed" if d.changed else "unchanged", d.wanted, d.plan, (now - 300.0, now)))
