"""Capacity of one replica: the request rate it sustains at its engine limits, analytic and simulated.

One notion, two measurements that must agree (a test holds them within 10%):

* ``analytic_capacity_per_s``: the arrival rate at which the analytic model's utilisation reaches 1
  (``recommender.load.pool``: the busiest of prefill lane, running slots, decode interference and
  feedback, and the KV cache at the running batch's mean), found by bisection in log-rate.
* ``simulated_capacity_per_s``: the simulator under overload: ``n_requests`` arrive at once, the
  scheduler keeps the replica as full as its limits allow, and the capacity is the completion rate
  between the 30th and 70th percentile of completion times (past the fill, before the drain).

``utilisation = arrival rate per replica / capacity`` is the fraction of capacity in use.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import numpy as np

from recommender.errors import ConfigError
from recommender.load.analytic import LoadResult, analyze
from recommender.load.protocols import LengthDistribution, Limits, StepCost
from recommender.load.topology import PoolKind, PoolSpec, Traffic


def max_stable_rate(stable: Callable[[float], bool], *, rel_tol: float = 1e-3, start_per_s: float = 1.0,
                    step: float = 4.0) -> float:
    """Largest arrival rate (requests/s) with ``stable(rate)``, assuming stability is monotone in the rate:
    steps of ``step`` x from ``start_per_s`` (up while stable, down while not) bracket it, then bisection in
    log-rate to ``rel_tol``; the stable end of the bracket is returned. ``inf`` past 1e7 req/s, 0 when even
    1e-6 req/s is unstable. A good guess with a small ``step`` saves calls: bisecting a 1.25x bracket to
    0.5% takes 6, a 4x one 9."""
    x = min(max(start_per_s, 1e-6), 1e7)
    if stable(x):
        lo, hi = x, x * step
        while stable(hi):
            lo, hi = hi, hi * step
            if hi > 1e7:
                return math.inf
    else:
        lo, hi = x / step, x
        while not stable(lo):
            lo, hi = lo / step, lo
            if lo < 1e-6:
                return 0.0
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if stable(mid) else (lo, mid)
    return lo


def saturation_rate_per_s(analyze_at: Callable[[float], LoadResult], *, rel_tol: float = 1e-3,
                          start_per_s: float = 1.0, step: float = 4.0) -> float:
    """Largest arrival rate (requests/s) at which ``analyze_at(rate)`` (the analytic model of some pools)
    is stable with utilisation below 1: :func:`max_stable_rate` over that rule."""

    def stable(rate: float) -> bool:
        r = analyze_at(rate)
        return bool(r.stable) and r.utilisation < 1.0

    return max_stable_rate(stable, rel_tol=rel_tol, start_per_s=start_per_s, step=step)


def analytic_capacity_per_s(
    *, cost: StepCost, limits: Limits, prompt: LengthDistribution, output: LengthDistribution,
    shared_prefix_fraction: float = 0.0, rel_tol: float = 1e-3, start_per_s: float = 1.0, step: float = 4.0,
) -> float:
    """Largest arrival rate (requests/s) at which one replica is stable in the analytic model
    (``start_per_s``: a guess, which only changes how many load-model calls the bracket takes)."""
    pool = PoolSpec(cost=cost, limits=limits)

    def analyze_at(rate: float) -> LoadResult:
        return analyze(pool, Traffic(rate_per_s=rate, prompt=prompt, output=output,
                                     shared_prefix_fraction=shared_prefix_fraction))

    return saturation_rate_per_s(analyze_at, rel_tol=rel_tol, start_per_s=start_per_s, step=step)


def simulated_capacity_per_s(
    *, cost: StepCost, limits: Limits, prompt: LengthDistribution, output: LengthDistribution,
    shared_prefix_fraction: float = 0.0, n_requests: int = 3000, seed: int = 0,
) -> float:
    """Completion rate (requests/s) of one simulated replica with ``n_requests`` queued at time 0."""
    from recommender.load.scheduler import ReplicaScheduler, Requests
    from recommender.load.simulator import check_fits, tokens_in_kv

    if n_requests < 100:
        raise ConfigError(f"a capacity run needs at least 100 requests, got {n_requests}")
    rng = random.Random(seed)
    prompts = [max(1, int(x)) for x in prompt.sample(rng, n_requests)]
    outputs = [max(1, int(x)) for x in output.sample(rng, n_requests)]
    pool = PoolSpec(cost=cost, limits=limits)
    check_fits(pool, prompts, outputs, "replica")
    hits = tokens_in_kv(pool, PoolKind.AGGREGATED, prompts, shared_prefix_fraction)
    n = n_requests
    req = Requests.new([0.0] * n, prompts, outputs, hits, hits)
    ReplicaScheduler(cost, limits, req, list(range(n)), sample_interval_s=1.0, max_samples=16).run()
    done = np.sort(np.asarray(req.finish))
    i, j = int(0.3 * n), int(0.7 * n)
    return (j - i) / max(float(done[j] - done[i]), 1e-12)
