"""NVIDIA Dynamo ``DynamoGraphDeployment`` (``nvidia.com/v1beta1``, the storage version) for a plan: ``dynamo.yaml``.

Checked against ``deploy/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml`` of ai-dynamo/dynamo
main as of 2026-08-21 (copied from the fork wxsms/dynamo ``2a6da14c``, which tracks upstream main; the upstream
snapshot is too large to fetch) and Dynamo's vLLM worker options (``components/src/dynamo/vllm/backend_args.py``).

``spec.backendFramework: vllm`` and ``spec.components``:

* ``Frontend`` (``type: frontend``, one replica): Dynamo's OpenAI-compatible HTTP server and router (the
  operator fills in its command, ports and probes);
* aggregated plan: ``VllmWorker`` (``type: worker``); P/D plan: ``VllmPrefillWorker`` (``type: prefill``)
  and ``VllmDecodeWorker`` (``type: decode``), each with the plan's replicas and TP;
* a worker's container ``main`` runs ``python3 -m dynamo.vllm --model <repo> <flags>``: the flags are the
  plan's ``vllm serve`` flags except ``--host`` / ``--port`` (the frontend serves HTTP), including the
  NixlConnector ``--kv-transfer-config`` of a P/D pool, plus Dynamo's ``--disaggregation-mode prefill|decode``;
  the vLLM part (as ``vllm serve <repo> <flags>``) passes vLLM 0.33's flag table;
* GPUs: ``tp`` of the catalog resource per worker pod, node placement by the Kubernetes output's rule,
  ``sharedMemorySize`` as there (2Gi, 20Gi with TP); HF token from Secret ``hf-token`` (key ``token``);
* probes: the operator's (Dynamo's system port), not ours.

The image is Dynamo's ``vllm-runtime``, which bundles its own vLLM build: ``--image`` must name one whose vLLM
is 0.33 for the flags to mean what they were checked against. Dynamo publishes CUDA images only, so an AMD
pool is refused unless ``--image`` names a ROCm build.
"""

from __future__ import annotations

from typing import Any

from recommender.deploy.k8s import scheduling, shm_size
from recommender.deploy.platform import (
    SERVER_FLAGS,
    checked_flags,
    escaped,
    gpu_resources,
    hf_token_env,
    metadata,
    nixl_env,
    render_yaml,
)
from recommender.deploy.spec import DeploySpec, PoolSpec, refuse_multinode
from recommender.errors import DeployError

API_VERSION = "nvidia.com/v1beta1"
#: the image in Dynamo's own v1beta1 examples (reference README); --image overrides it
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.0.0"
COMPONENT = {"both": ("VllmWorker", "worker"), "prefill": ("VllmPrefillWorker", "prefill"),
             "decode": ("VllmDecodeWorker", "decode")}


def image(spec: DeploySpec, pool: PoolSpec | None = None) -> str:
    """``--image``, else Dynamo's vllm-runtime (CUDA only: an AMD pool needs ``--image``)."""
    if spec.cluster.image:
        return spec.cluster.image
    if pool is not None and pool.gpu.vendor != "nvidia":
        raise DeployError(f"dynamo: the {pool.role} pool runs on {pool.gpu.id} ({pool.gpu.vendor}) but Dynamo's "
                          f"vllm-runtime image is built for CUDA; pass --image with a ROCm build of Dynamo, or "
                          f"deploy a rank on NVIDIA GPUs")
    return DYNAMO_IMAGE


def worker_args(spec: DeploySpec, pool: PoolSpec) -> list[str]:
    """``dynamo.vllm`` arguments: ``--model``, the checked vLLM flags, the disaggregation mode."""
    model = pool.weights.model
    flags = checked_flags(spec, pool, drop=SERVER_FLAGS, platform_argv=[model])
    mode = [] if pool.role == "both" else ["--disaggregation-mode", pool.role]
    return ["--model", model, *flags, *mode]


def worker(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """One vLLM worker component."""
    name, kind = COMPONENT[pool.role]
    container = {
        "name": "main",
        "image": image(spec, pool),
        "command": ["python3", "-m", "dynamo.vllm"],
        "args": escaped(worker_args(spec, pool)),
        "env": [hf_token_env(), *nixl_env(pool)],
        "resources": gpu_resources(pool),
    }
    return {"name": name, "type": kind, "replicas": pool.replicas, "sharedMemorySize": shm_size(pool.tp),
            "podTemplate": {"spec": {**scheduling(spec, pool), "containers": [container]}}}


def graph(spec: DeploySpec) -> dict[str, Any]:
    """The DynamoGraphDeployment object."""
    frontend = {"name": "Frontend", "type": "frontend", "replicas": 1,
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": image(spec)}]}}}
    return {"apiVersion": API_VERSION, "kind": "DynamoGraphDeployment",
            "metadata": metadata(spec, spec.name, "engine"),
            "spec": {"backendFramework": "vllm", "components": [frontend, *(worker(spec, p) for p in spec.pools)]}}


def render_dynamo(spec: DeploySpec) -> dict[str, str]:
    """``dynamo.yaml``."""
    refuse_multinode(spec, "dynamo")
    return render_yaml(spec, "dynamo.yaml", [graph(spec)],
                       "Apply with: kubectl apply -f dynamo.yaml (Dynamo operator installed; Secret hf-token, key "
                       "token, for gated models)")
