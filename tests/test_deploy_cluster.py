"""Manifests that land on the right hardware: GPU pinning by node label, namespace, images, tolerations,
node selector and storage class (flags or a values file), validated against the Kubernetes schemas and
the production-stack chart schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from test_deploy_render import CHART, STRICT_CHART, k8s_objects
from typer.testing import CliRunner

from recommender.cli import app
from recommender.deploy import cluster_options, render_deploy
from recommender.deploy.cluster import ROUTER_IMAGE, parse_toleration
from recommender.errors import DeployError

PLANS = Path(__file__).parent / "data" / "plans"
AGG = PLANS / "agg-llama70b-h100.json"
DISAGG = PLANS / "disagg-llama70b-h200.json"
AMD = PLANS / "amd-qwen7b-mi300x.json"
OPTS = cluster_options(namespace="llm", image="registry.example.com/vllm/vllm-openai:v0.33.0-patched",
                       storage_class="fast-rwx", node_selector=["cloud.google.com/gke-nodepool=h200-pool"],
                       tolerations=["nvidia.com/gpu:NoSchedule", "dedicated=llm:NoExecute"])


def _render(path: Path, fmt: str, opts: Any = None) -> dict[str, str]:
    return render_deploy(json.loads(path.read_text()), 1, fmt, cluster=opts)


def _pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"]["app.kubernetes.io/name"] == "vllm"]


@pytest.mark.parametrize(("path", "key", "value"), [
    (AGG, "nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),   # GFD label of an H100 SXM5 80GB
    (DISAGG, "nvidia.com/gpu.product", "NVIDIA-H200"),
    (AMD, "amd.com/gpu.device-id", "74a1"),                       # MI300X PCI device id 0x74a1
])
def test_every_engine_pod_is_pinned_to_the_gpu_model(path: Path, key: str, value: str) -> None:
    specs = _pod_specs(k8s_objects(_render(path, "k8s")))
    assert specs
    for spec in specs:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        expr = terms[0]["matchExpressions"][0]
        assert expr["key"] == key and expr["operator"] == "In" and value in expr["values"]


def test_cluster_options_reach_every_object_and_validate() -> None:
    objs = k8s_objects(_render(DISAGG, "k8s", OPTS))
    version = kubernetes_validate.latest_version()
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["namespace"] == "llm"
    pvc = next(o for o in objs if o["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "fast-rwx"
    for spec in _pod_specs(objs):
        assert spec["containers"][0]["image"] == "registry.example.com/vllm/vllm-openai:v0.33.0-patched"
        assert spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "h200-pool"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoExecute"} in spec["tolerations"]
    router = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    image = router["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == ROUTER_IMAGE and not image.endswith(":latest") and ":" in image


def test_helm_values_carry_the_options_and_pass_the_chart_schema() -> None:
    values = yaml.safe_load(_render(DISAGG, "helm", OPTS)["helm-values.yaml"])
    STRICT_CHART.validate(values)
    CHART.validate(values)
    for m in values["servingEngineSpec"]["modelSpec"]:
        assert (m["repository"], m["tag"]) == ("registry.example.com/vllm/vllm-openai", "v0.33.0-patched")
        exprs = m["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
        assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]} in exprs
        assert {"key": "cloud.google.com/gke-nodepool", "operator": "In", "values": ["h200-pool"]} in exprs
        assert m["storageClass"] == "fast-rwx" and m["tolerations"]
    assert (values["routerSpec"]["repository"], values["routerSpec"]["tag"]) == ("lmcache/lmstack-router", "v0.1.12")


def test_values_file_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump({"namespace": "from-file", "storage_class": "standard",
                                 "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}))
    opts = cluster_options(values_file=f, namespace="from-flag")
    assert opts.namespace == "from-flag" and opts.storage_class == "standard"
    assert opts.tolerations == ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},)
    f.write_text("colour: blue\n")
    with pytest.raises(DeployError, match="unknown key 'colour'"):
        cluster_options(values_file=f)


@pytest.mark.parametrize(("kw", "match"), [
    ({"namespace": "Bad_NS"}, "DNS-1123"),
    ({"router_image": "lmcache/lmstack-router:latest"}, "pinned"),
    ({"router_image": "lmcache/lmstack-router"}, "pinned"),
    ({"node_selector": ["novalue"]}, "key=value"),
    ({"tolerations": ["gpu:Sometimes"]}, "effect must be"),
    ({"image": "bad image"}, "image reference"),
])
def test_bad_cluster_options_are_one_line_errors(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(DeployError, match=match) as e:
        cluster_options(**kw)
    assert "\n" not in str(e.value)


def test_toleration_forms() -> None:
    assert parse_toleration("gpu") == {"key": "gpu", "operator": "Exists"}
    assert parse_toleration("gpu=yes:NoSchedule") == {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}


def test_deploy_cli_flags(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["deploy", str(AGG), "--format", "k8s", "--namespace", "llm", "--toleration",
                                   "nvidia.com/gpu:NoSchedule", "--storage-class", "fast"])
    assert res.exit_code == 0, res.output
    objs = [o for o in yaml.safe_load_all(res.stdout) if o]
    assert all(o["metadata"]["namespace"] == "llm" for o in objs)
    res = CliRunner().invoke(app, ["deploy", str(AGG), "--format", "k8s", "--namespace", "NO"])
    assert res.exit_code != 0 and "DNS-1123" in res.output


def test_deploy_cli_refuses_int8_on_b200_in_one_line(tmp_path: Path) -> None:
    # an old plan JSON: int8 W8A8 weights on B200 (vLLM's sm100 scaled_mm has no INT8 kernel)
    doc = json.loads(AGG.read_text())
    for row in doc["plans"]:
        row.update(gpu="b200", weight_dtype="int8", checkpoint="org/m-w8a8")
        for pool in row["pools"]:
            pool.update(gpu="b200", weight_dtype="int8")
    old = tmp_path / "old.plan.json"
    old.write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["deploy", str(old), "--format", "k8s", "--out", str(tmp_path / "out")])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not run int8 weights on b200 (blackwell)" in lines[0]
    assert not (tmp_path / "out").exists()
