"""``recommend simulate``: flags, plans (aggregated and P/D), traces, output formats and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.perf.step import Deployment, EngineLimits, StepCostModel
from recommender.profiles import resolve_profile

ROOT = Path(__file__).resolve().parents[1]
TRACE = Path(__file__).parent / "data" / "load" / "azure-conv-200.csv"
FLAGS = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--kv-dtype", "fp8", "--max-num-seqs", "256",
         "--max-num-batched-tokens", "8192"]


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


def test_flags_json_low_rate_matches_the_perf_models_own_steps() -> None:
    res = run(*FLAGS, "--prompt-tokens", "1000", "--output-tokens", "50", "--rate", "0.01", "--requests", "200",
              "--seed", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["requests"] == 200 and doc["analytic"]["stable"] is True
    # At 0.01 req/s requests never meet: TTFT is one prefill step of the perf model (computed here
    # from StepCostModel directly), and TPOT its one-sequence decode steps at contexts 1001..1049.
    cat = default_catalog()
    dep = Deployment(model=cat.model("llama-3.1-8b"), gpu=cat.gpu("h100-sxm"), tp=1, weight_dtype="bf16", kv_dtype="fp8",
                     profile=resolve_profile("vllm", None), limits=EngineLimits(256, 8192, True, False), max_model_len=1050)
    cost = StepCostModel.build(dep)
    # plus the profile's fixed per-request cost (request_overhead_s; 0 in the shipped vllm.yaml)
    prefill = cost.request_overhead_s + cost.step_s(1000, *cost.prefill_chunk_cost(1000, 0), prefill=True)
    decode = sum(cost.step_s(1, *cost.decode_seq_cost(1000 + k)) for k in range(1, 50)) / 49
    sim = doc["latency_s"]
    # within 1%: the scheduler's prefill step differs from this hand-built one by ~0.1 ms (0.4%) since the
    # attention efficiency ratio put attention's roofline kink inside it
    assert sim["ttft"]["simulated"]["p50"] == pytest.approx(prefill, rel=1e-2)
    # within 2%: the simulator sums a run of decode steps from a few step times (scheduler fast_forward); with
    # the attention roofline's kink inside the run (attention_efficiency_ratio 0.35) that sum is 0.9% under this
    # step-by-step mean (a known gap, issue 22's report)
    assert sim["tpot"]["simulated"]["p50"] == pytest.approx(decode, rel=2e-2)
    assert sim["ttft"]["analytic"]["p50"] == pytest.approx(prefill, rel=0.01)
    for m in ("ttft", "tpot", "e2e"):
        s = sim[m]["simulated"]
        assert s["p50"] <= s["p90"] <= s["p95"] <= s["p99"]


def test_same_seed_same_output_and_text_table() -> None:
    args = (*FLAGS, "--workload", str(ROOT / "examples" / "chat.yaml"), "--rate", "10", "--requests", "400", "--seed", "7")
    a, b = run(*args, "--format", "json"), run(*args, "--format", "json")
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout
    text = run(*args)
    assert text.exit_code == 0 and "TTFT" in text.stdout and "simulated" in text.stdout and "analytic" in text.stdout


def test_trace_replay_and_timeseries_csv(tmp_path: Path) -> None:
    out = tmp_path / "ts.csv"
    res = run(*FLAGS, "--workload", str(ROOT / "examples" / "chat.yaml"), "--trace", str(TRACE), "--timeseries", str(out),
              "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["requests"] == 200  # every trace row, not --requests
    # the trace's own rate: 199 gaps over its span
    rows = [ln.split(",") for ln in TRACE.read_text().splitlines()[1:]]
    assert doc["rate_per_s"] > 0 and len(rows) == 200
    lines = out.read_text().splitlines()
    assert lines[0] == "t_s,waiting,running,kv_usage" and len(lines) > 10


def _plan(tmp_path: Path, pools: list[dict], disaggregated: bool) -> Path:
    doc = {
        "version": 1,
        "workload": {"name": "chat", "model": "llama-3.1-8b", "arrival_rate_per_s": 20.0, "max_model_len": 5120,
                     "shared_prefix_fraction": 0.0, "source": str(ROOT / "examples" / "chat.yaml")},
        "engine": "vllm", "profile": "vllm",
        "plans": [{"rank": 1, "id": "test", "gpu": pools[-1]["gpu"], "tp": pools[-1]["tp"], "replicas": pools[-1]["replicas"],
                   "cuda_graphs": True, "gpu_memory_utilization": 0.92, "max_model_len": 5120,
                   "disaggregated": disaggregated, "pools": pools}],
    }
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    return p


def _pool(role: str, replicas: int, seqs: int = 256, budget: int = 8192) -> dict:
    return {"role": role, "gpu": "h100-sxm", "tp": 1, "replicas": replicas, "weight_dtype": "bf16", "kv_dtype": "fp8",
            "max_num_seqs": seqs, "max_num_batched_tokens": budget, "chunked_prefill": True, "enable_prefix_caching": False,
            "gpu_memory_utilization": 0.92}


def test_plan_aggregated_reads_lengths_from_the_workload_source(tmp_path: Path) -> None:
    res = run("--plan", str(_plan(tmp_path, [_pool("both", 2)], False)), "--requests", "600", "--seed", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["rate_per_s"] == 20.0 and doc["requests"] == 600 and "rank 1" in doc["config"]


def test_plan_disaggregated(tmp_path: Path) -> None:
    plan = _plan(tmp_path, [_pool("prefill", 1, 64, 8192), _pool("decode", 2, 256, 2048)], True)
    res = run("--plan", str(plan), "--requests", "500", "--seed", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    lat = doc["latency_s"]
    assert lat["ttft"]["simulated"]["p50"] > 0 and lat["tpot"]["simulated"]["p99"] >= lat["tpot"]["simulated"]["p50"]


@pytest.mark.parametrize("args,words", [
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1"], "--prompt-tokens"),
    ([*FLAGS, "--prompt-tokens", "100", "--output-tokens", "10", "--rate", "-1"], "--rate"),
    ([*FLAGS, "--prompt-tokens", "100", "--output-tokens", "10", "--rate", "1", "--format", "yaml"], "--format"),
    ([*FLAGS, "--prompt-tokens", "100", "--output-tokens", "10", "--rate", "1", "--requests", "0"], "--requests"),
    ([*FLAGS, "--prompt-tokens", "100", "--output-tokens", "10"], "--rate"),
    (["--plan", "/nonexistent/plan.json"], "plan.json"),
    # catalogs/kernel-support.yaml: blackwell lists no int8 weights (vLLM's sm100 scaled_mm has no INT8 kernel)
    (["--model", "llama-3.1-8b", "--gpu", "b200", "--weight-dtype", "int8", "--prompt-tokens", "100",
      "--output-tokens", "10", "--rate", "1"], "does not run int8 weights on b200 (blackwell)"),
])
def test_errors_are_one_line(args: list[str], words: str) -> None:
    res = run(*args)
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    err = res.stderr.strip() if res.stderr else res.output.strip()
    assert words in err and len(err.splitlines()) == 1


def test_bad_rank_is_one_line(tmp_path: Path) -> None:
    res = run("--plan", str(_plan(tmp_path, [_pool("both", 1)], False)), "--rank", "3")
    assert res.exit_code != 0 and "--rank 3" in (res.stderr or res.output)


def test_plan_with_overrides_is_simulated_as_planned(tmp_path: Path) -> None:
    # issue #31: a plan made with the arrival rate overridden to 80 req/s (chat.yaml says 20), constant
    # 300 / 40 token lengths (the file's are lognormal) and a 0.5 shared prefix was simulated at the file's
    # 20 req/s with the file's lengths. The plan's own echo is what must be simulated.
    import dataclasses

    from recommender.plan import dump_plan
    from recommender.search import SearchSettings, recommend
    from recommender.workload import LengthDist, load_workload

    w = load_workload(ROOT / "examples" / "chat.yaml")
    w = dataclasses.replace(w, arrival_rate_per_s=80.0, prompt_tokens=LengthDist.constant(300),
                            output_tokens=LengthDist.constant(40), shared_prefix_fraction=0.5, gpus=("h100-sxm",))
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(recommend(w, settings=SearchSettings(seed=0, verify=0, trials=60, top=1))))
    res = run("--plan", str(path), "--requests", "800", "--seed", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["rate_per_s"] == 80.0
    # constant 40 output tokens at 80 req/s: 3,200 output tok/s offered; the run serves it (within its noise)
    assert doc["simulated"]["output_tokens_per_s"] == pytest.approx(80.0 * 40, rel=0.1)
    assert doc["analytic"]["output_tokens_per_s"] == pytest.approx(80.0 * 40, rel=1e-9)
    assert doc["shared_prefix_fraction"] == 0.5


def test_plan_disaggregated_uses_the_rows_kv_link(tmp_path: Path) -> None:
    # the row's KV link (bytes per token, NIC bandwidth, TPs, latency) is the one simulated: a 1 MB/s NIC makes
    # every transfer of a chat prompt (~1,000 tokens x 32 KiB of fp8 KV on 8B) take ~30 s, which TTFT must show
    plan = _plan(tmp_path, [_pool("prefill", 1, 64, 8192), _pool("decode", 2, 256, 2048)], True)
    doc = json.loads(plan.read_text())
    per_token = 32 * 2 * 8 * 128  # llama-3.1-8b: 32 layers x (K and V) x 8 KV heads x 128 dims x 1 B (fp8)
    doc["plans"][0]["kv_link_model"] = {"bytes_per_token": float(per_token), "nic_bytes_per_s": 1e6, "prefill_tp": 1,
                                  "decode_tp": 1, "latency_s": 0.0}
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(doc))
    res = run("--plan", str(slow), "--requests", "300", "--seed", "2", "--rate", "0.01", "--format", "json")
    assert res.exit_code == 0, res.output
    lat = json.loads(res.stdout)["latency_s"]["ttft"]
    # a P-token prompt's transfer alone takes P x 32,768 B / 1 MB/s = 0.0328 s per token; chat prompts p50 ~ 600+
    assert lat["simulated"]["p50"] > 10.0 and lat["analytic"]["p50"] > 10.0


@pytest.mark.parametrize("dist", ["constant", "normal", "lognormal", "empirical", "histogram"])
def test_the_echo_rebuilds_each_kind_of_length_distribution(dist: str) -> None:
    # the plan file's echo (dump_plan -> load_plan) gives back the very distribution the plan was made for
    from recommender.cli.simulate import _echoed_lengths
    from recommender.plan import WorkloadEcho, load_plan
    from recommender.plan.io import plan_document
    from recommender.plan.types import Plan
    from recommender.search.to_plan import _lengths
    from recommender.workload import LengthDist

    d = {"constant": LengthDist.constant(300), "normal": LengthDist.normal(1000, 200, 10, 2000),
         "lognormal": LengthDist.lognormal(500, 300, 8, 4000), "empirical": LengthDist.empirical([5, 10, 10, 300, 2000]),
         "histogram": LengthDist.histogram([100, 1000, 5000], [1, 3, 1])}[dist]
    plan = Plan(workload=WorkloadEcho(model="llama-3.1-8b", prompt_tokens=_lengths(d), output_tokens=_lengths(d)), rows=())
    echo = load_plan(plan_document(plan)).workload
    rebuilt = _echoed_lengths(echo)
    assert rebuilt is not None and rebuilt[0] == d and rebuilt[1] == d and rebuilt[0].mean == d.mean


# -- the default run length (the search verifier's rule) and the stability verdict --------------------------------

BATCH_PLAN = ROOT / "examples" / "plans" / "batch-summarization.plan.json"


def _plan_rate(plan: dict) -> float:
    """The rate `simulate --plan` offers: the workload's, or an offline job's requests over its deadline
    (batch-summarization: 10,000,000 in 10 h = 277.8 req/s)."""
    w = plan["workload"]
    return w["arrival_rate_per_s"] or w["offline_requests"] / w["deadline_s"]


def _rule(rho: float, tail: float) -> tuple[int, int]:
    """The verifier's documented rule (recommender/search/verify.py's docstring), written out by hand: 100
    requests beyond the percentile, 100 / tail, x (1 + rho) / (1 - rho), / (1 - 0.2) for the warm-up; at least
    1,000, at most policies/search.yaml's verify_requests (20,000); the first 20% a warm-up."""
    import math

    n = min(max(math.ceil(100 / tail * (1 + rho) / (1 - rho) / 0.8), 1000), 20000)
    return n, int(n * 0.2)


def test_default_run_length_is_the_verifiers_and_a_healthy_plan_reads_stable() -> None:
    """Issue: `simulate --plan batch-summarization` ran 2,000 requests (7 s at 278 req/s, shorter than a request's
    ~8 s) with no warm-up, read TPOT at half the analytic value and called the plan overloaded."""
    plan = json.loads(BATCH_PLAN.read_text())
    row = plan["plans"][0]
    assert plan["slo"] == []  # no SLO: the percentile is p90, as the verifier's
    rho = row["load_utilisation"]  # 0.92: 1,000 x 1.92 / 0.08 / 0.8 ~ 29,800 requests, over the 20,000 cap
    assert _rule(rho, 0.1) == (20000, 4000)
    res = run("--plan", str(BATCH_PLAN), "-f", "json", "-q")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["requests"], doc["warmup_requests"]) == (20000, 4000)
    assert doc["run_length"]["sized"] is True and "capped at 20,000" in doc["run_length"]["why"]
    assert doc["simulated"]["stable"] is True
    # steady state: the simulated TPOT p90 is near the analytic one (it read 44% below it in the 2,000-request run)
    tpot = doc["latency_s"]["tpot"]
    assert tpot["simulated"]["p90"] == pytest.approx(tpot["analytic"]["p90"], rel=0.15)
    text = run("--plan", str(BATCH_PLAN), "-q", "--wide")
    assert "the first 4,000 left out as warm-up" in text.stdout and "run length: sized as `recommend`" in text.stdout
    assert "overloaded" not in text.stdout


def test_a_plan_below_the_cap_runs_the_rules_length() -> None:
    chat = ROOT / "examples" / "plans" / "chat.plan.json"
    plan = json.loads(chat.read_text())
    tail = min({"p50": 0.5, "p90": 0.1, "p95": 0.05, "p99": 0.01}[s["percentile"]] for s in plan["slo"])
    n, warm = _rule(plan["plans"][0]["load_utilisation"], tail)
    assert 1000 < n < 20000  # not clamped: the stretch by the utilisation shows
    doc = json.loads(run("--plan", str(chat), "-f", "json", "-q").stdout)
    assert (doc["requests"], doc["warmup_requests"]) == (n, warm)


def test_given_lengths_stay_as_given() -> None:
    doc = json.loads(run("--plan", str(BATCH_PLAN), "-n", "2000", "-f", "json", "-q").stdout)
    assert (doc["requests"], doc["warmup_requests"], doc["run_length"]["sized"]) == (2000, 0, False)
    doc = json.loads(run("--plan", str(BATCH_PLAN), "-n", "3000", "--warmup", "500", "-f", "json", "-q").stdout)
    assert (doc["requests"], doc["warmup_requests"]) == (3000, 500)
    doc = json.loads(run("--plan", str(BATCH_PLAN), "--warmup", "100", "-f", "json", "-q").stdout)
    assert (doc["requests"], doc["warmup_requests"]) == (20000, 100)  # the sized length, the given warm-up


def test_with_another_rate_the_utilisation_scales_with_it() -> None:
    """--rate overrides the plan's: its load utilisation (rate / capacity) no longer applies; the analytic model's
    saturation rate of the same pools gives it, which at 200 of the plan's 277.8 req/s is 0.919 x 200 / 277.8."""
    plan = json.loads(BATCH_PLAN.read_text())
    rho = plan["plans"][0]["load_utilisation"] * 200 / _plan_rate(plan)
    doc = json.loads(run("--plan", str(BATCH_PLAN), "--rate", "200", "-f", "json", "-q").stdout)
    assert doc["run_length"]["utilisation"] == pytest.approx(rho, rel=0.02)
    lo, hi = _rule(rho * 0.98, 0.1)[0], _rule(rho * 1.02, 0.1)[0]
    assert lo <= doc["requests"] <= hi < 20000


def test_a_short_run_still_filling_is_not_called_overloaded_and_an_overload_is() -> None:
    # 2,000 requests at 278 req/s arrive over ~7 s and each takes ~8 s: the batches are still filling
    res = run("--plan", str(BATCH_PLAN), "-n", "2000", "-q", "--wide")
    assert res.exit_code == 0, res.output
    assert "overloaded" not in res.stdout and "not steady yet" in res.stdout
    doc = json.loads(run("--plan", str(BATCH_PLAN), "-n", "2000", "-f", "json", "-q").stdout)
    sim = doc["simulated"]
    assert sim["stable"] is False and sim["filling"] is True and 2 * sim["waiting_growth"] < sim["in_system_growth"]
    # three times the plan's capacity (rate / load utilisation = 302 req/s): what cannot be served waits
    plan = json.loads(BATCH_PLAN.read_text())
    capacity = _plan_rate(plan) / plan["plans"][0]["load_utilisation"]
    over = run("--plan", str(BATCH_PLAN), "--rate", f"{3 * capacity:.0f}", "-n", "20000", "-q", "--wide")
    assert over.exit_code == 0, over.output
    assert "[queue still growing: overloaded]" in over.stdout


def test_a_warmup_over_the_sized_run_is_refused_in_one_line() -> None:
    res = run("--plan", str(BATCH_PLAN), "--warmup", "20000", "-q")
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "--warmup 20000" in res.stderr and "-n/--requests" in res.stderr
