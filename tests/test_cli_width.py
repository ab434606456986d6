"""Issue 27 item 5: at ``COLUMNS=80`` no line of any command's text output is longer than 80, and ``--wide``
keeps lines whole. Each command runs in-process (typer's CliRunner) on the shipped examples."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.render.table import fit_rows, fit_text

ROOT = Path(__file__).resolve().parent.parent
CHAT_PLAN = ROOT / "examples" / "plans" / "chat.plan.json"
BENCH = ROOT / "tests" / "data" / "bench"
WIDTH = 80


def run(*args: str, columns: int = WIDTH) -> str:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert res.exit_code in (0, 10), res.output
    assert "Traceback" not in res.output
    return res.stdout


def too_long(text: str, width: int = WIDTH) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


def request_log(path: Path, rate: float, seconds: float) -> Path:
    end = time.time()
    with path.open("w") as f:
        for i in range(int(rate * seconds)):
            f.write(json.dumps({"timestamp": end - seconds + (i + 0.5) / rate, "prompt_tokens": 1000,
                                "output_tokens": 200}) + "\n")
    return path


def test_every_command_fits_80_columns(tmp_path: Path) -> None:
    outputs = {
        "main job": run("-m", "llama-3.1-8b", "--rate", "5", "--prompt-tokens", "2k", "--output-tokens", "200",
                        "--trials", "30", "--verify", "0", "-q"),
        "estimate": run("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--prompt-tokens", "2000",
                        "--output-tokens", "200", "--rate", "4"),
        "estimate --bench": run("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--bench", "--num-prompts", "50"),
        "simulate": run("simulate", "--plan", str(CHAT_PLAN), "-n", "200", "-q"),
        "models": run("models"),
        "gpus": run("gpus"),
    }
    deep = tmp_path / ("a-folder-name-long-enough-that-every-written-path-is-wider-than-eighty-columns" + "x" * 10)
    outputs["deploy listing"] = run("deploy", str(CHAT_PLAN), "--out", str(deep))
    log = request_log(tmp_path / "requests.jsonl", rate=20.0, seconds=120)  # inside the plan's band: no search
    db = tmp_path / "history.db"
    outputs["replan"] = run("replan", "--current", str(CHAT_PLAN), "--traffic", str(log), "--storage", str(db))
    outputs["history"] = run("history", "--storage", str(db))
    files = [str(shutil.copy(BENCH / n, tmp_path / n)) for n in
             ("vllm-8b-c1-in1024-out128.json", "vllm-8b-rate4-in512-out512.json")]
    outputs["calibrate"] = run("calibrate", *files, "--out", str(tmp_path / "p.yaml"), "-q",
                               "--parameters", "hbm_bandwidth_efficiency,compute_efficiency")
    for name, text in outputs.items():
        assert text.strip(), name
        assert too_long(text) == [], f"{name}: {too_long(text)}"
    # the unfitted outputs had lines over 80 (the test would catch a command that stopped fitting)
    assert too_long(run("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--prompt-tokens", "2000",
                        "--output-tokens", "200", "--wide"))
    assert too_long(run("--wide", "history", "--storage", str(db)))
    # a long --out folder is named once and the files listed under it
    assert "  vllm-serve.sh" in outputs["deploy listing"].splitlines()


def test_estimate_formula_lines_keep_label_and_value_together() -> None:
    line = "  KV cache           budget - weights - activations - runtime - graphs" + " " * 20 + "= 55.3 GB per GPU"
    assert fit_text(line, 60).splitlines() == ["  KV cache           = 55.3 GB per GPU",
                                               "      budget - weights - activations - runtime - graphs"]


def test_a_wide_table_wraps_its_prose_column_then_drops_columns() -> None:
    rows = [["2026-01-01 00:00:00", "unchanged", "1.99", "a reason " * 10]]
    text, dropped = fit_rows(["time", "decision", "USD/h", "reason"], rows, width=60)
    assert dropped == [] and max(map(len, text.splitlines())) <= 60
    assert " ".join(text.split()).count("reason") == 11  # header + the ten words: nothing cut
    text, dropped = fit_rows(["time", "decision", "USD/h", "reason"], rows, width=40, drop_order=["decision"])
    assert dropped[0] == "decision" and max(map(len, text.splitlines())) <= 40
    # a table fitted after the fact keeps every cell of the rows it keeps
    table = ("| parameter   | start    | fitted   | note                           |\n"
             "|-------------|----------|----------|--------------------------------|\n"
             "| step_s      | 1.165 ms | 1.165 ms | unconstrained: kept at start   |")
    fitted = fit_text(table, 50)
    assert max(map(len, fitted.splitlines())) <= 50 and "1.165 ms" in fitted


@pytest.mark.parametrize("width", [60, 100])
def test_prose_wraps_under_its_second_column(width: int) -> None:
    line = "observed   " + "word " * 40
    out = fit_text(line, width).splitlines()
    assert all(len(x) <= width for x in out) and all(x.startswith(" " * 11) for x in out[1:])


def test_simulate_hides_percentiles_from_p95_and_names_them() -> None:
    """At 60 and 40 columns the latency table lost p95 / p99 with nothing said (only mean and p50 were left at 40,
    without the p90 the SLOs use). Now p95 goes first and p90 last, and a line names what is hidden."""
    args = ("simulate", "--plan", str(CHAT_PLAN), "-n", "200", "-q")
    at60, at40 = run(*args, columns=60), run(*args, columns=40)
    assert max(map(len, at60.splitlines())) <= 60 and max(map(len, at40.splitlines())) <= 40
    head60 = next(ln for ln in at60.splitlines() if ln.strip().startswith("mean") or " p90" in ln)
    assert "p90" in head60 and "p95" not in head60
    assert "p95 hidden to fit 60 columns" in at60
    assert "p90" in at40 and "p95, mean" in " ".join(at40.split()) and "hidden to fit 40 columns" in " ".join(at40.split())


def test_simulate_says_unbounded_where_the_analytic_model_saturates() -> None:
    out = run("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1000", "-n", "300",
              "--prompt-tokens", "2k", "--output-tokens", "200", "-q", columns=200)
    assert "analytic: unstable, mean running unbounded" in out and "None" not in out
    assert "TTFT  analytic   unbounded" in out and " inf " not in out


def test_simulate_plan_runs_a_summary_only_plan_whose_lengths_are_constant() -> None:
    """tests/data/plans/pd-h100-one-instance.plan.json predates the echo's distribution parameters, but its prompt and
    output are one length each (min = max = 6,000 and 200): simulate --plan runs them instead of asking for the
    workload file."""
    out = run("simulate", "--plan", str(ROOT / "tests" / "data" / "plans" / "pd-h100-one-instance.plan.json"), "-n", "200",
              "-q", columns=200)
    assert "TTFT  simulated" in out and "E2E   analytic" in out
