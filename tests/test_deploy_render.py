"""Rendered files: every ``vllm serve`` argv passes the 0.33 flag check in every format (cmd, k8s args,
Helm values as the chart expands them), manifests pass the real Kubernetes schemas, values pass the
production-stack chart schema, and all formats tell vLLM the same thing the plan modelled."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml
from importlib import resources

from recommender import deploy as _deploy
from recommender.catalog import default_catalog
from recommender.deploy.helm import chart_engine_argv
from recommender.deploy.vllm_flags import check_serve_args
from recommender.errors import DeployError
from recommender.plan import load_plan


def render_deploy(doc, **kw):  # the tests edit plan documents, then read them through the one loader
    return _deploy.render_deploy(load_plan(doc), **kw)


ROOT = Path(__file__).resolve().parent.parent
PLANS = Path(__file__).parent / "data" / "plans"
GOLDEN = Path(__file__).parent / "golden"
KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def plan_files() -> list[Path]:
    """Fixture plans plus any example plans the project ships (examples/**/*.plan.json)."""
    return sorted(PLANS.glob("*.json")) + sorted(ROOT.glob("examples/**/*.plan.json"))


def plan_cases() -> list[tuple[Path, int]]:
    return [(p, row["rank"]) for p in plan_files() for row in json.loads(p.read_text())["plans"]]


CASES = plan_cases()
IDS = [f"{p.stem}-r{r}" for p, r in CASES]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def run_script(script: str, tmp: Path, extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run a cmd-form script with a fake ``vllm`` on PATH that records its argv and NIXL env."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "vllm"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() if k.startswith('VLLM_')}},"
                    " open(os.environ['ARGV_OUT'], 'w'))\n")
    fake.chmod(0o755)
    path = tmp / "script.sh"
    path.write_text(script)
    out = tmp / "argv.json"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "ARGV_OUT": str(out), **(extra_env or {})}
    proc = subprocess.run(["sh", str(path)], cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
    return proc, json.loads(out.read_text()) if out.exists() else None


def expected_settings(doc: dict[str, Any], rank: int, role: str) -> dict[str, Any]:
    """What vLLM must be told, read straight from the plan JSON (independent of the renderers)."""
    row = next(r for r in doc["plans"] if r["rank"] == rank)
    pool = next(p for p in row["pools"] if p["role"] == role)
    wl = doc["workload"]
    exp: dict[str, Any] = {
        "tensor_parallel_size": pool["tp"], "max_num_seqs": pool["max_num_seqs"],
        "max_num_batched_tokens": pool["max_num_batched_tokens"], "enable_chunked_prefill": pool["chunked_prefill"],
        "enable_prefix_caching": pool.get("enable_prefix_caching", row["enable_prefix_caching"]), "gpu_memory_utilization": pool["gpu_memory_utilization"],
        "max_model_len": wl["max_model_len"], "kv_cache_dtype": KV[pool["kv_dtype"]],
        "served_model_name": list(dict.fromkeys([wl["hf_repo"], wl["model"]])),
        "model_tag": row.get("checkpoint") or wl["hf_repo"],
    }
    if pool["weight_dtype"] == "fp8" and wl["checkpoint_dtype"] in ("bf16", "fp16") and not row.get("checkpoint"):
        exp["quantization"] = "fp8"
    if row["cuda_graphs"]:
        # vLLM 0.33's default cap: 1024 on datacenter Blackwell, 512 elsewhere (shared/reference/vllm/README.md,
        # --max-cudagraph-capture-size); a decode step carries 1 + k tokens per sequence with k MTP draft tokens,
        # and the cap is rounded down to a multiple of 1 + k
        q = 1 + pool.get("num_speculative_tokens", 0)
        cap = 1024 if pool["gpu"] in ("b200", "b300", "gb200", "gb300") else 512
        exp["max_cudagraph_capture_size"] = min(pool["max_num_seqs"] * q, cap // q * q)
    else:
        exp["enforce_eager"] = True
    if role != "both":
        exp["kv_transfer_config"] = {"kv_connector": "NixlConnector",
                                     "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[role],
                                     "kv_buffer_device": "cuda", "kv_connector_extra_config": {"backends": ["UCX"]}}
    # MoE layouts (issue 21): flags only where the plan sets them (the parser then reports nothing: None)
    dp = pool.get("data_parallel_size", 1)
    exp["data_parallel_size"] = dp if dp > 1 else None
    exp["enable_expert_parallel"] = True if pool.get("enable_expert_parallel") else None
    k = pool.get("num_speculative_tokens", 0)
    exp["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k} if k else None
    return exp


def assert_settings(parsed: dict[str, Any], exp: dict[str, Any], where: str) -> None:
    got = {k: parsed.get(k) for k in exp}
    assert got == exp, where
    if "quantization" not in exp:
        assert "quantization" not in parsed, where


def k8s_objects(files: dict[str, str]) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(files["k8s.yaml"]) if o]


def engine_deployments(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """component label -> engine Deployment."""
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in objs
            if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/name"] == "vllm"}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*_a: Any, **_k: Any) -> None:
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


def _strict(schema: Any) -> Any:
    """The chart schema with additionalProperties: false wherever it lists properties (catches typos)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    return schema


CHART_SCHEMA = json.loads(resources.files("recommender").joinpath("data", "production-stack", "values.schema.json").read_text())
STRICT_CHART = jsonschema.Draft202012Validator(_strict(CHART_SCHEMA))
CHART = jsonschema.Draft202012Validator(CHART_SCHEMA)


# ---------------------------------------------------------------- all plans, all formats


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_cmd_scripts_run_vllm_with_the_modelled_settings(path: Path, rank: int, tmp_path: Path) -> None:
    doc = json.loads(path.read_text())
    files = render_deploy(doc, rank=rank, formats="cmd", plan_name=rel(path))
    for name, script in files.items():
        role = "both" if name == "vllm-serve.sh" else name.removeprefix("vllm-serve-").removesuffix(".sh")
        proc, rec = run_script(script, tmp_path, {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3"})
        assert proc.returncode == 0, proc.stderr
        assert rec["argv"][0] == "serve"
        assert_settings(check_serve_args(rec["argv"][1:]), expected_settings(doc, rank, role), name)
        if role != "both":
            assert rec["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"
            assert rec["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] in ("5600", "5601")


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_k8s_manifests_pass_the_kubernetes_schemas_offline(path: Path, rank: int, no_network: None) -> None:
    doc = json.loads(path.read_text())
    objs = k8s_objects(render_deploy(doc, rank=rank, formats="k8s", plan_name=rel(path)))
    version = kubernetes_validate.latest_version()
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)
        assert DNS_LABEL.fullmatch(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
        for labels in (obj["metadata"].get("labels", {}), obj.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})):
            for value in labels.values():
                assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), value


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_k8s_engines_match_the_plan(path: Path, rank: int) -> None:
    doc = json.loads(path.read_text())
    row = next(r for r in doc["plans"] if r["rank"] == rank)
    engines = engine_deployments(k8s_objects(render_deploy(doc, rank=rank, formats="k8s", plan_name=rel(path))))
    assert sorted(engines) == sorted("engine" if p["role"] == "both" else p["role"] for p in row["pools"])
    for pool in row["pools"]:
        dep = engines["engine" if pool["role"] == "both" else pool["role"]]
        c = dep["spec"]["template"]["spec"]["containers"][0]
        resource = "amd.com/gpu" if pool["gpu"].startswith("mi") else "nvidia.com/gpu"
        assert dep["spec"]["replicas"] == pool["replicas"]
        # one pod is one engine: tp x data_parallel_size GPUs (issue 21)
        assert c["resources"]["limits"] == {resource: str(pool["tp"] * pool.get("data_parallel_size", 1))}
        assert c["image"] == ("vllm/vllm-openai-rocm:v0.33.0" if resource == "amd.com/gpu" else "vllm/vllm-openai:v0.33.0")
        assert c["command"] == ["vllm", "serve"]
        # steered to the GPU model by the node label in the catalog (k8s.node_labels), softly by default
        # (--gpu-label auto: a cluster without GPU feature discovery still schedules the pod)
        node = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in node
        expr = node["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]["matchExpressions"][0]
        gpu = default_catalog().gpu(pool["gpu"])
        assert expr["key"] == ("amd.com/gpu.device-id" if gpu.vendor == "amd" else "nvidia.com/gpu.product")
        assert expr["operator"] == "In" and expr["values"] == [v for k, v in gpu.node_labels if k == expr["key"]]
        assert_settings(check_serve_args(c["args"]), expected_settings(doc, rank, pool["role"]), dep["metadata"]["name"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert volumes[next(k for k, v in mounts.items() if v == "/dev/shm")]["emptyDir"]["medium"] == "Memory"
        assert "persistentVolumeClaim" in volumes[next(k for k, v in mounts.items() if v == "/root/.cache/huggingface")]
        token = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
        labels = dep["metadata"]["labels"]
        assert labels["recommender/plan-rank"] == str(rank) and labels["recommender/plan-id"] == row["id"]
        assert set(dep["spec"]["selector"]["matchLabels"].items()) <= set(dep["spec"]["template"]["metadata"]["labels"].items())
        assert "recommender/plan-id" not in dep["spec"]["selector"]["matchLabels"]  # selectors are immutable


@pytest.mark.parametrize(("path", "rank"), CASES, ids=IDS)
def test_helm_values_pass_the_chart_schema_and_expand_to_the_modelled_flags(path: Path, rank: int) -> None:
    doc = json.loads(path.read_text())
    row = next(r for r in doc["plans"] if r["rank"] == rank)
    values = yaml.safe_load(render_deploy(doc, rank=rank, formats="helm", plan_name=rel(path))["helm-values.yaml"])
    CHART.validate(values)
    STRICT_CHART.validate(values)
    specs = values["servingEngineSpec"]["modelSpec"]
    assert len(specs) == len(row["pools"])
    for pool, ms in zip(sorted(row["pools"], key=lambda p: ["both", "prefill", "decode"].index(p["role"])), specs):
        assert ms["replicaCount"] == pool["replicas"] and ms["requestGPU"] == pool["tp"] * pool.get("data_parallel_size", 1)
        assert ms["tag"] == "v0.33.0"
        assert_settings(check_serve_args(chart_engine_argv(ms)), expected_settings(doc, rank, pool["role"]), ms["name"])


def test_strict_chart_schema_catches_a_key_the_chart_does_not_have() -> None:
    values = yaml.safe_load(render_deploy(json.loads((PLANS / "agg-llama70b-h100.json").read_text()), rank=1, formats="helm")["helm-values.yaml"])
    values["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["maxNumBatchedTokens"] = 8192
    assert not STRICT_CHART.is_valid(values)


def test_every_file_starts_with_a_header_naming_plan_and_workload() -> None:
    path = PLANS / "disagg-llama70b-h200.json"
    files = render_deploy(json.loads(path.read_text()), rank=1, formats="all", plan_name=rel(path))
    assert sorted(files) == ["helm-values.yaml", "k8s.yaml", "vllm-serve-decode.sh", "vllm-serve-prefill.sh"]
    for name, text in files.items():
        lines = text.splitlines()
        head = lines[1:4] if lines[0].startswith("#!") else lines[:3]
        assert head[0].startswith("# Generated by recommender"), name
        assert head[1] == "# Plan: pd-h200-p2x2-d4x1-bf16-fp8 (rank 1 of 1) from tests/data/plans/disagg-llama70b-h200.json"
        assert head[2].startswith("# Workload: chat-long (examples/chat-long.yaml); model llama-3.1-70b")


# ---------------------------------------------------------------- disaggregated layout


def test_disaggregated_k8s_layout() -> None:
    doc = json.loads((PLANS / "disagg-llama70b-h200.json").read_text())
    objs = k8s_objects(render_deploy(doc, rank=1, formats="k8s"))
    engines = engine_deployments(objs)
    pre, dec = engines["prefill"], engines["decode"]
    assert (pre["spec"]["replicas"], dec["spec"]["replicas"]) == (2, 1)
    for dep, role in ((pre, "kv_producer"), (dec, "kv_consumer")):
        c = dep["spec"]["template"]["spec"]["containers"][0]
        kvt = json.loads(c["args"][c["args"].index("--kv-transfer-config") + 1])
        assert kvt["kv_connector"] == "NixlConnector" and kvt["kv_role"] == role
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
        assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in c["ports"]
    router = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--routing-logic") + 1] == "disaggregated_prefill_orchestrated"
    # production-stack's router tells prefill from decode pods by their `model` label
    assert args[args.index("--prefill-model-labels") + 1] == pre["spec"]["template"]["metadata"]["labels"]["model"]
    assert args[args.index("--decode-model-labels") + 1] == dec["spec"]["template"]["metadata"]["labels"]["model"]
    selector = dict(kv.split("=") for kv in args[args.index("--k8s-label-selector") + 1].split(","))
    for dep in (pre, dec):
        assert set(selector.items()) <= set(dep["spec"]["template"]["metadata"]["labels"].items())
    assert not set(selector.items()) <= set(router["spec"]["template"]["metadata"]["labels"].items())
    service = next(o for o in objs if o["kind"] == "Service")
    assert set(service["spec"]["selector"].items()) <= set(router["spec"]["template"]["metadata"]["labels"].items())
    role = next(o for o in objs if o["kind"] == "Role")
    assert {"pods"} == set(role["rules"][0]["resources"]) and {"list", "watch"} <= set(role["rules"][0]["verbs"])
    binding = next(o for o in objs if o["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == router["spec"]["template"]["spec"]["serviceAccountName"]


def test_disaggregated_helm_layout() -> None:
    doc = json.loads((PLANS / "disagg-llama70b-h200.json").read_text())
    values = yaml.safe_load(render_deploy(doc, rank=1, formats="helm")["helm-values.yaml"])
    pre, dec = values["servingEngineSpec"]["modelSpec"]
    router = values["routerSpec"]
    assert router["routingLogic"] == "disaggregated_prefill_orchestrated"
    # the chart labels each engine pod `model: <modelSpec name>`
    assert router["extraArgs"] == ["--prefill-model-labels", pre["name"], "--decode-model-labels", dec["name"]]
    for ms in (pre, dec):
        env = {e["name"]: e for e in ms["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_amd_plan_targets_rocm() -> None:
    values = yaml.safe_load(render_deploy(json.loads((PLANS / "amd-qwen7b-mi300x.json").read_text()), rank=1, formats="helm")["helm-values.yaml"])
    ms = values["servingEngineSpec"]["modelSpec"][0]
    assert (ms["repository"], ms["requestGPUType"]) == ("vllm/vllm-openai-rocm", "amd.com/gpu")
    assert values["servingEngineSpec"]["runtimeClassName"] == ""


# ---------------------------------------------------------------- escaping


ODD_NAMES = ["my model", "it's/quoted", 'say "hi"/m', "$(touch PWNED1)", "`touch PWNED2`", "m; touch PWNED3",
             "a && touch PWNED4", "back\\slash", "$HOME/model", "m | tee PWNED5", "*", "m > PWNED6"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_unusual_model_names_are_refused_and_never_reach_the_shell(name: str, tmp_path: Path) -> None:
    doc = json.loads((PLANS / "agg-llama70b-h100.json").read_text())
    doc["workload"].update(hf_repo=name, model="served")
    with pytest.raises(DeployError, match="not a Hugging Face repo id"):
        render_deploy(doc, rank=2, formats="all")
    # as the served alias (the workload's model id) such a name is dropped, and header text stays a comment
    doc["workload"].update(hf_repo="org/model", model=name)
    doc["workload"]["source"] = "x\ntouch PWNED7"  # a newline in a header value must not end the comment
    files = render_deploy(doc, rank=2, formats="all")
    proc, rec = run_script(files["vllm-serve.sh"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert rec["argv"][1] == "org/model"
    assert rec["argv"][rec["argv"].index("--served-model-name") + 1] == "org/model"
    assert name not in rec["argv"]
    assert not list(tmp_path.glob("PWNED*"))


# ---------------------------------------------------------------- golden files


GOLDEN_PLANS = ["agg-llama70b-h100.json", "disagg-llama70b-h200.json"]


@pytest.mark.parametrize("plan", GOLDEN_PLANS)
def test_golden_files(plan: str) -> None:
    """Byte-for-byte regression; regenerate with RECOMMENDER_UPDATE_GOLDEN=1 after reviewing the diff."""
    path = PLANS / plan
    files = render_deploy(json.loads(path.read_text()), rank=1, formats="all", plan_name=rel(path))
    folder = GOLDEN / path.stem
    if os.environ.get("RECOMMENDER_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for name, text in files.items():
        assert (folder / name).read_text() == text, f"{folder / name} differs"


def test_renderers_do_not_mutate_the_plan() -> None:
    doc = json.loads((PLANS / "disagg-llama70b-h200.json").read_text())
    before = copy.deepcopy(doc)
    render_deploy(doc, rank=1, formats="all")
    assert doc == before
