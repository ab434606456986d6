"""Plans whose numbers hold: every example's rank-1 plan (search seeds 0-2), simulated for 20,000
requests, meets its SLOs at the asked percentile and is in steady state (served >= 98% of the offered
load over the second half and its last quarter). Slow: CI runs it (``CI=true``), locally ``--runslow``.

Issue #13: chat at 80 req/s on H100 once ranked 2 x H100 first (analytic utilisation 0.64); simulated
for 20,000 requests its queue kept growing (17.7k of 19.96k output tok/s served).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.profiles import engine_profile
from recommender.search.planner import SearchSettings, build_context, recommend
from recommender.search.policy import load_search_policy
from recommender.search.verify import meets, sim_summary, simulate_evaluation
from recommender.workload import Workload, load_workload

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
N_REQUESTS = 20_000


def _rank1_holds(w: Workload) -> None:
    ctx = build_context(w, load_search_policy(), engine_profile("vllm"), default_catalog())
    simulated: set[str] = set()
    for seed in (0, 1, 2):
        # rank 1 is the first row the simulator passes, whatever K (rows are verified in rank order)
        plan = recommend(w, settings=SearchSettings(seed=seed, top=1, verify=1))
        row = plan.rows[0]
        if row.id in simulated:  # the same plan from another seed: same simulation
            continue
        simulated.add(row.id)
        ev = next(e for e in plan.evaluations if e.candidate.key == row.id)  # the search's evaluation of the row
        # engine limits that mean something (#13.4): max_num_seqs within what the KV cache holds at the
        # mean context, or the grid's smallest value
        for p in ev.pools:
            if p.role != "prefill":
                held = p.kv_capacity_tokens // ctx.held_tokens_per_sequence()
                assert p.limits.max_num_seqs <= max(held, min(ctx.policy.max_num_seqs)), (row.label(), held)
        res = simulate_evaluation(ctx, ev, N_REQUESTS, seed, N_REQUESTS // 5)
        assert res.stable, (row.label(), res.served_fraction, res.served_fraction_late)
        assert meets(ctx, sim_summary(res)), (row.label(), sim_summary(res))


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
def test_rank1_of_every_example_holds_for_20k_simulated_requests(example: str) -> None:
    _rank1_holds(load_workload(EXAMPLES / f"{example}.yaml"))


@pytest.mark.slow
def test_chat_at_80_req_s_on_h100_holds() -> None:
    w = load_workload(EXAMPLES / "chat.yaml")
    _rank1_holds(dataclasses.replace(w, arrival_rate_per_s=80.0, gpus=("h100-sxm",)))


@pytest.mark.slow
def test_offline_rank1_finishes_before_its_deadline_and_one_replica_fewer_loses_the_margin() -> None:
    from recommender.search.verify import simulate_offline_job
    from recommender.sizing import OFFLINE_MAX_UTILISATION

    w = load_workload(EXAMPLES / "batch-summarization.yaml")
    ctx = build_context(w, load_search_policy(), engine_profile("vllm"), default_catalog())
    plan = recommend(w, settings=SearchSettings(seed=0, top=1, verify=1))
    row = plan.rows[0]
    ev = next(e for e in plan.evaluations if e.candidate.key == row.id)  # the search's evaluation of the row
    _, finish = simulate_offline_job(ctx, ev, 5000, 0)
    assert finish <= w.deadline_s
    # a job without SLOs is verified by its finish time alone (the burst's latencies are not simulated)
    assert row.simulated is not None and "ttft_s" not in row.simulated
    assert row.simulated["job_finish_s"] == pytest.approx(finish)
    # the analytic finish (utilisation = rate / capacity, x deadline) is the simulated one within the capacities'
    # 5% (tests/test_load_capacity.py); since issue 22's dense physics 31,628 analytic against 32,987 s (-4.1%)
    assert ev.utilisation * w.deadline_s == pytest.approx(finish, rel=0.05)
    # the job pays for the hours it runs: $/M tokens x tokens = $/h x finish
    tokens = w.offline_requests * (w.prompt_tokens.mean + w.output_tokens.mean)
    assert ev.usd_per_million_tokens * tokens / 1e6 == pytest.approx(ev.usd_per_hour * ev.utilisation * w.deadline_s / 3600)
    assert len(ev.pools) == 1 and ev.pools[0].replicas >= 2
    # not oversized: one replica fewer would end within 5% of the deadline in simulation, so it could not keep
    # the sizing's 2% margin (OFFLINE_MAX_UTILISATION) plus the analytic model's error (the capacities agree
    # within 5%, tests/test_load_capacity.py). The job's cost is the same either way: it pays GPU-hours x
    # running fraction, and fewer replicas run longer.
    assert OFFLINE_MAX_UTILISATION == 0.98
    fewer = dataclasses.replace(ev, pools=(dataclasses.replace(ev.pools[0], replicas=ev.pools[0].replicas - 1),))
    _, finish_fewer = simulate_offline_job(ctx, fewer, 5000, 0)
    assert finish_fewer > 0.95 * w.deadline_s, (row.label(), finish, finish_fewer)


def test_verification_does_not_drop_rank_1_for_queue_noise() -> None:
    # benchmarks/bench_search.py, seeds 0-9 (2026-12-01): chat seed 3 dropped the proven-cheapest h100-pcie plan
    # (0.79 of its capacity) for one 2.6x dearer: 3,556 simulated requests, last quarter 62 requests behind
    # arrivals (served 0.930 < 0.95) with ~100 in the system, a fluctuation, not a growing queue; rag seed 7
    # likewise (1.25x). Runs now last (1 + rho) / (1 - rho) at rho = the fraction of capacity in use, and a late
    # deficit within the mean number in system is not a trend.
    # Since issue 22's physics the proven-cheapest chat plan at seed 3 is another (mi300x TP1 fp8), so the test
    # holds verification to the unverified search's rank 1, whatever it is.
    w = load_workload(EXAMPLES / "chat.yaml")
    unverified = recommend(w, settings=SearchSettings(seed=3, top=1, verify=0))
    plan = recommend(w, settings=SearchSettings(seed=3, top=1, verify=1))
    assert plan.rows[0].id == unverified.rows[0].id
    # verified, over a run of at least the 1,000 requests the verifier's floor gives (README, "Verified in the simulator")
    assert plan.rows[0].simulated is not None and plan.rows[0].simulated["requests"] >= 1_000
