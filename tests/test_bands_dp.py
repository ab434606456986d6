"""A data-parallel-attention plan's bands re-run the load model the plan was sized with (``replicas x dp`` ranks).

``bands._at`` at ``g = 1`` is the plan's own analytic point, so its latencies must equal the evaluation's. Before,
the bands ran ``replicas`` ranks for a DP plan: DeepSeek-V3 chat's rank 1 (H200 TP1 DP8 MTP1 x3) saw its 20 req/s
on 3 ranks instead of 24, saturated, and read P(SLO) 0.001 with a TTFT p90 of 0.66 s against a 2 s SLO.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.profiles import engine_profile
from recommender.search.bands import _at
from recommender.search.planner import build_context
from recommender.search.policy import load_search_policy
from recommender.sizing import Candidate
from recommender.workload import load_workload

DSV3 = Path(__file__).parent / "data" / "workloads" / "deepseek-v3-chat.yaml"


@pytest.mark.parametrize("dp,mtp", [(8, 0), (8, 1), (4, 0)])
def test_dp_bands_at_no_error_are_the_plans_own_latencies(dp: int, mtp: int) -> None:
    w = load_workload(DSV3)
    ctx = build_context(w, replace(load_search_policy(), disaggregation=False), engine_profile("vllm"), default_catalog())
    ev = ctx.evaluator(Candidate("h200", 8 // dp, "fp8", "fp8", 32, 8192, dp=dp, mtp=mtp))
    assert ev.feasible and ev.pools[0].dp == dp and ev.pools[0].replicas >= 1
    lat = _at(ctx, ev, 1.0)
    assert lat is not None  # the pools are stable at the plan's own rate
    for metric in ("ttft", "tpot"):
        assert lat[f"{metric}@p90"] == pytest.approx(ev.latency(metric, "p90"), rel=1e-9)
