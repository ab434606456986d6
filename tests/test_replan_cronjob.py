"""The re-planner in the cluster: ``recommend deploy PLAN --format replan-cronjob`` (checked against the
Kubernetes schemas offline and against `recommend replan`'s own option parser) and ``--apply-to`` (a
loopback stand-in for the Kubernetes API records the scale patches)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml
from typer.testing import CliRunner

from recommender.plan import load_plan, with_replicas
from recommender.cli import app
from recommender.deploy import render_deploy
from recommender.deploy.replan_job import ReplanJobOptions
from recommender.replan.kube import ApplyError, apply_replicas

ROOT = Path(__file__).parent.parent
AGG = ROOT / "examples" / "plans" / "chat.plan.json"
DISAGG = ROOT / "tests" / "data" / "plans" / "disagg-llama70b-h200.json"


def objects(doc: dict[str, Any], opts: ReplanJobOptions) -> list[dict[str, Any]]:
    files = render_deploy(doc, rank=1, formats="replan-cronjob", replan=opts)
    assert list(files) == ["replan-cronjob.yaml"]
    return [o for o in yaml.safe_load_all(files["replan-cronjob.yaml"]) if o]


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*_a, **_k):
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("path", [AGG, DISAGG], ids=["aggregated", "disaggregated"])
@pytest.mark.parametrize("opts", [ReplanJobOptions(), ReplanJobOptions(apply=True, history_secret="replan-db")],
                         ids=["propose-sqlite", "apply-postgres"])
def test_cronjob_manifest_passes_the_kubernetes_schemas(path, opts, no_network):
    doc = json.loads(path.read_text())
    objs = objects(doc, opts)
    version = kubernetes_validate.latest_version()
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)
    kinds = [o["kind"] for o in objs]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim", "CronJob"]
    cron = objs[-1]
    assert cron["spec"]["schedule"] == "*/5 * * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == objs[0]["metadata"]["name"] == objs[2]["subjects"][0]["name"]
    # the deployed plan rides along in the ConfigMap, mounted where --current points
    assert load_plan(objs[3]["data"]["plan.json"]) == load_plan(doc)  # the same plan (written in format 2)
    # the re-planner's pods are never discovered as engines by the P/D router (name + instance selector)
    labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] != "vllm"


def test_cronjob_args_are_what_recommend_replan_accepts():
    doc = json.loads(DISAGG.read_text())
    objs = objects(doc, ReplanJobOptions(apply=True, history_secret="replan-db"))
    container = objs[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["recommend"] and container["args"][0] == "replan"
    cmd = typer.main.get_command(app).commands["replan"]  # type: ignore[attr-defined]
    ctx = cmd.make_context("replan", list(container["args"][1:]))
    p = ctx.params
    assert str(p["current"]) == "/plan/plan.json" and str(p["out"]) == "/data/plan"
    assert p["storage"] == "$(REPLAN_HISTORY_URL)"  # Kubernetes expands it from the Secret's env
    assert container["env"] == [{"name": "REPLAN_HISTORY_URL",
                                 "valueFrom": {"secretKeyRef": {"name": "replan-db", "key": "url"}}}]
    served = doc["workload"].get("served_model_name") or doc["workload"]["hf_repo"]
    assert p["selector"] == f'model_name="{served}"'
    # --apply-to names each engine Deployment in pool order; the Role may patch exactly those
    names = [o for o in p["apply_to"]]
    assert names == [n for n in names if n.endswith(("-prefill", "-decode"))] and len(names) == 2
    role = objs[1]
    scale_rule = next(r for r in role["rules"] if r["resources"] == ["deployments/scale"])
    assert scale_rule["resourceNames"] == names and scale_rule["verbs"] == ["get", "patch"]
    # without --apply there is no patch permission and no --apply-to
    plain = objects(doc, ReplanJobOptions())
    assert all("patch" not in r["verbs"] for r in plain[1]["rules"])
    assert "--apply-to" not in plain[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_hostile_traffic_and_selector_strings_do_not_expand(tmp_path):
    doc = json.loads(AGG.read_text())
    opts = ReplanJobOptions(traffic="prometheus+http://p:9090/$(HF_TOKEN)", selector='model_name="$(HF_TOKEN)"')
    args = objects(doc, opts)[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "prometheus+http://p:9090/$$(HF_TOKEN)" in args and 'model_name="$$(HF_TOKEN)"' in args


def test_deploy_cli_writes_the_cronjob_and_refuses_bad_options(tmp_path):
    run = CliRunner()
    r = run.invoke(app, ["deploy", str(AGG), "--format", "replan-cronjob", "--schedule", "*/10 * * * *",
                         "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "out" / "replan-cronjob.yaml").read_text()
    assert "schedule: '*/10 * * * *'" in text
    assert not (tmp_path / "out" / "k8s.yaml").exists()  # 'replan-cronjob' is not part of 'all' and vice versa
    for bad, match in ((["--schedule", "every 5 minutes"], "five-field cron"),
                       (["--selector", "model=llama"], "PromQL label matchers"),
                       (["--history-secret", "Bad_Name"], "Kubernetes object name")):
        r = run.invoke(app, ["deploy", str(AGG), "--format", "replan-cronjob", *bad])
        assert r.exit_code != 0 and match in r.output and "Traceback" not in r.output


class FakeKubeApi:
    """Records PATCH requests; answers 200, or 403 for deployments named 'forbidden'."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any], str | None]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.patches.append((self.path, self.headers["Content-Type"], body, self.headers.get("Authorization")))
                code = 403 if "/forbidden/" in self.path else 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def test_apply_scales_same_shape_changes_only(monkeypatch):
    api = FakeKubeApi()
    monkeypatch.setenv("RECOMMENDER_KUBE_API", api.url)
    monkeypatch.setenv("RECOMMENDER_KUBE_NAMESPACE", "prod")
    try:
        cur = load_plan(DISAGG)
        new = with_replicas(cur, (3, 2), "test")
        msg = apply_replicas(cur, new, ["llm-prefill", "llm-decode"])
        assert msg == "applied: llm-prefill -> 3 replicas, llm-decode -> 2 replicas"
        assert [(p[0], p[1], p[2]) for p in api.patches] == [
            ("/apis/apps/v1/namespaces/prod/deployments/llm-prefill/scale", "application/merge-patch+json",
             {"spec": {"replicas": 3}}),
            ("/apis/apps/v1/namespaces/prod/deployments/llm-decode/scale", "application/merge-patch+json",
             {"spec": {"replicas": 2}})]
        other = load_plan(AGG)
        assert apply_replicas(cur, other, ["llm-prefill", "llm-decode"]).startswith("not applied: ")
        assert len(api.patches) == 2
        with pytest.raises(ApplyError, match="HTTP 403"):
            apply_replicas(cur, new, ["forbidden", "llm-decode"])
    finally:
        api.httpd.shutdown()
        api.httpd.server_close()


def test_apply_scales_a_rented_plan(monkeypatch):
    """examples/plans/chat.plan.json rents runpod instances of 1 GPU: at 3 replicas it rents 3 instances, the
    same shape (the instance count follows the replicas), so the change is applied as a scale."""
    api = FakeKubeApi()
    monkeypatch.setenv("RECOMMENDER_KUBE_API", api.url)
    monkeypatch.setenv("RECOMMENDER_KUBE_NAMESPACE", "prod")
    try:
        cur = load_plan(AGG)
        new = with_replicas(cur, (3,), "test")
        assert (cur.top.instances, new.top.instances) == (1, 3)
        assert apply_replicas(cur, new, ["llm"]) == "applied: llm -> 3 replicas"
        assert [p[2] for p in api.patches] == [{"spec": {"replicas": 3}}]
    finally:
        api.httpd.shutdown()
        api.httpd.server_close()


def _tray_plan() -> dict[str, Any]:
    """examples/plans/batch-summarization.plan.json with its GB200 row (rank 5) at TP 8 as rank 1: an engine over
    two 4-GPU trays, which k8s.yaml runs as a LeaderWorkerSet (tests/test_deploy_multitray.py)."""
    doc = json.loads((ROOT / "examples" / "plans" / "batch-summarization.plan.json").read_text())
    row = next(p for p in doc["plans"] if p["pools"][0]["gpu"] == "gb200")
    row["tp"] = row["pools"][0]["tp"] = 8
    row["rank"] = 1
    doc["plans"] = [row]
    return doc


def test_the_job_of_a_plan_over_trays_scales_its_leader_worker_set() -> None:
    doc = _tray_plan()
    lws = next(o for o in yaml.safe_load_all(render_deploy(doc, rank=1, formats="k8s")["k8s.yaml"]) if o and o["kind"] == "LeaderWorkerSet")
    objs = objects(doc, ReplanJobOptions(apply=True))
    for o in objs:
        kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)
    role = next(o for o in objs if o["kind"] == "Role")
    name = lws["metadata"]["name"]
    assert role["rules"] == [
        {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "resourceNames": [name],
         "verbs": ["get"]},
        {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets/scale"], "resourceNames": [name],
         "verbs": ["get", "patch"]}]
    args = next(o for o in objs if o["kind"] == "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert args[args.index("--apply-to") + 1] == name


def test_apply_scales_a_leader_worker_set(monkeypatch):
    """The LWS CRD has the scale subresource (kubernetes-sigs/lws: specReplicasPath .spec.replicas, one group per
    replica): a same-shape change patches leaderworkersets/<name>/scale."""
    api = FakeKubeApi()
    monkeypatch.setenv("RECOMMENDER_KUBE_API", api.url)
    monkeypatch.setenv("RECOMMENDER_KUBE_NAMESPACE", "prod")
    try:
        cur = load_plan(_tray_plan())
        new = with_replicas(cur, (10,), "test")
        assert apply_replicas(cur, new, ["llm"]) == "applied: llm -> 10 replicas (LeaderWorkerSet)"
        assert [(p[0], p[2]) for p in api.patches] == [
            ("/apis/leaderworkerset.x-k8s.io/v1/namespaces/prod/leaderworkersets/llm/scale", {"spec": {"replicas": 10}})]
    finally:
        api.httpd.shutdown()
        api.httpd.server_close()
