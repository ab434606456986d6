"""The main job through the CLI: golden JSON for one example, every format, --emit, --plot, and the
error paths (one line on stderr, non-zero exit, never a traceback). Also: every command is documented
in the README (sqlite-utils style)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recommender.cli import app
from recommender.units import fmt_seconds

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "main" / "chat-golden.plan.json"
FAST = ["--trials", "60", "--verify", "0", "--seed", "3"]
VOLATILE = ("seconds", "evaluations_per_s", "trials")


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def _stable(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    for k in VOLATILE:
        doc["search"].pop(k, None)
    return doc


def _flat(doc: object, path: str = "") -> dict[str, object]:
    """Nested JSON -> {path: leaf}, so pytest.approx can compare floats inside lists and dicts."""
    if isinstance(doc, dict):
        return {k: v for key, val in doc.items() for k, v in _flat(val, f"{path}/{key}").items()}
    if isinstance(doc, list):
        return {k: v for i, val in enumerate(doc) for k, v in _flat(val, f"{path}/{i}").items()}
    return {path: doc}


TINY = str(Path(__file__).parent / "data" / "policies" / "tiny-search.yaml")
GOLDEN_WORKLOAD = str(Path(__file__).parent / "data" / "workloads" / "chat-golden.yaml")


def test_golden_plan_json_for_the_chat_example():
    # a tiny space the shape search completes (every configuration evaluated or pruned by its bounds),
    # so the golden depends on the model only
    res = run("--workload", GOLDEN_WORKLOAD, "--format", "json", "--policy", TINY, "--seed", "3")
    assert res.exit_code == 0, res.output
    got = _stable(json.loads(res.stdout))
    got["workload"]["source"] = "tests/data/workloads/chat-golden.yaml"
    assert got["search"]["search_complete"] and got["search"]["rank1_proven"], "the tiny space must be covered completely"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    # floats within 1e-6 relative: the numbers come from numpy/scipy, whose last bits differ across builds
    flat_got, flat_want = _flat(got), _flat(want)
    hint = "plan changed: if intended, regenerate with UPDATE_GOLDEN=1 pytest tests/test_cli_main.py"
    assert flat_got.keys() == flat_want.keys(), hint
    # numbers within 1e-6 relative, everything else (ids, names, flags) exactly; pytest >= 9.2's approx
    # refuses a relative tolerance on strings, so the two kinds are compared apart
    numeric = {k for k, v in flat_want.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert {k: flat_got[k] for k in numeric} == pytest.approx({k: flat_want[k] for k in numeric}, rel=1e-6), hint
    assert {k: flat_got[k] for k in flat_want.keys() - numeric} == {k: flat_want[k] for k in flat_want.keys() - numeric}, hint


def test_table_shows_ranked_rows_costs_and_why():
    res = run("--workload", str(ROOT / "examples" / "chat.yaml"), "--slo", "tpot=50ms", *FAST)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "TPOT p90" in out and "$/M tok" in out and "Rank 1" in out
    # the CLI SLO overrides the file's tpot=40ms for that metric and keeps its ttft=1s
    assert "tpot=50.00ms@p90" in out and "ttft=1.00s@p90" in out


@pytest.mark.parametrize("fmt", ["yaml", "csv"])
def test_other_formats_parse(fmt):
    res = run("--workload", str(ROOT / "examples" / "chat.yaml"), "--format", fmt, *FAST)
    assert res.exit_code == 0, res.output
    if fmt == "yaml":
        assert yaml.safe_load(res.stdout)["plans"][0]["rank"] == 1
    else:
        header, first = res.stdout.splitlines()[:2]
        assert header.startswith("rank,id,gpu,role") and first.startswith("1,")


def test_emit_writes_plan_and_deployment_files(tmp_path):
    out = tmp_path / "deploy"
    res = run("--workload", str(ROOT / "examples" / "rag.yaml"), "--emit", str(out), *FAST)
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["plans"][0]["rank"] == 1
    names = {p.name for p in out.iterdir()}
    assert any(n.endswith(".sh") for n in names) and any("k8s" in n for n in names) and "helm-values.yaml" in names


def test_plot_writes_a_self_contained_html_page(tmp_path):
    page = tmp_path / "front.html"
    res = run("--workload", str(ROOT / "examples" / "chat.yaml"), "--plot", str(page), *FAST)
    assert res.exit_code == 0, res.output
    text = page.read_text()
    assert text.lower().startswith("<!doctype html>") and 'id="pareto"' in text and "Plotly.newPlot" in text
    assert not re.search(r"<script[^>]+src=", text), "the chart page must not load scripts from anywhere"
    assert len(text) > 1_000_000                     # plotly's JS (several MB) is inlined, not linked


def _one_line_error(res, code_min: int = 1) -> str:
    assert res.exit_code >= code_min, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_missing_workload_file():
    assert "does not exist" in _one_line_error(run("--workload", "nope.yaml"))


def test_bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed\n")
    assert "not valid YAML" in _one_line_error(run("--workload", str(p)))


def test_bad_field_names_the_field(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("model: llama-3.1-8b\ntraffic: {arrival_rate: -3}\nprompt_tokens: 100\noutput_tokens: 10\n")
    assert "traffic.arrival_rate" in _one_line_error(run("--workload", str(p)))


def test_unknown_model_lists_valid_ids(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("model: llama-9\ntraffic: {arrival_rate: 1}\nprompt_tokens: 100\noutput_tokens: 10\n")
    line = _one_line_error(run("--workload", str(p)))
    assert "unknown model" in line and "llama-3.1-8b" in line


def test_malformed_slo():
    line = _one_line_error(run("--workload", str(ROOT / "examples" / "chat.yaml"), "--slo", "tpot<30ms"))
    assert "METRIC=LIMIT" in line


def test_impossible_slo_names_constraint_and_closest_plan():
    # 0.1 ms per output token is below any GPU's decode floor for an 8B model
    line = _one_line_error(run("--workload", str(ROOT / "examples" / "chat.yaml"), "--slo", "tpot=0.1ms", *FAST))
    assert "no plan meets" in line and "tpot" in line and "relax to" in line


def test_the_readme_cli_reference_is_the_commands_help():
    from recommender.cli.reference import reference

    page = (ROOT / "docs" / "cli-reference.md").read_text()
    assert reference() in page, ("docs/cli-reference.md is stale: regenerate it with "
                                 "`python3 -m recommender.cli.reference --write docs/cli-reference.md`")
    for opt in ("--workload", "--emit", "--bench", "--held-out-by", "--no-chunked-prefill", "--full"):
        assert f"`{opt}`" in reference()


def test_every_command_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    names = sorted({(c.name or c.callback.__name__).replace("_", "-") for c in app.registered_commands})
    assert names, "no commands registered"
    for name in names:
        assert re.search(rf"recommend {re.escape(name)}\b", readme), f"README does not document `recommend {name}`"


def test_infeasible_because_of_max_gpus_says_so() -> None:
    # the aiconfigurator side-by-side problem (benchmarks/workloads/aic-70b-h200.yaml): the closest plan meets
    # both mean SLOs but only on more GPUs than max_gpus 8; the message used to say the SLOs clash
    res = run("--workload", str(ROOT / "benchmarks" / "workloads" / "aic-70b-h200.yaml"),
              "--policy", str(ROOT / "benchmarks" / "policies" / "bf16-only.yaml"), "--verify", "0")
    assert res.exit_code == 4
    line = res.stderr.strip()
    assert "meets them" in line and "above max_gpus 8" in line and "not together" not in line, line


def test_a_model_no_offer_can_hold_says_so() -> None:
    # catalogs/gpus/mi300x.yaml: the one MI300X offer is a 1-GPU instance (DigitalOcean), and Llama-3.1-405B
    # needs TP >= 4 on 192 GB GPUs (405 GB of fp8 weights): no TP group can be rented. The message used to say
    # "every candidate saturates" (before the bounds skipped unrentable shapes) or "does not fit" (after).
    res = run("--model", "llama-3.1-405b", "--gpus", "mi300x", "--rate", "1", "--prompt-tokens", "1000",
              "--output-tokens", "100", "--verify", "0")
    assert res.exit_code == 4
    # it names the smallest TP group that holds the weights (TP4: 101 GB of fp8 per GPU; it named TP8, the largest)
    assert "no plan can be rented: no offer for mi300x holds a TP4 group" in res.stderr, res.stderr


def test_each_way_out_of_no_rentable_plan_gives_a_plan(tmp_path: Path) -> None:
    """The refusal names three ways out that need no catalog edit; each one plans 405B on MI300X (TP >= 4)."""
    flags = ("--gpus", "mi300x", "--rate", "1", "--prompt-tokens", "1000", "--output-tokens", "100", "--verify", "0")
    res = run("--model", "llama-3.1-405b", *flags)
    assert ('price mi300x per GPU-hour (--price mi300x=$X/h, or prices: {mi300x: "$X/h"} in the workload)'
            in res.stderr), res.stderr
    assert "--inventory mi300x=N" in res.stderr
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-405b\ntraffic: {arrival_rate: 1}\nprompt_tokens: {dist: constant, value: 1000}\n"
                  "output_tokens: {dist: constant, value: 100}\ngpus: [mi300x]\nprices: {mi300x: \"$2.59/h\"}\n")
    for args in (("--workload", str(wl), "--verify", "0", "--format", "json"),
                 ("--model", "llama-3.1-405b", *flags, "--price", "mi300x=$2.59/h", "--format", "json"),
                 ("--model", "llama-3.1-405b", *flags, "--inventory", "mi300x=8", "--format", "json")):
        res = run(*args)
        assert res.exit_code == 0, res.stderr
        (pool,) = json.loads(res.stdout)["plans"][0]["pools"]
        assert pool["gpu"] == "mi300x" and pool["tp"] >= 4  # 405 GB of fp8 weights over 192 GB GPUs


def test_price_flag_prices_a_gpu_without_an_offer_and_joins_the_files_prices(tmp_path: Path) -> None:
    """catalogs/gpus/mi355x.yaml has no dated offer (offers: []): --price gives it one, billed per GPU; over a
    workload file the flag wins for its GPU and the file's other prices stay."""
    flags = ("--model", "llama-3.1-8b", "--gpus", "mi355x", "--rate", "2", "--prompt-tokens", "500",
             "--output-tokens", "100", "--verify", "0", "--trials", "40")
    res = run(*flags)
    assert res.exit_code != 0 and "--price mi355x=$X/h" in res.stderr, res.stderr
    for price in ("MI355X=$3.00/h", "3"):  # one --gpus: a bare price is that GPU's, as estimate --price
        res = run(*flags, "--price", price, "--format", "json")
        assert res.exit_code == 0, res.stderr
        top = json.loads(res.stdout)["plans"][0]
        gpus = sum(p["tp"] * p["replicas"] for p in top["pools"])
        assert top["usd_per_hour"] == pytest.approx(3.00 * gpus)  # $3.00 per GPU-hour, per GPU in use
        # every GPU priced by the workload: the footer names those prices (it read "among 0 providers (; ...)")
        assert json.loads(res.stdout)["search"]["pricing"] == ("the workload's own prices only (--price / prices:, "
                                                               "billed per GPU): mi355x $3.00/GPU-hour")
    res = run(*flags[:2], "--gpus", "mi355x,h100", *flags[4:], "--price", "3")  # two GPUs: which one?
    assert res.exit_code != 0 and "give GPU=$PRICE/h" in res.stderr, res.stderr
    from recommender.workload import load_workload, parse_price_flag, workload_from_flags

    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\ntraffic: {arrival_rate: 1}\nprompt_tokens: 500\noutput_tokens: 100\n"
                  "prices: {h100: \"$2.00/h\", l4: 0.5}\n")
    w = workload_from_flags(load_workload(str(wl)), prices=parse_price_flag("h100-sxm=$2.50/h,mi355x=3"))
    assert w.usd_per_gpu_hour_overrides == {"h100-sxm": 2.50, "l4": 0.5, "mi355x": 3.0}
    for bad in ("mi355x", "mi355x=", "nosuchgpu=$1/h", "mi355x=$0/h", "mi355x=1,mi355x=2"):
        res = run(*flags, "--price", bad)
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code != 0 and len(err) == 1 and err[0].startswith("error: ") and "--price" in err[0], (bad, res.stderr)


def test_a_tie_without_slos_compares_the_ranks_latencies() -> None:
    """Two ranks at one cost with no SLOs: the why-line compares their TTFT and TPOT p90 (it said "same latencies"
    where rank 2's TPOT was 12.24 ms against 11.86 ms)."""
    res = run("--model", "deepseek-r1", "--rate", "1", "--prompt-tokens", "2k", "--output-tokens", "500",
              "--inventory", "h100-sxm=16@$2.00/h", "--inventory-network", "infiniband=400", "--verify", "0", "-f", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    a, b = doc["plans"][:2]
    assert a["usd_per_million_tokens"] == pytest.approx(b["usd_per_million_tokens"], rel=0.005)
    assert "same latencies" not in doc["why"]
    assert f"tpot {fmt_seconds(a['tpot_s'])} vs {fmt_seconds(b['tpot_s'])}" in doc["why"]


def test_an_infeasible_job_names_the_check_its_closest_plan_fails() -> None:
    """DeepSeek-R1 with 32k + 2k-token requests on RunPod's GPUs, no SLOs: every plan's KV cache peaks above the 85%
    cap (policies/search.yaml max_utilisation) whatever its replicas. The error said 'within max_gpus=None' and
    'the closest ... at utilisation 0.07; raise max_gpus or the deadline' (an online job has no deadline)."""
    res = run("-m", "deepseek-r1", "--rate", "1", "--prompt-tokens", "32k", "--output-tokens", "2k", "--provider",
              "runpod", "-q")
    assert res.exit_code == 4 and res.stdout == ""
    err = res.stderr.strip()
    assert "\n" not in err and "max_gpus=None" not in err and "deadline" not in err
    assert "within max_replicas=256" in err and "its KV cache peaks at" in err and "of capacity (> 85%)" in err
    res = run("-m", "llama-3.1-70b", "--rate", "20", "--prompt-tokens", "2k", "--output-tokens", "64", "--gpus", "a10g",
              "--slo", "tpot=30ms", "-q")
    assert res.exit_code == 4
    assert "meets them at the workload's rate" in res.stderr and "; or allow more GPU types than a10g" in res.stderr
