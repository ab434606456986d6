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

A row whose run breaks an SLO at its percentile or is unstable is not dropped on that one run (a
plan that meets its SLO reads above it in a short run by chance: the issue #24 case called the cheapest
plan unstable in 2 of 10 seeds). The failure is **confirmed** first (:func:`confirm_failure`):
``CONFIRM_RUNS`` independent replications (other seeds), each of ``2 n`` requests (at most the policy's
``verify_requests``), the first run left out (it chose to test, so it is not evidence). The row is dropped
when

* every replication is unstable (a stable plan that one run calls unstable with probability ``p`` is
  called unstable by all three with ``p^3``: 0.8% at the issue's p = 0.2), or
* for some SLO the replications' mean of ``simulated percentile / limit`` exceeds 1 by more than
  ``t_{0.95, R-1} x sd / sqrt(R)`` (a one-sided t-test on replication means at ``CONFIRM_ALPHA`` = 5%: a plan
  whose steady-state percentile meets its limit is dropped with probability at most 5% x the chance its first
  run failed).

Otherwise it is kept, and its ``simulated`` record says the first run missed and the confirmations did not
show it. A dropped row is replaced by the next analytic row, until ``k`` rows pass (or ``3 k`` were tried);
after any drop the kept rows' Pareto flags are recomputed without the dropped plans and the rows re-ranked
(:func:`rerank`), and :func:`verification_note` says what verification changed (the footer and the plan's
``search.verification``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from recommender import progress
from recommender.search.evaluate import Evaluation, SearchContext, kv_link
from recommender.search.pareto import non_dominated
from recommender.search.recommend_rows import QUALITY_RANK, RankedRow, more_rows, prefer_measured

TAIL_SAMPLES = 100  # requests beyond the percentile: its estimate then has ~10% relative noise in the count
MIN_REQUESTS = 1000
WARMUP_FRACTION = 0.2
_TAIL = {"p50": 0.5, "p90": 0.1, "p95": 0.05, "p99": 0.01, "mean": 0.5}
CONFIRM_RUNS = 3
CONFIRM_ALPHA = 0.05
# one-sided Student t quantiles t_{0.95, df} (any t table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015}


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
                          decode=PoolSpec(cost=costs[1], limits=dp.limits, replicas=dp.replicas),
                          kv_link=ev.kv_link or kv_link(ctx, c)),
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
                          kv_link=ev.kv_link or kv_link(ctx, ev.candidate)),
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
    # throughput-bound, but never before one request's latency (a few requests are bound by it, not by the rate)
    return burst, max(w.offline_requests / (p.ranks * per_replica), ev.latency("e2e", "p99"))


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
    return pools, ((ev.kv_link or kv_link(ctx, ev.candidate)) if ev.candidate.disaggregated else None)


def slo_ratios(ctx: SearchContext, sim: dict[str, Any]) -> dict[str, float]:
    """``simulated percentile / limit`` per SLO ('ttft@p90'); a missing or infinite value reads 10 (far over)."""
    out = {}
    for s in ctx.workload.slos:
        v = sim[f"{s.metric}_s"].get(s.percentile)
        out[f"{s.metric}@{s.percentile}"] = min(10.0, v / s.limit_s) if v is not None and math.isfinite(v) else 10.0
    return out


def confirmed_failure(stable: Sequence[bool], ratios: Sequence[dict[str, float]]) -> str:
    """Why the replications confirm a failure ('' when they do not; the module docstring's two tests)."""
    if stable and not any(stable):
        return f"unstable in {len(stable)} of {len(stable)} confirmation runs"
    n = len(ratios)
    if n < 2:
        return ""
    t = _T95.get(n - 1, 1.96)
    for name in ratios[0]:
        xs = [r[name] for r in ratios]
        mean = sum(xs) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        low = mean - t * sd / math.sqrt(n)
        if low > 1.0:
            return (f"{name} {mean:.2f} x its limit over {n} confirmation runs (one-sided 95% lower bound "
                    f"{low:.2f} > 1)")
    return ""


def confirm_failure(ctx: SearchContext, ev: Evaluation, n: int, warm: int, seed: int) -> tuple[str, list[dict[str, Any]]]:
    """(why the failure is confirmed, '' if not; the replications' summaries): ``CONFIRM_RUNS`` runs of ``2 n``
    requests (at most ``verify_requests``) on seeds ``seed + 1 ...``."""
    n2 = max(n, min(2 * n, ctx.policy.verify_requests))
    w2 = int(n2 * WARMUP_FRACTION) if n else warm
    sims = [sim_summary(simulate_evaluation(ctx, ev, n2, seed + 1 + j, w2)) for j in range(CONFIRM_RUNS)]
    return confirmed_failure([bool(x.get("stable", True)) for x in sims], [slo_ratios(ctx, x) for x in sims]), sims


def rerank(ctx: SearchContext, kept: Sequence[RankedRow], evaluations: Sequence[Evaluation],
           dropped: set[str]) -> list[RankedRow]:
    """After a drop: Pareto flags over the feasible evaluations less the dropped plans, then the order of
    :func:`recommender.search.recommend_rows.rank_rows` (Pareto rows first, by cost; evidence preference)."""
    feas = [e for e in evaluations if e.feasible and e.candidate.key not in dropped]
    objs = [e.objectives for e in feas]
    front = {objs[i] for i in non_dominated(objs)}
    rows = [dataclasses.replace(r, pareto=r.evaluation.objectives in front) for r in kept]
    order = sorted(range(len(rows)), key=lambda i: (not rows[i].pareto, rows[i].evaluation.usd_per_million_tokens,
                                                    rows[i].evaluation.objectives[1:],
                                                    QUALITY_RANK.get(rows[i].candidate.weight_dtype, 9),
                                                    rows[i].candidate.kv_dtype != "bf16"))
    if ctx.policy.prefer_measured:
        order = prefer_measured(ctx, [r.evaluation for r in rows], order)
    return [rows[i] for i in order]


def verification_note(first: RankedRow | None, kept: Sequence[RankedRow], dropped: Sequence[tuple[RankedRow, str]],
                      doubted: Sequence[RankedRow]) -> str:
    """What verification changed, for the footer ('' when nothing: every verified plan passed its first run)."""
    parts = []
    if dropped:
        parts.append("dropped " + "; ".join(f"{r.label()} {r.candidate.weight_dtype} ({why})" for r, why in dropped))
    if doubted:
        parts.append("kept " + ", ".join(f"{r.label()} {r.candidate.weight_dtype}" for r in doubted)
                     + " (a first run missed; the confirmation runs did not show it)")
    if not parts:
        return ""
    if first is not None and kept and any(r.candidate.key == first.candidate.key for r, _ in dropped):
        parts.append(f"rank 1 is the cheapest plan the simulator kept, {kept[0].label()}; the analytic rank 1 was "
                     f"{first.label()}")
    return "Verification " + "; ".join(parts) + "."


def verify_rows(ctx: SearchContext, rows: Sequence[RankedRow], evaluations: Sequence[Evaluation], k: int, seed: int,
                top: int) -> list[RankedRow]:
    """Simulate rows in rank order until ``k`` pass (at most ``3 k`` tried); drop confirmed failures, re-rank.
    :func:`verify` also returns what changed."""
    return verify(ctx, rows, evaluations, k, seed, top)[0]


def verify(ctx: SearchContext, rows: Sequence[RankedRow], evaluations: Sequence[Evaluation], k: int, seed: int,
           top: int) -> tuple[list[RankedRow], str, bool]:
    """(rows, :func:`verification_note`, whether the analytic rank 1 was dropped); see the module docstring."""
    # ``more_rows`` continues the search's own ranking; rows ranked otherwise (``--confidence`` keeps a subset of it)
    # would meet themselves again there, and a plan would be listed twice
    listed = {r.candidate.key for r in rows}
    pool = list(rows) + [r for r in more_rows(ctx, evaluations, rows, extra=2 * k) if r.candidate.key not in listed]
    dropped: list[tuple[RankedRow, str]] = []
    doubted: list[RankedRow] = []
    kept: list[RankedRow] = []
    passed = tried = 0
    pcts = [s.percentile for s in ctx.workload.slos] or ["p90"]
    done: dict[tuple[Any, ...], dict[str, Any]] = {}  # rows that simulate alike (e.g. fp8 / int8 weights on H100)
    with progress.bar(f"verify top {k} in the simulator", total=k, unit="plan") as bar:
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
                    if ctx.workload.is_offline:  # a finish time past the deadline: the burst slice is not noise-bound
                        dropped.append((r, "finishes after the deadline"))
                        continue
                    confirm_key = ("confirm", key)
                    if confirm_key not in done:
                        why, sims = confirm_failure(ctx, r.evaluation, n, warm, seed)
                        done[confirm_key] = {"why": why, "runs": sims}
                    why = str(done[confirm_key]["why"])
                    if why:
                        dropped.append((r, why))
                        continue
                    doubted.append(r)
                    sim = {**sim, "confirmation": [
                        {"stable": x.get("stable"), **{f"{m}_s": x[f"{m}_s"] for m in ("ttft", "tpot", "e2e")}}
                        for x in done[confirm_key]["runs"]]}
                passed += 1
                bar.update(1)
                r = dataclasses.replace(r, simulated=sim)
            kept.append(r)
            if len(kept) >= top:
                break
    if dropped:
        kept = rerank(ctx, kept, evaluations, {r.candidate.key for r, _ in dropped})
    first = rows[0] if rows else None
    lost_first = first is not None and any(r.candidate.key == first.candidate.key for r, _ in dropped)
    return ([dataclasses.replace(r, rank=i + 1) for i, r in enumerate(kept)],
            verification_note(first, kept, dropped, doubted), lost_first)
