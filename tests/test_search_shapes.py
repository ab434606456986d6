"""The shape search (branch and bound) against exhaustive evaluation, its bounds, the properties a
correct optimiser must have, budgets and the Optuna storage paths.

References are computed here, independently of the code under test: exhaustive evaluation of every
point of a small full space (aggregated and P/D) with the same evaluator.
"""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from recommender.catalog import default_catalog
from recommender.errors import ConfigError
from recommender.profiles import engine_profile
from recommender.search import SearchSettings, recommend
from recommender.search.bounds import Bounds
from recommender.search.exhaustive import enumerate_space, exhaustive, front, search_quality
from recommender.search.planner import build_context, space_choices
from recommender.search.policy import load_search_policy
from recommender.search.shapes import shape_search
from recommender.workload import LengthDist, Slo, Workload

CHAT = Workload(
    model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(1000, 600, 32, 4096),
    output_tokens=LengthDist.lognormal(250, 150, 8, 1024), arrival_rate_per_s=10.0,
    gpus=("h100-sxm", "l40s"), slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", 0.05, "p90")), name="chat-shapes",
)
# a small FULL space: aggregated and P/D, two GPU types, two TPs, two dtypes of each kind
SMALL = dataclasses.replace(
    load_search_policy(), tensor_parallel=(1, 2), weight_dtypes=("native", "fp8"), kv_dtypes=("bf16", "fp8"),
    max_num_seqs=(64, 256), max_num_batched_tokens=(0, 2048, 8192), disaggregation=True, trials=5000, verify=0,
)
# a smaller full space for the fast tests: 2 GPUs x 2 TP x 1 x 1 x 2 x 3 = 24 aggregated points + 96 P/D pairs
TINY = dataclasses.replace(SMALL, weight_dtypes=("native",), kv_dtypes=("fp8",))
QUIET = SearchSettings(seed=0, verify=0)


def _ctx(w: Workload = CHAT, policy=SMALL):
    return build_context(w, policy, engine_profile("vllm"), default_catalog())


def _truth(w: Workload, policy=SMALL):
    ctx = _ctx(w, policy)
    return exhaustive(ctx, space_choices(ctx))


def _cheapest(evals) -> float:
    return min((e.usd_per_million_tokens for e in evals if e.feasible), default=math.inf)


@pytest.fixture(scope="module")
def chat_truth():
    return _truth(CHAT)


@pytest.fixture(scope="module")
def tiny_truth():
    return _truth(CHAT, TINY)


def test_bounds_never_exceed_the_evaluation(tiny_truth):
    # the pruning is exact only if every bound is below what sizing finds: cost and each latency objective
    ctx = _ctx(CHAT, TINY)
    ch = space_choices(ctx)
    bounds = Bounds(ctx, ch.max_num_seqs, ch.budgets)
    k = 1e6 / (CHAT.arrival_rate_per_s * (CHAT.prompt_tokens.mean + CHAT.output_tokens.mean) * 3600)
    checked = 0
    for ev in tiny_truth:
        if not ev.feasible:
            continue
        b = bounds.of(ev.candidate)
        shape = bounds.of(dataclasses.replace(ev.candidate, max_num_seqs=0, max_num_batched_tokens=0))
        assert b is not None and shape is not None
        for lb in (b, shape):
            assert lb.usd_per_hour * k <= ev.objectives[0] * (1 + 1e-9)
            for lat_lb, lat in zip(lb.latencies_s, ev.objectives[1:]):
                assert lat_lb <= lat * (1 + 1e-9)
        checked += 1
    assert checked > 20


@pytest.mark.slow
@pytest.mark.parametrize("example, slo", [("chat", None), ("rag", Slo("tpot", 0.03, "p90")),
                                          ("batch-summarization", None), ("long-context", None)])
def test_bounds_never_exceed_the_evaluations_of_the_default_search(example: str, slo: Slo | None) -> None:
    # the full default space (all GPUs, offers, P/D, offline pricing): every feasible evaluation the shape
    # search makes lies above its bounds (these once failed by 1.5% on offline P/D: the load model's fitted
    # prefill cost sits under the exact FLOPs; bounds.BUSY_SLACK)
    from pathlib import Path

    from recommender.search.shapes import usd_per_hour_to_objective
    from recommender.workload import load_workload

    w = load_workload(Path(__file__).resolve().parents[1] / "examples" / f"{example}.yaml")
    if slo is not None:
        w = dataclasses.replace(w, slos=tuple(s for s in w.slos if s.metric != slo.metric) + (slo,))
    ctx = build_context(w, load_search_policy(), engine_profile("vllm"), default_catalog())
    ch = space_choices(ctx)
    res = shape_search(ctx, ch, max_evaluations=600)
    bounds, k = Bounds(ctx, ch.max_num_seqs, ch.budgets), usd_per_hour_to_objective(ctx)
    checked = 0
    for ev in res.evaluations:
        if not ev.feasible:
            continue
        b = bounds.of(ev.candidate)
        assert b is not None and b.usd_per_hour * k <= ev.objectives[0] * (1 + 1e-9), ev.candidate.key
        assert all(lb <= lat * (1 + 1e-9) for lb, lat in zip(b.latencies_s, ev.objectives[1:])), ev.candidate.key
        checked += 1
    assert checked > 100


# Offline jobs whose cost bound rests on the busy-time bound alone (no latency SLO): decode-heavy on a 70B
# model (long outputs: the KV read per decode token dominates) and prefill-heavy with one output token.
DECODE_HEAVY_JOB = """
name: decode-heavy
model: llama-3.1-70b
traffic: {offline: {requests: 1M, deadline: 10h}}
prompt_tokens: {dist: lognormal, mean: 300, std: 100, min: 16, max: 2000}
output_tokens: {dist: lognormal, mean: 1500, std: 500, min: 100, max: 4000}
"""
PREFILL_HEAVY_JOB = """
name: prefill-heavy
model: gpt-oss-20b
traffic: {offline: {requests: 20M, deadline: 10h}}
prompt_tokens: {dist: lognormal, mean: 6000, std: 2000, min: 500, max: 16000}
output_tokens: {dist: constant, value: 2}
shared_prefix_fraction: 0.3
"""


@pytest.mark.slow
@pytest.mark.parametrize("source", ["batch-summarization", "code-completion", "chat",
                                    DECODE_HEAVY_JOB, PREFILL_HEAVY_JOB,
                                    "../benchmarks/workloads/tight-tpot-70b"],
                         ids=["batch-summarization", "code-completion", "chat", "decode-heavy-job", "prefill-heavy-job",
                              "tight-tpot-70b"])
def test_bounds_never_exceed_random_evaluations_of_the_full_space(source: str, tmp_path) -> None:
    # the search evaluates what its bounds rank first; here 150 combos drawn uniformly from the whole default
    # space (every GPU, dtype, TP, P/D pair and engine limits) must lie above their bounds as well
    from pathlib import Path

    from bound_checks import context_of, random_bound_checks

    job = source if "\n" in source else Path(__file__).resolve().parents[1] / "examples" / f"{source}.yaml"
    ctx = context_of(tmp_path, job)
    # a 10 ms TPOT leaves ~1 in 4 combos feasible
    assert random_bound_checks(ctx, 400 if "tight" in ctx.workload.name else 150, seed=1) > 50


def test_decode_pool_capacity_stays_under_c_over_the_step_of_c(tmp_path) -> None:
    # A decode pool's step holds at most c sequences, so one replica serves at most c / decode_step_s(c, ctx)
    # tokens/s: 16 / 0.024044 s = 665 tokens/s, / E[O - 1] = 1498.8 -> 0.4440 req/s (A100 TP2 int4, the
    # decode-heavy job). The load model capped a step at c - 1 decoders in every pool, as if a slot prefilled;
    # in a decode pool (its "prefill" is one token) that read 0.4518 req/s at saturation, past the ceiling.
    from recommender.load import PoolSpec
    from recommender.load.capacity import saturation_rate_per_s
    from recommender.sizing import Candidate, pd_limits

    from bound_checks import context_of

    ctx = context_of(tmp_path, DECODE_HEAVY_JOB)
    c = Candidate("a100-80gb", 1, "int4", "fp8", 16, 2048, True, "a100-80gb", 2)
    p_lim, d_lim = pd_limits(c, ctx.workload.max_model_len, ctx.workload.prefix_caching)
    p_cost = ctx.cost_model("a100-80gb", 1, "int4", "fp8", p_lim)[0]
    d_cost = ctx.cost_model("a100-80gb", 2, "int4", "fp8", d_lim)[0]
    assert p_cost is not None and d_cost is not None
    ceiling = 16 / d_cost.decode_step_s(16, 1133) / (1500 - 1)  # mean context 300 + E[O^2] / (2 E[O]) = 1133
    assert ceiling == pytest.approx(0.444, abs=5e-4)
    sat = saturation_rate_per_s(lambda x: ctx.analyze_pd(c, PoolSpec(cost=p_cost, limits=p_lim, replicas=60),
                                                         PoolSpec(cost=d_cost, limits=d_lim, replicas=63), x),
                                rel_tol=1e-3, start_per_s=27.0, step=1.1)
    assert sat / 63 <= ceiling * 1.001


def test_cost_bound_holds_where_the_load_model_runs_past_c_over_the_step_of_c(tmp_path) -> None:
    # An aggregated pool's step model holds at most c - 1 decoders (a slot prefills), so near saturation its
    # capacity can pass c / decode_step_s(c): Qwen3-30B-A3B on L4 TP2 EP fp8 at 16 sequences (the decode-heavy job)
    # serves 0.2035 req/s per replica against 16 / 0.05268 / E[O - 1] = 0.2026. The offline bound prices the job at
    # that throughput bound, so with the step at c it read 1.2175 over the evaluation's 1.2122 $/M tokens; at a
    # step of c - 1 (0.2089) it holds.
    from recommender.search.evaluate import evaluate
    from recommender.search.shapes import usd_per_hour_to_objective
    from recommender.sizing import Candidate

    from bound_checks import context_of

    ctx = context_of(tmp_path, DECODE_HEAVY_JOB.replace("llama-3.1-70b", "qwen3-30b-a3b"))
    ch = space_choices(ctx)
    bounds, k = Bounds(ctx, ch.max_num_seqs, ch.budgets), usd_per_hour_to_objective(ctx)
    c = Candidate("l4", 2, "fp8", "bf16", 16, 4096, False, ep=True)
    b, ev = bounds.of(c), evaluate(ctx, c)
    assert b is not None and ev.feasible
    per_replica_req_s = ctx.workload.effective_rate_per_s / ev.utilisation / ev.pools[0].replicas
    cost = bounds.generous_cost("l4", 2, "fp8", "bf16", 1, True, 0)
    assert cost is not None
    assert per_replica_req_s > 16 / cost.decode_step_s(16, 1133) / (1500 - 1)  # past the step-of-c ceiling
    assert b.usd_per_hour * k <= ev.objectives[0]


def test_rank_one_and_front_equal_exhaustive_on_a_tiny_full_space(tiny_truth):
    ctx = _ctx(CHAT, TINY)
    res = shape_search(ctx, space_choices(ctx), max_evaluations=10_000)
    assert res.complete and res.rank1_proven
    assert _cheapest(res.evaluations) == pytest.approx(_cheapest(tiny_truth), rel=1e-9)
    q = search_quality(res.evaluations, tiny_truth)
    assert front(tiny_truth) and q.hypervolume_ratio >= 0.99999
    assert len(res.evaluations) < len(tiny_truth), "the bounds must prune something"


@pytest.mark.slow
def test_rank_one_and_front_equal_exhaustive_on_a_small_full_space(chat_truth):
    ctx = _ctx()
    res = shape_search(ctx, space_choices(ctx), max_evaluations=10_000)
    assert res.complete and res.rank1_proven
    assert _cheapest(res.evaluations) == pytest.approx(_cheapest(chat_truth), rel=1e-9)
    assert search_quality(res.evaluations, chat_truth).hypervolume_ratio >= 0.99999


@pytest.mark.slow
@pytest.mark.parametrize("rate", [1.0, 4.0, 25.0])
def test_default_plan_rank_one_within_1pct_of_exhaustive_over_seeds(rate):
    # the shape search does not sample, so every seed must give the exhaustive optimum
    w = dataclasses.replace(CHAT, arrival_rate_per_s=rate)
    best = _cheapest(_truth(w))
    for seed in (0, 1, 2):
        plan = recommend(w, settings=SearchSettings(seed=seed), policy=dataclasses.replace(SMALL, verify=0))
        assert plan.rows[0].usd_per_million_tokens <= best * 1.01


def _plan_usd_per_hour(w: Workload, policy=SMALL) -> float:
    return recommend(w, settings=QUIET, policy=policy).rows[0].usd_per_hour


@pytest.mark.slow
@pytest.mark.parametrize("limit,looser", [(0.03, 0.045), (0.05, 0.1)])
def test_a_looser_slo_never_costs_more(limit, looser):
    tight = dataclasses.replace(CHAT, slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", limit, "p90")))
    loose = dataclasses.replace(CHAT, slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", looser, "p90")))
    assert _plan_usd_per_hour(loose) <= _plan_usd_per_hour(tight) * (1 + 1e-9)


@pytest.mark.slow
def test_dropping_an_slo_never_costs_more():
    # the case: an e2e-only SLO must not cost more than the stricter TTFT + TPOT one
    strict = dataclasses.replace(CHAT, slos=(Slo("ttft", 1.0, "p90"), Slo("tpot", 0.04, "p90")))
    e2e_only = dataclasses.replace(CHAT, slos=(Slo("e2e", 1.0 + 1024 * 0.04, "p90"),))
    assert _plan_usd_per_hour(e2e_only) <= _plan_usd_per_hour(strict) * (1 + 1e-9)


@pytest.mark.slow
def test_more_gpu_types_or_more_gpus_never_cost_more():
    one = dataclasses.replace(CHAT, gpus=("l40s",), max_gpus=4)
    assert _plan_usd_per_hour(dataclasses.replace(one, gpus=("l40s", "h100-sxm"))) <= _plan_usd_per_hour(one) * (1 + 1e-9)
    assert _plan_usd_per_hour(dataclasses.replace(one, max_gpus=16)) <= _plan_usd_per_hour(one) * (1 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("rate", [2.0, 8.0])
def test_more_traffic_never_costs_less(rate):
    low = dataclasses.replace(CHAT, arrival_rate_per_s=rate)
    high = dataclasses.replace(CHAT, arrival_rate_per_s=rate * 2.5)
    assert _plan_usd_per_hour(high) >= _plan_usd_per_hour(low) * (1 - 1e-9)


def test_a_trial_budget_is_reported_and_cli_trials_win_over_the_policy_timeout():
    plan = recommend(CHAT, settings=SearchSettings(seed=0, trials=5, verify=0), policy=SMALL)
    m = plan.search
    assert m.trials_run == 5 and m.trials_asked == 5 and m.stopped_by == "trials"
    assert m.timeout_s is None  # --trials alone: the policy's timeout does not cut it
    from recommender.render.plan import search_footer

    assert "5 of 5 trials asked" in search_footer(m)
    cut = dataclasses.replace(m, stopped_by="timeout", timeout_s=0.5, trials_run=3)
    assert "3 of 5 trials asked: cut by the 0.5 s timeout" in search_footer(cut)
    both = recommend(CHAT, settings=SearchSettings(seed=0, trials=5, timeout_s=30.0, verify=0), policy=SMALL)
    assert both.search.timeout_s == 30.0


def test_every_evaluation_is_a_completed_trial_and_a_rerun_ranks_all_of_them(tmp_path):
    storage = str(tmp_path / "study.log")
    small = dataclasses.replace(SMALL, trials=6)
    first = recommend(CHAT, settings=SearchSettings(seed=0, storage=storage, verify=0), policy=small)
    study = optuna.load_study(study_name=first.search.study_name, storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(storage)))
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == first.search.trials_run == 6
    assert {t.user_attrs["key"] for t in trials} == {e.candidate.key for e in first.evaluations}
    assert all(set(t.constraints) == set(first.search.constraints) or len(t.constraints) == 4 for t in trials)
    # the rerun evaluates the same first 6 again (cached: no new trials from them) plus nothing new,
    # and ranks every completed trial of the study
    second = recommend(CHAT, settings=SearchSettings(seed=1, storage=storage, verify=0, trials=12), policy=small)
    keys = {e.candidate.key for e in second.evaluations}
    assert {t.user_attrs["key"] for t in trials} <= keys


def test_sqlite_with_workers_is_refused_with_the_alternative(tmp_path):
    with pytest.raises(ConfigError, match="journal file"):
        recommend(CHAT, settings=SearchSettings(storage=str(tmp_path / "s.db"), workers=2, verify=0), policy=SMALL)


@pytest.mark.slow
def test_two_workers_on_a_journal_file_find_the_exhaustive_rank_one(tmp_path, tiny_truth):
    plan = recommend(CHAT, settings=SearchSettings(seed=0, storage=str(tmp_path / "s.log"), workers=2, verify=0),
                     policy=TINY)
    assert plan.search.workers == 2 and plan.search.trials > plan.search.trials_run
    assert plan.rows[0].usd_per_million_tokens == pytest.approx(_cheapest(tiny_truth), rel=1e-9)
    # the main process re-evaluates only the other worker's trials that can rank (front and cheapest), and
    # the ranked Pareto rows are the one-process search's (dominated rows beyond them are whatever each search
    # happened to evaluate: a bound prunes what can neither rank first nor join the front)
    assert plan.search.evaluations is not None and plan.search.evaluations < plan.search.trials
    one = recommend(CHAT, settings=SearchSettings(seed=0, verify=0), policy=TINY)
    assert [r.id for r in plan.rows if r.pareto] == [r.id for r in one.rows if r.pareto]
    assert plan.rows[0].id == one.rows[0].id


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_on_postgresql_share_one_study(postgres_url, tiny_truth):
    plan = recommend(CHAT, settings=SearchSettings(seed=0, storage=postgres_url, workers=2, verify=0), policy=TINY)
    study = optuna.load_study(study_name=plan.search.study_name, storage=postgres_url)
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    # both workers' trials are in the database, and rank 1 is the exhaustive optimum
    assert len(done) == plan.search.trials and len(done) > plan.search.trials_run
    assert plan.rows[0].usd_per_million_tokens == pytest.approx(_cheapest(tiny_truth), rel=1e-9)


def test_the_space_enumeration_counts_every_pair():
    ch = space_choices(_ctx())
    agg = len(ch.gpus) * len(ch.tps) * len(ch.weight_dtypes) * len(ch.kv_dtypes) * len(ch.max_num_seqs) * len(ch.budgets)
    # P/D pairs keep one GPU type (policy pd_heterogeneous_gpus: false), any decode TP
    assert not ch.pd_heterogeneous
    assert sum(1 for _ in enumerate_space(ch)) == agg * (1 + len(ch.tps))


def test_sizing_never_imports_search():
    import ast
    from pathlib import Path

    import recommender.sizing as sizing

    tree = ast.parse(Path(sizing.__file__).read_text())
    mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in mods if m and m.startswith("recommender.search")]


@pytest.mark.slow
def test_a_tight_tpot_problem_proves_rank_1_within_the_default_budget() -> None:
    # issue #31: 70B at 5 req/s, 1.5k/150 tokens, TTFT 250 ms / TPOT 10 ms p90. Its cost bounds ignored prefill
    # interference and the prefill lane's queue: 2,000 of 2,000 trials, 49 s, rank 1 not proven. Rank 1 is the
    # one an 8,000-trial run with the old bounds proved (277 s, 2026-12-01): b200 TP4 x1 at $0.9145/M. Proven after
    # 352 trials before issue 22's dense physics; with it (GEMM curve, per-layer time, attention ratio) after 1,326:
    # more shapes now cost within the bounds' slack of rank 1 (median bound / cost 0.77 on sampled feasible ones).
    # The second pass of #31 (curve per chunk, interference at the decode step, P/D rental per KV path): 219
    # (benchmarks/results/tight-tpot.md); 600 leaves room for the load model's changes
    from pathlib import Path

    from recommender.search.planner import SearchSettings, recommend
    from recommender.workload import load_workload

    w = load_workload(Path(__file__).resolve().parents[1] / "benchmarks" / "workloads" / "tight-tpot-70b.yaml")
    plan = recommend(w, settings=SearchSettings(seed=0, verify=0))
    assert plan.search.rank1_proven and plan.search.trials_run is not None and plan.search.trials_run < 600
    assert plan.top.id.startswith("b200-tp4-fp8") and plan.top.usd_per_million_tokens == pytest.approx(0.9145, rel=1e-3)


def test_the_unrentable_shapes_explained_include_one_of_each_group_size_narrowest_weights_first() -> None:
    """When no offer can rent any shape, the few evaluated to explain why hold one shape per group size (its narrowest
    weights, the likeliest to fit), so the error can name the smallest group that holds the model."""
    from recommender.search.shapes import _unrentable_to_explain
    from recommender.sizing import Candidate

    cs = [Candidate("g", tp, wd, "fp8", 64, 0) for tp in (8, 4, 2) for wd in ("bf16", "fp8", "int4")]
    picked = _unrentable_to_explain(cs, n=5)
    assert [(c.tp, c.weight_dtype) for c in picked[:3]] == [(8, "int4"), (4, "int4"), (2, "int4")]
    assert len(picked) == 5 and len(set(picked)) == 5
