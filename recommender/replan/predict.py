"""The current plan under the model: does it still meet its SLOs at the forecast load?

``predict_plan(plan, workload)`` rebuilds the deployed configuration from the plan's rank-1 row (per pool:
GPU, TP, dtypes, the engine limits it was given, its replica counts; the row's ``max_model_len``) and runs the
analytic load model (``recommender.load.analyze`` / ``analyze_disaggregated``) at
``workload.arrival_rate_per_s`` (the re-planner passes forecast x (1 + headroom)) with the workload's
length distributions and shared-prefix fraction. The plan *meets* the load when the model says it is
stable, its utilisation is at most the search policy's ``max_utilisation`` and every SLO percentile is
within its limit; otherwise ``misses`` lists why, with the predicted numbers.

This is the same test the search applies to a candidate (``recommender.search.evaluate``), but on the
replica counts that are deployed instead of derived ones, so "at risk" is a prediction, not a rate ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Mapping

from recommender.catalog import Catalog, default_catalog
from recommender.load import analyze, analyze_disaggregated
from recommender.load.link import KvLink
from recommender.load.topology import Disaggregated, PoolSpec, Traffic
from recommender.plan import Plan
from recommender.plan.rebuild import PoolModel, pool_models, row_kv_link
from recommender.profiles import EngineProfile, engine_profile
from recommender.search.policy import SearchPolicy, load_search_policy
from recommender.units import fmt_seconds
from recommender.workload import Workload


UTILISATION_MISS = "predicted utilisation"


@dataclass(frozen=True)
class Prediction:
    """The model's verdict on one deployment at ``rate_per_s`` (latencies in seconds)."""

    rate_per_s: float
    stable: bool
    utilisation: float
    max_utilisation: float
    latencies: Mapping[str, Mapping[str, float]]  # metric -> percentile -> seconds
    misses: tuple[str, ...]  # why it fails ("" when it meets the load)
    replicas: tuple[int, ...] = ()
    p_slo: float | None = None  # P(all SLOs met) at this rate from the plan's band (None: the plan has no bands)

    @property
    def meets(self) -> bool:
        return not self.misses

    @property
    def slo_misses(self) -> tuple[str, ...]:
        """The misses other than the utilisation cap (a sizing margin, not an SLO): saturation or an SLO."""
        return tuple(m for m in self.misses if not m.startswith(UTILISATION_MISS))

    def summary(self, workload: Workload) -> str:
        """'tpot p90 25.1 ms, utilisation 0.61' for the workload's SLO metrics."""
        parts = [f"{s.metric} {s.percentile} {fmt_seconds(self.latencies[s.metric][s.percentile])}"
                 for s in workload.slos if s.percentile in self.latencies.get(s.metric, {})]
        util = f"utilisation {self.utilisation:.2f}" if math.isfinite(self.utilisation) else "saturated"
        return ", ".join(parts + [util])

    def to_dict(self) -> dict[str, Any]:
        return {"rate_per_s": round(self.rate_per_s, 4), "stable": self.stable,
                "utilisation": round(self.utilisation, 4) if math.isfinite(self.utilisation) else None,
                "max_utilisation": self.max_utilisation, "meets": self.meets, "misses": list(self.misses),
                "p_slo": self.p_slo,
                "latencies_s": {m: {p: (round(v, 5) if math.isfinite(v) else None) for p, v in d.items()}
                                for m, d in self.latencies.items()}}


def pool_step_costs(plan: Plan, workload: Workload, *, profile: EngineProfile,
                    catalog: Catalog) -> tuple[PoolModel, ...]:
    """Per pool of the plan's rank-1 row: its step costs, the limits vLLM was given and one replica's deployment
    (``recommender.plan.rebuild.pool_models``; pipeline stages included)."""
    row = plan.top
    max_len = int(row.max_model_len or plan.workload.max_model_len or workload.max_model_len)
    return pool_models(row, model=catalog.model(workload.model), profile=profile, catalog=catalog,
                       max_model_len=max_len)


def predict_plan(plan: Plan, workload: Workload, *, profile: EngineProfile | None = None,
                 policy: SearchPolicy | None = None, catalog: Catalog | None = None,
                 replicas: tuple[int, ...] | None = None) -> Prediction:
    """Evaluate the rank-1 row of ``plan`` (or its shape at ``replicas`` per pool) under ``workload``.

    Raises RecommenderError when the plan names a GPU or model the catalog does not know or a
    configuration that no longer fits in memory (the message says which).
    """
    policy = policy or load_search_policy()
    profile = profile or engine_profile("vllm")
    catalog = catalog or default_catalog()
    row = plan.top
    reps = replicas if replicas is not None else row.pool_replicas
    pools = pool_step_costs(plan, workload, profile=profile, catalog=catalog)
    rate = float(workload.effective_rate_per_s)
    sfx = workload.shared_prefix_fraction
    link: KvLink | None = None
    if len(pools) > 1:  # the KV link the search sized the plan with (older plans: its path's, or the policy's)
        link = row_kv_link(row, catalog.model(workload.model), pools[0].pool, pools[-1].pool,
                           default_bytes_per_s_per_gpu=policy.kv_transfer_bandwidth_bytes_per_s,
                           default_latency_s=policy.kv_transfer_latency_s)

    def run(at_per_s: float) -> Any:
        traffic = Traffic(rate_per_s=at_per_s, prompt=workload.prompt_tokens, output=workload.output_tokens,
                          shared_prefix_fraction=sfx)
        first, last = pools[0], pools[-1]
        if link is None:
            # a replica of a data-parallel-attention engine is dp load-model ranks (recommender.sizing)
            ranks = int(reps[0]) * first.pool.data_parallel_size
            return analyze(PoolSpec(cost=first.cost, limits=first.limits, replicas=ranks), traffic)
        return analyze_disaggregated(Disaggregated(
            prefill=PoolSpec(cost=first.cost, limits=first.limits, replicas=int(reps[0])),
            decode=PoolSpec(cost=last.cost, limits=last.limits, replicas=int(reps[-1])), kv_link=link), traffic)

    res = run(rate)
    lat = {m: {p: float(getattr(res, f"{m}_s").at(p)) for p in ("mean", "p50", "p90", "p95", "p99")}
           for m in ("ttft", "tpot", "e2e")}
    misses = []
    if not res.stable:
        misses.append(f"saturated at {rate:.2f} req/s (utilisation {res.utilisation:.2f}, bottleneck "
                      f"{res.bottleneck or 'capacity'})")
    else:
        if res.utilisation > policy.max_utilisation:
            misses.append(f"{UTILISATION_MISS} {res.utilisation:.2f} > cap {policy.max_utilisation:.2f} at "
                          f"{rate:.2f} req/s")
        for s in workload.slos:
            v = lat[s.metric][s.percentile]
            if v > s.limit_s:
                misses.append(f"predicted {s.metric} {s.percentile} {fmt_seconds(v)} > {fmt_seconds(s.limit_s)} SLO "
                              f"at {rate:.2f} req/s")
    sigma = (row.bands or {}).get("sigma") if row.bands else None
    st = (row.bands or {}).get("sigma_ttft")  # the class's TTFT log-sd (bands.py), when the plan has one
    p_met = (p_slo_met(run, rate, workload, float(sigma), sigma_ttft=float(st) if isinstance(st, (int, float)) and st > 0
                       else None) if isinstance(sigma, (int, float)) and sigma > 0 else None)
    return Prediction(rate, bool(res.stable), float(res.utilisation), policy.max_utilisation, lat, tuple(misses),
                      tuple(int(r) for r in reps), p_met)


def p_slo_met(run: Any, rate_per_s: float, workload: Workload, sigma: float, steps: int = 8,
              sigma_ttft: float | None = None) -> float | None:
    """P(all SLOs met) at ``rate_per_s`` under one standard-normal error ``z`` (``recommender.search.bands``):
    every step time is ``g = exp(sigma z)`` times the model's (``sigma``: the plan's evidence class), so the load
    is the model's at ``g x rate`` and a latency ``g x L(g x rate)``; with ``sigma_ttft`` (the class's TTFT log-sd)
    TTFT is ``exp(sigma_ttft z) L(g x rate)``. ``Phi(z*)``, ``z*`` the largest ``z`` with the pools stable and
    every SLO within its limit (bisection over ``z`` in +-4). None without SLOs."""
    if not workload.slos:
        return None
    st = sigma if sigma_ttft is None else sigma_ttft

    def ok(z: float) -> bool:
        g = math.exp(sigma * z)
        r = run(rate_per_s * g)
        return bool(r.stable) and all(
            math.exp((st if s.metric == "ttft" else sigma) * z) * float(getattr(r, f"{s.metric}_s").at(s.percentile))
            <= s.limit_s for s in workload.slos)

    lo, hi = -4.0, 4.0
    if not ok(lo):
        return 0.0
    if ok(hi):
        return 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return round(NormalDist().cdf(lo), 4)


def smaller_shape_meets(plan: Plan, workload: Workload, **kw: Any) -> tuple[int, ...] | None:
    """Replica counts with one replica fewer in one pool that still meet the load, else None.

    Used to tell whether traffic is inside the current plan's band (it meets the load and no smaller
    plan of the same shape does)."""
    cur = plan.top.pool_replicas
    for i in range(len(cur)):
        if cur[i] <= 1:
            continue
        fewer = tuple(r - 1 if j == i else r for j, r in enumerate(cur))
        if predict_plan(plan, workload, replicas=fewer, **kw).meets:
            return fewer
    return None

