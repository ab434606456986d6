"""P/D pods on an RDMA path request their NICs and tell NIXL which transport to use (else NIXL falls back to
TCP); P and D planned on one instance are scheduled onto one node."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from test_deploy_render import k8s_objects

from recommender.deploy import render_deploy
from recommender.deploy.k8s import DEFAULT_RDMA_RESOURCE

BASE = json.loads((Path(__file__).parent / "data" / "plans" / "disagg-llama70b-h200.json").read_text())
# the plan's pools: prefill 2 x TP2, decode TP? (tests/data/plans/disagg-llama70b-h200.json)
TPS = {p["role"]: p["tp"] for p in BASE["plans"][0]["pools"]}


def _plan(kind: str, *, same_instance: bool = False, resource: str = "", per_gpu: float = 0.0) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    row = doc["plans"][0]
    rdma = kind in ("infiniband", "roce", "efa") and not same_instance
    row["kv_link"] = {"kind": kind, "bytes_per_s_per_gpu": 50e9, "same_instance": same_instance, "rdma": rdma,
                      "known": True, "label": kind}
    for p in row["pools"]:
        p["rental"] = {"provider": "x", "instances": 1, "gpus_per_instance": 8, "usd_per_instance_hour": 8.0,
                       "usd_per_hour": 8.0, "rdma_resource": resource, "rdma_per_gpu": per_gpu}
    row["usd_per_hour"] = 8.0 * len(row["pools"])  # the plan reader holds a row's price to its pools' sum
    return doc


def _engines(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objs = k8s_objects(render_deploy(doc, rank=1, formats="k8s"))
    version = kubernetes_validate.latest_version()
    for o in objs:
        kubernetes_validate.validate(o, version, strict=True)
    return {o["metadata"]["name"].rsplit("-", 1)[-1]: o for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"]["app.kubernetes.io/name"] == "vllm"}


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]


def _backend(c: dict[str, Any]) -> str:
    cfg = json.loads(c["args"][c["args"].index("--kv-transfer-config") + 1])
    return str(cfg["kv_connector_extra_config"]["backends"][0])


def test_efa_pods_request_efa_devices_and_use_libfabric() -> None:
    # AWS p5.48xlarge: 32 EFA devices for 8 GPUs = 4 per GPU ([N1]); a TP2 pod requests 8
    engines = _engines(_plan("efa", resource="vpc.amazonaws.com/efa", per_gpu=4))
    assert set(engines) == {"prefill", "decode"}
    for role, dep in engines.items():
        c = _container(dep)
        assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == str(4 * TPS[role])
        assert c["resources"]["requests"]["vpc.amazonaws.com/efa"] == str(4 * TPS[role])
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert {"name": "FI_PROVIDER", "value": "efa"} in c["env"]
        assert _backend(c) == "LIBFABRIC"


@pytest.mark.parametrize("kind", ["infiniband", "roce"])
def test_infiniband_pods_request_an_rdma_device_and_use_ucx(kind: str) -> None:
    for dep in _engines(_plan(kind)).values():
        c = _container(dep)
        assert c["resources"]["limits"][DEFAULT_RDMA_RESOURCE] == "1"
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"] and _backend(c) == "UCX"


def test_ethernet_and_same_instance_pods_request_no_rdma_device() -> None:
    for doc in (_plan("ethernet"), _plan("pcie5", same_instance=True)):
        for dep in _engines(doc).values():
            c = _container(dep)
            assert set(c["resources"]["limits"]) == {"nvidia.com/gpu"} and "securityContext" not in c
            assert _backend(c) == "UCX"


def test_p_and_d_on_one_instance_are_scheduled_onto_one_node() -> None:
    engines = _engines(_plan("pcie5", same_instance=True))
    aff = engines["decode"]["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    term = aff["requiredDuringSchedulingIgnoredDuringExecution"][0]
    prefill_labels = engines["prefill"]["spec"]["template"]["metadata"]["labels"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert all(prefill_labels[k] == v for k, v in term["labelSelector"]["matchLabels"].items())
    assert "podAffinity" not in engines["prefill"]["spec"]["template"]["spec"].get("affinity", {})
    # across instances, no such constraint
    assert "podAffinity" not in _engines(_plan("efa"))["decode"]["spec"]["template"]["spec"].get("affinity", {})


@pytest.mark.parametrize("resource", ['evil"\n  x: $(rm -rf /)', "no-slash", "UPPER/efa", "a/" + "b" * 80])
def test_a_plan_whose_rdma_resource_is_no_kubernetes_resource_name_is_refused(resource: str) -> None:
    """The RDMA device resource becomes a key of a pod's resource limits: a hand-edited plan file must name a
    Kubernetes extended resource (domain/name), or nothing is written."""
    from recommender.errors import ConfigError

    with pytest.raises(ConfigError, match=r"rental.rdma_resource .* is not a Kubernetes extended resource name") as e:
        render_deploy(_plan("efa", resource=resource, per_gpu=4), rank=1, formats="k8s")
    assert "\n" not in str(e.value)
