"""Verify the top plans in the discrete-event simulator and drop the ones it shows breaking an SLO.

The analytic load model ranks thousands of candidates; the simulator replays ``verify_requests``
seeded requests through a vLLM-like scheduler for the few that matter. A row whose simulated
percentile exceeds its SLO is dropped and the next analytic row takes its place (re-ranked).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from recommender.plan import PlanRow
from recommender.search.evaluate import Evaluation, SearchContext, kv_transfer_s_per_token
from recommender.search.recommend_rows import more_rows


def simulate_evaluation(ctx: SearchContext, ev: Evaluation, n_requests: int, seed: int) -> Any:
    """Run the simulator for one evaluated plan at the workload's rate."""
    from recommender.load import simulate, simulate_disaggregated

    w = ctx.workload
    c = ev.candidate
    rate = w.effective_rate_per_s
    costs = []
    for p in ev.pools:
        cost, _ = ctx.cost_model(p.gpu, p.tp, p.weight_dtype, p.kv_dtype, p.limits)
        costs.append(cost)
    if c.disaggregated:
        pp, dp = ev.pools
        return simulate_disaggregated(costs[0], pp.limits, pp.replicas, costs[1], dp.limits, dp.replicas,
                                      kv_transfer_s_per_token(ctx, c), rate, w.prompt_tokens, w.output_tokens,
                                      n_requests=n_requests, seed=seed, shared_prefix_fraction=w.shared_prefix_fraction)
    p = ev.pools[0]
    return simulate(costs[0], p.limits, rate, w.prompt_tokens, w.output_tokens, n_requests=n_requests, seed=seed,
                    replicas=p.replicas, shared_prefix_fraction=w.shared_prefix_fraction)


def sim_summary(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in ("ttft", "tpot", "e2e"):
        out[f"{m}_s"] = getattr(res, f"{m}_s").to_dict()
    out["completed"] = getattr(res, "completed", None)
    out["preempted"] = getattr(res, "preempted", None)
    return out


def meets(ctx: SearchContext, sim: dict[str, Any]) -> bool:
    for s in ctx.workload.slos:
        v = sim[f"{s.metric}_s"].get(s.percentile)
        if v is None or not math.isfinite(v) or v > s.limit_s:
            return False
    return True


def verify_rows(ctx: SearchContext, rows: Sequence[PlanRow], evaluations: Sequence[Evaluation], k: int, seed: int,
                top: int) -> list[PlanRow]:
    """Simulate the first ``k`` rows; drop failures, refill from the remaining ranked rows, re-rank."""
    pool = list(rows) + more_rows(ctx, evaluations, rows, extra=2 * k)
    kept: list[PlanRow] = []
    checked = 0
    for r in pool:
        if checked < k:
            sim = sim_summary(simulate_evaluation(ctx, r.evaluation, ctx.policy.verify_requests, seed))
            checked += 1
            if not meets(ctx, sim):
                continue
            r = dataclasses.replace(r, simulated=sim)
        kept.append(r)
        if len(kept) >= top:
            break
    return [dataclasses.replace(r, rank=i + 1) for i, r in enumerate(kept)]
