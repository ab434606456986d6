"""Verification cannot drop a plan on one unlucky run (issue #24, item 4): a failure is confirmed by independent
replications before a drop; after a drop the Pareto flags, the ranking and the text are recomputed, and the
footer says what verification changed."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

import recommender.search.verify as verify_mod
from recommender.render.plan import render_table
from recommender.search import SearchSettings, recommend
from recommender.search.pareto import dominates
from recommender.search.policy import load_search_policy
from recommender.search.verify import confirmed_failure
from recommender.workload import LengthDist, Slo, Workload

CHAT = Workload(
    model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(1000, 600, 32, 4096),
    output_tokens=LengthDist.lognormal(250, 150, 8, 1024), arrival_rate_per_s=10.0,
    gpus=("h100-sxm", "a100-80gb", "l40s"), slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", 0.05, "p90")), name="chat-test",
)
POLICY = dataclasses.replace(
    load_search_policy(), tensor_parallel=(1, 2), weight_dtypes=("native", "fp8"), max_num_seqs=(64, 256),
    max_num_batched_tokens=(2048, 8192), disaggregation=False, trials=120, verify=2, verify_requests=3000)


def test_confirmation_is_a_one_sided_t_test_on_replication_means():
    # ratios 1.20, 1.25, 1.30: mean 1.25, sd 0.05; lower bound 1.25 - 2.920 x 0.05 / sqrt(3) = 1.166 > 1: drop
    why = confirmed_failure([True] * 3, [{"tpot@p90": x} for x in (1.20, 1.25, 1.30)])
    assert "tpot@p90 1.25 x its limit" in why and "lower bound 1.17 > 1" in why
    # 0.95, 1.02, 0.98: mean 0.983 < 1: not shown, kept
    assert confirmed_failure([True] * 3, [{"tpot@p90": x} for x in (0.95, 1.02, 0.98)]) == ""
    # 1.02, 1.10, 1.06: mean 1.06, sd 0.04, bound 1.06 - 2.920 x 0.04 / sqrt(3) = 0.993: within the noise, kept
    assert confirmed_failure([True] * 3, [{"tpot@p90": x} for x in (1.02, 1.10, 1.06)]) == ""
    # unstable in every replication: drop; in two of three: kept
    assert confirmed_failure([False] * 3, [{"tpot@p90": 0.5}] * 3) == "unstable in 3 of 3 confirmation runs"
    assert confirmed_failure([False, False, True], [{"tpot@p90": 0.5}] * 3) == ""


def test_a_first_run_that_misses_by_chance_does_not_drop_the_plan(monkeypatch):
    """The analytic rank 1's first simulator run is made to read as a miss; its confirmation runs are real
    simulations of a plan that meets its SLOs, so it stays rank 1 and the footer says it was doubted."""
    base = recommend(CHAT, settings=SearchSettings(seed=0, trials=120, verify=2), policy=POLICY)
    first_id = base.top.id
    real_meets = verify_mod.meets
    calls = {"n": 0}

    def unlucky_first(ctx, sim):
        calls["n"] += 1
        return False if calls["n"] == 1 else real_meets(ctx, sim)

    monkeypatch.setattr(verify_mod, "meets", unlucky_first)
    plan = recommend(CHAT, settings=SearchSettings(seed=0, trials=120, verify=2), policy=POLICY)
    assert plan.top.id == first_id
    assert plan.search.verification and "(a first run missed; the confirmation runs did not show it)" in plan.search.verification
    assert len(plan.top.simulated["confirmation"]) == verify_mod.CONFIRM_RUNS
    assert plan.search.verification in render_table(plan)


def test_after_a_confirmed_drop_flags_ranks_and_text_are_recomputed(monkeypatch):
    """The analytic rank 1 simulates as failing and its confirmation agrees: it is dropped, the next plans rank,
    and every flag and sentence is about the plans kept."""
    base = recommend(CHAT, settings=SearchSettings(seed=0, trials=120, verify=2), policy=POLICY)
    first = base.top
    real_sim, real_summary = verify_mod.simulate_evaluation, verify_mod.sim_summary
    monkeypatch.setattr(verify_mod, "simulate_evaluation", lambda ctx, ev, n, seed, warm=0: (
        "FAILED" if ev.candidate.key == first.id else real_sim(ctx, ev, n, seed, warm)))
    monkeypatch.setattr(verify_mod, "sim_summary", lambda res: dict(FAILED) if res == "FAILED" else real_summary(res))
    monkeypatch.setattr(verify_mod, "confirm_failure", lambda ctx, ev, n, warm, seed: ("tpot@p90 1.30 x its limit", []))
    plan = recommend(CHAT, settings=SearchSettings(seed=0, trials=120, verify=2), policy=POLICY)
    assert all(r.id != first.id for r in plan.rows)
    assert plan.search.rank1_proven is False
    v = plan.search.verification or ""
    assert v.startswith("Verification dropped") and "tpot@p90 1.30 x its limit" in v and "the analytic rank 1 was" in v
    table = render_table(plan)
    assert "NOT proven cheapest (the simulator dropped the analytic optimum)" in table and v in table
    # the Pareto flags are those of the plans kept: no kept row dominates a row flagged Pareto, and the
    # Pareto rows come first, cheapest first
    objs = {r.id: (r.usd_per_million_tokens, r.ttft_s, r.tpot_s) for r in plan.rows}
    for r in plan.rows:
        if r.pareto:
            assert not any(dominates(o, objs[r.id]) for k, o in objs.items() if k != r.id)
    flags = [r.pareto for r in plan.rows]
    assert flags == sorted(flags, reverse=True) and plan.rows[0].pareto
    pareto_costs = [r.usd_per_million_tokens for r in plan.rows if r.pareto]
    assert pareto_costs == sorted(pareto_costs)
    assert first.id not in plan.why and "-" not in plan.why.split("% ")[0][-4:]  # never "-74% less"


FAILED = {"ttft_s": {"p90": math.inf}, "tpot_s": {"p90": math.inf}, "e2e_s": {}, "stable": False, "requests": 1,
          "completed": 1}


@pytest.mark.slow
def test_issue_24_qwen72b_on_8_h200_has_one_rank_1_for_seeds_0_to_9(tmp_path: Path):
    """The done-when case: Qwen2.5-72B, gpus [h200], max_gpus 8, 8 req/s, 2,000/300 tokens, TTFT 2 s / TPOT 40 ms
    at p90; the default policy (verify 3)."""
    w = Workload(model="qwen2.5-72b", prompt_tokens=LengthDist.constant(2000), output_tokens=LengthDist.constant(300),
                 arrival_rate_per_s=8.0, gpus=("h200",), max_gpus=8,
                 slos=(Slo("ttft", 2.0, "p90"), Slo("tpot", 0.04, "p90")), name="q72")
    tops = {recommend(w, settings=SearchSettings(seed=s)).top.id for s in range(10)}
    assert len(tops) == 1, tops


EXAMPLES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES)
def test_issue_24_every_example_has_one_rank_1_for_seeds_0_to_9(example: str):
    """The done-when's second half: every example (default settings: verification on) gives the same rank 1
    for seeds 0-9 (about 4 s a seed on the development machine)."""
    from recommender.workload import load_workload

    w = load_workload(Path(__file__).resolve().parents[1] / "examples" / example)
    tops = {recommend(w, settings=SearchSettings(seed=s)).top.id for s in range(10)}
    assert len(tops) == 1, tops
