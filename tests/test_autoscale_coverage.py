"""The target measured with the controller in the loop (recommender/autoscale/coverage.py), on days whose
answer is a hand calculation: evenly spaced arrivals give every window the same rate, so which windows a
replica count covers is arithmetic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recommender.autoscale.coverage import coverage, covered_rule, static_replicas_covering
from recommender.autoscale.profile import DayTraffic, DiurnalProfile, tiled_trace_day
from recommender.autoscale.rule import AutoscalePolicy, ScalingRule, derive_rule

PERIOD_S = 7200.0
WINDOW_S = 300.0


def _even_day(rate_per_s: float = 20.0) -> DayTraffic:
    a = (np.arange(int(rate_per_s * PERIOD_S)) + 0.5) / rate_per_s   # 6,000 arrivals in every 300 s window
    ones = np.ones(a.size, dtype=int)
    return DayTraffic(a, ones, ones, "even")


def _profile() -> DiurnalProfile:
    return DiurnalProfile(mean_rate_per_s=20.0, peak_to_trough=1.0, period_s=PERIOD_S)


def _rule(day: DayTraffic) -> ScalingRule:
    # c1 = 10 req/s; a constant day: B = g = 1, burst target 10 / 1.1 = 9.09, ceil(20 / 9.09) = 3 replicas
    return derive_rule(capacity_per_s=10.0, profile=_profile(), startup=100.0, policy=AutoscalePolicy(),
                       gpus_per_replica=2, model_name="m", arrival_s=day.arrival_s)


def test_coverage_of_a_constant_day_by_hand() -> None:
    day = _even_day()
    rule = _rule(day)
    assert rule.target_per_replica_per_s == pytest.approx(10.0 / 1.1) and rule.min_replicas == rule.max_replicas == 3
    n_windows = int(PERIOD_S / WINDOW_S)
    # 3 replicas x 7 req/s = 21 >= 20 in every window; 3 x 6.5 = 19.5 < 20 in none
    ok = coverage(rule, day, np.full(n_windows, 7.0), period_s=PERIOD_S, window_s=WINDOW_S)
    assert ok.covered == 1.0 and ok.flaps == 0
    assert ok.gpu_hours == pytest.approx(3 * 2 * 2.0)                  # 3 replicas x 2 GPUs x 2 h
    assert coverage(rule, day, np.full(n_windows, 6.5), period_s=PERIOD_S, window_s=WINDOW_S).covered == 0.0


def test_the_target_rises_while_the_windows_stay_covered() -> None:
    """c_w = 10.5: the grid T_k = 10 k / 200 rises to T = c1 = 10, where ceil(20 / 10) = 2 replicas serve
    2 x 10.5 = 21 >= 20. c_w = 9.5: 2 replicas (only at T = 10) serve 19 < 20, so the run stops at
    T = 9.95 with 3 replicas."""
    day = _even_day()
    n_windows = int(PERIOD_S / WINDOW_S)
    up, cov = covered_rule(_rule(day), day, _profile(), np.full(n_windows, 10.5), window_s=WINDOW_S, goal=0.99)
    assert up.target_per_replica_per_s == pytest.approx(10.0) and up.min_replicas == up.max_replicas == 2
    assert cov.covered == 1.0 and cov.gpu_hours == pytest.approx(2 * 2 * 2.0)
    short, _ = covered_rule(_rule(day), day, _profile(), np.full(n_windows, 9.5), window_s=WINDOW_S, goal=0.99)
    assert short.target_per_replica_per_s == pytest.approx(9.95) and short.max_replicas == 3
    # the burst target stays when even its own replicas do not cover the windows (never lower)
    same, none = covered_rule(_rule(day), day, _profile(), np.full(n_windows, 1.0), window_s=WINDOW_S, goal=0.99)
    assert same == _rule(day) and none.covered == 0.0


def _bursty_day() -> DayTraffic:
    """A 600-request tile at 1 req/s whose requests 200-440 come at 2 req/s, tiled over a 2-hour 3:1 'day'."""
    gaps = np.where((np.arange(600) > 200) & (np.arange(600) < 440), 0.5, 1.0)
    tile = np.cumsum(gaps) - gaps[0]
    prof = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=3.0, peak_hour=12.0, period_s=PERIOD_S)
    return tiled_trace_day(prof, tile, np.ones(600, int), np.ones(600, int), source="t")


@pytest.mark.parametrize(("share", "goal"), [(0.7, 0.9), (0.7, 0.95), (0.8, 0.9)])
def test_a_longer_startup_never_raises_the_covered_target(share: float, goal: float) -> None:
    """c1 = 0.6 req/s, windows serve share x c1 per replica, cooldown 600 s for every start-up here (max(600,
    3 x 180, 300 + 180 + 30)): the same controller decisions with every replica ready later cover no more
    windows, so the covered target never rises with the start-up time and min replicas never fall."""
    prof = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=3.0, peak_hour=12.0, period_s=PERIOD_S)
    day = _bursty_day()
    policy = dataclasses.replace(AutoscalePolicy(), min_scale_down_stabilisation_s=600.0)
    caps = np.full(int(PERIOD_S / WINDOW_S), 0.6 * share)
    rules = []
    for startup in (30.0, 60.0, 120.0, 180.0):
        rule = derive_rule(capacity_per_s=0.6, profile=prof, startup=startup, policy=policy, gpus_per_replica=1,
                           model_name="m", arrival_s=day.arrival_s, burst_period_s=day.burst_period_s(prof))
        assert rule.cooldown_s == pytest.approx(600.0)
        up, cov = covered_rule(rule, day, prof, caps, window_s=WINDOW_S, goal=goal)
        assert up.target_per_replica_per_s >= rule.target_per_replica_per_s
        rules.append(up)
    for a, b in zip(rules, rules[1:]):
        assert b.target_per_replica_per_s <= a.target_per_replica_per_s + 1e-12
        assert b.min_replicas >= a.min_replicas


def test_the_static_peak_plan_covers_the_windows_by_the_same_test() -> None:
    """24 windows of 20 req/s. At c_w = 7 every window needs 20 / 7 = 2.86 -> 3 replicas. With one window
    at c_w = 4 (needs 5) a goal of 0.95 allows one miss in 24 (ceil(0.95 x 24) = 23 covered): still 3; a goal
    of 0.99 needs ceil(23.76) = 24 covered: 5. Windows with no capacity (nan: too few arrivals) are not judged."""
    day = _even_day()
    n_windows = int(PERIOD_S / WINDOW_S)
    caps = np.full(n_windows, 7.0)
    kw = dict(period_s=PERIOD_S, window_s=WINDOW_S)
    assert static_replicas_covering(day, caps, goal=0.99, **kw) == 3
    caps[5] = 4.0
    assert static_replicas_covering(day, caps, goal=0.95, **kw) == 3
    assert static_replicas_covering(day, caps, goal=0.99, **kw) == 5
    caps[5] = np.nan
    assert static_replicas_covering(day, caps, goal=0.99, **kw) == 3
    # the replica count it returns covers the goal by coverage()'s own test on a constant rule
    rule = dataclasses.replace(_rule(day), min_replicas=3, max_replicas=3)
    assert coverage(rule, day, caps, **kw).covered == 1.0
