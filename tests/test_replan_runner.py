"""One replan step's plumbing: history rows, output files, planner failures; the history DB itself."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from recommender.errors import DeployError, InfeasibleError
from recommender.plan import plan_document
from recommender.replan import runner
from recommender.replan.history import History, sqlite_path, storage_url
from recommender.replan.logs import RequestLog, RequestLogSource
from recommender.replan.policy import Policy
from recommender.replan.runner import replan_once, write_outputs
from recommender.replan.sources import default_state_path, kind_of, open_source
from test_replan_support import FakePlanner, FakePredictor, fake_plan

T0 = 1.7e9


def busy_source(rate: float = 6.0) -> RequestLogSource:
    t = T0 + (np.arange(int(rate * 600)) + 0.5) / rate
    log = RequestLog.of(t, np.full(t.size, 500), np.full(t.size, 50))
    return RequestLogSource(log=log, clock=lambda: T0 + 600.0)


def test_history_roundtrip_order_and_urls(tmp_path):
    h = History(str(tmp_path / "sub" / "h.db"))  # folder created
    a = h.record(time_s=10.0, deployment="a", decision="unchanged", wanted="none", reason="r1",
                 observed={"x": np.float64(1.5)}, current=fake_plan(2, 2.4), proposed=None, usd_per_hour_current=4.0)
    h.record(time_s=20.0, deployment="b", decision="changed", wanted="up", reason="r2", observed=None, current=None,
             proposed=fake_plan(3, 3.0))
    h.record(time_s=30.0, deployment="a", decision="changed", wanted="down", reason="r3", observed=None, current=None,
             proposed=None)
    assert [r.reason for r in h.list()] == ["r3", "r2", "r1"]
    assert [r.reason for r in h.list(deployment="a")] == ["r3", "r1"]
    assert h.list(deployment="a")[1].observed == {"x": 1.5} and h.list(deployment="a")[1].id == a
    # plans are stored as plan files hold them (version 2) and read back through the one reader
    assert h.list(deployment="a")[1].current == plan_document(fake_plan(2, 2.4))
    assert h.list(deployment="b")[0].proposed["version"] == 2
    assert h.list(deployment="b")[0].proposed_plan == fake_plan(3, 3.0)
    assert h.last_change("a").time_s == 30.0 and h.last_change("c") is None
    assert [r.reason for r in History(str(tmp_path / "sub" / "h.db")).list(limit=1)] == ["r3"]  # persisted
    assert storage_url("x.db") == "sqlite:///x.db" and storage_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert sqlite_path("sqlite:///:memory:") is None
    assert default_state_path(str(tmp_path / "h.db")) == tmp_path / "h.db.metrics-state.json"


def test_sources_are_chosen_by_form():
    assert kind_of("http://pod:8000/metrics") == "vllm-metrics"
    assert kind_of("prometheus+http://prom:9090") == "prometheus"
    assert kind_of("logs/requests.jsonl") == "request-log"
    with pytest.raises(Exception, match="mixes source kinds"):
        open_source(["http://a/metrics", "x.csv"], Policy(), default_state_path(None))


def test_write_outputs_renders_deploy_files_before_plan_json(tmp_path, monkeypatch):
    order = []

    def writer(doc, out):
        order.append(("deploy", (out / "plan.json").exists()))
        (out / "vllm-serve.sh").parent.mkdir(parents=True, exist_ok=True)
        (out / "vllm-serve.sh").write_text("vllm serve ...")
        return [out / "vllm-serve.sh"]

    monkeypatch.setattr(runner, "deploy_writer", lambda: writer)
    written = write_outputs(fake_plan(3, 3.0), tmp_path / "out")
    assert order == [("deploy", False)]  # plan.json is written last
    assert [p.rsplit("/", 1)[1] for p in written] == ["vllm-serve.sh", "plan.json"]
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["plans"][0]["replicas"] == 3


def test_refused_deploy_keeps_everything_as_it_was(tmp_path, monkeypatch):
    def refuse(doc, out):
        raise DeployError("gpu h100-sxm has no k8s resource name")

    monkeypatch.setattr(runner, "deploy_writer", lambda: refuse)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "plan.json").write_text("old")
    h = History(str(tmp_path / "h.db"))
    r = replan_once(current=fake_plan(2, 2.4), source=busy_source(), planner=FakePlanner(), policy=Policy(),
                    history=h, out_dir=tmp_path / "out", predictor=FakePredictor())
    assert r.decision == "error" and r.exit_code == 2 and "no k8s resource name" in r.reason
    assert (tmp_path / "out" / "plan.json").read_text() == "old"
    assert h.list()[0].decision == "error" and h.last_change("chat/llama-3.1-8b") is None


def test_planner_failure_is_an_error_run_with_its_exit_code(tmp_path):
    def infeasible(workload, current):
        raise InfeasibleError("no GPU meets ttft=2s at 7.2 req/s")

    h = History(str(tmp_path / "h.db"))
    r = replan_once(current=fake_plan(2, 2.4), source=busy_source(), planner=infeasible, policy=Policy(), history=h, predictor=FakePredictor())
    assert r.decision == "error" and r.exit_code == 4 and "keeping the current plan" in r.reason
    # 3600 requests from T0 + 1/12 s to T0 + 600 s: 3600 / 599.917 s; what was seen is still reported
    assert r.observed["arrival_rate_per_s"] == pytest.approx(3600 / (600 - 1 / 12), rel=1e-4)
    r = replan_once(current=fake_plan(2, 2.4), source=busy_source(), planner=lambda w, c: {"plans": []},
                    policy=Policy(), history=h, predictor=FakePredictor())
    assert r.decision == "error" and "the planner's proposal: not a plan" in r.reason
    no_rows = dataclasses.replace(fake_plan(2, 2.4), rows=())
    r = replan_once(current=fake_plan(2, 2.4), source=busy_source(), planner=lambda w, c: no_rows,
                    policy=Policy(), history=h, predictor=FakePredictor())
    assert r.decision == "error" and "the planner's proposal: not a plan (needs at least one ranked row" in r.reason
    r = replan_once(current=fake_plan(2, 2.4), source=busy_source(), planner=lambda w, c: 1 / 0, policy=Policy(),
                    history=h, predictor=FakePredictor())
    assert r.decision == "error" and r.exit_code == 2 and "ZeroDivisionError" in r.reason


def test_planner_gets_the_forecast_workload_and_the_current_plan(tmp_path):
    planner = FakePlanner()
    cur = fake_plan(2, 2.4)
    replan_once(current=cur, source=busy_source(6.0), planner=planner, policy=Policy(headroom=0.5),
                history=History(str(tmp_path / "h.db")), predictor=FakePredictor())
    wl, warm = planner.calls[0]
    assert wl.arrival_rate_per_s == pytest.approx(6.0 * 1.5, rel=0.01)  # peak of 1-min rates x (1 + headroom)
    assert wl.prompt_tokens.max_tokens == 500 and wl.output_tokens.max_tokens == 50
    assert warm == cur  # the warm start
