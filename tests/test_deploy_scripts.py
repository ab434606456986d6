"""The serve scripts `recommend deploy --format all` writes parse and run under the shells users run them with.

Issue 30: every P/D script was broken shell under bash (an apostrophe inside ``"${VAR:?message}"``) while
``sh`` (dash) accepted it, so a dash-only test passed. Here every script of every example plan and test plan
is checked with ``bash -n`` AND ``dash -n``, then executed by each shell with a fake ``vllm`` on PATH that
records its argv (NUL-separated, so every word comes back exactly); the argv must equal the engine-settings
step's ``vllm serve`` arguments (``vllm_cmd.serve_argv``), and the main settings are also checked against
the plan JSON directly. `.ci/run` installs dash; a test skips only when a shell is truly absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import recommender.cli  # noqa: F401  (registers every command on the app)
from recommender.cli.app import app
from recommender.deploy import build_spec, shell
from recommender.deploy.vllm_cmd import CMD_PORTS, cmd_file_name, engine_options, serve_argv
from recommender.plan import load_plan

ROOT = Path(__file__).resolve().parent.parent
PLAN_FILES = sorted((ROOT / "examples" / "plans").glob("*.json")) + sorted((ROOT / "tests" / "data" / "plans").glob("*.json"))
CASES = [(p, row["rank"]) for p in PLAN_FILES for row in json.loads(p.read_text())["plans"]]
IDS = [f"{p.stem}-r{r}" for p, r in CASES]
SHELLS = ("bash", "dash")
#: the fake vllm: every argument NUL-terminated into $ARGV_OUT, the NIXL variables into $ARGV_OUT.env
FAKE_VLLM = ('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$ARGV_OUT"\n'
             'printf \'%s\\n\' "${VLLM_NIXL_SIDE_CHANNEL_HOST:-}" "${VLLM_NIXL_SIDE_CHANNEL_PORT:-}" > "$ARGV_OUT.env"\n')


def need(sh: str) -> str:
    path = shutil.which(sh)
    if path is None:
        pytest.skip(f"{sh} is not installed on this machine (apt-get install {sh}; .ci/run installs it)")
    return path


def test_both_shells_are_present_in_ci() -> None:
    """In CI (.ci/run installs dash) a missing shell is a failure, not a silent skip."""
    if os.environ.get("CI"):
        assert all(shutil.which(sh) for sh in SHELLS), "CI must install bash and dash (.ci/run)"


def fake_path(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").write_text(FAKE_VLLM)
    (bin_dir / "vllm").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "ARGV_OUT": str(tmp / "argv")}


def run_with(sh: str, script: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str] | None]:
    argv_out = Path(env["ARGV_OUT"])
    argv_out.unlink(missing_ok=True)
    proc = subprocess.run([need(sh), str(script)], cwd=script.parent, env=env, capture_output=True, text=True, timeout=30)
    if not argv_out.exists():
        return proc, None
    raw = argv_out.read_bytes()
    assert raw.endswith(b"\0")
    return proc, raw[:-1].decode("utf-8").split("\0")


def deploy_all(path: Path, rank: int, out: Path) -> None:
    res = CliRunner().invoke(app, ["deploy", str(path), "--rank", str(rank), "--format", "all", "--out", str(out)])
    assert res.exit_code == 0, res.output


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_every_written_script_parses_and_runs_the_plans_flags_in_bash_and_dash(path: Path, rank: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    deploy_all(path, rank, out)
    plan = load_plan(path)
    spec = build_spec(plan, rank, plan_name=str(path))
    row = next(r for r in json.loads(path.read_text())["plans"] if r["rank"] == rank)
    scripts = sorted(out.glob("*.sh"))
    assert {cmd_file_name(p) for p in spec.pools} <= {s.name for s in scripts}
    for script in scripts:  # every script the set holds (other targets may add their own), in both shells
        assert os.access(script, os.X_OK), script.name
        for sh in SHELLS:
            check = subprocess.run([need(sh), "-n", str(script)], capture_output=True, text=True, timeout=30)
            assert check.returncode == 0, f"{sh} -n {script.name}: {check.stderr}"
    env = {**fake_path(tmp_path), "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3"}
    for pool in spec.pools:
        script = out / cmd_file_name(pool)
        port = CMD_PORTS[pool.role][0]
        want = ["serve", *serve_argv(engine_options(spec, pool), "0.0.0.0", port)]
        plan_pool = next(p for p in row["pools"] if p["role"] == pool.role)
        for sh in SHELLS:
            proc, argv = run_with(sh, script, env)
            assert proc.returncode == 0, f"{sh} {script.name}: {proc.stderr}"
            assert argv == want, f"{sh} {script.name}"
            # the main settings, read straight from the plan JSON (not from the renderer)
            assert int(flag(argv, "--tensor-parallel-size")) == plan_pool["tp"]
            assert int(flag(argv, "--max-num-seqs")) == plan_pool["max_num_seqs"]
            assert int(flag(argv, "--max-num-batched-tokens")) == plan_pool["max_num_batched_tokens"]
            assert float(flag(argv, "--gpu-memory-utilization")) == plan_pool["gpu_memory_utilization"]
            assert int(flag(argv, "--max-model-len")) == json.loads(path.read_text())["workload"]["max_model_len"]
            assert ("--enable-chunked-prefill" in argv) is plan_pool["chunked_prefill"]
            if pool.role != "both":
                host, side_port = Path(env["ARGV_OUT"] + ".env").read_text().splitlines()
                assert (host, int(side_port)) == ("10.1.2.3", CMD_PORTS[pool.role][1])
                assert json.loads(flag(argv, "--kv-transfer-config"))["kv_role"] == \
                    {"prefill": "kv_producer", "decode": "kv_consumer"}[pool.role]


def test_a_script_runs_by_its_own_shebang(tmp_path: Path) -> None:
    """``./vllm-serve.sh`` (the kernel reads ``#!/bin/sh``) runs vllm as well."""
    path = ROOT / "examples" / "plans" / "chat.plan.json"
    deploy_all(path, 1, tmp_path / "out")
    env = fake_path(tmp_path)
    proc = subprocess.run([str(tmp_path / "out" / "vllm-serve.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(path.read_text())
    model = doc["plans"][0].get("checkpoint") or doc["workload"]["hf_repo"]  # a pre-quantized checkpoint when named
    assert Path(env["ARGV_OUT"]).read_bytes().split(b"\0")[:2] == [b"serve", model.encode()]


@pytest.mark.parametrize("sh", SHELLS)
def test_pd_script_without_its_host_address_stops_with_the_message(sh: str, tmp_path: Path) -> None:
    deploy_all(ROOT / "tests" / "data" / "plans" / "disagg-llama70b-h200.json", 1, tmp_path / "out")
    env = fake_path(tmp_path)  # VLLM_NIXL_SIDE_CHANNEL_HOST unset
    for role in ("prefill", "decode"):
        proc, argv = run_with(sh, tmp_path / "out" / f"vllm-serve-{role}.sh", env)
        assert argv is None  # vllm never started
        assert proc.returncode == 2
        assert proc.stderr.splitlines() == [
            "set VLLM_NIXL_SIDE_CHANNEL_HOST to this host's IP address (the NIXL side channel the other pool "
            f"connects to), e.g. VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.5 sh vllm-serve-{role}.sh"]
        proc, _ = run_with(sh, tmp_path / "out" / f"vllm-serve-{role}.sh", {**env, "VLLM_NIXL_SIDE_CHANNEL_HOST": ""})
        assert proc.returncode == 2  # empty counts as unset


TRAPS = ["it's", "say \"hi\"", "$HOME and ${HOME} and $(echo no) and `echo no`", "back\\slash \\n", "a;b|c&d>e<f",
         "  spaces  ", "*?[x]", "'", "", "-n", "%s %d %%", "ünïcödé €"]


@pytest.mark.parametrize("sh", SHELLS)
def test_the_quoting_helper_passes_every_trap_through_unchanged(sh: str, tmp_path: Path) -> None:
    """Each message printed by ``say`` and each word quoted by ``quote`` comes out byte for byte."""
    script = tmp_path / "t.sh"
    lines = ["set -eu", *[shell.say(t) for t in TRAPS], shell.export("X_TEST", "it's $x"),
             'printf "%s\\n" "$X_TEST" >&2', *shell.require_env("X_UNSET_TEST", "can't go on: ${X_UNSET_TEST:?}")]
    script.write_text("\n".join(lines) + "\n")
    assert subprocess.run([need(sh), "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run([need(sh), str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"})
    assert proc.returncode == 2
    assert proc.stderr.split("\n")[:-1] == [*TRAPS, "it's $x", "can't go on: ${X_UNSET_TEST:?}"]


def test_helper_refuses_what_it_cannot_write_safely() -> None:
    with pytest.raises(ValueError):
        shell.say("two\nlines")
    with pytest.raises(ValueError):
        shell.require_env("BAD NAME", "x")
    with pytest.raises(ValueError):
        shell.export("1X")


@pytest.mark.slow
def test_readme_pd_emit_scripts_parse_in_bash_and_dash(tmp_path: Path) -> None:
    """The issue's own reproduction: the README's P/D plan via ``--emit``."""
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["--workload", str(ROOT / "examples" / "rag.yaml"), "--slo", "tpot=30ms",
                                   "--emit", str(out)])
    assert res.exit_code == 0, res.output
    scripts = sorted(out.glob("*.sh"))
    assert scripts
    env: dict[str, Any] = {**fake_path(tmp_path), "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3"}
    for script in scripts:
        for sh in SHELLS:
            assert subprocess.run([need(sh), "-n", str(script)], capture_output=True, timeout=30).returncode == 0
            proc, argv = run_with(sh, script, env)
            assert proc.returncode == 0 and argv is not None and argv[0] == "serve", proc.stderr
