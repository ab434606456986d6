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
    return render_deploy(json.loads(path.read_text()), rank=1, formats=fmt, cluster=opts)


def _pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"]["app.kubernetes.io/name"] == "vllm"]


@pytest.mark.parametrize(("path", "key", "value"), [
    (AGG, "nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),   # GFD label of an H100 SXM5 80GB
    (DISAGG, "nvidia.com/gpu.product", "NVIDIA-H200"),
    (AMD, "amd.com/gpu.device-id", "74a1"),                       # MI300X PCI device id 0x74a1
])
def test_every_engine_pod_is_pinned_to_the_gpu_model(path: Path, key: str, value: str) -> None:
    # --gpu-label gfd: the GPU feature discovery label is required
    specs = _pod_specs(k8s_objects(_render(path, "k8s", cluster_options(gpu_label="gfd"))))
    assert specs
    for spec in specs:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        expr = terms[0]["matchExpressions"][0]
        assert expr["key"] == key and expr["operator"] == "In" and value in expr["values"]
    # the default (cluster kind unknown): the same label only preferred, so pods schedule without GFD
    for spec in _pod_specs(k8s_objects(_render(path, "k8s"))):
        node = spec["affinity"]["nodeAffinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in node
        prefs = [t["preference"]["matchExpressions"][0] for t in node["preferredDuringSchedulingIgnoredDuringExecution"]]
        assert any(e["key"] == key and value in e["values"] for e in prefs)


def _schedules_on(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies the pod's required node affinity and nodeSelector (Kubernetes'
    rule: every key of nodeSelector, and every matchExpression of one of the required terms, In = value listed)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not req:
        return True
    return any(all(labels.get(e["key"]) in e["values"] for e in t["matchExpressions"]) for t in req["nodeSelectorTerms"])


# node labels as each cluster kind sets them for an 8 x H100 SXM node (GKE a3-highgpu-8g: the Compute Engine
# accelerator type nvidia-h100-80gb; EKS p5.48xlarge: its instance type; GFD: the NVML product name)
GFD_NODE = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GKE_NODE = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
EKS_NODE = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


@pytest.mark.parametrize(("choice", "fits", "misses"), [
    (None, [GFD_NODE, GKE_NODE, EKS_NODE, {}], []),          # default: soft, any node with the GPU resource
    ("gfd", [GFD_NODE], [GKE_NODE, EKS_NODE, {}]),
    ("gke", [GKE_NODE], [GFD_NODE, EKS_NODE, {}]),
    ("eks", [EKS_NODE], [GFD_NODE, GKE_NODE, {}]),
    ("none", [GFD_NODE, GKE_NODE, EKS_NODE, {}], []),
])
def test_gpu_label_choice_decides_which_clusters_schedule_the_pods(choice: str | None, fits: list[dict[str, str]],
                                                                  misses: list[dict[str, str]]) -> None:
    for fmt in ("k8s", "helm"):
        files = _render(AGG, fmt, cluster_options(gpu_label=choice))
        if fmt == "k8s":
            specs = _pod_specs(k8s_objects(files))
        else:
            specs = yaml.safe_load(files["helm-values.yaml"])["servingEngineSpec"]["modelSpec"]
            STRICT_CHART.validate(yaml.safe_load(files["helm-values.yaml"]))
        assert specs
        for spec in specs:
            assert all(_schedules_on(spec, n) for n in fits), (fmt, choice, spec.get("affinity"))
            assert not any(_schedules_on(spec, n) for n in misses), (fmt, choice, spec.get("affinity"))
    if choice == "none":
        assert all("affinity" not in s for s in _pod_specs(k8s_objects(_render(AGG, "k8s", cluster_options(gpu_label="none")))))


def test_a_gpu_label_the_catalog_lacks_is_refused_in_one_line() -> None:
    with pytest.raises(DeployError, match="--gpu-label gke: the catalog names no gke node label for mi300x"):
        _render(AMD, "k8s", cluster_options(gpu_label="gke"))
    with pytest.raises(DeployError, match="--gpu-label 'gce'"):
        cluster_options(gpu_label="gce")


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
        # the user's node selector is required; the GPU model label (default --gpu-label auto) only preferred
        node = m["affinity"]["nodeAffinity"]
        exprs = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
        assert exprs == [{"key": "cloud.google.com/gke-nodepool", "operator": "In", "values": ["h200-pool"]}]
        prefs = [t["preference"]["matchExpressions"] for t in node["preferredDuringSchedulingIgnoredDuringExecution"]]
        assert [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}] in prefs
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
