"""Error bands and P(SLO met) per plan row (issue #24, items 1-2; recommender/search/bands.py)."""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import pytest

from recommender.catalog import default_catalog
from recommender.profiles import engine_profile
from recommender.render.plan import render_csv, render_table
from recommender.search import SearchSettings, recommend
from recommender.search.bands import PRIOR_SIGMA, class_sigma, evidence_class
from recommender.search.planner import build_context
from recommender.search.policy import load_search_policy
from recommender.workload import LengthDist, Slo, Workload

CHAT = Workload(
    model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(1000, 600, 32, 4096),
    output_tokens=LengthDist.lognormal(250, 150, 8, 1024), arrival_rate_per_s=10.0,
    gpus=("h100-sxm", "a100-80gb", "l40s"), slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", 0.05, "p90")), name="chat-b",
)
POLICY = dataclasses.replace(
    load_search_policy(), tensor_parallel=(1, 2), weight_dtypes=("native", "fp8"), max_num_seqs=(64, 256),
    max_num_batched_tokens=(2048, 8192), disaggregation=False, trials=120, verify=0)


def plan_at(confidence: float):
    return recommend(CHAT, settings=SearchSettings(seed=0, trials=120, verify=0, confidence=confidence), policy=POLICY)


def test_bands_widen_as_evidence_rows_shrink():
    fit_sigma = 0.2
    sigmas = [class_sigma(n, fit_sigma) for n in (100, 30, 10, 3, 1, 0)]
    assert sigmas == sorted(sigmas) and sigmas[-1] == PRIOR_SIGMA
    # hand value: 10 rows at 0.2 with 5 prior rows at 0.5: sqrt((10 x 0.04 + 5 x 0.25) / 15) = 0.3317
    assert class_sigma(10, 0.2) == pytest.approx(math.sqrt((10 * 0.04 + 5 * 0.25) / 15))


def test_the_class_and_its_rows_come_from_the_fit_section():
    ctx = build_context(CHAT, POLICY, engine_profile("vllm"), default_catalog())
    fit = ctx.profile.fit
    by_gpu = next(r for r in fit["held_out"] if r["by"] == "gpu")
    gpus = default_catalog().gpus
    fam = gpus["h100-sxm"].arch
    groups = {g: st for g, st in by_gpu["per_group"].items() if g in gpus and gpus[g].arch == fam}
    rows = sum(st["start"]["n"] for st in groups.values()) + ctx.profile.evidence("h100-sxm")[1]
    c = evidence_class(ctx, "h100-sxm", "fp8")
    assert c.family == fam and c.rows == rows and c.model_class == "dense"
    if groups:  # their held-out median APE, row weighted, as a log-sd (median |N(0, s)| = 0.6745 s)
        m = sum(st["start"]["n"] * st["held_out"]["median_ape_pct"] for st in groups.values()) / sum(
            st["start"]["n"] for st in groups.values()) / 100
        assert c.sigma == pytest.approx(class_sigma(rows, m / 0.6745))
    # a family without rows in the fit gets the wide prior
    unmeasured = [g for g, x in gpus.items() if ctx.profile.evidence(g)[1] == 0 and not any(
        g2 in by_gpu["per_group"] and gpus[g2].arch == x.arch for g2 in gpus)]
    if unmeasured:
        assert evidence_class(ctx, unmeasured[0], "fp8").sigma == PRIOR_SIGMA


def test_every_row_carries_bands_and_p_slo_in_json_csv_and_table():
    plan = plan_at(0.5)
    for r in plan.rows:
        b = r.bands
        assert b is not None and set(b) >= {"class", "class_rows", "sigma", "ttft_s", "tpot_s", "e2e_s",
                                            "capacity_per_s", "p_slo", "p_slo_each"}
        lo, hi = b["tpot_s"]
        assert lo <= r.tpot_s and (hi is None or hi >= r.tpot_s)  # the point prediction is inside its band
        assert 0.5 <= b["p_slo"] <= 1.0  # default ranking: the point prediction meets every SLO (g* >= 1)
        # P(all SLOs) is the smallest of the per-SLO ones (one error factor for all)
        assert b["p_slo"] == pytest.approx(min(b["p_slo_each"].values()))
        # hand check of the band ends: g = exp(+-1.2816 sigma) scales the capacity
        cap = CHAT.arrival_rate_per_s / r.load_utilisation
        assert b["capacity_per_s"][0] == pytest.approx(cap * math.exp(-1.2816 * b["sigma"]), rel=1e-3)
    assert "P(SLO)" in render_table(plan) and f"{plan.top.bands['p_slo']:.2f} (" in render_table(plan)
    assert "p_slo,evidence_class" in render_csv(plan).splitlines()[0]
    assert NormalDist().cdf(0) == 0.5


def test_higher_confidence_never_gives_a_cheaper_rank_1():
    costs = []
    for conf in (0.5, 0.6, 0.7, 0.8, 0.9):
        plan = plan_at(conf)
        costs.append(plan.top.usd_per_million_tokens)
        if conf > 0.5 and plan.search.confidence is not None:
            assert all(r.bands["p_slo"] >= conf for r in plan.rows)
    assert costs == sorted(costs), costs


@pytest.mark.slow
def test_on_rag_a_higher_confidence_moves_rank_1_to_dearer_surer_plans():
    """examples/rag.yaml: rank 1 (mi300x, P 0.87 at the default) gives way as the confidence rises."""
    from recommender.workload import load_workload

    w = load_workload("examples/rag.yaml")
    base = recommend(w, settings=SearchSettings(seed=0, verify=0)).top
    p0 = base.bands["p_slo"]
    assert p0 < 0.98  # the default rank 1 is not near-certain: a higher confidence has somewhere to go
    above = round(p0 + 0.01, 4)  # just above the default rank 1's P(SLO met): it must give way
    tops = [recommend(w, settings=SearchSettings(seed=0, verify=0, confidence=c)).top for c in (0.5, above, 0.99)]
    costs = [t.usd_per_million_tokens for t in tops]
    assert costs == sorted(costs) and costs[-1] > costs[0], costs
    assert tops[0].id == base.id and tops[1].id != base.id and tops[1].bands["p_slo"] >= above


def test_at_confidence_0_9_a_thinly_measured_rank_1_gives_way_to_a_well_measured_plan():
    """a100-80gb (ampere: no rows in the vLLM fit, the 0.5 prior) priced at $1/GPU-h is rank 1 by its point
    prediction at P 0.77; at --confidence 0.9 the h100-sxm plan (hopper, 19 rows) takes rank 1."""
    w = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(1000, 600, 32, 4096),
                 output_tokens=LengthDist.lognormal(250, 150, 8, 1024), arrival_rate_per_s=10.0,
                 gpus=("h100-sxm", "a100-80gb"), usd_per_gpu_hour_overrides={"h100-sxm": 4.0, "a100-80gb": 1.0},
                 slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", 0.03, "p90")), name="thin")
    policy = dataclasses.replace(POLICY, trials=150)
    point = recommend(w, settings=SearchSettings(seed=0, trials=150, verify=0), policy=policy)
    sure = recommend(w, settings=SearchSettings(seed=0, trials=150, verify=0, confidence=0.9), policy=policy)
    assert point.top.gpu == "a100-80gb" and point.top.bands["class_rows"] == 0 and point.top.bands["p_slo"] < 0.9
    assert point.top.bands["sigma"] == PRIOR_SIGMA
    assert sure.top.gpu == "h100-sxm" and sure.top.bands["class_rows"] > 0 and sure.top.bands["p_slo"] >= 0.9
    assert sure.top.usd_per_million_tokens > point.top.usd_per_million_tokens
