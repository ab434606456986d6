"""Fuzz suite (hypothesis): workloads, SLO strings, config.json, plan JSON, /metrics text, request logs, and (round 3)
Prometheus answers, /metrics counter pairs, CronJob options, YAML duplicate keys, special files as outputs and
storage, journals, calibration results, request counts, log timestamps and terminal strings (the hostile HTTP
servers are in test_hostile_network.py).

Invalid input must give one ``RecommenderError`` (CLI: one line on stderr, non-zero exit, no traceback, no file
written); valid input must give finite numbers in range and, for the main job, a plan that meets its own
constraints. Locally each property runs 25 examples; under CI (or --runslow) the ``slow`` copies run the big counts
(3,170 + 42 main-job runs), about 3,200 generated cases in all; test_hostile_network.py adds 200 generated
hostile servers.
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

from recommender import bounded
from recommender.atomic import atomic_write_text
from recommender.calibrate.readers import read_bench_json
from recommender.cli import app
from recommender.bounded import check_storage
from recommender.cli.checks import check_writable_file
from recommender.deploy import render_deploy
from recommender.deploy.replan_job import ReplanJobOptions
from recommender.errors import RecommenderError
from recommender.hf_config import arch_from_config
from recommender.httpread import printable
from recommender.perf.memory import kv_cache_bytes_per_token
from recommender.plan import load_plan
from recommender.replan.logs import parse_request_log
from recommender.replan.metrics import diff, observe_deltas, parse_exposition
from recommender.replan.observation import MAX_REQUESTS_PER_S, check_observation
from recommender.replan.promapi import PrometheusSource
from recommender.search.study import check_journal
from recommender.units import MAX_UNIX_S
from recommender.workload import MAX_TOKENS, Slo, workload_from_dict
from recommender.yamlfile import load_yaml_text

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
                                              "sliding_window", "quantization_config", "_name_or_path",
                                              "layer_types", "tie_word_embeddings"]),
                             max_size=3, unique=True)):
        cfg[key] = draw(st.one_of(NUMBERS, st.integers(-8, 100_000), ANY_SCALAR, JSONISH, CONFIG_VALUES[key]))
    return cfg


LAYER_LISTS = st.lists(st.sampled_from(["full_attention", "sliding_attention", "linear_attention", 1]), max_size=40)
CONFIG_VALUES: dict[str, Any] = {
    "layer_types": LAYER_LISTS, "tie_word_embeddings": st.sampled_from([True, False, "false", "true", 0, 1, None]),
    "quantization_config": st.fixed_dictionaries({"quant_method": st.sampled_from(["gptq", "awq", "fp8", "mxfp4", "x"]),
                                                  "bits": st.one_of(st.sampled_from([2, 3, 4, 8, 4.5, "4"]), NUMBERS)}),
    "sliding_window": st.one_of(st.sampled_from([1.5, 4096, 0, -1, None]), NUMBERS),
    "intermediate_size": st.sampled_from([1.5, 12288.5, 0, True]),
    "max_position_embeddings": st.sampled_from([1, 0, 127, 128, 2**40, 32768.0]),
    "torch_dtype": st.sampled_from(["bfloat16", "int3", "float16", "torch.float16", "", 7]),
    **{k: st.integers(-8, 100_000) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "head_dim", "vocab_size", "model_type",
                                               "_name_or_path")},
}
DEEPSEEK = json.loads((DATA / "hf_configs" / "DeepSeek-V3" / "config.json").read_text())


@st.composite
def mla_configs(draw: st.DrawFn) -> Any:
    """DeepSeek-V3 with its MLA ranks, head dims and MoE layout mutated."""
    cfg = dict(DEEPSEEK)
    for key in draw(st.lists(st.sampled_from(["q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                              "v_head_dim", "first_k_dense_replace", "moe_layer_freq",
                                              "n_shared_experts", "num_experts_per_tok"]), min_size=1, max_size=3,
                             unique=True)):
        cfg[key] = draw(st.one_of(st.sampled_from([-100000, 0, 1.5, None, True, "512", 10**9, 512, 64]), NUMBERS))
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
    assert kv_cache_bytes_per_token(arch, "bf16") > 0 and 0 <= arch.num_sliding_layers <= arch.num_layers
    assert isinstance(arch.tied_embeddings, bool) and arch.max_position_embeddings >= 128
    assert isinstance(arch.intermediate_size, int) and (arch.sliding_window is None or arch.sliding_window >= 1)
    if arch.mla is not None:
        assert arch.mla.kv_lora_rank >= 1 and arch.mla.v_head_dim >= 1 and (arch.mla.q_lora_rank or 1) >= 1


def check_plan(doc: Any) -> None:
    try:
        files = render_deploy(doc, rank=1, formats="all")
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


# ------------------------------------------------------------------------------------------ round 3 classes

PROM_OK = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1000.0, "5"]}]}}
PROM_BAD_VALUES = ["1e300", "-98.7", "NaN", "+Inf", "1.7e308", "x", "", "5", "0", "3e6", "1e999"]


@st.composite
def prometheus_answers(draw: st.DrawFn) -> dict[str, str]:
    """A table query -> answer text for every query the source makes; a few answers are hostile."""
    def vector(values: list[str], les: list[str] | None = None) -> Any:
        return {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"le": les[i]} if les else {}, "value": [1000.0, v]} for i, v in enumerate(values)]}}

    hostile = draw(st.sampled_from(["rate", "hist", "shape", "range", "gauge", "none"]))
    value = st.one_of(st.sampled_from(PROM_BAD_VALUES), st.floats(0, 1e7).map(repr))
    answers: dict[str, Any] = {"rate": vector(["5"]), "hist": vector(["10", "50", "100"], ["100", "1000", "+Inf"]),
                               "sum": vector(["30000"]), "gauge": vector(["0.5"]),
                               "range": {"status": "success", "data": {"resultType": "matrix", "result": [
                                   {"metric": {}, "values": [[940.0, "5"], [1000.0, "5"]]}]}}}
    if hostile == "rate":
        answers["rate"] = vector(draw(st.lists(value, min_size=1, max_size=3)))
    elif hostile == "hist":
        les = draw(st.lists(st.sampled_from(["-100", "100", "1000", "+Inf", "NaN", "x", "1e999"]), min_size=1, max_size=4))
        answers["hist"] = vector(draw(st.lists(value, min_size=len(les), max_size=len(les))), les)
    elif hostile == "shape":
        answers["rate"] = draw(st.sampled_from([
            {"status": "success", "data": []}, {"status": "success", "data": {"resultType": "vector", "result": ["5"]}},
            {"status": "success", "data": {"resultType": "matrix", "result": []}}, [], "x", {"status": "error"},
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"a": 1}, "value": [0, "1"]}]}},
            {"status": "success", "data": {"resultType": "vector", "result": [{"value": [0, 5]}]}}]))
    elif hostile == "range":
        answers["range"] = {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {}, "values": [[draw(st.sampled_from([-5e11, 1000.0, 1e300])), draw(value)]]}]}}
    elif hostile == "gauge":
        answers["gauge"] = vector([draw(value)])
    return {k: json.dumps(v) if not isinstance(v, str) else v for k, v in answers.items()}


def check_prometheus(answers: dict[str, str]) -> None:
    def fetch(url: str, timeout_s: float, headers: Any = None) -> str:
        q = url.split("query=", 1)[1]
        if "query_range" in url:
            return answers["range"]
        if "_bucket" in q:
            return answers["hist"]
        if "_sum" in q:
            return answers["sum"]
        if "num_requests" in q or "kv_cache" in q:
            return answers["gauge"]
        return answers["rate"]

    src = PrometheusSource("prometheus+http://p:9090", fetch=fetch, clock=lambda: 1000.0, min_requests=1)
    try:
        obs = src.observe()
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    check_observation(obs)
    assert 0 <= obs.arrival_rate_per_s <= MAX_REQUESTS_PER_S
    for h in (obs.prompt_tokens.histogram, *obs.latency.values()):
        assert h is not None and all(e >= 0 for e in h.upper_edges)
        assert all(b >= a for a, b in zip(h.cumulative_counts, h.cumulative_counts[1:]))
    assert all(p.rate_per_s >= 0 and 0 <= p.end_s <= MAX_UNIX_S for p in obs.rate_points)


@st.composite
def counter_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """Two scrapes of one endpoint: the second with counters, buckets or sums changed (falling, negative, huge)."""
    first = METRICS
    lines = METRICS.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        if lines[i].startswith("vllm:") and " " in lines[i]:
            head, val = lines[i].rsplit(" ", 1)
            new = draw(st.one_of(st.sampled_from(["-98.7", "0", "1e300", "1.7e308", "-1"]),
                                 st.floats(0, 2 * max(1.0, abs(float(val)))).map(repr)))
            lines[i] = f"{head} {new}"
    return first, "\n".join(lines) + "\n"


def check_counter_pair(pair: tuple[str, str]) -> None:
    try:
        a = parse_exposition(pair[0], "http://fuzz/metrics", 1000.0)
        b = parse_exposition(pair[1], "http://fuzz/metrics", 1060.0)
        obs = check_observation(observe_deltas([diff(a, b)], [b], 1060.0))
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    assert 0 <= obs.arrival_rate_per_s <= MAX_REQUESTS_PER_S and obs.prompt_tokens_per_s >= 0
    for h in (obs.prompt_tokens.histogram, obs.output_tokens.histogram, *obs.latency.values()):
        assert h is not None and all(c >= 0 for c in h.bucket_counts()) and h.sum_value >= 0


INJECT = ["\napiVersion: v1\nkind: Secret\nmetadata: {name: hf-token}\n#", "$(HF_TOKEN) --privileged", "\x1b]0;x\x07",
          " ", "\x00", "\u202e", "'", '"', "# c", "\r\n", "{{x}}", "`id`"]


@st.composite
def cronjob_options(draw: st.DrawFn) -> dict[str, Any]:
    bit = st.one_of(st.sampled_from(INJECT + HOSTILE), st.text(max_size=8))
    traffic = draw(st.one_of(st.sampled_from(["prometheus+http://p:9090", "http://pod:8000/metrics", "file:///etc/passwd",
                                              "", "  ", "/var/log/x.jsonl", "https://u:p@h/x", "ftp://x"]),
                             st.builds(lambda b: "prometheus+http://p:9090" + b, bit)))
    image = draw(st.one_of(st.sampled_from(["recommender:latest", "ghcr.io/o/r:v1", "r@sha256:" + "a" * 64, "UPPER:1"]),
                           st.builds(lambda b: "recommender:v1" + b, bit)))
    return {"traffic": traffic, "image": image,
            "schedule": draw(st.one_of(st.just("*/5 * * * *"), st.builds(lambda b: "*/5 * * * *" + b, bit))),
            "selector": draw(st.one_of(st.none(), st.just('model_name="m"'), bit)),
            "history_secret": draw(st.one_of(st.none(), st.just("replan-db"), bit))}


def check_cronjob(kw: dict[str, Any]) -> None:
    try:
        files = render_deploy(load_plan(AGG), rank=1, formats="replan-cronjob", replan=ReplanJobOptions(**kw))
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    text = files["replan-cronjob.yaml"]
    header = text.split("\n---\n", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines())  # no document hides in the comment
    assert all(ch.isprintable() for line in header.splitlines() for ch in line)
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim",
                                         "CronJob"]
    pod = docs[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == kw["image"] and not any(c in kw["image"] for c in " \n$")
    assert "securityContext" not in container
    for a in container["args"]:  # Kubernetes expands $(VAR) in args: every $ must be doubled
        assert "$(" not in a.replace("$$", "") or a == "$(REPLAN_HISTORY_URL)"


@st.composite
def yaml_duplicates(draw: st.DrawFn) -> tuple[str, bool]:
    """A workload-like YAML text and whether it repeats a key in one mapping."""
    keys = draw(st.lists(st.sampled_from(["model", "name", "slo", "prices", "gpus", "h100", "a"]), min_size=1, max_size=5))
    nested = draw(st.booleans())
    body = "".join(f"  {k}: {i}\n" for i, k in enumerate(keys)) if nested else "".join(f"{k}: {i}\n" for i, k in enumerate(keys))
    text = ("outer:\n" + body) if nested else body
    return text, len(set(keys)) != len(keys)


def check_yaml_duplicates(case: tuple[str, bool]) -> None:
    text, dup = case
    try:
        load_yaml_text(text)
    except yaml.YAMLError as e:
        assert dup and "duplicate key" in str(e).splitlines()[0]
        return
    assert not dup


SPECIALS = ["fifo", "devnull-link", "dir", "file-link", "regular", "absent", "devnode"]


def _make(kind: str, tmp: Path) -> Path:
    import os
    import stat

    p = tmp / f"target-{kind}"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "devnull-link":
        p.symlink_to("/dev/null")
    elif kind == "dir":
        p.mkdir()
    elif kind == "file-link":
        (tmp / "real").write_text("keep")
        p.symlink_to(tmp / "real")
    elif kind == "regular":
        p.write_text("old")
    elif kind == "devnode":  # a character device like /dev/null, made here (root) so no test can touch the real one
        try:
            os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            os.mkfifo(p)
    return p


def check_special_file(case: tuple[str, str]) -> None:
    import os
    import stat
    import tempfile

    kind, op = case
    with tempfile.TemporaryDirectory() as d:
        p = _make(kind, Path(d))
        before = os.lstat(p).st_mode if os.path.lexists(p) else None
        try:
            if op == "write":
                atomic_write_text(p, "new")
            elif op == "read":
                bounded.read_file_text(p, "input")
            elif op == "storage":
                check_storage(str(p))
            else:
                check_writable_file(str(p), "--out")
        except RecommenderError as e:
            assert "\n" not in str(e)
            assert kind not in ("regular", "absent") or op == "read"
        else:
            if op in ("write", "check"):
                assert kind in ("regular", "absent"), (kind, op)
            if op == "read":
                assert kind in ("regular", "file-link")
        after = os.lstat(p).st_mode if os.path.lexists(p) else None
        if kind not in ("regular", "absent"):
            assert after == before  # never replaced
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@st.composite
def journals(draw: st.DrawFn) -> tuple[bytes, bool]:
    """An Optuna-like journal: valid records, maybe garbage appended or a line cut, and whether it is valid."""
    recs = [json.dumps({"op_code": i % 3, "worker_id": "w", "n": i}).encode() for i in range(draw(st.integers(0, 5)))]
    data = b"".join(r + b"\n" for r in recs)
    op = draw(st.sampled_from(["ok", "garbage", "cut", "partial-tail", "binary"]))
    if op == "garbage":
        return data + draw(st.sampled_from([b"garbage{\n", b"[1, 2]\n", b"{}\n", b"\x00\xff\n", b'{"op_code": 99}\n',
                                            b'{"op_code": true}\n'])), False
    if op == "cut" and recs:
        cut = draw(st.integers(1, len(recs[-1]) - 1))
        return data[: len(data) - len(recs[-1]) - 1] + recs[-1][:cut] + b"\n", False
    if op == "partial-tail":
        return data + b'{"op_code": 1, "wor', True  # a write in progress: left to Optuna
    if op == "binary":
        return data + bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=8))) + b"\n", False
    return data, True


def check_journal_case(case: tuple[bytes, bool]) -> None:
    import tempfile

    data, valid = case
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "study.log"
        p.write_bytes(data)
        try:
            check_journal(str(p))
        except RecommenderError as e:
            assert not valid and str(p) in str(e) and "line" in str(e) and "\n" not in str(e)
            return
        assert valid


BENCH = {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "completed": 100, "num_prompts": 100,
         "total_input_tokens": 100_000, "total_output_tokens": 10_000, "request_rate": "inf", "max_concurrency": 16,
         "output_throughput": 1500.0, "median_ttft_ms": 120.0, "median_tpot_ms": 12.0,
         "gpu": "h100-sxm", "tp": 1}


@st.composite
def bench_results(draw: st.DrawFn) -> dict[str, Any]:
    doc = dict(BENCH)
    for key in draw(st.lists(st.sampled_from(["completed", "num_prompts", "total_input_tokens", "total_output_tokens",
                                              "request_rate", "max_concurrency", "output_throughput", "median_ttft_ms",
                                              "tp", "prompt_tokens", "max_num_seqs", "gpu_memory_utilization"]),
                             min_size=1, max_size=3, unique=True)):
        doc[key] = draw(st.one_of(st.sampled_from(["inf", "-1", -1, 0, 1024, 1e12, 5, "nan", True, 1.5, "x"]), NUMBERS))
    return doc


def check_bench(doc: dict[str, Any]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "run.json"
        try:
            p.write_text(json.dumps(doc))
        except ValueError:
            return
        try:
            res = read_bench_json(p)
        except RecommenderError as e:
            assert "\n" not in str(e)
            return
    for m in res.measurements:
        assert 1 <= m.tp <= 72 and math.isfinite(m.value) and m.value > 0
        assert 0 < m.gpu_memory_utilization <= 1 and m.limits.max_num_seqs >= 1
        assert 0 < m.load.prompt_tokens <= 10_000_000 and 0 < m.load.output_tokens <= 10_000_000


def check_request_count(n: int) -> None:
    try:
        assert bounded.check_request_count(n, "--requests") == n
    except RecommenderError as e:
        assert "--requests" in str(e) and "2,000,000" in str(e) and not 1 <= n <= bounded.DEFAULT_MAX_REQUESTS
        return
    assert 1 <= n <= bounded.DEFAULT_MAX_REQUESTS


@st.composite
def log_timestamps(draw: st.DrawFn) -> str:
    t = st.one_of(st.sampled_from([-5e11, -1, 0, 1.7e9, 1.7e12, 4.2e9, 1e300, 2.5e11, "9999-12-31T00:00:00",
                                   "0001-01-01T00:00:00", "2023-11-16 18:15:46.68"]), st.floats(-1e12, 1e13))
    rows = [{"timestamp": draw(t), "prompt_tokens": draw(st.sampled_from([1, 100, 10**8, 5])),
             "output_tokens": 10} for _ in range(draw(st.integers(1, 4)))]
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    extra = draw(st.sampled_from(["", '{"timestamp": 1.7e9, "prompt_tokens": 3, "output_tokens": 1, "n": "a\u2028b"}\n']))
    return sep.join(json.dumps(r) for r in rows) + sep + extra


def check_log_timestamps(text: str) -> None:
    try:
        log = parse_request_log(text, "fuzz.jsonl")
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    assert all(0 <= t <= MAX_UNIX_S for t in log.timestamps_s) and (log.prompt_tokens <= MAX_TOKENS).all()


TERMINAL = st.text(alphabet=st.sampled_from(["a", "\x1b", "]", "\x07", "\x00", "\u202e", "\u200b", "\n", "\r", "é",
                                             "\x9b", "\u2028"]), max_size=20)


def check_terminal(name: str) -> None:
    """A workload name or --deployment with terminal controls: refused, and any echo of it is escaped."""
    doc = {"name": name, "model": "llama-3.1-8b", "traffic": {"arrival_rate": 1},
           "prompt_tokens": 100, "output_tokens": 10}
    try:
        w = workload_from_dict(doc, "fuzz.yaml")
    except RecommenderError as e:
        assert all(ch.isprintable() for ch in str(e))
    else:
        assert w.name.isprintable()
    shown = printable(name)
    assert all(ch.isprintable() for ch in shown)


@st.composite
def plan_cross_fields(draw: st.DrawFn) -> Any:
    """The sample plan with TP, prices, utilisation or totals edited together or apart."""
    doc = json.loads(json.dumps(AGG))
    row, pool = doc["plans"][0], doc["plans"][0]["pools"][0]
    field = draw(st.sampled_from(["tp", "usd_per_gpu_hour", "usd_per_hour", "gpu_memory_utilization", "checkpoint_dtype"]))
    value = draw(st.sampled_from({"tp": [1, 2, 4, 8, 16, 32, 64], "usd_per_gpu_hour": [-100, 0, 3.5, 1e9],
                                  "usd_per_hour": [-100, 0, 1e12, row["usd_per_hour"]],
                                  "gpu_memory_utilization": [1e-9, 0.04, 0.05, 0.9, 1.0, 1.01],
                                  "checkpoint_dtype": ["int3", "bf16", "fp8", ""]}[field]))
    if field == "checkpoint_dtype":
        doc["workload"]["checkpoint_dtype"] = value
    elif field == "usd_per_hour":
        row["usd_per_hour"] = value
    else:
        pool[field] = value
        if field in row:
            row[field] = value
        if field == "tp":
            row["gpus_total"] = value * pool["replicas"]
    return doc


def check_plan_cross_fields(doc: Any) -> None:
    from recommender.catalog import default_catalog

    try:
        plan = load_plan(doc)
    except RecommenderError as e:
        assert "\n" not in str(e)
        return
    cat = default_catalog()
    for row in plan.rows:
        for p in row.pools:
            assert p.tp <= cat.gpu(p.gpu).interconnect.gpus_per_domain
            assert p.usd_per_gpu_hour is None or p.usd_per_gpu_hour >= 0
            assert 0.05 <= p.gpu_memory_utilization <= 1
        assert row.usd_per_hour is None or 0 <= row.usd_per_hour <= 1e7
        if row.usd_per_hour is not None and all(p.usd_per_hour is not None for p in row.pools):
            assert abs(sum(p.usd_per_hour or 0 for p in row.pools) - row.usd_per_hour) <= 0.01 + 1e-3 * row.usd_per_hour


CASES = [("workload", workloads(), check_workload, 400), ("slo", slo_strings(), check_slo, 300),
         ("config", configs(), check_config, 300), ("plan", plans(), check_plan, 200),
         ("metrics", metrics_texts(), check_metrics, 120), ("log", request_logs(), check_log, 200),
         ("mla-config", mla_configs(), check_config, 200), ("prometheus", prometheus_answers(), check_prometheus, 200),
         ("counter-pair", counter_pairs(), check_counter_pair, 150), ("cronjob", cronjob_options(), check_cronjob, 150),
         ("yaml-duplicates", yaml_duplicates(), check_yaml_duplicates, 100),
         ("special-file", st.tuples(st.sampled_from(SPECIALS), st.sampled_from(["write", "read", "storage", "check"])),
          check_special_file, 100),
         ("journal", journals(), check_journal_case, 100), ("bench", bench_results(), check_bench, 150),
         ("request-count", st.one_of(st.integers(-10, 10**10), st.sampled_from([0, 1, 2_000_000, 2_000_001, 10**9])),
          check_request_count, 100),
         ("log-timestamps", log_timestamps(), check_log_timestamps, 150), ("terminal", TERMINAL, check_terminal, 100),
         ("plan-cross-fields", plan_cross_fields(), check_plan_cross_fields, 150)]


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

