"""Issue 27 item 6: one form for each kind of value, and mistakes named before any work starts.

Durations with units on the main job (as ``replan`` takes them), token counts with k/M on ``estimate``, YAML
errors with line, column and the closest valid key, output paths probed before the search, typer's shell
completion, metavars that name the value, and a progress bar that ends full with phases for verification."""

from __future__ import annotations

import re

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from typer.testing import CliRunner

from recommender import progress
from recommender.cli import app

QUICK = ["-m", "llama-3.1-8b", "--gpus", "h100", "--rate", "2", "--prompt-tokens", "1000", "--output-tokens", "100"]


def run(*args: str, **env: str) -> Any:
    res = CliRunner().invoke(app, list(args), env=env or None, prog_name="recommend")
    assert "Traceback" not in res.output
    return res


def test_main_job_timeout_takes_a_unit() -> None:
    res = run(*QUICK, "--trials", "10", "--verify", "0", "--timeout", "5s", "-f", "json", "-q")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["search"]["timeout_s"] == 5.0
    res = run(*QUICK, "--timeout", "2min", "--trials", "10", "--verify", "0", "-f", "json", "-q")
    assert json.loads(res.stdout)["search"]["timeout_s"] == 120.0
    bad = run(*QUICK, "--timeout", "5q")
    assert bad.exit_code == 2 and "--timeout" in bad.stderr and "unknown time unit" in bad.stderr


def test_estimate_token_counts_take_k_and_m() -> None:
    base = ["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-f", "json"]
    with_k = run(*base, "--prompt-tokens", "8k", "--output-tokens", "1k")
    plain = run(*base, "--prompt-tokens", "8000", "--output-tokens", "1000")
    assert with_k.exit_code == plain.exit_code == 0, with_k.output
    assert json.loads(with_k.stdout) == json.loads(plain.stdout)  # 8k is 8000 (decimal, as vLLM reads it)
    assert run(*base, "--prompt-tokens", "8q").exit_code == 2


def test_workload_yaml_errors_give_line_column_and_the_closest_key(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text("model: llama-3.1-8b\ntraffic: {arival_rate: 3}\nprompt_tokens: 1000\noutput_tokens: 100\n")
    res = run("-w", str(f), "-q")
    # 'traffic: {' is 10 characters: the misspelt key starts in column 11 of line 2
    assert res.exit_code == 2 and f"{f} line 2, column 11: field 'traffic.arival_rate': unknown key; " \
        "did you mean 'arrival_rate'?" in res.stderr
    f.write_text("model: llama-3.1-8b\ntraffic: {arrival_rate: 3}\nprompt_tokens: 1000\noutput_tokens: 100\nslos: [tpot=1s]\n")
    assert "line 5, column 1: field 'slos': unknown key; did you mean 'slo'?" in run("-w", str(f), "-q").stderr
    f.write_text("model: llama-3.1-8b\narrival_rate: 3\n")  # a key one level too high: named with its parent
    assert "did you mean 'traffic.arrival_rate'?" in run("-w", str(f), "-q").stderr
    f.write_text("model: llama-3.1-8b\n  x: [1\n")
    assert "is not valid YAML (line 2, column 4)" in run("-w", str(f), "-q").stderr


def test_search_policy_typo_names_the_key(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("trails: 5\n")
    res = run(*QUICK, "--policy", str(pol), "-q")
    assert res.exit_code == 2 and "line 1, column 1: field 'trails': unknown key; did you mean 'trials'?" in res.stderr


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (a file system nobody can create files in)")
@pytest.mark.parametrize("flag,path", [("--report", "/proc/x.html"), ("--plot", "/proc/x.html"), ("--emit", "/proc/xdir")])
def test_unwritable_outputs_are_refused_before_the_search(monkeypatch: pytest.MonkeyPatch, flag: str, path: str) -> None:
    import recommender.search as search

    def no_search(*a: Any, **k: Any) -> Any:
        raise AssertionError("the search ran before the output path was checked")

    monkeypatch.setattr(search, "recommend", no_search)
    res = run(*QUICK, flag, path, "-q")
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {flag} {path}: ") and ".tmp" not in res.stderr


def test_shell_completion_completes_commands_and_options() -> None:
    def complete(words: str, cword: int) -> str:
        return str(run(_RECOMMEND_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword)).stdout)

    assert complete("recommend est", 1).split() == ["estimate"]
    assert complete("recommend estimate --prompt", 2).split() == ["--prompt-tokens"]
    assert "--install-completion" in run("--help").stdout


def test_metavars_name_the_value() -> None:
    helps = {c: run(*([c] if c else []), "--help").stdout for c in
             ("", "estimate", "simulate", "deploy", "replan", "history", "calibrate", "models", "gpus")}
    for cmd, text in helps.items():
        # no typer metavars like '<str>' or '{plan}' (a JSON example such as '{"method": "mtp"}' is help text)
        assert "<str>" not in text and "<int>" not in text and "<float>" not in text, cmd
        assert not re.search(r"\{[a-z_]+\}", text), cmd
    assert "--gpus GPU,..." in helps[""] and "--workload FILE" in helps[""] and "--top N" in helps[""]
    assert "--gpu GPU" in helps["estimate"] and "--prompt-tokens TOKENS" in helps["estimate"]
    assert "Usage: recommend deploy [OPTIONS] PLAN.json" in helps["deploy"]
    assert "(0.33 default 0.92)" not in helps["estimate"]


def test_progress_bar_ends_full_and_verification_has_its_own_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    bars: list[dict[str, Any]] = []

    class Bar:
        def __init__(self, total: float | None) -> None:
            self.total, self.n = total, 0.0

        def update(self, n: float = 1) -> None:
            self.n += n

        def refresh(self) -> None:
            pass

    @contextmanager
    def bar(description: str, *, total: float | None = None, unit: str = "it") -> Iterator[Bar]:
        b = Bar(total)
        yield b
        bars.append({"what": description, "total": b.total, "n": b.n})

    monkeypatch.setattr(progress, "bar", bar)
    res = run(*QUICK, "--verify", "1", "-q")
    assert res.exit_code == 0, res.output
    search = [b for b in bars if b["what"] == "search"]
    assert len(search) == 1 and search[0]["n"] == search[0]["total"] > 0
    assert [b for b in bars if b["what"] == "verify top 1 in the simulator"] == [
        {"what": "verify top 1 in the simulator", "total": 1, "n": 1}]


def test_a_profile_parameter_typo_names_the_closest_parameter(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text("engine: vllm\nparameters:\n  hbm_bandwith_efficiency: 0.7\n")
    res = run("estimate", "-m", "llama-3.1-8b", "-g", "h100", "--prompt-tokens", "1k", "--output-tokens", "100",
              "--profile", str(prof))
    assert res.exit_code == 2 and "did you mean 'hbm_bandwidth_efficiency'?" in res.stderr


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_calibrate_and_simulate_outputs_are_checked_before_the_work() -> None:
    bench = Path(__file__).resolve().parent / "data" / "bench" / "vllm-8b-c1-in1024-out128.json"
    res = run("calibrate", str(bench), "--out", "/proc/p.yaml", "-q")
    assert res.exit_code == 2 and res.stderr.startswith("error: --out /proc/p.yaml: cannot write in /proc")
    plan = Path(__file__).resolve().parent.parent / "examples" / "plans" / "chat.plan.json"
    res = run("simulate", "--plan", str(plan), "--timeseries", "/proc/t.csv", "-n", "100", "-q")
    assert res.exit_code == 2 and res.stderr.startswith("error: --timeseries /proc/t.csv: cannot write in /proc")


@pytest.mark.parametrize(("args", "line"), [
    (["--bogus"], "error: No such option: --bogus (Possible options: --gpus); see 'recommend -h'"),
    (["nosuchcmd"], "error: No such command 'nosuchcmd'; see 'recommend -h'"),
    (["calibrate", "x.json"], "error: Missing option '--out' / '-o'; see 'recommend calibrate -h'"),
    (["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "extra"],
     "error: Got unexpected extra argument(s) (extra); see 'recommend estimate -h'"),
    (["simulate", "-dp", "8"], "error: No such option: -d; see 'recommend simulate -h'"),
])
def test_a_usage_mistake_is_one_line_naming_the_commands_help(args: list[str], line: str) -> None:
    """Click's usage box (Usage: / Try ... / Error: ...) was four lines; every other mistake is one."""
    res = run(*args)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == line + "\n"


@pytest.mark.parametrize("cmd", ["gpus", "models"])
def test_the_catalog_commands_take_wide_as_every_command_does(cmd: str) -> None:
    narrow, wide = run(cmd, COLUMNS="60"), run(cmd, "--wide", COLUMNS="60")
    assert narrow.exit_code == wide.exit_code == 0, wide.output
    assert max(map(len, wide.stdout.splitlines())) > max(map(len, narrow.stdout.splitlines()))
    assert wide.stdout == run("--wide", cmd, COLUMNS="60").stdout
