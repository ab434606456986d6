"""The target measured with the autoscaler in the loop: how many SLO windows the rule's replicas cover.

The rule's burst target (``recommender.autoscale.rule``) stacks two worst cases: ``B``, the 99th percentile
of a window's rate over the highest held reading, and the HPA's tolerance, which may leave the count alone
until the reading is 10% above ``replicas x target``. They seldom meet in the same window, and the replica
count is an integer (``ceil``) with its own slack. Here the controller (``recommender.autoscale.replay``:
readings, hold, tolerance, stabilisation, start-up) runs on the day's arrivals, the engines not simulated,
and each SLO window ``w`` is checked against what its replicas serve::

    c_w       = c1 at the lengths of the requests arriving in w   (bisection on the load model, as c1;
                windows grouped by their mean prompt into quantile groups, each group's pooled lengths)
    n_w(T)    = replicas ready at w's start and not removed before its end, the controller at target T
    covered   = share over windows with >= 10 arrivals of [ r_w <= n_w(T) c_w ]
    T         = the largest T_k = c1 k / 200 >= T_burst of the run upward from the burst target T_burst in
                which every T_k covers >= slo_window_goal of the windows with 0 flaps (T_burst itself when
                the first step fails); min and max replicas follow T as in the rule

``c_w`` and not ``c1``: a burst of the Azure conversation trace carries longer prompts (1,414 tokens against
1,154), so its windows' capacity is ~0.86 c1, and windows of short prompts up to 1.6 c1; the load model at a
window's own lengths is what the simulator's replay tracks (the static peak plan's failed windows bring
1.09-1.12 c_w, its busiest passing one 1.04 c_w). The target never falls below the burst target. While the
cooldown is the same (the burst period, not ``3 x start-up``), a longer start-up leaves the controller's
decisions alone and delays every replica's ``ready_s``, so it never covers more windows at any ``T``: the run
starts no higher (``T_burst`` never rises) and stops no later, and the target never rises.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from recommender.autoscale.profile import DayTraffic, DiurnalProfile
from recommender.autoscale.replay import controller
from recommender.autoscale.rule import ScalingRule, metric_series, replica_capacity_per_s
from recommender.plan import Plan
from recommender.profiles import EngineProfile
from recommender.search.policy import SearchPolicy
from recommender.workload import LengthDist, Workload

#: the target grid: c1 / TARGET_STEPS apart
TARGET_STEPS = 200
#: windows with fewer arrivals are not judged (as in the replay)
MIN_WINDOW_REQUESTS = 10


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """What the controller alone found at one target: share of SLO windows covered, flaps, GPU-hours asked."""

    target_per_replica_per_s: float
    covered: float
    flaps: int
    gpu_hours: float


def window_capacities_per_s(plan: Plan, workload: Workload, day: DayTraffic, *, profile: EngineProfile,
                            search: SearchPolicy, window_s: float, period_s: float, groups: int = 8) -> np.ndarray:
    """``c_w`` for every SLO window of the day (nan where fewer than 10 requests arrive): the windows in
    ``groups`` quantile groups of their mean prompt length, each group's capacity by bisection on the pooled
    prompt and output lengths of its requests (``replica_capacity_per_s``)."""
    edges = np.append(np.arange(0.0, period_s, window_s), period_s)
    starts = np.searchsorted(day.arrival_s, edges)
    count = np.diff(starts)
    judged = np.nonzero(count >= MIN_WINDOW_REQUESTS)[0]
    out = np.full(count.size, np.nan)
    if judged.size == 0:
        return out
    mean_prompt = np.array([float(np.mean(day.prompt_tokens[starts[k]:starts[k + 1]])) for k in judged])
    order = judged[np.argsort(mean_prompt, kind="stable")]
    for part in np.array_split(order, min(groups, order.size)):
        idx = np.concatenate([np.arange(starts[k], starts[k + 1]) for k in part])
        w = dataclasses.replace(workload, prompt_tokens=LengthDist.empirical(day.prompt_tokens[idx].tolist()),
                                output_tokens=LengthDist.empirical(day.output_tokens[idx].tolist()))
        out[part] = replica_capacity_per_s(plan, w, profile=profile, search=search)
    return out


def _windows(day: DayTraffic, *, period_s: float, window_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The SLO windows' start times (s), arrivals in each, and lengths (s; the last may be shorter)."""
    edges = np.arange(0.0, period_s, window_s)
    came = np.diff(np.searchsorted(day.arrival_s, np.append(edges, period_s)))
    return edges, came, np.minimum(window_s, period_s - edges)


def coverage(rule: ScalingRule, day: DayTraffic, capacities_per_s: np.ndarray, *, period_s: float,
             window_s: float) -> Coverage:
    """The controller on the day at ``rule``'s target: the share of judged windows with ``r_w <= n_w c_w``."""
    reps, flaps, _ = controller(rule, np.asarray(day.arrival_s, dtype=float), period_s)
    edges, came, span = _windows(day, period_s=period_s, window_s=window_s)
    ready = np.array([r.ready_s for r in reps])
    removed = np.array([r.removed_s for r in reps])
    n = ((ready[None, :] <= edges[:, None]) & (removed[None, :] >= (edges + span)[:, None])).sum(axis=1)
    judged = np.isfinite(capacities_per_s)
    ok = came[judged] / span[judged] <= n[judged] * capacities_per_s[judged] + 1e-12
    paid = float(np.sum(np.clip(np.minimum(removed, period_s) - np.maximum(np.array([r.asked_s for r in reps]), 0.0),
                                0.0, None)))
    return Coverage(target_per_replica_per_s=rule.target_per_replica_per_s,
                    covered=float(np.mean(ok)) if ok.size else 1.0, flaps=flaps,
                    gpu_hours=paid * rule.gpus_per_replica / 3600.0)


def static_replicas_covering(day: DayTraffic, capacities_per_s: np.ndarray, *, period_s: float, window_s: float,
                             goal: float) -> int:
    """The fewest constant replicas ``n`` that cover ``goal`` of the judged SLO windows, ``r_w <= n c_w``: the
    static peak plan sized by the autoscaler's own criterion (each window at its own lengths). With the
    windows' needs ``x_w = r_w / c_w`` sorted, ``n = ceil(x_(m))`` for ``m = ceil(goal x N)`` of ``N`` windows."""
    edges, came, span = _windows(day, period_s=period_s, window_s=window_s)
    judged = np.isfinite(capacities_per_s)
    need = np.sort(came[judged] / span[judged] / capacities_per_s[judged])
    if need.size == 0:
        return 1
    m = max(1, math.ceil(goal * need.size - 1e-9))
    return max(1, math.ceil(float(need[m - 1]) - 1e-9))


def _at_target(rule: ScalingRule, target: float, profile: DiurnalProfile, top_per_s: float) -> ScalingRule:
    lo = max(1, math.ceil(profile.trough_rate_per_s / target - 1e-9))
    return dataclasses.replace(rule, target_per_replica_per_s=target, min_replicas=lo,
                               max_replicas=max(lo, math.ceil(top_per_s / target - 1e-9)))


def covered_rule(rule: ScalingRule, day: DayTraffic, profile: DiurnalProfile, capacities_per_s: np.ndarray, *,
                 window_s: float, goal: float) -> tuple[ScalingRule, Coverage]:
    """The largest target of the upward run from the burst target that covers ``goal`` of the windows with 0
    flaps (module docstring), and its coverage; ``rule`` itself (with its coverage) when the first step fails.
    Min and max replicas as in the rule: ``ceil(trough / T)``, ``ceil(max(peak, highest reading) / T)``."""
    c1 = rule.replica_capacity_per_s
    _, m = metric_series(np.asarray(day.arrival_s, dtype=float), polling_s=rule.polling_s,
                         window_s=rule.metric_window_s, start_s=rule.metric_window_s, end_s=profile.period_s)
    top = max(profile.peak_rate_per_s, float(np.max(m, initial=0.0)))
    base = coverage(rule, day, capacities_per_s, period_s=profile.period_s, window_s=window_s)
    best, best_cov = rule, base
    k = math.floor(rule.target_per_replica_per_s / c1 * TARGET_STEPS + 1e-9) + 1
    while k <= TARGET_STEPS:
        cand = _at_target(rule, c1 * k / TARGET_STEPS, profile, top)
        cov = coverage(cand, day, capacities_per_s, period_s=profile.period_s, window_s=window_s)
        if cov.flaps > 0 or cov.covered < goal:
            break
        best, best_cov = cand, cov
        k += 1
    return best, best_cov
