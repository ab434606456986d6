"""The "P/D N% cheaper than best aggregated" note is measured against the cheapest aggregated plan of the
space (its rank 1 proven), not the cheapest one a P/D-led search happened to evaluate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from recommender.search.planner import SearchSettings, recommend
from recommender.search.policy import SearchPolicy
from recommender.workload import Slo, load_workload

# the README's P/D example (examples/rag.yaml with tpot=30ms) on H100 NVL only: P/D on one instance leads
RAG = load_workload(Path(__file__).resolve().parents[1] / "examples" / "rag.yaml")
W = dataclasses.replace(RAG, slos=(Slo("ttft", 3.0, "p90"), Slo("tpot", 0.03, "p90")), gpus=("h100-nvl",))


@pytest.mark.slow
def test_pd_saving_is_against_the_proven_best_aggregated_plan() -> None:
    plan = recommend(W, settings=SearchSettings(verify=0, seed=0))
    top = plan.top
    assert top.disaggregated and plan.search.aggregated_rank1_proven is True
    # the same space without P/D: its rank 1 is the cheapest aggregated plan (proven by its own search)
    agg = recommend(W, settings=SearchSettings(verify=0, seed=0), policy=SearchPolicy(disaggregation=False))
    assert agg.search.rank1_proven and not agg.top.disaggregated
    assert top.usd_per_million_tokens is not None and agg.top.usd_per_million_tokens is not None
    want = 1.0 - top.usd_per_million_tokens / agg.top.usd_per_million_tokens
    assert top.pd_saving_vs_aggregated == pytest.approx(want, rel=1e-9)


@pytest.mark.slow
def test_a_pd_plan_records_its_handoff_and_is_re_predicted_with_it() -> None:
    # the P/D rank 1 carries the measured handoff in its KV link (recommender.load.link: 60 ms); the re-planner's
    # prediction at the plan's own rate rebuilds that link and gives the plan's TTFT; without the handoff the same
    # plan's TTFT is 60 ms lower at every percentile (a delay, not a link's service time)
    import json

    from recommender.plan import dump_plan, load_plan
    from recommender.replan.predict import predict_plan

    plan = load_plan(json.loads(dump_plan(recommend(W, settings=SearchSettings(verify=0, seed=0)))))
    top = plan.top
    assert top.disaggregated and top.kv_link_model is not None
    assert top.kv_link_model["handoff_s"] == pytest.approx(0.06)
    pred = predict_plan(plan, W)
    for q in ("p50", "p90"):
        assert pred.latencies["ttft"][q] == pytest.approx(top.latency("ttft", q), rel=1e-6)
    doc = json.loads(dump_plan(plan))
    doc["plans"][0]["kv_link_model"]["handoff_s"] = 0.0
    without = predict_plan(load_plan(doc), W)
    for q in ("mean", "p50", "p90"):
        assert pred.latencies["ttft"][q] - without.latencies["ttft"][q] == pytest.approx(0.06, rel=1e-6)
