"""The search explores MoE engine layouts (issue 21 item 2-3): data-parallel attention (``--data-parallel-size``)
and expert parallelism (``--enable-expert-parallel``); sizing counts ``tp x dp`` GPUs per engine; plans and deploy
files carry the flags; dense models are untouched."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.deploy.spec import build_spec
from recommender.deploy.vllm_cmd import engine_options, serve_argv
from recommender.deploy.k8s import engine_container
from recommender.estimator import build_deployment
from recommender.load import PoolSpec, Traffic, analyze
from recommender.perf.step import StepCostModel
from recommender.plan import dump_plan, load_plan
from recommender.search.bounds import Bounds
from recommender.search.exhaustive import enumerate_space
from recommender.search.planner import SearchSettings, build_context, recommend, space_choices
from recommender.search.policy import load_search_policy
from recommender.search.space import layout_valid, moe_layouts
from recommender.sizing import Candidate, limits_of
from recommender.profiles import engine_profile
from recommender.workload import load_workload

DATA = Path(__file__).parent / "data"
DSV3 = DATA / "workloads" / "deepseek-v3-chat.yaml"


@pytest.fixture(scope="module")
def dsv3_plan():
    # verification off: the simulator's check of the same search is tests/data/plans/moe-dsv3-h200-dp8.json's;
    # MTP off (mtp_draft_tokens: []): these tests are about DP attention and EP (MTP: tests/test_mtp_search.py)
    return recommend(load_workload(DSV3), settings=SearchSettings(verify=0),
                     policy=replace(load_search_policy(), mtp_draft_tokens=()))


def test_dense_candidates_keep_their_keys_and_get_no_layouts():
    # the key format of docs/ARCHITECTURE.md's plan example: h200-tp2-fp8-kvfp8-s256-b8192
    assert Candidate("h200", 2, "fp8", "fp8", 256, 8192).key == "h200-tp2-fp8-kvfp8-s256-b8192"
    assert Candidate("h200", 1, "fp8", "fp8", 256, 8192, dp=8, ep=True).key == "h200-tp1-dp8-ep-fp8-kvfp8-s256-b8192"
    cat = default_catalog()
    assert moe_layouts(cat.model("llama-3.1-8b"), (1, 2, 4, 8)) == ()
    assert moe_layouts(cat.model("deepseek-v3"), (1, 2, 4, 8)) == (
        (1, True), (2, False), (2, True), (4, False), (4, True), (8, False), (8, True))


def test_layout_validity_follows_the_perf_models_checks():
    cat = default_catalog()
    ds, h200 = cat.model("deepseek-v3"), cat.gpu("h200")
    assert layout_valid(ds, h200, 1, 8, True) is None          # SGLang's TP8 EP8 DPA = --tp 1 -dp 8 -ep
    assert layout_valid(ds, h200, 8, 1, True) is None          # TP8 EP8 without DP attention
    assert "one GPU" in (layout_valid(ds, h200, 1, 1, True) or "")  # EP over one GPU is plain TP1
    assert "scale-up domain" in (layout_valid(ds, h200, 8, 2, False) or "")  # 16 GPUs > one 8-GPU NVLink domain
    assert "divide" in (layout_valid(ds, h200, 1, 3, False) or "")           # 3 does not divide 8
    assert "dense" in (layout_valid(cat.model("llama-3.1-8b"), h200, 1, 2, False) or "")
    # GB200: estimate explains a DP 16 EP engine inside the NVL72 rack (perf.moe.check_layout), the search does not
    # plan it (16 does not divide 72: the renderers run one engine per pod, a 4-GPU tray); DP 8 divides 72 and is planned
    gb200 = cat.gpu("gb200")
    assert "does not divide gb200's 72-GPU domain" in (layout_valid(ds, gb200, 1, 16, True) or "")
    assert layout_valid(ds, gb200, 1, 8, True) is None


@pytest.mark.slow  # over 20 s on 2 cores (2026-12-03 --durations)
def test_the_dsv3_search_evaluates_dp_and_ep_candidates_and_rank1_deploys(dsv3_plan):
    plan = dsv3_plan
    layouts = {(e.candidate.dp, e.candidate.ep) for e in plan.evaluations}
    assert (8, True) in layouts and (8, False) in layouts and (1, False) in layouts
    assert any(e.feasible and e.candidate.dp > 1 for e in plan.evaluations)
    assert plan.search.rank1_proven
    best_tp = min(e.usd_per_hour for e in plan.evaluations if e.feasible and e.candidate.dp == 1 and not e.candidate.ep)
    row = plan.rows[0]
    pool = row.pools[0]
    if pool.data_parallel_size > 1 or pool.enable_expert_parallel:  # a MoE layout won: it must beat every TP plan
        assert row.usd_per_hour is not None and row.usd_per_hour <= best_tp
    assert pool.data_parallel_size > 1, "on H200, DP attention's unreplicated MLA KV serves this load on fewer GPUs"
    # GPUs: tp x dp per replica; price: those GPUs at the rental's per-GPU rate
    assert row.gpus_total == pool.tp * pool.data_parallel_size * pool.replicas
    assert pool.rental is not None
    assert row.usd_per_hour == pytest.approx(row.gpus_total * pool.rental.usd_per_instance_hour / pool.rental.gpus_per_instance)
    spec = build_spec(plan, 1)
    argv = serve_argv(engine_options(spec, spec.pools[0]))  # raises on a flag vLLM 0.33's parser refuses
    i = argv.index("--data-parallel-size")
    assert argv[i + 1] == str(pool.data_parallel_size)
    assert argv[argv.index("--tensor-parallel-size") + 1] == str(pool.tp)
    assert ("--enable-expert-parallel" in argv) == pool.enable_expert_parallel
    res = engine_container(spec, spec.pools[0])["resources"]
    assert res["limits"]["nvidia.com/gpu"] == str(pool.tp * pool.data_parallel_size)


@pytest.mark.slow  # the dsv3_plan fixture's search: 28 s on 2 cores (2026-12-03 --durations)
def test_a_dp_engine_is_dp_load_model_ranks(dsv3_plan):
    """Sizing's figures for a DP candidate are the load model's over replicas x dp ranks, each rank's step
    model built directly (one attention rank of a tp x dp engine, perf.moe)."""
    w = load_workload(DSV3)
    cat = default_catalog()
    ev = next(e for e in dsv3_plan.evaluations if e.feasible and e.candidate.dp == 8)
    c, p = ev.candidate, ev.pools[0]
    limits = limits_of(c, w.max_model_len, w.shared_prefix_fraction > 0)
    dep = build_deployment(model=cat.model(w.model), gpu=cat.gpu(c.gpu), tp=c.tp, weight_dtype=c.weight_dtype,
                           kv_dtype=c.kv_dtype, profile=engine_profile("vllm"), limits=limits,
                           gpu_memory_utilization=0.92, max_model_len=w.max_model_len, dp=c.dp, ep=c.ep)
    res = analyze(PoolSpec(cost=StepCostModel.build(dep), limits=limits, replicas=p.replicas * c.dp),
                  Traffic(rate_per_s=w.effective_rate_per_s, prompt=w.prompt_tokens, output=w.output_tokens,
                          shared_prefix_fraction=w.shared_prefix_fraction))
    assert ev.latency("tpot", "p90") == pytest.approx(res.tpot_s.at("p90"), rel=1e-9)
    assert p.gpus == c.tp * c.dp * p.replicas


def test_cost_bounds_stay_below_every_dp_and_ep_evaluation():
    """The shape search proves rank 1 with its cost bounds: they must hold for the MoE layouts too."""
    w = load_workload(DSV3)
    policy = replace(load_search_policy(), max_num_seqs=(64, 256), max_num_batched_tokens=(2048, 8192),
                     kv_dtypes=("fp8",), tensor_parallel=(1, 2, 4, 8), mtp_draft_tokens=())
    ctx = build_context(w, policy, engine_profile("vllm"), default_catalog())
    ch = space_choices(ctx)
    bounds = Bounds(ctx, ch.max_num_seqs, ch.budgets)
    checked = 0
    for c in enumerate_space(ch, disaggregated=False):
        if c.dp == 1 and not c.ep:
            continue
        ev = ctx.evaluator(c)
        if not ev.feasible:
            continue
        b = bounds.of(c)
        assert b is not None and b.usd_per_hour <= ev.usd_per_hour * (1 + 1e-9), c.key
        assert b.replicas[0] <= ev.pools[0].replicas, c.key
        checked += 1
    assert checked >= 3


def test_rank1_with_moe_layouts_is_the_exhaustive_optimum():
    """On a reduced DeepSeek-V3 space (TP 1-8 x every layout, two limits each) the shape search's rank 1 costs
    what the cheapest feasible candidate of the whole space costs (exhaustive reference)."""
    w = load_workload(DSV3)
    policy = replace(load_search_policy(), max_num_seqs=(64, 256), max_num_batched_tokens=(2048, 8192),
                     kv_dtypes=("fp8",), tensor_parallel=(1, 2, 4, 8), disaggregation=False, mtp_draft_tokens=())
    ctx = build_context(w, policy, engine_profile("vllm"), default_catalog())
    truth = [ctx.evaluator(c) for c in enumerate_space(space_choices(ctx), disaggregated=False)]
    best = min(e.usd_per_million_tokens for e in truth if e.feasible)
    plan = recommend(w, settings=SearchSettings(verify=0), policy=policy)
    assert plan.search.rank1_proven
    assert plan.rows[0].usd_per_million_tokens == pytest.approx(best, rel=1e-9)
    winner = min((e for e in truth if e.feasible), key=lambda e: e.usd_per_million_tokens).candidate
    assert winner.dp > 1  # the reference's own optimum is a DP-attention engine on H200


@pytest.mark.slow  # the dsv3_plan fixture's search: 28 s on 2 cores (2026-12-03 --durations)
def test_plan_files_write_the_layout_only_when_set(dsv3_plan, tmp_path):
    text = dump_plan(dsv3_plan)
    back = load_plan(_write(tmp_path, text))
    dp_rows = [r for r in back.rows if r.pools[0].data_parallel_size > 1]
    assert dp_rows and '"data_parallel_size": 8' in text
    assert back.rows[0].pools[0] == dsv3_plan.rows[0].pools[0]
    tp_only = [r for r in dsv3_plan.rows if r.pools[0].data_parallel_size == 1 and not r.pools[0].enable_expert_parallel]
    if tp_only:
        doc = dump_plan(replace(dsv3_plan, rows=(tp_only[0],)))
        assert "data_parallel_size" not in doc and "enable_expert_parallel" not in doc
    assert math.isfinite(back.rows[0].usd_per_hour or math.inf)


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "plan.json"
    f.write_text(text)
    return f
