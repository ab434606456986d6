"""`recommend simulate` / the report on plans that are not the plain dense aggregated case: a trace replayed on a
P/D plan or on flags (the analytic model beside it at the replayed requests' rate and lengths), and the report's
walkthrough of a pool on owned GPUs (billed per GPU in use, not per node)."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--kv-dtype", "fp8", "--max-num-seqs", "256",
         "--max-num-batched-tokens", "8192"]


def _trace(tmp_path: Path) -> Path:
    """40 requests 0.5 s apart (span 19.5 s: 39 gaps, 2.0 req/s), prompts of 100 tokens, outputs alternating 10 and
    30 (mean 20), then two stragglers at 1,000 s and 2,000 s that `--requests 40` leaves out of the replay."""
    lines = ["timestamp,prompt_tokens,output_tokens"]
    lines += [f"{i * 0.5},100,{10 if i % 2 == 0 else 30}" for i in range(40)]
    lines += ["1000,100,10", "2000,100,10"]
    p = tmp_path / "trace.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def _pd_plan(tmp_path: Path) -> Path:
    def pool(role: str, replicas: int, seqs: int, budget: int) -> dict:
        return {"role": role, "gpu": "h100-sxm", "tp": 1, "replicas": replicas, "weight_dtype": "bf16", "kv_dtype": "fp8",
                "max_num_seqs": seqs, "max_num_batched_tokens": budget, "chunked_prefill": True,
                "enable_prefix_caching": False, "gpu_memory_utilization": 0.92}

    pools = [pool("prefill", 1, 64, 8192), pool("decode", 2, 256, 2048)]
    doc = {
        "version": 1,
        "workload": {"name": "chat", "model": "llama-3.1-8b", "arrival_rate_per_s": 20.0, "max_model_len": 5120,
                     "shared_prefix_fraction": 0.0, "source": str(ROOT / "examples" / "chat.yaml")},
        "engine": "vllm", "profile": "vllm",
        "plans": [{"rank": 1, "id": "pd", "gpu": "h100-sxm", "tp": 1, "replicas": 2, "cuda_graphs": True,
                   "gpu_memory_utilization": 0.92, "max_model_len": 5120, "disaggregated": True, "pools": pools}],
    }
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("how", ["flags", "pd-plan"])
def test_a_trace_is_compared_at_its_own_rate_and_lengths(tmp_path: Path, how: str) -> None:
    """The analytic row beside a replayed trace is the replayed requests' load: 39 gaps over 19.5 s = 2.0 req/s and a
    mean output of 20 tokens, so output tokens/s = 2.0 x 20 = 40. It was the plan's (or the workload's) rate and
    lengths (a P/D plan of chat.yaml: 20 req/s and ~300-token outputs), and the header named that rate, or None
    (a text traceback) when only flags were given; the rate counted the stragglers `--requests` leaves out."""
    trace = _trace(tmp_path)
    what = ([*FLAGS, "--prompt-tokens", "100", "--output-tokens", "30"] if how == "flags"
            else ["--plan", str(_pd_plan(tmp_path))])
    res = CliRunner().invoke(app, ["simulate", *what, "--trace", str(trace), "--requests", "40", "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["requests"] == 40
    assert doc["rate_per_s"] == pytest.approx(2.0)
    assert doc["analytic"]["output_tokens_per_s"] == pytest.approx(40.0, rel=2e-3)
    text = CliRunner().invoke(app, ["simulate", *what, "--trace", str(trace), "--requests", "40", "-q", "--wide"])
    assert text.exit_code == 0, text.output
    assert "40 requests at 2 req/s" in text.stdout.splitlines()[0]


@pytest.fixture(scope="module")
def owned_plan():  # type: ignore[no-untyped-def]
    from recommender.offers import OwnedGpus
    from recommender.search import SearchSettings, recommend
    from recommender.workload import LengthDist, Slo, Workload

    w = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.constant(2000), output_tokens=LengthDist.constant(300),
                 arrival_rate_per_s=20.0, slos=(Slo("tpot", 0.03, "p90"),), name="own8b",
                 inventory=(OwnedGpus(gpu="h100-sxm", count=16),))
    return recommend(w, settings=SearchSettings(seed=0, verify=0, top=1, trials=40))


def test_the_report_bills_an_owned_pool_per_gpu_in_use(owned_plan) -> None:  # type: ignore[no-untyped-def]
    """docs/cli.md: owned GPUs without a price cost 1 per GPU-hour, for the GPUs in use. The walkthrough's Cost line
    read '1 x owned 8-GPU at $8.00/h = $2.00/h' (the node's GPUs at 1 each, then the 2 in use) and 'owned '', 8-GPU
    instances, ' for its source; the report never said the dollars are GPU-hours."""
    from recommender.render.report import render_report

    plan = owned_plan
    (pool,) = plan.top.pools
    assert pool.rental is not None and pool.rental.provider == "owned"
    gpus = pool.gpus
    page = render_report(plan)
    text = unescape(re.sub(r"<[^>]+>", "\n", page))
    cost = next(ln for ln in text.splitlines() if ln.strip().startswith("USD/hour"))
    assert f"$1.00/GPU-hour x {gpus} GPUs in use" in cost and cost.rstrip().endswith(f"= ${gpus * 1.0:,.2f}/h")
    source = next(ln for ln in text.splitlines() if ln.strip().startswith("price from"))
    assert "at $8.00/h" not in cost and "''" not in source
    assert source.split("price from", 1)[1].strip() == "owned GPUs: --inventory (no price: 1 per GPU-hour)"
    assert "$1 = 1 GPU-hour" in text  # the pricing note the text table's footer carries


BATCH_PLAN = ROOT / "examples" / "plans" / "batch-summarization.plan.json"


def _batch_plan() -> tuple[float, float]:
    """(the plan row's load utilisation, the rate it is at): the workload's, or the offline job's requests over its
    deadline (10,000,000 in 10 h = 277.8 req/s)."""
    plan = json.loads(BATCH_PLAN.read_text())
    w = plan["workload"]
    return plan["plans"][0]["load_utilisation"], w["arrival_rate_per_s"] or w["offline_requests"] / w["deadline_s"]


def _analytic_line(*args: str) -> str:
    res = CliRunner().invoke(app, ["simulate", "--plan", str(BATCH_PLAN), "-n", "1000", "-q", "--wide", *args])
    assert res.exit_code == 0, res.output
    return next(ln for ln in res.stdout.splitlines() if ln.startswith("analytic:"))


def test_another_rate_reports_the_utilisation_at_that_rate() -> None:
    """`--plan P --rate R` printed 'the plan's load utilisation 0.92', the plan's own rate's, as the run's. At 200 of
    the plan's 277.8 req/s the same pools are at 0.92 x 200 / 277.8 of their capacity (rate / capacity)."""
    util, rate = _batch_plan()
    rho = util * 200 / rate
    line = _analytic_line("--rate", "200")
    m = re.search(r"load utilisation \(rate / capacity\) ([0-9.]+) at 200 req/s", line)
    assert m is not None, line
    assert float(m.group(1)) == pytest.approx(rho, abs=0.015)
    assert f"the plan's {util:.2f} is at its own {rate:.3g} req/s" in line
    assert f"the plan's load utilisation (rate / capacity) {util:.2f}," not in line
    doc = json.loads(CliRunner().invoke(app, ["simulate", "--plan", str(BATCH_PLAN), "--rate", "200", "-n", "1000",
                                              "-q", "-f", "json"]).stdout)
    assert doc["load_utilisation"] == pytest.approx(rho, rel=0.02)
    assert doc["plan_load_utilisation"] == util and doc["plan_rate_per_s"] == pytest.approx(rate)


def test_at_the_plans_own_rate_the_plans_utilisation_is_the_runs() -> None:
    util, _ = _batch_plan()
    line = _analytic_line()
    assert f"the plan's load utilisation (rate / capacity) {util:.2f}," in line and " at its own " not in line
