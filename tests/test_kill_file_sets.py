"""Kill tests: a writer killed (SIGKILL) at random moments never leaves a mixed file set, and the next run
removes what the killed one left behind.

A set is consistent when the folder holds exactly the files its manifest names and every file comes from the
same write (same plan / same token)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recommender.deploy.writer import SET_MANIFEST, write_file_set

ROOT = Path(__file__).resolve().parents[1]
AGG = Path(__file__).parent / "data" / "plans" / "agg-llama70b-h100.json"

# a child that writes sets A and B (3 files of ~200 kB each) alternately, forever
LOOP = """
import sys
from recommender.deploy.writer import write_file_set
out = sys.argv[1]
print("ready", flush=True)
i = 0
while True:
    tag = "AB"[i % 2]
    write_file_set(out, {n: f"SET={tag}\\n" + "x" * 200_000 for n in ("plan.json", "k8s.yaml", "run.sh")})
    i += 1
"""


def tokens(out: Path) -> set[str]:
    """The set tokens found in ``out``; asserts the folder is exactly its manifest's set."""
    names = {p.name for p in out.iterdir()}
    assert SET_MANIFEST in names, f"no manifest in {sorted(names)}"
    listed = set(json.loads((out / SET_MANIFEST).read_text())["files"])
    assert names - {SET_MANIFEST} == listed
    return {(out / n).read_text().splitlines()[0] for n in listed}


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.set-"))


def test_a_crash_at_any_step_keeps_the_old_set_or_the_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: the step-th file-system call (open, fsync, chmod, rename, exchange) raises, as a kill would stop it
    there. Early steps keep the old set, late ones leave the new one, none a mix or a temp folder."""
    import recommender.deploy.writer as writer

    outcomes: dict[int, str] = {}
    for step in range(40):
        out = tmp_path / f"s{step}" / "deploy"
        write_file_set(out, {n: "SET=A\n" for n in ("plan.json", "k8s.yaml", "run.sh")})
        calls = [0]

        def counting(fn):  # type: ignore[no-untyped-def]
            def wrapped(*a, **k):  # type: ignore[no-untyped-def]
                calls[0] += 1
                if calls[0] == step + 1:
                    raise KeyboardInterrupt  # stands for the kill: nothing after this point runs
                return fn(*a, **k)
            return wrapped

        with monkeypatch.context() as m:
            for name in ("fsync", "chmod", "rename"):
                m.setattr(writer.os, name, counting(getattr(os, name)))
            m.setattr(writer, "_exchange", counting(writer._exchange))
            m.setattr(writer, "open", counting(open), raising=False)
            try:
                write_file_set(out, {n: "SET=B\n" for n in ("plan.json", "k8s.yaml", "run.sh", "extra.sh")})
                done = True
            except KeyboardInterrupt:
                done = False
        got = tokens(out)
        assert got in ({"SET=A"}, {"SET=B"}), (step, got)
        assert leftovers(out.parent, "deploy") == []  # an exception cleans up; a real kill is cleaned by the next run
        outcomes[step] = "done" if done else next(iter(got))
        if done:
            assert got == {"SET=B"}
            break
    kept = [s for s, o in outcomes.items() if o == "SET=A"]
    swapped = [s for s, o in outcomes.items() if o != "SET=A"]
    assert kept and swapped and max(kept) < min(swapped), outcomes  # the swap is one step


@pytest.mark.slow
def test_killed_writers_never_leave_a_mixed_set(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    write_file_set(out, {n: "SET=0\n" for n in ("plan.json", "k8s.yaml", "run.sh")})
    rng = random.Random(17)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", LOOP, str(out)], stdout=subprocess.PIPE, env=env, cwd=ROOT)
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.15))
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert len(tokens(out)) == 1, "files of two sets side by side"
    write_file_set(out, {"plan.json": "SET=final\n"})  # the next run cleans up after the killed ones
    assert tokens(out) == {"SET=final"} and leftovers(tmp_path, "deploy") == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["deploy", "emit"])
def test_killing_deploy_out_and_emit_never_mixes_plans(tmp_path: Path, how: str) -> None:
    """The real commands, killed at random points (import, search, render, write)."""
    out = tmp_path / "out"
    rng = random.Random(5)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    base = [sys.executable, "-c", "from recommender.cli import main; main()"]
    if how == "deploy":
        cmds = [base + ["deploy", str(AGG), "--rank", str(r), "--out", str(out)] for r in (1, 2, 3)]
    else:
        wl = str(Path(__file__).parent / "data" / "workloads" / "chat-golden.yaml")
        tiny = str(Path(__file__).parent / "data" / "policies" / "tiny-search.yaml")
        cmds = [base + ["--workload", wl, "--policy", tiny, "--verify", "0", "--seed", str(s), "--emit", str(out)]
                for s in (1, 2)]
    subprocess.run(cmds[0], env=env, cwd=ROOT, check=True, capture_output=True)
    t_full = 0.0
    for i in range(4):
        start = time.monotonic()
        child = subprocess.Popen(cmds[i % len(cmds)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        if i == 0:
            child.wait()
            t_full = time.monotonic() - start
        else:
            time.sleep(rng.uniform(0.3, 1.0) * t_full)
            child.send_signal(signal.SIGKILL)
            child.wait()
        plans = {line.split(" from ")[0] for n in os.listdir(out) if n.endswith((".sh", ".yaml"))
                 for line in (out / n).read_text().splitlines() if line.startswith("# Plan: ")}
        assert len(plans) == 1, plans
        assert tokens(out)
        if how == "emit":
            doc = json.loads((out / "plan.json").read_text())
            assert doc["plans"][0]["id"] in next(iter(plans))



def test_replan_out_swaps_plan_json_in_with_its_deployment_files(tmp_path: Path) -> None:
    from recommender.plan import load_plan
    from recommender.replan.runner import write_outputs

    out = tmp_path / "out"
    written = write_outputs(load_plan(AGG), out)
    listed = set(json.loads((out / SET_MANIFEST).read_text())["files"])
    assert "plan.json" in listed and {Path(w).name for w in written} == listed
    assert json.loads((out / "plan.json").read_text())["plans"][0]["rank"] == 1


# --------------------------------------------------------------------------- --plot FILE: one file, atomically

CHAT_PLAN = ROOT / "examples" / "plans" / "chat.plan.json"


def _fake_export(self: object, format: str) -> bytes:  # noqa: A002 - plotly's keyword
    """Stands in for kaleido (optional, not installed in CI): a static image of the requested kind."""
    return f"IMAGE {format}\n".encode() * 50_000


@pytest.mark.parametrize("name", ["chart.html", "chart.png", "chart.svg"])
def test_plot_interrupted_at_any_step_keeps_the_old_file_or_writes_the_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The step-th file-system call of `--plot FILE` raises (as a kill would stop it there): the file is the old one
    or the complete new one, never part of one, and no temp file stays. A writer straight into FILE (plotly's
    write_image) never keeps the old file at any step, which fails the `kept` check."""
    import plotly.graph_objects as go

    import recommender.atomic as atomic
    from recommender.plan import load_plan
    from recommender.render.plot import render_chart_html, write_plot

    monkeypatch.setattr(go.Figure, "to_image", _fake_export)
    plan = load_plan(CHAT_PLAN)
    path = tmp_path / name
    new = render_chart_html(plan).encode() if name.endswith(".html") else _fake_export(None, name[-3:])
    outcomes: dict[int, str] = {}
    for step in range(12):
        path.write_bytes(b"OLD")
        calls = [0]

        def counting(fn):  # type: ignore[no-untyped-def]
            def wrapped(*a, **k):  # type: ignore[no-untyped-def]
                calls[0] += 1
                if calls[0] == step + 1:
                    raise KeyboardInterrupt
                return fn(*a, **k)
            return wrapped

        with monkeypatch.context() as m:
            for fn in ("fdopen", "fsync", "chmod", "replace"):
                m.setattr(atomic.os, fn, counting(getattr(os, fn)))
            try:
                write_plot(str(path), plan)
                done = True
            except KeyboardInterrupt:
                done = False
        got = path.read_bytes()
        assert got in (b"OLD", new), (step, len(got))
        assert [p.name for p in tmp_path.iterdir() if p.name != name] == [], step
        outcomes[step] = "new" if got == new else "old"
        if done:
            break
    kept = [s for s, o in outcomes.items() if o == "old"]
    swapped = [s for s, o in outcomes.items() if o == "new"]
    assert kept and swapped and max(kept) < min(swapped), outcomes


PLOT_LOOP = """
import sys
import plotly.graph_objects as go
from recommender.plan import load_plan
from recommender.render.plot import write_plot
sizes = {"A": 3_000_000, "B": 7_000_000}
def export(self, format):
    return (tag * sizes[tag]).encode()
go.Figure.to_image = export  # kaleido stand-in: large images of two sizes
plan = load_plan(sys.argv[2])
print("ready", flush=True)
i = 0
while True:
    tag = "AB"[i % 2]
    write_plot(sys.argv[1], plan)
    i += 1
"""


@pytest.mark.slow
def test_killed_plot_writer_never_leaves_a_partial_image(tmp_path: Path) -> None:
    out = tmp_path / "chart.png"
    rng = random.Random(23)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for k in range(6):
        child = subprocess.Popen([sys.executable, "-c", PLOT_LOOP, str(out), str(CHAT_PLAN)], stdout=subprocess.PIPE,
                                 env=env, cwd=ROOT)
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        # the last child runs until one image is complete (a slow machine may finish none in 0.4 s), then is killed
        # at a random point of a later write
        deadline = time.monotonic() + 120.0
        while k == 5 and not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.05, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait()
        if out.exists():
            data = out.read_bytes()
            assert data in (b"A" * 3_000_000, b"B" * 7_000_000), f"partial image: {len(data):,} bytes"
    assert out.exists()
