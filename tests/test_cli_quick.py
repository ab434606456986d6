"""The main job without a file (quick flags), flags over a file, strict SLO units, every option checked before
the search starts, and the table fitted to the terminal width."""

from __future__ import annotations

import re

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import recommender.search
from recommender.cli import app

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--trials", "40", "--verify", "0", "--seed", "3"]
QUICK = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpus", "h100,H200", "--rate", "5",
         "--prompt-tokens", "2000", "--output-tokens", "300", "--slo", "tpot=30ms"]


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def one_line_error(res) -> str:
    assert res.exit_code != 0, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_quick_flags_plan_without_a_file() -> None:
    res = run(*QUICK, *FAST, "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    wl = doc["workload"]
    assert wl["model"] == "llama-3.1-8b" and wl["hf_repo"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert wl["arrival_rate_per_s"] == 5.0
    assert wl["prompt_tokens"]["p99"] == 2000 and wl["output_tokens"]["p99"] == 300
    assert wl["max_model_len"] == 2300                           # 2000 prompt + 300 output tokens
    assert doc["slo"] == [{"metric": "tpot", "limit_s": 0.03, "percentile": "p90"}]
    gpus = {p["gpu"] for plan in doc["plans"] for p in plan["pools"]}
    assert gpus and gpus <= {"h100-sxm", "h200"}                # aliases resolved; nothing else allowed
    assert all(plan["tpot_s"] <= 0.03 for plan in doc["plans"])


def test_flags_override_the_file_and_the_rest_of_the_file_stays() -> None:
    res = run("--workload", str(ROOT / "examples" / "chat.yaml"), "--rate", "3", "--gpus", "h100", *FAST,
              "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["workload"]["arrival_rate_per_s"] == 3.0 and doc["workload"]["name"] == "chat"
    assert {p["gpu"] for plan in doc["plans"] for p in plan["pools"]} == {"h100-sxm"}
    ref = json.loads(run("--workload", str(ROOT / "examples" / "chat.yaml"), *FAST, "--format", "json").stdout)
    assert doc["workload"]["prompt_tokens"] == ref["workload"]["prompt_tokens"]   # not overridden: the file's


def test_quick_flags_say_what_is_missing() -> None:
    line = one_line_error(run("--model", "llama-3.1-8b", "--rate", "2"))
    assert "--prompt-tokens" in line and "--output-tokens" in line and "missing" in line


@pytest.mark.parametrize("slo", ["tpot=30", "ttft=0.5", "e2e=20@p99"])
def test_an_slo_without_a_unit_is_an_error_that_shows_the_accepted_forms(slo: str) -> None:
    line = one_line_error(run(*QUICK[:-2], "--slo", slo))
    assert "needs a time unit" in line and "=30ms" in line and "@p99" in line


def test_an_slo_without_a_unit_in_a_file_is_an_error_too(tmp_path: Path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text("model: llama-3.1-8b\ntraffic: {arrival_rate: 1}\nprompt_tokens: 100\noutput_tokens: 10\nslo: [tpot=30]\n")
    assert "needs a time unit" in one_line_error(run("--workload", str(p)))


def _no_search(*a, **k):
    raise AssertionError("the search ran before the options were checked")


@pytest.mark.parametrize("extra, words", [
    (["--workers", "2"], ("--workers 2 needs --storage",)),
    (["--plot", "chart.pdf"], ("--plot", ".html")),
    (["--plot", "chart.png"], ("kaleido",)),
    (["--report", "page.txt"], ("--report", ".html")),
    (["--report", "/nonexistent-dir/x/page.html"], ("does not exist",)),
    (["--format", "xml"], ("--format",)),
    (["--gpus", "h999"], ("unknown GPU 'h999'",)),
    (["--model", "someorg/unknown-model"], ("not in the catalog",)),
    (["--top", "0"], ("--top 0",)),
])
def test_options_are_checked_before_the_search(monkeypatch, extra: list[str], words: tuple[str, ...]) -> None:
    monkeypatch.setattr(recommender.search, "recommend", _no_search)
    if "kaleido" in words and __import__("importlib").util.find_spec("kaleido") is not None:
        pytest.skip("kaleido is installed here: .png export is allowed")
    args = list(QUICK)
    for flag in ("--gpus", "--model"):
        if flag in extra:                    # the extra replaces the quick flag's value
            i = args.index(flag)
            del args[i:i + 2]
    line = one_line_error(run(*args, *extra))
    for w in words:
        assert w in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_an_unwritable_output_folder_fails_before_the_search(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(recommender.search, "recommend", _no_search)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    assert "not writable" in one_line_error(run(*QUICK, "--report", str(ro / "r.html")))


def test_table_fits_80_columns_and_wide_shows_every_column() -> None:
    narrow = run("--workload", str(ROOT / "examples" / "rag.yaml"), *FAST, env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert max(len(ln) for ln in narrow.stdout.splitlines()) <= 80
    for col in ("rank", "deployment", "GPUs", "TTFT p90", "TPOT p90", "$/M tok"):
        assert col in narrow.stdout
    assert "--wide shows all" in narrow.stdout
    wide = run("--workload", str(ROOT / "examples" / "rag.yaml"), *FAST, "--wide", env={"COLUMNS": "80"})
    hidden = re.search(r"columns hidden to fit 80 columns \((.*?)\); --wide", " ".join(narrow.stdout.split())).group(1)
    assert {"replicas", "TP", "max seqs", "chunk", "out tok/s", "$/hour", "$/M out"} <= set(hidden.split(", "))
    narrow_header = re.split(r"\s{2,}", narrow.stdout.split("\n\n")[1].splitlines()[0].strip())
    wide_header = re.split(r"\s{2,}", wide.stdout.split("\n\n")[1].splitlines()[0].strip())
    for col in hidden.split(", "):
        assert col in wide_header and col not in narrow_header, col
    piped = run("--workload", str(ROOT / "examples" / "rag.yaml"), *FAST)     # no terminal, no COLUMNS: all columns
    assert piped.stdout.split("\n\n")[1] == wide.stdout.split("\n\n")[1]


def test_a_pd_table_with_twin_dtypes_drops_weights_last_and_says_when_the_rest_is_still_wider() -> None:
    """rag at tpot=30ms ranks P/D plans whose weights/KV cells hold twins ('fp8/fp8 | int8/fp8'): at 80 columns the
    table was 88 wide under a footer saying it fitted 80. weights/KV is the last column dropped; at 60 columns the
    essential ones still need 68, and the footer says so instead of 'to fit 60 columns'."""
    args = ("--workload", str(ROOT / "examples" / "rag.yaml"), "--slo", "tpot=30ms", "-q", "--verify", "0")
    at80 = run(*args, env={"COLUMNS": "80"})
    assert at80.exit_code == 0, at80.output
    assert max(len(ln) for ln in at80.stdout.splitlines()) <= 80
    flat = " ".join(at80.stdout.split())
    assert "columns hidden to fit 80 columns" in flat and "binding, weights/KV); --wide" in flat
    at60 = " ".join(run(*args, env={"COLUMNS": "60"}).stdout.split())
    need = re.search(r"13 columns hidden \(the rest need (\d+) of 60 columns\)", at60)
    assert need is not None and int(need.group(1)) > 60, at60


def test_help_fits_80_columns_without_truncated_option_names() -> None:
    for cmd in ([], ["estimate"], ["simulate"], ["deploy"], ["models"]):
        res = run(*cmd, "-h", env={"COLUMNS": "80"})
        assert res.exit_code == 0
        assert max(len(ln) for ln in res.stdout.splitlines()) <= 80, cmd
        assert "…" not in res.stdout
    assert "--gpu-memory-utilization" in run("estimate", "-h", env={"COLUMNS": "80"}).stdout


def test_csv_has_one_row_per_pool() -> None:
    # long prompts, short outputs on H100 only: at 0.5 req/s of 8k-token prompts rank 1 is prefill/decode
    # disaggregated on one instance (more traffic needs two instances, whose KV would cross RunPod's Ethernet)
    args = ["--model", "llama-3.1-70b", "--gpus", "h100", "--rate", "0.5", "--prompt-tokens", "8000",
            "--output-tokens", "300", "--slo", "tpot=30ms", *FAST]
    res = run(*args, "--format", "csv")
    ref = json.loads(run(*args, "--format", "json").stdout)
    assert res.exit_code == 0, res.output
    assert any(p["disaggregated"] for p in ref["plans"])
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(rows) == sum(len(p["pools"]) for p in ref["plans"])
    for plan in ref["plans"]:
        mine = [r for r in rows if r["rank"] == str(plan["rank"])]
        assert [r["role"] for r in mine] == [p["role"] for p in plan["pools"]]
        assert [r["gpu"] for r in mine] == [p["gpu"] for p in plan["pools"]]
        assert sum(int(r["pool_gpus"]) for r in mine) == plan["gpus_total"]


def test_csv_booleans_are_lowercase_and_there_is_no_trailing_blank_line() -> None:
    res = run("--model", "llama-3.1-8b", "--gpus", "h100", "--rate", "2", "--prompt-tokens", "1000",
              "--output-tokens", "100", *FAST, "--format", "csv")
    assert res.exit_code == 0, res.output
    assert res.stdout.endswith("\n") and not res.stdout.endswith("\n\n")
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    for col in ("chunked_prefill", "enable_prefix_caching", "pareto"):
        assert {r[col] for r in rows} <= {"true", "false"}, col


def test_version_prints_the_package_version() -> None:
    from recommender import __version__

    res = run("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"recommend {__version__}"


def test_a_comma_separated_slo_list_is_two_slos() -> None:
    args = ["--model", "llama-3.1-8b", "--gpus", "h100", "--rate", "2", "--prompt-tokens", "1000",
            "--output-tokens", "100", *FAST, "--format", "json"]
    listed = json.loads(run(*args, "--slo", "ttft=500ms,tpot=30ms").stdout)
    repeated = json.loads(run(*args, "--slo", "ttft=500ms", "--slo", "tpot=30ms").stdout)
    assert listed["slo"] == repeated["slo"] and len(listed["slo"]) == 2
