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
