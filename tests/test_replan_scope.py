"""What `recommend replan` compares and says: the deployed rank (``--rank``, passed by the CronJob), the workload's
model against the plan's, /metrics series of the plan's model only and a window of enough requests, bounded
messages for hostile answers, exit codes a Kubernetes Job reads, and the small wording fixes (a reason that says
"keeping the current plan" once, history of an unknown deployment, an unsupported URL scheme)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

import recommender.cli.replan as cli_replan
from recommender.cli import app
from recommender.deploy import render_deploy
from recommender.deploy.replan_job import ReplanJobOptions
from recommender.errors import TrafficSourceError
from recommender.replan import runner
from recommender.replan.history import History
from recommender.replan.policy import Policy
from recommender.replan.runner import MAX_ERROR_REASON_CHARS, keeping, replan_once
from test_replan_support import FakePlanner, FakePredictor, MetricsServer, VllmState, fake_plan, fake_plan_doc

ROOT = Path(__file__).parent.parent
RAG = ROOT / "examples" / "plans" / "rag.plan.json"
KEEP = "keeping the current plan"
cli = CliRunner()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The fake planner and model, no deployment files; a llama-3.1-8b plan of 2 replicas sized for 2.4 req/s; a
    policy with a 0.2 s scrape interval and a 20-request minimum."""
    monkeypatch.setattr(cli_replan, "search_planner", lambda **kw: FakePlanner())
    monkeypatch.setattr(runner, "deploy_writer", lambda: None)
    monkeypatch.setattr(runner, "model_predictor", lambda **kw: FakePredictor())
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(fake_plan_doc(2, 2.4)))
    policy = tmp_path / "policy.yaml"
    policy.write_text("metrics: {min_scrape_interval: 0.2s, timeout: 2s}\ndata: {min_requests: 20, min_span: 10s}\n")
    return {"plan": plan, "policy": policy, "db": tmp_path / "h.db", "tmp": tmp_path}


def replan(env: dict[str, Any], *args: str) -> Any:
    return cli.invoke(app, ["replan", "--current", str(env["plan"]), "--policy", str(env["policy"]),
                            "--storage", str(env["db"]), *args])


def write_log(path: Path, rate: float, seconds: float, prompt: int = 1000, output: int = 200) -> Path:
    end = time.time()
    n = int(rate * seconds)
    path.write_text("".join(json.dumps({"timestamp": end - seconds + (i + 0.5) / rate, "prompt_tokens": prompt,
                                        "output_tokens": output}) + "\n" for i in range(n)))
    return path


def one_line_error(r: Any) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    return str(lines[0])


# ---------------------------------------------------------------------------------------------- 1: the deployed rank
def _job(rank: int, traffic: str) -> tuple[list[str], str, list[str], list[str]]:
    """(container args, ConfigMap plan, the Role's Deployment names, k8s.yaml's Deployment names) of rank ``rank``."""
    files = render_deploy(json.loads(RAG.read_text()), rank=rank, formats="replan-cronjob,k8s", replan=ReplanJobOptions(traffic=traffic))
    objs = [o for o in yaml.safe_load_all(files["replan-cronjob.yaml"]) if o]
    engines = [o["metadata"]["name"] for o in yaml.safe_load_all(files["k8s.yaml"]) if o and o["kind"] == "Deployment"]
    role_names = [n for rule in objs[1]["rules"] for n in rule["resourceNames"]]
    args = objs[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    return args, objs[3]["data"]["plan.json"], role_names, engines


@pytest.mark.parametrize("rank", [1, 3])
def test_the_cronjob_of_a_rank_replans_against_that_rank(env: dict[str, Any], rank: int) -> None:
    """The ConfigMap holds the whole plan; the job's --rank makes the run compare traffic with the row deployed (the
    row read from the plan file here), and the Role names the Deployments k8s.yaml of that rank creates."""
    row = next(r for r in json.loads(RAG.read_text())["plans"] if r["rank"] == rank)
    args, plan_json, role_names, engines = _job(rank, "http://traffic.invalid/metrics")
    assert args[args.index("--rank") + 1] == str(rank) and role_names == engines
    tmp = env["tmp"]
    (tmp / "cm.json").write_text(plan_json)
    log = write_log(tmp / "req.jsonl", rate=4.0, seconds=600, prompt=6000, output=180)
    paths = {"/plan/plan.json": str(tmp / "cm.json"), "/data/plan": str(tmp / "out"), "/data/history.db": str(env["db"]),
             "/data/metrics-state.json": str(tmp / "state.json"), "http://traffic.invalid/metrics": str(log)}
    r = cli.invoke(app, [paths.get(a, a) for a in args] + ["--policy", str(env["policy"])])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["decision"] != "error", r.output
    current = min(doc["current"]["plans"], key=lambda c: c["rank"])  # the row the run treats as deployed
    assert current["id"] == row["id"] and current["usd_per_hour"] == pytest.approx(row["usd_per_hour"])
    assert [p["replicas"] for p in current["pools"]] == [p["replicas"] for p in row["pools"]]
    assert row["id"] in doc["reason"] or current["gpu"] in doc["reason"]


def test_a_rank_the_plan_lacks_is_one_line(env: dict[str, Any]) -> None:
    r = replan(env, "--rank", "3", "--traffic", str(write_log(env["tmp"] / "r.jsonl", 1.5, 120)))
    assert r.exit_code == 2 and "--rank 3" in one_line_error(r) and "its ranks: 1" in r.stderr


# ------------------------------------------------------------------------------------ 2: the workload's model
@pytest.mark.parametrize("model, refused", [("llama-3.1-70b", True), ("meta-llama/Llama-3.1-8B-Instruct", False)])
def test_a_workload_of_another_model_is_refused(env: dict[str, Any], model: str, refused: bool) -> None:
    """The plan is llama-3.1-8b: a 70B workload would propose other weights; the 8B's repo id is the same model."""
    wl = env["tmp"] / "wl.yaml"
    wl.write_text(f"name: chat\nmodel: {model}\ntraffic: {{arrival_rate: 2}}\nprompt_tokens: 1000\n"
                  f"output_tokens: 250\nslo: [ttft=2s@p99]\n")
    r = replan(env, "--workload", str(wl), "--traffic", str(write_log(env["tmp"] / "r.jsonl", 1.5, 120)),
               "--format", "json")
    if refused:
        assert r.exit_code == 2 and "is not the plan's ('llama-3.1-8b')" in one_line_error(r)
        row = History(str(env["db"])).list()[0]
        assert row.decision == "error" and "llama-3.1-70b" in row.reason
    else:
        assert r.exit_code in (0, 10) and json.loads(r.stdout)["decision"] != "error", r.output


# ------------------------------------------------------------------------------- 3: a hostile answer stays short
def test_a_huge_garbage_metrics_page_gives_bounded_messages(env: dict[str, Any]) -> None:
    """5 MB on one line: the parser's error quotes the line, but stderr, stdout and the stored reason stay short."""
    with MetricsServer(lambda: "x" * 5_000_000) as srv:
        r = replan(env, "--traffic", srv.url, "--format", "json")
    line = one_line_error(r)
    assert r.exit_code == 2 and len(line) <= 500 and "not valid Prometheus text exposition" in line
    assert line.endswith(KEEP) and line.count(KEEP) == 1
    assert len(r.stdout) < 20_000 and "x" * 200 not in r.stdout  # the JSON document carries the plan, no page
    reason = History(str(env["db"])).list()[0].reason
    assert len(reason) <= MAX_ERROR_REASON_CHARS and "x" * 200 not in reason


def test_keeping_bounds_any_reason_and_says_it_once() -> None:
    assert keeping("y" * 1_000_000).endswith("...; " + KEEP) and len(keeping("y" * 1_000_000)) == MAX_ERROR_REASON_CHARS
    assert keeping(f"counter is -1: refused, {KEEP}") == f"counter is -1: refused, {KEEP}"
    assert keeping("unreachable") == f"unreachable; {KEEP}"


# ------------------------------------------------------------------- 4: /metrics windows: enough requests, one model
def test_a_metrics_window_without_requests_is_not_enough_data_and_keeps_its_baseline(env: dict[str, Any]) -> None:
    st = VllmState()
    st.serve(500, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)  # before the first scrape: not in any window
    with MetricsServer(st.exposition) as srv:
        first = replan(env, "--traffic", srv.url, "--format", "json")
        assert first.exit_code == 11, first.output
        doc = json.loads(first.stdout)
        assert doc["decision"] == "unchanged" and doc["observed"] is None
        assert "0 request(s)" in doc["reason"] and "need at least 20 (20 more)" in doc["reason"]
        assert doc["reason"].count(KEEP) == 1
        state = json.loads((env["tmp"] / "h.db.metrics-state.json").read_text())["scrapes"][srv.url]
        time.sleep(0.3)
        st.serve(30, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
        second = replan(env, "--traffic", srv.url, "--format", "json")
    obs = json.loads(second.stdout)["observed"]
    assert second.exit_code in (0, 10) and obs["requests"] == 30  # 530 - 500 at the kept baseline
    assert obs["end_s"] - obs["window_s"] == pytest.approx(state["time_s"], abs=1e-3)  # from the first run's scrape
    rows = History(str(env["db"])).list()
    assert [r.decision for r in rows][1] == "unchanged" and rows[1].window is None  # no window counted for scale-down


def _two_models(ours: VllmState, theirs: VllmState) -> str:
    """One exposition with both states' series, each sample of ours followed by theirs (families stay together)."""
    out = []
    for a, b in zip(ours.exposition().splitlines(), theirs.exposition().splitlines()):
        out.append(a)
        if not a.startswith("#") and a.strip() and a != b:
            out.append(b)
    return "\n".join(out) + "\n"


def test_metrics_series_of_another_model_are_left_out(env: dict[str, Any]) -> None:
    ours, theirs = VllmState(), VllmState(model_name="meta-llama/Llama-3.1-70B-Instruct")

    def body() -> str:
        ours.serve(25, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
        theirs.serve(1000, prompt=8000, output=10, ttft_s=9.0, itl_s=0.5)
        return _two_models(ours, theirs)

    with MetricsServer(body) as srv:
        r = replan(env, "--traffic", srv.url, "--format", "json")
    obs = json.loads(r.stdout)["observed"]
    assert r.exit_code in (0, 10) and obs["requests"] == 25, r.output  # the 70B's 1000 are not ours
    assert obs["prompt_tokens"]["mean"] == pytest.approx(800)
    assert any("left out the series of model_name meta-llama/Llama-3.1-70B-Instruct" in n for n in obs["notes"])


def test_an_endpoint_of_another_model_only_is_refused(env: dict[str, Any]) -> None:
    st = VllmState(model_name="meta-llama/Llama-3.1-70B-Instruct")
    st.serve(100, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
    with MetricsServer(st.exposition) as srv:
        r = replan(env, "--traffic", srv.url)
    line = one_line_error(r)
    assert r.exit_code == 2 and "serves only model_name meta-llama/Llama-3.1-70B-Instruct" in line
    assert "llama-3.1-8b" in line and "--served-model-name" in line


def test_a_name_of_its_own_is_accepted_with_served_model_name(env: dict[str, Any]) -> None:
    st = VllmState(model_name="my-model")

    def body() -> str:
        st.serve(25, prompt=800, output=100, ttft_s=0.2, itl_s=0.02)
        return st.exposition()

    with MetricsServer(body) as srv:
        refused = replan(env, "--traffic", srv.url)
        assert refused.exit_code == 2 and "serves only model_name my-model" in refused.stderr
        r = replan(env, "--traffic", srv.url, "--served-model-name", "my-model", "--format", "json")
    assert r.exit_code in (0, 10) and json.loads(r.stdout)["observed"]["requests"] == 25, r.output


# ------------------------------------------------------------------------------ 5: exit codes a Job reads
@pytest.mark.parametrize("rate, seconds, outcome", [(4.0, 120, 10), (1.0, 5, 11), (1.5, 120, 0)])
def test_exit_zero_unless_error_maps_outcomes_to_success(env: dict[str, Any], rate: float, seconds: float,
                                                         outcome: int) -> None:
    log = write_log(env["tmp"] / "r.jsonl", rate, seconds)
    plain = replan(env, "--traffic", str(log), "--format", "json")
    assert plain.exit_code == outcome, plain.output
    (env["tmp"] / "h.db").unlink()
    r = replan(env, "--traffic", str(log), "--format", "json", "--exit-zero-unless-error")
    assert r.exit_code == 0 and json.loads(r.stdout)["exit_code"] == outcome, r.output


def test_exit_zero_unless_error_still_fails_on_an_error(env: dict[str, Any]) -> None:
    r = replan(env, "--traffic", "http://127.0.0.1:9/metrics", "--exit-zero-unless-error")
    assert r.exit_code == 2 and "unreachable" in one_line_error(r)


def test_the_cronjob_fails_only_on_errors() -> None:
    args, _, _, _ = _job(1, "prometheus+http://p:9090")
    assert "--exit-zero-unless-error" in args
    cmd = typer.main.get_command(app).commands["replan"]  # type: ignore[attr-defined]
    assert cmd.make_context("replan", list(args[1:])).params["exit_zero_unless_error"] is True


# ------------------------------------------------------------------------------------------ 6: wording
def test_a_refused_reading_says_keeping_the_current_plan_once(tmp_path: Path) -> None:
    class Refused:
        def observe(self) -> Any:
            raise TrafficSourceError(f"counter is 1e+300: a traffic reading must be finite; refused, {KEEP}")

    r = replan_once(current=fake_plan(2, 2.4), source=Refused(), planner=FakePlanner(), policy=Policy(),
                    history=History(str(tmp_path / "h.db")), predictor=FakePredictor())
    assert r.decision == "error" and r.reason.count(KEEP) == 1
    assert History(str(tmp_path / "h.db")).list()[0].reason.count(KEEP) == 1


def test_history_of_an_unknown_deployment_names_those_recorded(env: dict[str, Any]) -> None:
    replan(env, "--traffic", str(write_log(env["tmp"] / "r.jsonl", 1.5, 120)))
    r = cli.invoke(app, ["history", "--storage", str(env["db"]), "--deployment", "nomatch"])
    assert r.exit_code == 0
    assert r.stdout.strip() == ("no re-planning runs of deployment 'nomatch'; runs are recorded for: "
                                "chat/llama-3.1-8b (1 run) (--deployment takes one of these)")
    empty = cli.invoke(app, ["history", "--storage", str(env["tmp"] / "e.db"), "--deployment", "x"])
    assert empty.exit_code == 2  # no history file at all: run replan first


@pytest.mark.parametrize("url, scheme", [("ftp://x", "ftp"), ("file:///tmp/log.jsonl", "file"), ("s3://b/k", "s3")])
def test_an_unsupported_scheme_is_named(env: dict[str, Any], url: str, scheme: str) -> None:
    r = replan(env, "--traffic", url)
    line = one_line_error(r)
    assert r.exit_code == 2 and f"the scheme '{scheme}' is not supported" in line and "does not exist" not in line
    assert "http(s)://" in line and "prometheus+http(s)://" in line
