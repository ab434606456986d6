"""Verify the top plans in the discrete-event simulator and drop the ones it shows breaking an SLO.

The analytic load model ranks thousands of candidates; the simulator replays seeded requests through
a vLLM-like scheduler for the few that matter, long enough to be in steady state:

* run length (``verify_run_length``): enough requests that ``TAIL_SAMPLES`` of them lie beyond the
  asked percentile, ``TAIL_SAMPLES / (1 - q)``, stretched by ``(1 + rho) / (1 - rho)`` (the correlation
  time of a queue at utilisation ``rho``: consecutive waits are not independent), then the warm-up;
  at least ``MIN_REQUESTS``, at most the policy's ``verify_requests``;
* warm-up: the first ``WARMUP_FRACTION`` of the requests are left out of the percentiles;
* stability: over the second half of the arrivals the simulator served at least 98% of what arrived,
  and 95% over its last quarter (``SimResult.stable``): a queue that keeps growing fails.

An offline job is verified as a burst: a slice of ``OFFLINE_SLICE_REQUESTS`` arriving at once,
projected to the whole job (``job_finish_s``), which must end before the deadline.

A row that breaks an SLO at its percentile or is unstable is dropped and the next analytic row is
verified in its place, until ``k`` rows pass (or ``3 k`` were tried); then the list is re-ranked.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from recommender.search.evaluate import Evaluation, SearchContext, kv_link
from recommender.search.recommend_rows import RankedRow, more_rows

TAIL_SAMPLES = 100  # requests beyond the percentile: its estimate then has ~10% relative noise in the count
MIN_REQUESTS = 1000
WARMUP_FRACTION = 0.2
_TAIL = {"p50": 0.5, "p90": 0.1, "p95": 0.05, "p99": 0.01, "mean": 0.5}


def verify_run_length(*, utilisation: float, percentiles: Sequence[str], max_requests: int) -> tuple[int, int]:
    """(requests to simulate, warm-up requests) for a plan at ``utilisation`` checked at ``percentiles``:
    ``n = TAIL_SAMPLES / tail x (1 + rho) / (1 - rho) / (1 - WARMUP_FRACTION)``, clamped to
    ``[MIN_REQUESTS, max_requests]`` (``rho`` capped at 0.95)."""
    tail = min((_TAIL.get(p, 0.1) for p in percentiles), default=0.1)
    rho = min(max(utilisation, 0.0), 0.95) if math.isfinite(utilisation) else 0.95
    n = TAIL_SAMPLES / tail * (1.0 + rho) / (1.0 - rho) / (1.0 - WARMUP_FRACTION)
    n_req = int(min(max(math.ceil(n), MIN_REQUESTS), max(max_requests, 1)))
    return n_req, int(n_req * WARMUP_FRACTION)


def simulate_evaluation(ctx: SearchContext, ev: Evaluation, n_requests: int, seed: int, warmup_requests: int = 0) -> Any:
    """Run the simulator for one evaluated plan at the workload's rate."""
    from recommender.load import Disaggregated, PoolSpec, Traffic, simulate, simulate_disaggregated

    w = ctx.workload
    c = ev.candidate
    traffic = Traffic(rate_per_s=w.effective_rate_per_s, prompt=w.prompt_tokens, output=w.output_tokens,
                      shared_prefix_fraction=w.shared_prefix_fraction)
    costs: list[Any] = []
    for p in ev.pools:
        cost, why = ctx.pool_cost(p)
        assert cost is not None, why  # an evaluated (feasible) pool always has a cost model
        costs.append(cost)
    if c.disaggregated:
        pp, dp = ev.pools
        return simulate_disaggregated(
            Disaggregated(prefill=PoolSpec(cost=costs[0], limits=pp.limits, replicas=pp.replicas),
                          decode=PoolSpec(cost=costs[1], limits=dp.limits, replicas=dp.replicas), kv_link=kv_link(ctx, c)),
            traffic, n_requests=n_requests, seed=seed, warmup_requests=warmup_requests)
    p = ev.pools[0]
    return simulate(PoolSpec(cost=costs[0], limits=p.limits, replicas=p.ranks), traffic, n_requests=n_requests,
                    seed=seed, warmup_requests=warmup_requests)


OFFLINE_SLICE_REQUESTS = 5000


def simulate_offline_job(ctx: SearchContext, ev: Evaluation, n_requests: int, seed: int,
                         *, slice_latencies: bool = True) -> tuple[Any, float]:
    """(result of a slice of ``n_requests`` arriving at once, projected finish of the whole job in s).

    The job is a burst: aggregated, each replica serves its share at its simulated completion rate under
    that burst (``recommender.load.capacity.simulated_capacity_per_s``); P/D, the slice's duration
    scaled to the job (conservative: it includes the slice's fill and drain). Aggregated without
    ``slice_latencies`` (a job without SLOs), the slice itself is not simulated and the result is None."""
    import random

    from recommender.load import Disaggregated, PoolSpec, Replay, simulate, simulate_disaggregated
    from recommender.load.capacity import simulated_capacity_per_s

    w = ctx.workload
    assert w.offline_requests
    n = min(n_requests, w.offline_requests)
    rng = random.Random(seed)
    rows = list(zip([0.0] * n, w.prompt_tokens.sample(rng, n), w.output_tokens.sample(rng, n)))
    replay = Replay(rows=tuple(rows), shared_prefix_fraction=w.shared_prefix_fraction)
    costs: list[Any] = [ctx.pool_cost(p)[0] for p in ev.pools]
    assert all(c is not None for c in costs), "an evaluated plan has cost models"
    if ev.candidate.disaggregated:
        pp, dp = ev.pools
        res = simulate_disaggregated(
            Disaggregated(prefill=PoolSpec(cost=costs[0], limits=pp.limits, replicas=pp.replicas),
                          decode=PoolSpec(cost=costs[1], limits=dp.limits, replicas=dp.replicas),
                          kv_link=kv_link(ctx, ev.candidate)),
            replay, seed=seed)
        return res, res.duration_s * w.offline_requests / n
    # aggregated: identical replicas behind round-robin; each runs its share of the burst at the completion
    # rate of its middle (30th-70th percentile of completions: past the fill, before the drain). The run
    # holds at least 6 x max_num_seqs requests: with fewer, that middle is the first wave of admitted
    # requests finishing together (512 slots, 1,000 requests read 61% above the sustained rate).
    p = ev.pools[0]
    burst: Any = None
    if slice_latencies:
        burst = simulate(PoolSpec(cost=costs[0], limits=p.limits, replicas=p.ranks), replay, seed=seed)
    per_replica = simulated_capacity_per_s(cost=costs[0], limits=p.limits, prompt=w.prompt_tokens, output=w.output_tokens,
                                           shared_prefix_fraction=w.shared_prefix_fraction, n_requests=max(n // p.ranks, 6 * p.limits.max_num_seqs, 2000),
                                           seed=seed)
    return burst, w.offline_requests / (p.ranks * per_replica)


def sim_summary(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in ("ttft", "tpot", "e2e"):
        out[f"{m}_s"] = getattr(res, f"{m}_s").to_dict()
    out["completed"] = getattr(res, "completed", None)
    out["preempted"] = getattr(res, "preempted", None)
    out["requests"] = getattr(res, "completed", None)
    out["warmup_requests"] = getattr(res, "warmup_requests", 0)
    out["served_fraction"] = round(float(getattr(res, "served_fraction", 1.0)), 4)
    out["stable"] = bool(getattr(res, "stable", True))
    return out


def meets(ctx: SearchContext, sim: dict[str, Any]) -> bool:
    """Stable (an offline job: finished before its deadline), and every SLO met at its percentile."""
    if "job_finish_s" in sim:
        if not sim["job_finish_s"] <= (ctx.workload.deadline_s or math.inf):
            return False
    elif not sim.get("stable", True):
        return False
    for s in ctx.workload.slos:
        v = sim[f"{s.metric}_s"].get(s.percentile)
        if v is None or not math.isfinite(v) or v > s.limit_s:
            return False
    return True


def _simulated_alike(ctx: SearchContext, ev: Evaluation) -> tuple[Any, ...]:
    """What a simulation of ``ev`` depends on: each pool's step-cost model (numbers only), limits and replicas,
    and the KV link of a P/D pair. Two rows equal here simulate identically under one seed."""
    pools = tuple((ctx.pool_cost(p)[0], p.limits, p.ranks)
                  for p in ev.pools)
    return pools, (kv_link(ctx, ev.candidate) if ev.candidate.disaggregated else None)


def verify_rows(ctx: SearchContext, rows: Sequence[RankedRow], evaluations: Sequence[Evaluation], k: int, seed: int,
                top: int) -> list[RankedRow]:
    """Simulate rows in rank order until ``k`` pass (at most ``3 k`` tried); drop failures, re-rank."""
    pool = list(rows) + more_rows(ctx, evaluations, rows, extra=2 * k)
    kept: list[RankedRow] = []
    passed = tried = 0
    pcts = [s.percentile for s in ctx.workload.slos] or ["p90"]
    done: dict[tuple[Any, ...], dict[str, Any]] = {}  # rows that simulate alike (e.g. fp8 / int8 weights on H100)
    for r in pool:
        if passed < k and tried < 3 * k:
            # the queue's correlation time follows the fraction of capacity in use (the row's
            # load_utilisation), not the busiest resource's utilisation, which is lower until saturation
            rho = r.load_utilisation if r.load_utilisation is not None else r.evaluation.utilisation
            n, warm = verify_run_length(utilisation=rho, percentiles=pcts, max_requests=ctx.policy.verify_requests)
            key = (_simulated_alike(ctx, r.evaluation), n, warm)
            if key not in done:
                if ctx.workload.is_offline:
                    # without SLOs only the finish time is checked: the burst's latencies are not simulated
                    res, finish = simulate_offline_job(ctx, r.evaluation, OFFLINE_SLICE_REQUESTS, seed,
                                                       slice_latencies=bool(ctx.workload.slos))
                    done[key] = {**(sim_summary(res) if res is not None else {}), "job_finish_s": finish,
                                 "warmup_requests": 0}
                else:
                    done[key] = sim_summary(simulate_evaluation(ctx, r.evaluation, n, seed, warm))
            sim = done[key]
            tried += 1
            if not meets(ctx, sim):
                continue
            passed += 1
            r = dataclasses.replace(r, simulated=sim)
        kept.append(r)
        if len(kept) >= top:
            break
    return [dataclasses.replace(r, rank=i + 1) for i, r in enumerate(kept)]
