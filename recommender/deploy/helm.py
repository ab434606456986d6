"""Helm values for vLLM production-stack (chart ``vllm-stack`` 0.1.12) for the same plan.

Each pool becomes one ``servingEngineSpec.modelSpec[]`` entry. The chart has keys for chunked
prefill, prefix caching, max model length, dtype, TP, max sequences and GPU memory utilization;
every other flag goes to ``vllmConfig.extraArgs`` (reference README section 4).
``chart_engine_argv`` reproduces the chart's ``templates/deployment-vllm-multi.yaml`` arg list, so
the arguments the chart will hand to ``vllm serve`` are checked flag by flag before the file is
emitted. Disaggregated plans get a prefill and a decode ``modelSpec`` (NixlConnector through
``extraArgs``, NIXL side-channel env) and the router in ``disaggregated_prefill_orchestrated`` mode,
which finds the two pools by the chart's pod label ``model: <modelSpec name>``.
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml

from recommender.deploy.gpu_select import gpu_affinity
from recommender.deploy.k8s import (
    HF_TOKEN_KEY,
    HF_TOKEN_SECRET,
    STARTUP_PERIOD_S,
    NoAliasDumper,
    cache_size_gib,
    deployment_name,
    host_requests,
    shm_size,
    startup_failure_threshold,
)
from recommender.deploy.spec import (
    DeploySpec,
    PoolSpec,
    comment_lines,
    dns_label,
    k8s_escape,
    refuse_multinode,
)
from recommender.deploy.vllm_cmd import (
    HTTP_PORT,
    IMAGE_TAG,
    NIXL_SIDE_CHANNEL_PORT,
    VLLM_IMAGE,
    engine_options,
    extra_flag_groups,
    fmt_float,
)
from recommender.deploy.vllm_flags import check_serve_args
from recommender.errors import DeployError


def chart_engine_argv(model_spec: Mapping[str, Any], container_port: int = HTTP_PORT) -> list[str]:
    """The ``vllm serve`` arguments the chart builds from one modelSpec (after ``vllm serve``).

    Mirrors ``deployment-vllm-multi.yaml``: model, ``--host 0.0.0.0 --port``, then vllmConfig keys in the
    template's order (``enablePrefixCaching`` absent still emits ``--no-enable-prefix-caching``), then
    ``extraArgs`` verbatim. Values are strings, as the template quotes them.
    """
    argv = [str(model_spec["modelURL"]), "--host", "0.0.0.0", "--port", str(container_port)]
    cfg = model_spec.get("vllmConfig") or {}
    if "enableChunkedPrefill" in cfg:
        argv.append("--enable-chunked-prefill" if cfg["enableChunkedPrefill"] else "--no-enable-chunked-prefill")
    argv.append("--enable-prefix-caching" if cfg.get("enablePrefixCaching") else "--no-enable-prefix-caching")
    for key, flag in (("maxModelLen", "--max-model-len"), ("dtype", "--dtype"),
                      ("tensorParallelSize", "--tensor-parallel-size"), ("maxNumSeqs", "--max-num-seqs"),
                      ("gpuMemoryUtilization", "--gpu_memory_utilization"), ("maxLoras", "--max_loras")):
        if key in cfg:
            value = cfg[key]
            argv += [flag, fmt_float(value) if isinstance(value, float) else str(value)]
    argv += [str(a) for a in cfg.get("extraArgs") or []]
    return argv


def _model_spec(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    o = engine_options(spec, pool)
    cpu, memory = host_requests(pool.gpus_per_replica)
    vllm_config: dict[str, Any] = {
        "enableChunkedPrefill": o.enable_chunked_prefill,
        "enablePrefixCaching": o.enable_prefix_caching,
        "maxModelLen": o.max_model_len,
        "tensorParallelSize": o.tensor_parallel_size,
        "maxNumSeqs": o.max_num_seqs,
        "gpuMemoryUtilization": o.gpu_memory_utilization,
    }
    if o.dtype:
        vllm_config["dtype"] = o.dtype
    # the chart puts modelURL and extraArgs into the container's args, where Kubernetes expands $(VAR)
    vllm_config["extraArgs"] = [k8s_escape(a) for g in extra_flag_groups(o) for a in g]
    name = deployment_name(spec, pool)
    repo, tag = split_image(spec.cluster.image) if spec.cluster.image else (VLLM_IMAGE.get(pool.gpu.vendor, VLLM_IMAGE["nvidia"]), IMAGE_TAG)
    annotations = {"recommender/plan": spec.plan_id, "recommender/plan-rank": str(spec.rank),
                   "recommender/plan-source": spec.plan_name, "recommender/modelled": spec.summary}
    entry: dict[str, Any] = {
        "name": name,
        "annotations": annotations,
        "podAnnotations": annotations,
        "podLabels": {"recommender/plan-id": dns_label(spec.plan_id, 63), "recommender/plan-rank": str(spec.rank)},
        "repository": repo,
        "tag": tag,
        "modelURL": k8s_escape(o.model),
        "replicaCount": pool.replicas,
        "requestCPU": int(cpu),
        "requestMemory": memory,
        "requestGPU": pool.gpus_per_replica,
        "requestGPUType": pool.gpu.k8s_resource,
        "pvcStorage": f"{cache_size_gib(pool.checkpoint_bytes)}Gi",
        # the chart makes one PVC per modelSpec, shared by that modelSpec's replicas
        "pvcAccessMode": ["ReadWriteMany" if pool.replicas > 1 else "ReadWriteOnce"],
        "shmSize": shm_size(pool.gpus_per_replica),
        "hf_token": {"secretName": HF_TOKEN_SECRET, "secretKey": HF_TOKEN_KEY},
        "vllmConfig": vllm_config,
    }
    # the chart ignores nodeSelectorTerms when affinity is set: the user's selector goes into the affinity
    affinity = gpu_affinity(pool.gpu, spec.cluster.gpu_label, spec.cluster.node_selector)
    if affinity:
        entry["affinity"] = affinity
    if spec.cluster.tolerations:
        entry["tolerations"] = [dict(t) for t in spec.cluster.tolerations]
    if spec.cluster.storage_class:
        entry["storageClass"] = spec.cluster.storage_class
    if pool.role != "both":
        entry["env"] = [
            {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        ]
    check_serve_args(chart_engine_argv(entry))
    return entry


def split_image(image: str) -> tuple[str, str]:
    """``registry/repo:tag`` -> (``registry/repo``, ``tag``); the chart joins them as ``repository:tag``,
    so a digest-only reference cannot be expressed and is refused."""
    head, _, tail = image.rpartition(":")
    if "@" in image or not head or "/" in tail:
        raise DeployError(f"image {image!r}: the Helm chart needs repository:tag (no digest-only references)")
    return head, tail


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {"periodSeconds": period_s, "failureThreshold": failures, "httpGet": {"path": "/health", "port": HTTP_PORT}}


def values(spec: DeploySpec) -> dict[str, Any]:
    """The values document (a plain dict, validated in the tests against the chart's schema)."""
    amd = any(p.gpu.vendor == "amd" for p in spec.pools)
    startup = max(startup_failure_threshold(p.checkpoint_bytes) for p in spec.pools)
    engine: dict[str, Any] = {
        "enableEngine": True,
        # the router's pod discovery selects engines by these labels: keep them stable across plans
        "labels": {"app.kubernetes.io/instance": spec.name, "app.kubernetes.io/managed-by": "recommender"},
        "runtimeClassName": "" if amd else "nvidia",
        "containerPort": HTTP_PORT,
        "startupProbe": {"initialDelaySeconds": 15, **_probe(STARTUP_PERIOD_S, startup)},
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 3),
        "modelSpec": [_model_spec(spec, p) for p in spec.pools],
    }
    router_repo, router_tag = split_image(spec.cluster.router_image)
    router: dict[str, Any] = {"enableRouter": True, "serviceDiscovery": "k8s", "repository": router_repo, "tag": router_tag}
    if spec.cluster.tolerations:
        engine["tolerations"] = [dict(t) for t in spec.cluster.tolerations]
    if spec.disaggregated:
        prefill, decode = (deployment_name(spec, p) for p in spec.pools)
        router.update({"routingLogic": "disaggregated_prefill_orchestrated",
                       "extraArgs": ["--prefill-model-labels", prefill, "--decode-model-labels", decode]})
    else:
        router["routingLogic"] = "roundrobin"
    return {"servingEngineSpec": engine, "routerSpec": router}


def render_helm(spec: DeploySpec) -> dict[str, str]:
    """``helm-values.yaml`` for ``helm install <release> vllm/vllm-stack -f helm-values.yaml``."""
    refuse_multinode(spec, "helm")  # production-stack's chart runs one pod per replica
    header = "\n".join(comment_lines(spec)) + (
        "\n# Install: helm repo add vllm https://vllm-project.github.io/production-stack && "
        "helm install <release> vllm/vllm-stack -f helm-values.yaml\n"
    )
    body = yaml.dump(values(spec), Dumper=NoAliasDumper, sort_keys=False, default_flow_style=False, width=1_000_000)
    return {"helm-values.yaml": header + body}
