"""``recommend replan`` and ``recommend history`` end to end (fake planner, loopback metrics server)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import recommender.cli.replan as cli_replan
from recommender.cli import app
from recommender.replan import runner
from recommender.replan.history import History
from test_replan_support import FakePlanner, FakePredictor, MetricsServer, VllmState, fake_plan_doc

runner_ = CliRunner()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Plan file, fast policy, history path; the planner is the fake, deploy files are not rendered."""
    planner = FakePlanner()
    monkeypatch.setattr(cli_replan, "search_planner", lambda **kw: planner)
    monkeypatch.setattr(runner, "deploy_writer", lambda: None)
    monkeypatch.setattr(runner, "model_predictor", lambda **kw: FakePredictor())
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(fake_plan_doc(2, 2.4)))  # 2 replicas, sized for 2.4 req/s (a version-1 file)
    policy = tmp_path / "policy.yaml"
    policy.write_text("metrics: {min_scrape_interval: 0.2s}\ndata: {min_requests: 20, min_span: 10s}\n")
    return {"plan": plan, "policy": policy, "db": tmp_path / "h.db", "tmp": tmp_path, "planner": planner}


def write_log(path: Path, rate: float, seconds: float, end: float | None = None) -> Path:
    end = time.time() if end is None else end
    n = int(rate * seconds)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": end - seconds + (i + 0.5) / rate, "prompt_tokens": 1000,
                                "output_tokens": 200}) + "\n")
    return path


def invoke(env, *args):
    return runner_.invoke(app, ["replan", "--current", str(env["plan"]), "--policy", str(env["policy"]),
                                "--storage", str(env["db"]), *args])


def test_scale_up_from_a_request_log_exits_10_and_writes_the_plan_atomically(env):
    log = write_log(env["tmp"] / "req.jsonl", rate=4.0, seconds=120)  # 4 req/s: 2 replicas are too few
    out = env["tmp"] / "out"
    r = invoke(env, "--traffic", str(log), "--out", str(out), "--format", "json")
    assert r.exit_code == 10, r.output
    doc = json.loads(r.stdout)
    assert set(doc) >= {"changed", "reason", "observed", "current", "proposed", "usd_per_hour_delta"}
    assert doc["changed"] is True and re.match(r"SLO at risk: predicted capacity 2.00 req/s < 4.(79|80) req/s", doc["reason"])
    assert doc["observed"]["arrival_rate_per_s"] == pytest.approx(4.0, rel=0.01)
    # the window mean = 4 req/s (480 requests over the 120 s the log covers, less its first and last half gap),
    # x 1.2 headroom = 4.8 req/s -> 5 replicas
    assert doc["proposed"]["plans"][0]["replicas"] == 5
    assert doc["usd_per_hour_delta"] == pytest.approx((5 - 2) * 2.0)
    written = json.loads((out / "plan.json").read_text())
    assert written == doc["proposed"] and written["replan"]["deployment"] == "chat/llama-3.1-8b"
    assert written["version"] == 2 and doc["current"]["version"] == 2  # the --current file was version 1
    assert [p.name for p in out.iterdir()] == ["plan.json"]  # no temp file left behind
    rows = History(str(env["db"])).list()
    assert len(rows) == 1 and rows[0].decision == "changed" and rows[0].proposed == written


def test_unchanged_exits_0_and_table_explains(env):
    log = write_log(env["tmp"] / "req.jsonl", rate=1.5, seconds=120)  # 1.5 x 1.2 = 1.8 -> 2 replicas
    r = invoke(env, "--traffic", str(log))
    assert r.exit_code == 0, r.output
    assert "decision   unchanged: traffic is within the current plan's band" in r.stdout
    assert env["planner"].calls == []  # no search inside the band
    assert "observed   request-log" in r.stdout and "slo        ttft p99: observed no data" in r.stdout


def test_several_logs_are_merged_as_one_fleet(env):
    a = write_log(env["tmp"] / "a.jsonl", rate=1.0, seconds=120)
    b = write_log(env["tmp"] / "b.csv.jsonl", rate=2.0, seconds=120)
    r = invoke(env, "--format", "json", "--traffic", str(a), str(b))  # `--traffic A B`
    doc = json.loads(r.stdout)
    assert doc["observed"]["requests"] == 120 + 240
    assert doc["observed"]["arrival_rate_per_s"] == pytest.approx(3.0, rel=0.01)


def test_insufficient_data_exits_11_and_says_how_much_more(env):
    log = write_log(env["tmp"] / "req.jsonl", rate=1.0, seconds=5)  # 5 requests
    r = invoke(env, "--traffic", str(log))
    assert r.exit_code == 11
    assert "15 more request(s)" in r.stdout and "keeping the current plan" in r.stdout
    assert History(str(env["db"])).list()[0].decision == "unchanged"


def test_live_metrics_endpoint_first_run_waits_one_interval(env):
    st = VllmState()

    def body() -> str:  # every scrape finds 25 more finished requests (a window needs the policy's 20)
        st.serve(25, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
        return st.exposition()

    with MetricsServer(body) as srv:
        r = invoke(env, "--traffic", srv.url, "--format", "json")
        assert srv.hits == 2
    assert r.exit_code in (0, 10), r.output
    # the wait for the second scrape is announced on stderr (stdout stays the JSON document)
    assert "replan: no earlier scrape of 1 of 1 /metrics endpoint(s) to diff against: waiting 0 s" in r.stderr
    doc = json.loads(r.stdout)
    assert doc["observed"]["requests"] == 25 and doc["observed"]["source"] == "vllm-metrics"
    assert 0.19 <= doc["observed"]["window_s"] < 2.0  # the 0.2 s min_scrape_interval, plus scheduling
    assert doc["observed"]["slo"][0]["observed_s"] == pytest.approx(0.1 + 0.15 * 0.99, rel=1e-3)  # ttft (0.1, 0.25]
    state = Path(str(env["db"]) + ".metrics-state.json")
    assert srv.url in json.loads(state.read_text())["scrapes"]  # next to the history DB


def test_unreachable_endpoint_keeps_the_plan_and_exits_2_with_one_line(env):
    out = env["tmp"] / "out"
    r = invoke(env, "--traffic", "http://127.0.0.1:9/metrics", "--out", str(out))
    assert r.exit_code == 2
    assert "unreachable" in r.stderr and "keeping the current plan" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not out.exists()
    assert History(str(env["db"])).list()[0].decision == "error"


def test_watch_loops_and_adopts_each_change(env, monkeypatch):
    log = write_log(env["tmp"] / "req.jsonl", rate=4.0, seconds=120)
    real_watch = runner.watch
    slept = []
    monkeypatch.setattr(runner, "watch", lambda step, cur, iv, **kw: real_watch(
        step, cur, iv, sleep=slept.append, iterations=3, **kw))
    r = invoke(env, "--traffic", str(log), "--watch", "--interval", "2s", "--format", "json")
    assert r.exit_code == 0, r.output
    docs = [json.loads(chunk) for chunk in r.stdout.replace("}\n{", "}\x00{").split("\x00")]
    assert [d["changed"] for d in docs] == [True, False, False]
    # after the change the adopted 5-replica plan is the current one; nothing more to do at 4 req/s
    assert docs[1]["current"]["plans"][0]["replicas"] == 5 and "within the current plan's band" in docs[1]["reason"]
    assert len(slept) == 2 and all(0 < s <= 2.0 for s in slept)


def test_watch_stops_cleanly_on_interrupt(env, monkeypatch):
    log = write_log(env["tmp"] / "req.jsonl", rate=1.5, seconds=120)

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "watch", interrupt)
    r = invoke(env, "--traffic", str(log), "--watch")
    assert r.exit_code == 0 and "stopped" in r.stderr


def test_history_lists_decisions(env):
    log = write_log(env["tmp"] / "req.jsonl", rate=4.0, seconds=120)
    invoke(env, "--traffic", str(log))
    invoke(env, "--traffic", "http://127.0.0.1:9/metrics")
    r = runner_.invoke(app, ["history", "--storage", str(env["db"]), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["decision"] for x in rows] == ["error", "changed"]  # newest first
    assert rows[1]["usd_per_hour_current"] == 4.0 and rows[1]["usd_per_hour_proposed"] == 10.0
    assert rows[1]["observed_rate_per_s"] == pytest.approx(4.0, rel=0.01)
    r = runner_.invoke(app, ["history", "--storage", str(env["db"]), "--limit", "1"])
    assert r.exit_code == 0 and "error" in r.stdout and "changed" not in r.stdout
    r = runner_.invoke(app, ["history", "--storage", str(env["tmp"] / "none.db")])
    assert r.exit_code == 2 and "run `recommend replan` first" in r.stderr
    r = runner_.invoke(app, ["history", "--storage", str(env["db"]), "--format", "xml"])
    assert r.exit_code == 2 and "--format 'xml': use table or json" in r.stderr


@pytest.mark.parametrize("args,match", [
    (["--current", "missing.json"], "does not exist"),
    (["--policy", "{bad}"], "policy file"),
    (["--format", "xml"], "--format 'xml': use table or json"),
])
def test_bad_inputs_are_one_line_errors(env, args, match):
    base = {"--current": str(env["plan"]), "--policy": str(env["policy"]), "--format": "table"}
    base.update(dict(zip(args[::2], args[1::2])))
    argv = ["replan", "--traffic", "x.jsonl", "--storage", str(env["db"])]
    for k, v in base.items():
        argv += [k, v]
    r = runner_.invoke(app, argv)
    assert r.exit_code == 2
    assert match in r.output and "Traceback" not in r.output
