"""The search explores MTP speculative decoding (issue 21 item 2-4): k in {0, 1, 2, 3} draft tokens for models
whose config has MTP modules (DeepSeek-V3: ``num_nextn_predict_layers: 1``), alongside TP, dtypes and the MoE
layouts; the bounds stay lower bounds, rank 1 stays the optimum, plans and ``vllm serve`` carry
``--speculative-config``; dense models get no MTP candidates."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.deploy.spec import build_spec
from recommender.deploy.vllm_cmd import engine_options, serve_argv
from recommender.errors import ConfigError
from recommender.plan import dump_plan, load_plan
from recommender.profiles import engine_profile
from recommender.search.bounds import Bounds
from recommender.search.exhaustive import enumerate_space
from recommender.search.planner import SearchSettings, build_context, recommend, space_choices
from recommender.search.policy import load_search_policy
from recommender.search.space import mtp_choices
from recommender.sizing import Candidate
from recommender.workload import Slo, load_workload

DATA = Path(__file__).parent / "data"
DSV3 = DATA / "workloads" / "deepseek-v3-chat.yaml"
CAT = default_catalog()
#: a reduced DeepSeek-V3 space: TP 1-8, every MoE layout, k in {0..3}, two limits each, fp8 KV, aggregated
SMALL = dict(max_num_seqs=(64, 256), max_num_batched_tokens=(2048, 8192), kv_dtypes=("fp8",),
             tensor_parallel=(1, 2, 4, 8), disaggregation=False)


def _ctx(w, **policy):
    return build_context(w, replace(load_search_policy(), **policy), engine_profile("vllm"), CAT)


def test_only_models_with_mtp_heads_get_mtp_candidates():
    # DeepSeek-V3's config: num_nextn_predict_layers 1 (catalogs/models/deepseek-v3.yaml); Llama and Qwen: none
    assert CAT.model("deepseek-v3").mtp_layers == 1
    assert mtp_choices(CAT.model("deepseek-v3")) == (1, 2, 3)
    for dense in ("llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b"):
        assert mtp_choices(CAT.model(dense)) == ()
    with pytest.raises(ConfigError, match="1 to 8"):
        mtp_choices(CAT.model("deepseek-v3"), (0, 2))
    assert Candidate("h200", 8, "fp8", "fp8", 256, 8192, mtp=2).key == "h200-tp8-mtp2-fp8-kvfp8-s256-b8192"
    assert Candidate("h200", 1, "fp8", "fp8", 32, 4096, dp=8, mtp=1).key == "h200-tp1-dp8-mtp1-fp8-kvfp8-s32-b4096"


def test_dense_search_space_has_no_mtp():
    w = load_workload(Path(__file__).resolve().parents[1] / "examples" / "chat.yaml")
    ch = space_choices(_ctx(w))
    assert ch.mtp == ()
    assert all(c.mtp == 0 for c in enumerate_space(ch))


def test_mtp_candidate_is_sized_with_the_catalogs_acceptance():
    # k = 2 at the fitted a = 0.591 (catalogs/models/deepseek-v3.yaml speculative.acceptance_rate, the pair fit of
    # benchmarks/fit_inferencex.py stage D): tau = 1 + 0.591 + 0.591^2 = 1.940281 tokens per verify step
    w = load_workload(DSV3)
    ctx = _ctx(w, **SMALL)
    c = Candidate("h200", 8, "fp8", "fp8", 256, 8192, mtp=2)
    ev = ctx.evaluator(c)
    assert ev.feasible and ev.pools[0].mtp == 2
    cost = ctx.pool_cost(ev.pools[0])[0]
    assert cost is not None and cost.draft is not None
    assert cost.tokens_per_step == pytest.approx(1.940281, rel=1e-6)
    assert cost.query_tokens == 3
    plain = ctx.evaluator(Candidate("h200", 8, "fp8", "fp8", 256, 8192))
    # the MTP module (~14e9 parameters with the shared head, fp8 over 8 GPUs) and its KV layer take cache space
    assert cost.kv_capacity_tokens < ctx.pool_cost(plain.pools[0])[0].kv_capacity_tokens  # type: ignore[union-attr]
    # a disaggregated or dense MTP candidate is refused in one line
    bad = ctx.evaluator(Candidate("h200", 8, "fp8", "fp8", 256, 8192, True, "h200", 8, mtp=1))
    assert not bad.feasible and "aggregated" in bad.reason


@pytest.mark.parametrize("slo", [None, Slo("tpot", 0.025, "p90")], ids=["chat-slos", "tpot-25ms"])
def test_bounds_stay_below_every_mtp_evaluation(slo):
    """The shape search proves rank 1 with its bounds: cost, replicas and every latency bound must hold for MTP
    candidates (per-token decode floor W / (hbm tau), verify steps in the busy time), per combo and per shape."""
    w = load_workload(DSV3)
    if slo is not None:
        w = dataclasses.replace(w, slos=tuple(s for s in w.slos if s.metric != "tpot") + (slo,))
    ctx = _ctx(w, **SMALL)
    ch = space_choices(ctx)
    assert ch.mtp == (1, 2, 3)
    bounds = Bounds(ctx, ch.max_num_seqs, ch.budgets)
    k = 1e6 / (w.effective_rate_per_s * (w.prompt_tokens.mean + w.output_tokens.mean) * 3600)
    checked = 0
    for c in enumerate_space(ch, disaggregated=False):
        if not c.mtp:
            continue
        ev = ctx.evaluator(c)
        if not ev.feasible:
            continue
        for lb in (bounds.of(c), bounds.of(replace(c, max_num_seqs=0, max_num_batched_tokens=0))):
            assert lb is not None and lb.usd_per_hour * k <= ev.objectives[0] * (1 + 1e-9), c.key
            assert lb.replicas[0] <= ev.pools[0].replicas, c.key
            for lat_lb, lat in zip(lb.latencies_s, ev.objectives[1:]):
                assert lat_lb <= lat * (1 + 1e-9), c.key
        checked += 1
    assert checked >= 10


def test_offline_mtp_cost_bound_holds():
    # an offline DeepSeek-V3 job: the cost bound rests on the busy-time bound, which counts (O - 1) / tau verify
    # steps of k + 1 tokens each
    w = dataclasses.replace(load_workload(DSV3), offline_requests=200_000, deadline_s=10 * 3600.0, slos=())
    assert w.is_offline
    ctx = _ctx(w, **SMALL)
    ch = space_choices(ctx)
    bounds = Bounds(ctx, ch.max_num_seqs, ch.budgets)
    checked = 0
    for c in enumerate_space(ch, disaggregated=False):
        if c.mtp and c.dp == 1 and not c.ep:
            ev = ctx.evaluator(c)
            if ev.feasible:
                b = bounds.of(c)
                assert b is not None and b.usd_per_hour <= ev.usd_per_hour * (1 + 1e-9), c.key
                checked += 1
    assert checked >= 5


@pytest.mark.slow  # over 20 s on 2 cores (2026-12-03 --durations)
def test_rank1_with_mtp_is_the_exhaustive_optimum():
    """On the reduced space (TP x layouts x k in {0..3} x two limits) the shape search's rank 1 costs what the
    cheapest feasible candidate of the whole space costs."""
    w = dataclasses.replace(load_workload(DSV3), slos=(Slo("ttft", 2.0, "p90"), Slo("tpot", 0.025, "p90")))
    ctx = _ctx(w, **SMALL)
    truth = [ctx.evaluator(c) for c in enumerate_space(space_choices(ctx), disaggregated=False)]
    feasible = [e for e in truth if e.feasible]
    best = min(e.usd_per_million_tokens for e in feasible)
    plan = recommend(w, settings=SearchSettings(verify=0), policy=replace(load_search_policy(), **SMALL))
    assert plan.search.rank1_proven
    assert plan.rows[0].usd_per_million_tokens == pytest.approx(best, rel=1e-9)
    # at TPOT 25 ms MTP is the cheaper lever: the best plan without it costs more
    best_plain = min(e.usd_per_million_tokens for e in feasible if not e.candidate.mtp)
    assert best < best_plain


@pytest.fixture(scope="module")
def dsv3_mtp_plan():
    # the proof takes 1,393 evaluations (77 s on a loaded 2-core machine, 2026-12-03), past the policy's 60 s
    # timeout there: a budget in evaluations would not be a wall-clock race, so the test gives it time
    return recommend(load_workload(DSV3), settings=SearchSettings(verify=0, timeout_s=600))


@pytest.mark.slow  # over 20 s on 2 cores (2026-12-03 --durations)
def test_the_dsv3_plan_considers_mtp_and_its_serve_line_parses(dsv3_mtp_plan, tmp_path):
    plan = dsv3_mtp_plan
    ks = {e.candidate.mtp for e in plan.evaluations}
    assert ks == {0, 1, 2, 3}
    assert plan.search.rank1_proven
    mtp_rows = [r for r in plan.rows if r.pools[0].num_speculative_tokens > 0]
    assert mtp_rows
    row = mtp_rows[0]
    spec = build_spec(replace(plan, rows=(row,)), 1)
    argv = serve_argv(engine_options(spec, spec.pools[0]))  # raises on a flag vLLM 0.33's parser refuses
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {"method": "mtp", "num_speculative_tokens": row.pools[0].num_speculative_tokens}
    # vLLM 0.33's SpeculativeConfig (recommender/data/vllm/serve-flags.json, from ../shared/reference/vllm): both keys
    # are fields, "mtp" is one of the Literal values of `method`, num_speculative_tokens an int
    table = json.loads((Path(__file__).resolve().parents[1] / "recommender" / "data" / "vllm" / "serve-flags.json")
                       .read_text())["nested_json_configs"]["SpeculativeConfig"]
    assert "'mtp'" in table["method"]["type"] and "int" in table["num_speculative_tokens"]["type"]
    # the plan file carries it and reads back the same
    f = tmp_path / "plan.json"
    f.write_text(dump_plan(plan))
    back = load_plan(f)
    assert [p.num_speculative_tokens for r in back.rows for p in r.pools] == \
        [p.num_speculative_tokens for r in plan.rows for p in r.pools]
    assert math.isfinite(row.usd_per_million_tokens or math.inf)
