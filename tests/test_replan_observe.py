"""Observation -> forecast, Workload and SLO risk."""

from __future__ import annotations

import math

import pytest

from recommender.replan.observation import Histogram, LengthObservation, Observation, RatePoint
from recommender.replan.observe import (
    base_workload_from_plan, forecast_rate_per_s, observed_workload, slo_attainment, slo_risks,
)
from recommender.replan.policy import Policy
from recommender.workload import Slo
from test_replan_support import fake_plan

PTS = [RatePoint(100.0, 60.0, 2.0), RatePoint(160.0, 60.0, 5.0), RatePoint(220.0, 60.0, 3.0)]


def test_forecast_peak_and_ewma():
    assert forecast_rate_per_s(PTS, Policy(forecast_method="peak"), 220.0) == 5.0
    # half-life 60 s, 60-s points: a = 1 - 2**-1 = 0.5; 2 -> 2 + 0.5 (5 - 2) = 3.5 -> 3.5 + 0.5 (3 - 3.5) = 3.25
    ewma = Policy(forecast_method="ewma", ewma_halflife_s=60.0)
    assert forecast_rate_per_s(PTS, ewma, 220.0) == pytest.approx(3.25)
    # lookback 100 s at t=220 keeps points ending at >= 120 s: peak 5, ewma 5 -> 4
    assert forecast_rate_per_s(PTS, Policy(forecast_method="ewma", ewma_halflife_s=60.0, lookback_s=100.0), 220.0) == \
        pytest.approx(4.0)
    assert forecast_rate_per_s([], Policy(), 0.0) == 0.0


def obs(rate=3.0, n=500, ttft=None, tpot=None) -> Observation:
    lat = {}
    if ttft is not None:
        lat["ttft"] = ttft
    if tpot is not None:
        lat["tpot"] = tpot
    lengths = LengthObservation(n, 1000.0, samples=tuple([500] * (n // 2) + [1500] * (n - n // 2)))
    out = LengthObservation(n, 100.0, samples=tuple([100] * n))
    return Observation("request-log", ("x",), 1000.0, 300.0, float(n), rate, (RatePoint(1000.0, 300.0, rate),),
                       lengths, out, latency=lat)


def test_observed_workload_plans_for_forecast_with_headroom_and_observed_lengths():
    cur = fake_plan(4, 4.8)
    base = base_workload_from_plan(cur)
    wl, notes = observed_workload(obs(), base, cur, Policy(headroom=0.25), forecast_per_s=4.0)
    assert wl.arrival_rate_per_s == pytest.approx(5.0)  # 4 x 1.25
    assert wl.prompt_tokens.kind == "empirical" and wl.prompt_tokens.max_tokens == 1500
    assert wl.output_tokens.max_tokens == 100 and wl.model == "llama-3.1-8b" and not notes
    assert [s.metric for s in wl.slos] == ["ttft", "tpot"] and wl.gpus == ("h100-sxm",)
    floor, notes = observed_workload(obs(rate=0.0), base, cur, Policy(), forecast_per_s=0.0)
    assert floor.arrival_rate_per_s == Policy().min_rate_per_s and "policy floor" in notes[0]
    few, notes = observed_workload(obs(n=5), base, cur, Policy(), forecast_per_s=1.0)
    assert few.prompt_tokens is base.prompt_tokens and "5 requests observed" in notes[0]


def test_plan_summary_rebuilds_lengths_with_the_same_quantiles():
    # fake_plan's prompt summary: min 10, p50 900, p90 2000, p99 4000, max 6000 (mean 1000)
    wl = base_workload_from_plan(fake_plan(4, 4.8))
    assert wl.prompt_tokens.quantile(0.5) == pytest.approx(900, abs=3)
    assert wl.prompt_tokens.quantile(0.9) == pytest.approx(2000, abs=3)
    assert wl.prompt_tokens.max_tokens == 6000
    assert wl.slos[0] == Slo("ttft", 2.0, "p99")


def test_histogram_lengths_are_clipped_to_the_plans_max_model_len():
    h = Histogram((1000.0, 5000.0, 10000.0, math.inf), (50.0, 90.0, 100.0, 100.0), 200_000.0)
    o = Observation("vllm-metrics", ("u",), 1.0, 30.0, 100.0, 3.0, (), LengthObservation(100, 2000.0, histogram=h),
                    LengthObservation(100, 100.0, histogram=Histogram((100.0, math.inf), (100.0, 100.0), 1e4)))
    cur = fake_plan(4, 4.8)  # max_model_len 7000
    wl, _ = observed_workload(o, base_workload_from_plan(cur), cur, Policy(), 3.0)
    assert wl.prompt_tokens.max_tokens == 7000 and wl.output_tokens.max_tokens == 100


def test_observed_slo_risk():
    cur = fake_plan(4, 4.8)
    slos = base_workload_from_plan(cur).slos  # ttft 2 s @p99, tpot 50 ms @p90
    # TTFT: 90 in (0, 1], 10 in (2.5, 5] -> p99 = 2.5 + 2.5 x (99 - 90) / 10 = 4.75 s > 2 s
    ttft = Histogram((1.0, 2.5, 5.0, math.inf), (90.0, 90.0, 100.0, 100.0), 100.0)
    tpot = Histogram((0.025, 0.05, math.inf), (100.0, 100.0, 100.0), 2.0)  # p90 = 0.0225 s: fine
    risks = slo_risks(obs(ttft=ttft, tpot=tpot), slos, Policy())
    assert risks == ["observed ttft p99 4750 ms > 2000 ms SLO"]
    assert slo_risks(obs(ttft=ttft), slos, Policy(slo_risk_min_requests=101)) == []  # too few samples
    assert slo_risks(obs(), slos, Policy()) == []  # a rate alone is no risk: predict.py decides that
    att = slo_attainment(obs(ttft=ttft), slos, Policy())
    assert att[0]["observed_s"] == pytest.approx(4.75) and att[0]["ok"] is False and att[1]["observed_s"] is None
