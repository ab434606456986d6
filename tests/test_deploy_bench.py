"""``deploy --format bench``: the vllm bench serve runs that check a plan (round-3 issue #27 item 8).

Checked by real consumers: every flag against vLLM 0.33's ``vllm bench serve`` flag table
(tests/data/vllm/bench-serve-flags.json, copied from shared/reference/vllm), the script by ``bash -n`` and
``dash -n`` and by running it with stand-in ``vllm`` / ``recommend`` programs that record their argv, and the
``calibrate`` line by this project's own ``calibrate`` command parser.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from recommender.deploy import render_deploy
from recommender.deploy.bench import num_prompts, range_ratio
from recommender.plan import LengthSummary, load_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "examples" / "plans").glob("*.plan.json")) + sorted((ROOT / "tests/data/plans").glob("*.json"))
BENCH_FLAGS = json.loads((ROOT / "tests/data/vllm/bench-serve-flags.json").read_text(encoding="utf-8"))["flags"]
FLAG_TABLE = {name: f for f in BENCH_FLAGS for name in f["flags"]}


def test_range_ratio_matches_the_p90_by_hand() -> None:
    # uniform on [m (1 - r), m (1 + r)] has p90 = m (1 + 0.8 r): mean 1000, p90 1400 -> r = 0.4 / 0.8 = 0.5
    assert range_ratio(LengthSummary(dist="lognormal", mean=1000, p90=1400)) == pytest.approx(0.5)
    assert range_ratio(LengthSummary(dist="constant", mean=500, p90=500)) == 0.0
    assert range_ratio(LengthSummary(dist="lognormal", mean=100, p90=1000)) == 0.95   # clipped below 1
    assert range_ratio(None) == 0.0


def test_prompt_count_is_five_minutes_of_traffic_within_bounds() -> None:
    assert num_prompts(4.0, None) == 1200          # 4 req/s x 300 s
    assert num_prompts(0.1, None) == 200 and num_prompts(100.0, None) == 5000
    assert num_prompts(None, 640) == 640           # offline: the job's requests, at once


def _groups(script: str, head: str) -> list[list[str]]:
    """Flag groups of each ``head`` command in the script (continuation lines joined, words shell-split)."""
    import shlex

    joined = script.replace("\\\n", " ")
    return [shlex.split(line)[len(head.split()):] for line in joined.splitlines() if line.startswith(head + " ")]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_every_bench_flag_is_in_vllm_0_33s_table(path: Path) -> None:
    script = render_deploy(load_plan(path), formats="bench")["bench.sh"]
    runs = _groups(script, "vllm bench serve")
    assert runs
    for argv in runs:
        i = 0
        while i < len(argv):
            flag = argv[i]
            assert flag in FLAG_TABLE, flag
            nargs = FLAG_TABLE[flag]["nargs"]
            n = 0 if nargs == 0 else 1
            if n:
                value = argv[i + 1]
                choices = FLAG_TABLE[flag]["choices"]
                assert choices is None or value in choices, (flag, value)
            i += 1 + n


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_bench_script_parses(path: Path, shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI: {shell} must be installed")
        pytest.skip(f"no {shell} here")
    script = tmp_path / "bench.sh"
    script.write_text(render_deploy(load_plan(path), formats="bench")["bench.sh"], encoding="utf-8")
    res = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_running_the_script_sends_the_plans_rates(path: Path, tmp_path: Path) -> None:
    """Stand-in ``vllm`` and ``recommend`` on PATH record their argv; the runs carry the plan's rate and lengths."""
    plan = load_plan(path)
    (tmp_path / "bin").mkdir()
    for prog in ("vllm", "recommend"):
        stub = tmp_path / "bin" / prog
        stub.write_text(f'#!/bin/sh\n{{ for a in "$@"; do printf "%s\\n" "$a"; done; echo --end--; }} >> "$LOG_DIR/{prog}.log"\n',
                        encoding="utf-8")  # one log per program, runs in the order they ran
        stub.chmod(0o755)
    script = tmp_path / "bench.sh"
    script.write_text(render_deploy(plan, formats="bench")["bench.sh"], encoding="utf-8")
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "LOG_DIR": str(logs),
           "BASE_URL": "http://router:8000", "REPLICA_URL": "http://engine-0:8000"}
    res = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    def calls(prog: str) -> list[list[str]]:
        log = logs / f"{prog}.log"
        text = log.read_text() if log.exists() else ""
        return [c.strip("\n").splitlines() for c in text.split("--end--\n") if c.strip()]

    runs = calls("vllm")
    row = next(r for r in plan.rows if r.rank == 1)
    w = plan.workload
    rate = w.arrival_rate_per_s

    def value(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    first = runs[0]
    assert first[:2] == ["bench", "serve"]
    assert value(first, "--base-url") == "http://router:8000"
    assert value(first, "--request-rate") == ("inf" if rate is None else f"{rate:.6g}")
    if w.prompt_tokens is not None:
        assert value(first, "--random-input-len") == str(round(w.prompt_tokens.mean))
    calibrations = calls("recommend")
    if row.disaggregated:
        assert len(runs) == 1 and not calibrations     # P/D: checked by the SLO run only, said in the script
        return
    replicas = row.pools[0].replicas
    second = runs[1]
    assert value(second, "--base-url") == "http://engine-0:8000"
    if rate is not None:
        assert float(value(second, "--request-rate")) == pytest.approx(rate / replicas, rel=1e-5)
    pool = row.pools[0]
    if pool.data_parallel_size > 1 or pool.pp > 1 or pool.enable_expert_parallel or pool.num_speculative_tokens:
        # calibrate's results state TP, dtypes and limits only: a profile fitted to this engine would describe
        # another (it had run `calibrate --tp 1` on a DP 8 replica); the script says so instead
        assert not calibrations and "# 3. Not fed back: recommend calibrate fits TP engines" in script.read_text()
        return
    (argv,) = calibrations
    assert argv[0] == "calibrate" and argv[1] == "bench-results/replica.json"
    assert value(argv, "--tp") == str(row.pools[0].tp) and value(argv, "--gpu") == row.pools[0].gpu
    assert value(argv, "--max-num-seqs") == str(row.pools[0].max_num_seqs)
    # the calibrate line's options are this project's calibrate command's options
    from recommender.cli.app import app
    import typer.main

    cmd = typer.main.get_command(app)
    names = {o for p in cmd.commands["calibrate"].params for o in p.opts}  # type: ignore[attr-defined]
    assert {a for a in argv if a.startswith("--")} <= names


def test_the_script_states_the_plans_error_band_beside_its_prediction() -> None:
    """The SLO check's header gives the row's p10-p90 band (its ``bands``, docs/bands.md) so a measured p90 can be read
    against the model's stated error; a slow end past capacity reads 'saturated'; a plan without bands has no line."""
    import dataclasses

    from recommender.units import fmt_seconds

    plan = load_plan(ROOT / "examples" / "plans" / "chat.plan.json")
    b = plan.top.bands
    assert b is not None
    head = render_deploy(plan, formats="bench")["bench.sh"].splitlines()[:5]
    line = next(x for x in head if "stated error" in x)
    assert f"class {b['class']}, {b['class_rows']} rows" in line
    lo, hi = b["tpot_s"]
    assert f"TPOT {fmt_seconds(lo)} - {'saturated' if hi is None else fmt_seconds(hi)}" in line
    bare = dataclasses.replace(plan, rows=[dataclasses.replace(r, bands=None) for r in plan.rows])
    assert not any("stated error" in x for x in render_deploy(bare, formats="bench")["bench.sh"].splitlines())
