"""Hostile and careless inputs at the edge: bounded reads, numbers in physical ranges, one-line errors.

Every CLI case asserts the contract: non-zero exit, exactly one line on stderr, no traceback, no file written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from typer.testing import CliRunner

from recommender import bounded
from recommender.cli import app
from recommender.errors import (
    ConfigError,
    RecommenderError,
    UnsupportedArchitectureError,
)
from recommender.hf_config import arch_from_config
from recommender.workload import workload_from_dict

DATA = Path(__file__).parent / "data"
AGG = DATA / "plans" / "agg-llama70b-h100.json"
QWEN = json.loads((DATA / "hf_configs" / "Qwen3-8B" / "config.json").read_text())
BASE = {"model": "llama-3.1-8b", "traffic": {"arrival_rate": 2},
        "prompt_tokens": {"dist": "constant", "value": 500}, "output_tokens": {"dist": "constant", "value": 100},
        "slo": ["tpot=60ms"]}


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def assert_one_line_error(res, code: int | None = None) -> str:
    """Non-zero exit, one line on stderr starting 'error:', no traceback; returns that line."""
    assert res.exit_code != 0, res.output
    if code is not None:
        assert res.exit_code == code, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    return lines[0]


# ------------------------------------------------------------------------------------------ bounded reads


def test_devices_fifos_and_directories_are_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        with pytest.raises(bounded.NotAFileError):
            bounded.read_file_bytes(path, "workload file")
    line = assert_one_line_error(run("--workload", "/dev/zero"), 2)
    assert "/dev/zero" in line and "not a regular file" in line
    assert "not a regular file" in assert_one_line_error(run("deploy", str(fifo)))
    assert "not a regular file" in assert_one_line_error(
        run("estimate", "--model", str(fifo), "--gpu", "h100-sxm", "--context", "10"))


def test_the_size_limit_is_configurable_and_named_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(BASE) + "#" + "x" * 5000 + "\n")
    monkeypatch.setenv(bounded.MAX_READ_ENV, "4KB")
    with pytest.raises(bounded.InputTooLargeError, match=bounded.MAX_READ_ENV):
        bounded.read_file_text(wl, "workload file")
    line = assert_one_line_error(run("--workload", str(wl), env={bounded.MAX_READ_ENV: "4KB"}), 2)
    assert bounded.MAX_READ_ENV in line and "4,000-byte" in line
    monkeypatch.setenv(bounded.MAX_READ_ENV, "1MB")
    assert bounded.read_file_text(wl, "workload file").startswith("model")
    monkeypatch.setenv(bounded.MAX_READ_ENV, "-5")
    with pytest.raises(ConfigError, match="positive size"):
        bounded.max_read_bytes()


class _Slow(BaseHTTPRequestHandler):
    """Answers 200 then sends one byte every 0.2 s, forever (each read returns quickly)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self.send_response(200)
        self.end_headers()
        try:
            while True:
                self.wfile.write(b"#")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, *a: object) -> None:
        pass


class _Endless(_Slow):
    """An endless /metrics body, as fast as the socket takes it."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        chunk = b"# HELP x y\n" * 10_000
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("server", [_Slow], indirect=True)
def test_a_server_trickling_bytes_hits_the_overall_deadline(server: str) -> None:
    start = time.monotonic()
    with pytest.raises(bounded.ReadDeadlineError, match="within 1 s"):
        bounded.fetch_url_bytes(server, 1.0, "metrics endpoint")
    assert time.monotonic() - start < 3.0  # per-read timeouts would never fire: one byte every 0.2 s


@pytest.mark.parametrize("server", [_Endless], indirect=True)
def test_an_endless_body_stops_at_the_size_limit(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bounded.MAX_READ_ENV, "1MB")
    with pytest.raises(bounded.InputTooLargeError, match="1,000,000-byte"):
        bounded.fetch_url_bytes(server, 30.0, "metrics endpoint")


@pytest.mark.parametrize("text", ["[1e999]", '{"a": NaN}', '{"a": -Infinity}', "[" * 100_000 + "]" * 100_000])
def test_json_with_non_finite_numbers_or_absurd_nesting_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        bounded.load_json_text(text, "plan")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"version": 1, "plans": [{"tp": 1e999}]}',
                                  '{"version": 1, "plans": [{"tp": NaN}]}'])
def test_deploy_refuses_hostile_plan_json_in_one_line(text: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(text)
    assert_one_line_error(run("deploy", str(plan), "--out", str(tmp_path / "out")), 2)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ numbers at the edge


@pytest.mark.parametrize("patch, match", [
    ({"prices": {"h100-sxm": -1.0}}, "above \\$0"),
    ({"prices": {"h100-sxm": 0}}, "above \\$0"),
    ({"prices": {"h100-sxm": float("nan")}}, "prices"),
    ({"prices": {"h100-sxm": "$1e999/h"}}, "finite"),
    ({"prices": {"h100-sxn": 2.0}}, "unknown GPU 'h100-sxn'"),
    ({"prompt_tokens": {"dist": "normal", "mean": 500, "std": float("inf")}}, "finite"),
    ({"prompt_tokens": {"dist": "normal", "mean": 500, "std": 1e12}}, "10000000"),
    ({"prompt_tokens": {"dist": "constant", "value": 10**30}}, "10000000"),
    ({"output_tokens": {"dist": "lognormal", "mean": 9e6, "std": 1e6}}, "mean \\+ 6 std"),
    ({"traffic": {"arrival_rate": float("inf")}}, "finite"),
    ({"traffic": {"arrival_rate": 1e300}}, "1000000"),
    ({"traffic": {"offline": {"requests": 10, "deadline": "-5s"}}}, "positive duration"),
    ({"max_gpus": 10**9}, "100000"),
    ({"slo": ["tpot=1e999ms"]}, "finite"),
    ({"slo": ["tpot=-3ms"]}, "positive"),
])
def test_workload_numbers_outside_physical_ranges_are_refused(patch: dict, match: str) -> None:
    with pytest.raises(RecommenderError, match=match):
        workload_from_dict({**BASE, **patch}, "w.yaml")


@pytest.mark.parametrize("patch, match", [
    ({"hidden_size": -4096}, "non-negative"),
    ({"intermediate_size": -8}, "intermediate_size"),
    ({"num_key_value_heads": 5}, "must divide"),
    ({"num_hidden_layers": 10**9}, "num_layers"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"head_dim": None, "hidden_size": 4095}, "must divide hidden_size"),
])
def test_config_json_sizes_are_validated(patch: dict, match: str) -> None:
    with pytest.raises(UnsupportedArchitectureError, match=match):
        arch_from_config({**QWEN, **patch}, model_id="x")


def test_a_config_json_with_a_negative_size_gives_one_line_not_negative_weights(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**QWEN, "intermediate_size": -12288}))
    line = assert_one_line_error(run("estimate", "--model", str(cfg), "--gpu", "h100-sxm", "--context", "100"))
    assert "intermediate_size" in line


@pytest.mark.parametrize("args, match", [
    (["--context", "1000000000000"], "--context"),
    (["--prompt-tokens", "100", "--output-tokens", "100", "--rate", "inf"], "--rate"),
    (["--prompt-tokens", "100", "--output-tokens", "100", "--rate", "1e300"], "--rate"),
    (["--context", "100", "--price", "-2"], "--price"),
    (["--context", "100", "--price", "nan"], "--price"),
    (["--context", "100", "--batch", "1000000000"], "--batch"),
    (["--context", "100", "--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
])
def test_estimate_refuses_absurd_inputs_before_any_loop(args: list[str], match: str) -> None:
    line = assert_one_line_error(run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", *args), 2)
    assert match in line


@pytest.mark.parametrize("args, match", [
    (["--seed", "-1"], "--seed"), (["--trials", "0"], "--trials"), (["--trials", "-1"], "--trials"),
    (["--timeout", "nan"], "--timeout"), (["--top", "0"], "--top"),
])
def test_main_job_flags_out_of_range(args: list[str], match: str) -> None:
    line = assert_one_line_error(run("--workload", "examples/chat.yaml", *args), 2)
    assert match in line


# ------------------------------------------------------------------------------------------ the CLI wrapper


def test_bad_output_paths_are_one_line(tmp_path: Path) -> None:
    existing = tmp_path / "chat.yaml"
    existing.write_text("x")
    line = assert_one_line_error(run("deploy", str(AGG), "--out", str(existing)))
    assert "not a folder" in line and existing.read_text() == "x"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    line = assert_one_line_error(run("deploy", str(AGG), "--out", str(foreign)))
    assert "notes.txt" in line and (foreign / "notes.txt").read_text() == "keep"
    under_file = existing / "sub"
    assert_one_line_error(run("deploy", str(AGG), "--out", str(under_file)))


def test_unexpected_errors_are_one_line_with_the_debug_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import recommender.cli.deploy as deploy_cli

    def boom(*a: object, **k: object) -> None:
        raise KeyError("internal-bug")

    monkeypatch.setattr(deploy_cli, "render_deploy", boom)
    res = run("deploy", str(AGG))
    line = assert_one_line_error(res, 1)
    assert "re-run with --debug for the traceback" in line and "KeyError" in line
    debug = run("--debug", "deploy", str(AGG))
    assert isinstance(debug.exception, KeyError)  # --debug lets the traceback through
    assert "--debug" in assert_one_line_error(run("deploy", str(AGG)), 1)  # only for that run


def test_bad_storage_urls_are_one_line() -> None:
    for url in ("nosuchdb://x/y", "sqlite:////nonexistent-dir/x/y.db", "postgresql+nodriver://u@h/db", "mysql://x"):
        res = run("--workload", "examples/chat.yaml", "--storage", url, "--trials", "2", "--verify", "0")
        assert "storage" in assert_one_line_error(res, 2)


def test_a_profile_must_be_a_profile() -> None:
    line = assert_one_line_error(run("--workload", "examples/chat.yaml", "--profile", "examples/chat.yaml"), 2)
    assert "no 'parameters' mapping" in line


def test_yaml_with_non_finite_numbers_anywhere_is_one_line(tmp_path: Path) -> None:
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({**BASE, "shared_prefix_fraction": float("nan")}))
    assert_one_line_error(run("--workload", str(wl)), 2)
    wl.write_text(yaml.safe_dump({**BASE, "traffic": {"arrival_rate": float("inf")}}))
    assert_one_line_error(run("--workload", str(wl)), 2)


def test_a_plan_key_with_a_line_break_gives_a_one_line_error() -> None:
    # found by tests/test_fuzz.py (hypothesis): pydantic's error location quoted a dict key holding "\n"
    import json

    from recommender.deploy import render_deploy
    from recommender.errors import RecommenderError

    doc = json.loads((Path(__file__).resolve().parents[1] / "examples" / "plans" / "chat.plan.json").read_text())
    doc["workload"]["bad\nkey\x1b[2J"] = 1
    with pytest.raises(RecommenderError) as e:
        render_deploy(doc, rank=1, formats="all")
    assert "field 'workload.bad\\nkey\\x1b[2J'" in str(e.value)
