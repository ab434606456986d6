"""llm-d: Helm values for the ``llm-d-modelservice`` chart plus a Gateway API Inference Extension ``InferencePool``.

Files: ``llm-d-values.yaml`` (``helm install <release> llm-d-modelservice/llm-d-modelservice -f llm-d-values.yaml``)
and ``llm-d-inferencepool.yaml`` (``inference.networking.k8s.io/v1`` InferencePool selecting the engine pods).
Checked against chart ``llm-d-modelservice`` v0.4.12 (llm-d-incubation/llm-d-modelservice ``3051935e``,
its ``values.schema.json`` and ``templates/_helpers.tpl``) and the InferencePool CRD of
kubernetes-sigs/gateway-api-inference-extension ``84436a96``.

With ``modelCommand: vllmServe`` the chart writes ``vllm serve <model of modelArtifacts.uri> --port <p>
[--tensor-parallel-size <parallelism.tensor> when > 1] [--data-parallel-size <parallelism.data> when > 1]
[--data-parallel-size-local <parallelism.dataLocal> when > 1] --served-model-name <modelArtifacts.name>``
(``vllmServeModelCommand`` in ``_helpers.tpl``) and then the container's ``args`` verbatim (no shell): our args are
every other flag of the plan's line, ``$``-escaped for Kubernetes, and the whole line (the chart's part rebuilt +
ours) passes vLLM 0.33's flag table, which refuses a flag given twice: a data-parallel plan's DP size is the chart's
``parallelism.data``, never again in ``args``.

* aggregated plan: one ``decode`` pool (``prefill.create: false``), no routing sidecar, vLLM on port 8000;
* P/D plan: ``prefill`` and ``decode`` with their own replicas, TP and NixlConnector ``--kv-transfer-config``;
  decode pods get llm-d's routing sidecar (``routing.proxy``, connector ``nixlv2``) on port 8000 in front of
  vLLM on 8200, which sends each request's prefill to a prefill pod first;
* GPUs: the chart requests ``parallelism.tensor x parallelism.dataLocal`` GPUs of ``accelerator.type`` (nvidia /
  amd), ``tp x data_parallel_size`` per pod; node placement
  is the Kubernetes output's rule (:func:`recommender.deploy.k8s.scheduling`) in each role's ``extraConfig``;
* HF token: env ``HF_TOKEN`` from Secret ``hf-token`` key ``token`` (not ``authSecretName``, whose key
  name the chart fixes to ``HF_TOKEN``), so every output reads the same Secret;
* ``modelArtifacts.labels`` (``llm-d.ai/inference-serving: "true"``, ``llm-d.ai/model: <name>``) are on every
  engine pod and are the InferencePool's selector; its endpoint picker is Service ``<name>-epp`` port 9002
  (installed by llm-d's scheduler chart, e.g. GAIE's ``inferencepool`` chart with its own pool turned off).
"""

from __future__ import annotations

from typing import Any

import yaml

from recommender.deploy.k8s import NoAliasDumper, cache_size_gib, host_requests, scheduling, shm_size
from recommender.deploy.platform import (
    SERVER_FLAGS,
    checked_flags,
    escaped,
    hf_model_uri,
    hf_token_env,
    metadata,
    nixl_env,
    probes,
    render_yaml,
)
from recommender.deploy.spec import DeploySpec, PoolSpec, comment_lines, refuse_multinode
from recommender.deploy.vllm_cmd import HTTP_PORT, image_for

CHART_VERSION = "v0.4.12"
#: pinned like the router image (never the chart default ``latest``): the tag KServe's P/D preset runs (aaac4e29)
ROUTING_SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.7.1"
SIDECAR_VLLM_PORT = 8200
EPP_PORT = 9002
#: flags the chart writes itself (from modelArtifacts, routing and parallelism): never repeated in ``args``
CHART_FLAGS = SERVER_FLAGS | {"--served-model-name", "--tensor-parallel-size", "--data-parallel-size",
                              "--data-parallel-size-local"}


def vllm_port(spec: DeploySpec, pool: PoolSpec) -> int:
    """Port vLLM listens on: 8200 behind the decode routing sidecar of a P/D plan, else 8000 (chart vllmPort)."""
    return SIDECAR_VLLM_PORT if spec.disaggregated and pool.role == "decode" else HTTP_PORT


def pod_labels(spec: DeploySpec) -> dict[str, str]:
    """``modelArtifacts.labels``: on every engine pod, and the InferencePool's selector."""
    return {"llm-d.ai/inference-serving": "true", "llm-d.ai/model": spec.name}


def chart_argv(spec: DeploySpec, pool: PoolSpec) -> list[str]:
    """The part of the ``vllm serve`` line the chart writes (after ``vllm serve``), for the check."""
    argv = [pool.weights.model, "--port", str(vllm_port(spec, pool))]
    if pool.tp > 1:
        argv += ["--tensor-parallel-size", str(pool.tp)]
    if pool.data_parallel_size > 1:  # parallelism.data and .dataLocal (one pod holds every rank: see _role)
        argv += ["--data-parallel-size", str(pool.data_parallel_size),
                 "--data-parallel-size-local", str(pool.data_parallel_size)]
    return argv + ["--served-model-name", spec.served_model_names[0]]


def _container(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    port = vllm_port(spec, pool)
    flags = checked_flags(spec, pool, drop=CHART_FLAGS, platform_argv=chart_argv(spec, pool))
    return {
        "name": "vllm",
        "image": spec.cluster.image or image_for(pool),
        "modelCommand": "vllmServe",
        "args": escaped(flags),
        "env": [hf_token_env(), *nixl_env(pool)],
        "ports": [{"containerPort": port, "name": "http", "protocol": "TCP"}],
        # host CPU and memory as k8s.yaml's; the chart adds tensor x dataLocal GPUs to requests and limits
        "resources": {"requests": dict(zip(("cpu", "memory"), host_requests(pool.gpus_per_replica)))},
        "mountModelVolume": True,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "extraConfig": probes(pool, port=port),
    }


def _role(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    role: dict[str, Any] = {
        "create": True,
        "replicas": pool.replicas,
        # data-parallel attention: the chart requests tensor x dataLocal GPUs per pod (its values schema)
        "parallelism": {"tensor": pool.tp, **({"data": pool.data_parallel_size, "dataLocal": pool.data_parallel_size}
                                              if pool.data_parallel_size > 1 else {})},
        "containers": [_container(spec, pool)],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(pool.gpus_per_replica)}}],
    }
    placement = scheduling(spec, pool)
    if placement:
        role["extraConfig"] = placement
    return role


def values(spec: DeploySpec) -> dict[str, Any]:
    """The chart values (validated in the tests against the chart's values.schema.json)."""
    decode = spec.pools[-1]
    vendors = {p.gpu.vendor for p in spec.pools}
    doc: dict[str, Any] = {
        "multinode": False,
        "modelArtifacts": {"uri": hf_model_uri(spec, "llm-d"), "name": spec.served_model_names[0],
                           "size": f"{cache_size_gib(max(p.checkpoint_bytes for p in spec.pools))}Gi",
                           "labels": pod_labels(spec)},
        "accelerator": {"type": "amd" if vendors == {"amd"} else "nvidia"},
        "routing": {"servicePort": HTTP_PORT,
                    "proxy": {"enabled": spec.disaggregated, "image": ROUTING_SIDECAR_IMAGE, "connector": "nixlv2",
                              "targetPort": SIDECAR_VLLM_PORT, "secure": False}},
        "decode": _role(spec, decode),
        "prefill": _role(spec, spec.pools[0]) if spec.disaggregated else {"create": False},
    }
    return doc


def inference_pool(spec: DeploySpec) -> dict[str, Any]:
    """The InferencePool in front of the engine pods (port 8000: vLLM, or the decode routing sidecar)."""
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": metadata(spec, spec.name, "engine"),
            "spec": {"selector": {"matchLabels": pod_labels(spec)}, "targetPorts": [{"number": HTTP_PORT}],
                     "endpointPickerRef": {"name": f"{spec.name}-epp", "port": {"number": EPP_PORT},
                                           "failureMode": "FailClose"}}}


def render_llmd(spec: DeploySpec) -> dict[str, str]:
    """``llm-d-values.yaml`` and ``llm-d-inferencepool.yaml``."""
    refuse_multinode(spec, "llm-d")
    header = "\n".join(comment_lines(spec)) + (
        "\n# Install: helm repo add llm-d-modelservice https://llm-d-incubation.github.io/llm-d-modelservice/ && "
        f"helm install <release> llm-d-modelservice/llm-d-modelservice --version {CHART_VERSION} -f llm-d-values.yaml\n")
    body = yaml.dump(values(spec), Dumper=NoAliasDumper, sort_keys=False, default_flow_style=False, width=1_000_000)
    return {"llm-d-values.yaml": header + body,
            **render_yaml(spec, "llm-d-inferencepool.yaml", [inference_pool(spec)],
                          f"Apply with: kubectl apply -f llm-d-inferencepool.yaml (endpoint picker: Service "
                          f"{spec.name}-epp port {EPP_PORT})")}
