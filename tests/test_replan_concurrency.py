"""Concurrent ``recommend replan`` runs sharing one ``--state`` file and one history lose nothing (issue 30).

Eight deployments, each with its own vLLM /metrics URL, re-plan at the same moment against one state file
and one SQLite history. Before the lock, each run read the state, added its URL and renamed its copy over
the file, so the last renames won (the issue saw 3 of 8 URLs left). Now the read-merge-write holds
``flock`` on ``<state>.lock``: all 8 baselines must be there, and ``recommend history`` must list all 8
decisions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import recommender.cli  # noqa: F401  (registers every command on the app)
from recommender.cli.app import app
from recommender.replan.filelock import LockTimeoutError, locked, lock_path
from recommender.replan.metrics import load_state, save_state
from test_replan_support import MetricsServer, VllmState

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "examples" / "plans" / "chat.plan.json"
RUNS = 8


@pytest.mark.slow  # 8 CLI processes: ~10 s of CPU (40 s wall on a loaded 2-core machine)
def test_eight_concurrent_replans_keep_every_baseline_and_every_decision(tmp_path: Path) -> None:
    state, db = tmp_path / "state.json", tmp_path / "history.db"
    policy = tmp_path / "policy.yaml"
    # no waiting for a second scrape: each run saves its baseline and exits 11 (not enough data yet)
    policy.write_text("metrics:\n  wait_for_baseline: false\n")
    vllm = VllmState()
    vllm.serve(10, 500, 100, 0.2, 0.02)
    with MetricsServer(vllm.exposition) as server:
        base = server.url.removesuffix("/metrics")
        urls = [f"{base}/pod{i}/metrics" for i in range(RUNS)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs = [subprocess.Popen([sys.executable, "-m", "recommender", "replan", "--current", str(PLAN),
                                   "--traffic", url, "--state", str(state), "--storage", str(db),
                                   "--policy", str(policy), "--deployment", f"fleet-{i}", "--format", "json"],
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i, url in enumerate(urls)]
        results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 11, err
        assert json.loads(out)["decision"] == "unchanged"
    assert sorted(load_state(state)) == sorted(urls)  # all 8 baselines (the unlocked code kept 3)
    res = CliRunner().invoke(app, ["history", "--storage", str(db), "--format", "json", "--limit", "100"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert sorted(r["deployment"] for r in rows) == sorted(f"fleet-{i}" for i in range(RUNS))
    assert all("insufficient data" in r["reason"] for r in rows)
    table = CliRunner().invoke(app, ["history", "--storage", str(db), "--limit", "100"])
    assert all(f"fleet-{i}" in table.stdout for i in range(RUNS))


def test_threads_updating_one_state_file_lose_nothing(tmp_path: Path) -> None:
    """The same in one process: 8 threads x 3 updates each, every URL survives."""
    from recommender.replan.metrics import parse_exposition

    state = tmp_path / "state.json"
    text = VllmState().exposition()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(3):
                url = f"http://pod{i}-{j}/metrics"
                save_state(state, {url: parse_exposition(text, url, 1000.0 + j)})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(load_state(state)) == 8 * 3


def test_a_held_lock_times_out_in_one_line_and_a_symlinked_lock_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with locked(state):
        try:
            with locked(state, timeout_s=0.05):
                raise AssertionError("a second holder got the lock")
        except LockTimeoutError as e:
            assert "locked by another run" in str(e) and "\n" not in str(e)
    with locked(state, timeout_s=0.05):
        pass  # released on exit
    other = tmp_path / "other.json"
    (tmp_path / "target").write_text("user data\n")
    lock_path(other).symlink_to(tmp_path / "target")
    try:
        with locked(other, timeout_s=0.05):
            raise AssertionError("followed a symlinked lock file")
    except Exception as e:  # noqa: BLE001
        assert "symlink" in str(e)
    assert (tmp_path / "target").read_text() == "user data\n"
