"""Fuzz suite (hypothesis): workloads, SLO strings, config.json, plan JSON, /metrics text, request logs.

Invalid input must give one ``RecommenderError`` (CLI: one line on stderr, non-zero exit, no traceback, no file
written); valid input must give finite numbers in range and, for the main job, a plan that meets its own
constraints. Locally each property runs 25 examples; under CI (or --runslow) the ``slow`` copies run the big counts
(1,520 + 30 main-job runs), about 1,700 generated cases in all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_deploy import HOSTILE, check_rendered
from typer.testing import CliRunner

from recommender.cli import app
from recommender.deploy import render_deploy
from recommender.errors import RecommenderError
from recommender.hf_config import arch_from_config
from recommender.replan.logs import parse_request_log
from recommender.replan.metrics import parse_exposition
from recommender.workload import MAX_TOKENS, Slo, workload_from_dict

DATA = Path(__file__).parent / "data"
QWEN = json.loads((DATA / "hf_configs" / "Qwen3-8B" / "config.json").read_text())
AGG = json.loads((DATA / "plans" / "agg-llama70b-h100.json").read_text())
METRICS = (DATA / "traffic" / "vllm-metrics-example.txt").read_text()
TINY = str(DATA / "policies" / "tiny-search.yaml")
FAST = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------ strategies

NASTY_FLOATS = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 0.0, -0.0, -1.0, 1e-320])
NUMBERS = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True), NASTY_FLOATS)
ANY_SCALAR = st.one_of(NUMBERS, st.text(max_size=12), st.none(), st.booleans(), st.sampled_from(HOSTILE))
JSONISH = st.recursive(ANY_SCALAR, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
                       max_leaves=8)


@st.composite
def dists(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["constant", "normal", "lognormal", "empirical", "histogram", "bogus"]))
    num = st.one_of(st.integers(1, 20_000), NUMBERS)
    d: dict[str, Any] = {"dist": kind}
    if kind == "constant":
        d["value"] = draw(num)
    elif kind in ("normal", "lognormal"):
        d.update(mean=draw(num), std=draw(st.one_of(st.integers(0, 5000), NUMBERS)))
        if draw(st.booleans()):
            d["max"] = draw(num)
    elif kind == "empirical":
        d["samples"] = draw(st.lists(num, max_size=5))
    elif kind == "histogram":
        d["edges"] = draw(st.lists(num, max_size=4))
        d["counts"] = draw(st.lists(num, max_size=4))
    if draw(st.integers(0, 5)) == 0:
        d[draw(st.text(max_size=6))] = draw(ANY_SCALAR)
    return draw(st.one_of(st.just(d), st.just(d), ANY_SCALAR))


@st.composite
def workloads(draw: st.DrawFn) -> Any:
    doc: dict[str, Any] = {
        "model": draw(st.sampled_from(["llama-3.1-8b", "qwen3-8b", "nope-model", *HOSTILE[:3]])),
        "traffic": draw(st.one_of(
            st.fixed_dictionaries({"arrival_rate": st.one_of(st.floats(0.1, 50), NUMBERS)}),
            st.fixed_dictionaries({"offline": st.fixed_dictionaries({
                "requests": st.one_of(st.integers(1, 10**6), NUMBERS),
                "deadline": st.one_of(st.sampled_from(["1h", "30min", "-5s", "1e999s", "soon"]), NUMBERS)})}),
            ANY_SCALAR)),
        "prompt_tokens": draw(dists()),
        "output_tokens": draw(dists()),
    }
    if draw(st.booleans()):
        doc["prices"] = draw(st.dictionaries(st.sampled_from(["h100-sxm", "l40s", "h100-sxn", "$(X)"]),
                                             st.one_of(st.sampled_from(["$2.49/h", "$-1/h", "$1e999/h", "free"]), NUMBERS),
                                             max_size=2))
    if draw(st.booleans()):
        doc["slo"] = draw(st.lists(slo_strings(), max_size=2))
    if draw(st.booleans()):
        doc["shared_prefix_fraction"] = draw(NUMBERS)
    if draw(st.booleans()):
        doc["max_gpus"] = draw(st.one_of(st.integers(-2, 64), NUMBERS))
    if draw(st.integers(0, 6)) == 0:
        doc[draw(st.text(max_size=8))] = draw(JSONISH)
    return doc


@st.composite
def valid_workloads(draw: st.DrawFn) -> Any:
    """Workloads the planner must accept (sizes a 8B model serves on the tiny policy's GPUs)."""
    return {
        "model": "llama-3.1-8b", "gpus": ["h100-sxm", "l40s"],
        "traffic": {"arrival_rate": draw(st.floats(0.2, 30))},
        "prompt_tokens": draw(st.one_of(
            st.fixed_dictionaries({"dist": st.just("constant"), "value": st.integers(16, 4000)}),
            st.fixed_dictionaries({"dist": st.just("lognormal"), "mean": st.floats(50, 3000),
                                   "std": st.floats(0, 1000), "max": st.just(6000)}))),
        "output_tokens": {"dist": "constant", "value": draw(st.integers(8, 500))},
        "slo": [f"tpot={draw(st.integers(15, 200))}ms", f"ttft={draw(st.integers(300, 5000))}ms@p99"],
        "max_gpus": draw(st.integers(1, 64)),
        "prices": {"h100-sxm": draw(st.sampled_from(["$2.49/h", 3.1]))},
    }


def slo_strings() -> st.SearchStrategy[str]:
    metric = st.sampled_from(["tpot", "ttft", "e2e", "TPOT", "lat", ""])
    value = st.one_of(st.sampled_from(["30", "0", "-3", "1e999", "nan", "inf", "1e-400", "2.5", ".5", "1e308"]),
                      st.integers(-10**6, 10**6).map(str))
    unit = st.sampled_from(["ms", "s", "min", "h", "us", "µs", "", "sec", "ns", "%"])
    pct = st.sampled_from(["", "@p90", "@p99", "@mean", "@p42", "@", "@p50@p90"])
    structured = st.builds(lambda m, v, u, p: f"{m}={v}{u}{p}", metric, value, unit, pct)
    return st.one_of(structured, structured, st.text(max_size=20))


@st.composite
def configs(draw: st.DrawFn) -> Any:
    cfg = dict(QWEN)
    for key in draw(st.lists(st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads",
                                              "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                              "max_position_embeddings", "model_type", "torch_dtype",
                                              "sliding_window", "quantization_config", "_name_or_path"]),
                             max_size=3, unique=True)):
        cfg[key] = draw(st.one_of(NUMBERS, st.integers(-8, 100_000), ANY_SCALAR, JSONISH))
    return cfg


@st.composite
def plans(draw: st.DrawFn) -> Any:
    doc = json.loads(json.dumps(AGG))
    row, pool, wl = doc["plans"][0], doc["plans"][0]["pools"][0], doc["workload"]
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from([row, pool, wl, doc]))
        key = draw(st.one_of(st.sampled_from(sorted(target)), st.text(max_size=6)))
        target[key] = draw(st.one_of(NUMBERS, ANY_SCALAR, JSONISH, st.integers(-3, 10**6)))
    return doc


@st.composite
def metrics_texts(draw: st.DrawFn) -> str:
    lines = METRICS.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["value", "drop", "garbage", "label"]))
        if op == "value" and " " in lines[i] and not lines[i].startswith("#"):
            lines[i] = lines[i].rsplit(" ", 1)[0] + " " + draw(st.sampled_from(["NaN", "+Inf", "-1", "1e999", "x", "1e308"]))
        elif op == "drop":
            del lines[i]
        elif op == "garbage":
            lines[i] = draw(st.text(max_size=30))
        else:
            lines[i] = lines[i].replace('le="', 'le="' + draw(st.sampled_from(["x", "-", "NaN", "1e999"])), 1)
    return "\n".join(lines) + "\n"


@st.composite
def request_logs(draw: st.DrawFn) -> str:
    cell = st.one_of(st.integers(-5, 10**7).map(str), st.sampled_from(["nan", "inf", "-inf", "1e999", "", "x",
                                                                       "2023-11-16 18:15:46.6805900"]))
    rows = draw(st.lists(st.tuples(cell, cell, cell), max_size=6))
    if draw(st.booleans()):
        header = draw(st.sampled_from(["timestamp,prompt_tokens,output_tokens", "TIMESTAMP,ContextTokens,GeneratedTokens",
                                       "a,b,c", ""]))
        return header + "\n" + "\n".join(",".join(r) for r in rows) + "\n"
    recs = [json.dumps({"timestamp": _num(t), "prompt_tokens": _num(p), "output_tokens": _num(o)}) for t, p, o in rows]
    if draw(st.booleans()):
        recs.append(draw(st.text(max_size=20)))
    return "\n".join(recs) + "\n"


def _num(s: str) -> Any:
    try:
        return float(s) if math.isfinite(float(s)) else s
    except ValueError:
        return s


# ------------------------------------------------------------------------------------------ properties


def check_workload(doc: Any) -> None:
    try:
        w = workload_from_dict(doc, "fuzz.yaml")
    except RecommenderError as e:
        assert "\n" not in str(e).strip()
        return
    for d in (w.prompt_tokens, w.output_tokens):
        assert 1 <= d.min_tokens <= d.max_tokens <= MAX_TOKENS
        assert math.isfinite(d.mean) and d.min_tokens <= d.quantile(0.99) <= d.max_tokens
    rate = w.effective_rate_per_s
    assert math.isfinite(rate) and rate > 0
    assert all(math.isfinite(p) and p > 0 for p in w.usd_per_gpu_hour_overrides.values())
    assert all(math.isfinite(s.limit_s) and s.limit_s > 0 for s in w.slos)
    assert 0 <= w.shared_prefix_fraction < 1


def check_slo(text: str) -> None:
    try:
        s = Slo.parse(text)
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    assert math.isfinite(s.limit_s) and s.limit_s > 0 and s.metric in ("ttft", "tpot", "e2e")


def check_config(cfg: Any) -> None:
    try:
        arch = arch_from_config(cfg, model_id="fuzz")
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    assert arch.total_params > 0 and arch.num_heads % arch.num_kv_heads == 0
    assert arch.hf_repo == "" or "$" not in arch.hf_repo


def check_plan(doc: Any) -> None:
    try:
        files = render_deploy(doc, 1, "all")
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    check_rendered(files, "$(HF_TOKEN)")


def check_metrics(text: str) -> None:
    try:
        scrape = parse_exposition(text, "http://fuzz/metrics", 1000.0)
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    assert all(math.isfinite(v) and v >= 0 for v in scrape.counters.values())


def check_log(text: str) -> None:
    try:
        log = parse_request_log(text, "fuzz.csv")
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    assert all(math.isfinite(t) for t in log.timestamps_s) and (log.prompt_tokens >= 0).all()


CASES = [("workload", workloads(), check_workload, 400), ("slo", slo_strings(), check_slo, 300),
         ("config", configs(), check_config, 300), ("plan", plans(), check_plan, 200),
         ("metrics", metrics_texts(), check_metrics, 120), ("log", request_logs(), check_log, 200)]


def _property(strategy: st.SearchStrategy[Any], check: Any, n: int) -> Any:
    @settings(FAST, max_examples=n)
    @given(strategy)
    def prop(x: Any) -> None:
        check(x)

    return prop


@pytest.mark.parametrize("name, strategy, check, _n", CASES, ids=[c[0] for c in CASES])
def test_fuzz_quick(name: str, strategy: Any, check: Any, _n: int) -> None:
    _property(strategy, check, 25)()


@pytest.mark.slow
@pytest.mark.parametrize("name, strategy, check, n", CASES, ids=[c[0] for c in CASES])
def test_fuzz_many(name: str, strategy: Any, check: Any, n: int) -> None:
    _property(strategy, check, n)()


# ------------------------------------------------------------------------------------------ through the CLI


def cli_contract(res: Any, out: Path) -> None:
    """Invalid input: non-zero exit, one line on stderr starting 'error:', no traceback, nothing written."""
    assert res.exit_code != 0
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert not out.exists()


@pytest.mark.slow
@settings(FAST, max_examples=30)
@given(doc=workloads())
def test_main_job_contract(doc: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every fuzzed workload: a one-line refusal with nothing written, or a plan that meets its own constraints."""
    run_main_job(doc, tmp_path_factory.mktemp("fz"))


@pytest.mark.slow
@settings(FAST, max_examples=12)
@given(doc=valid_workloads())
def test_valid_workloads_give_plans_that_meet_their_own_constraints(doc: Any,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    assert run_main_job(doc, tmp_path_factory.mktemp("ok")) in (0, 4)  # a plan, or "no deployment meets the SLOs"


def run_main_job(doc: Any, tmp: Path) -> int:
    """The main job with --emit on ``doc``; checks the contract for its outcome and returns the exit code."""
    wl, out = tmp / "w.yaml", tmp / "out"
    try:
        wl.write_text(yaml.safe_dump(doc, allow_unicode=True))
    except yaml.YAMLError:
        return -1
    res = CliRunner().invoke(app, ["--workload", str(wl), "--policy", TINY, "--trials", "16", "--verify", "0",
                                   "--format", "json", "--emit", str(out)])
    if res.exit_code != 0:
        cli_contract(res, out)
        assert res.exit_code in (2, 3, 4)  # user error, does not fit, infeasible: never an internal error (1)
        return int(res.exit_code)
    plan = json.loads(res.stdout)
    w = workload_from_dict(doc, str(wl))
    row = plan["plans"][0]
    for slo in w.slos:  # rank 1 meets every SLO at its percentile
        assert row[f"{slo.metric}_s"] <= slo.limit_s * (1 + 1e-9) or row["percentile"] != slo.percentile
    assert row["usd_per_hour"] > 0 and row["gpus_total"] <= (w.max_gpus or 10**9)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) and (out / "plan.json").exists()
    return 0


@pytest.mark.parametrize("text", ["", "{", "[]", '{"plans": []}', '{"workload": 1, "plans": [1]}', "\x00\xff",
                                  json.dumps({**AGG, "plans": [{**AGG["plans"][0], "tp": 3, "rank": 1}]}),
                                  json.dumps({**AGG, "plans": [{**AGG["plans"][0], "tp": 3, "rank": 1, "pools": [
                                      {**AGG["plans"][0]["pools"][0], "tp": 3}]}]}),
                                  json.dumps({**AGG, "plans": [{**AGG["plans"][0], "replicas": 1e30, "rank": 1, "pools": [
                                      {**AGG["plans"][0]["pools"][0], "replicas": 1e30}]}]}),
                                  json.dumps({**AGG, "version": 99})])
def test_deploy_contract_on_bad_plans(text: str, tmp_path: Path) -> None:
    plan, out = tmp_path / "plan.json", tmp_path / "out"
    plan.write_text(text, encoding="utf-8", errors="surrogateescape")
    cli_contract(CliRunner().invoke(app, ["deploy", str(plan), "--out", str(out)]), out)

