"""KServe ``LLMInferenceService`` (``serving.kserve.io/v1alpha2``) for a plan: ``kserve.yaml``.

Checked against the CRD of kserve/kserve ``aaac4e29`` (2026-08-21) and its well-known preset
``config/llmisvcconfig/config-llm-template.yaml`` (``kserve-config-llm-template``), which every service gets
merged under it (by container name: ours is ``main``). That preset runs
``bash -c 'eval "exec vllm serve /mnt/models --served-model-name <spec.model.name> ... --port 8000
--tensor-parallel-size <spec.parallelism.tensor> ... $@"' --`` with the container's ``args`` as ``$@``, so:

* the model comes from ``spec.model.uri`` (``hf://<repo>``: KServe's storage initializer downloads it to
  ``/mnt/models``), the served name from ``spec.model.name``, TP from ``spec.parallelism.tensor``, replicas
  from ``spec.replicas``; the container ``args`` carry every other flag of the plan's ``vllm serve`` line;
* because the preset passes ``$@`` through ``eval``, each argument is shell-quoted (``shlex.quote``, as the
  cmd scripts do) and then ``$``-escaped for Kubernetes, so neither the shell nor ``$(VAR)`` expansion can
  change a value; the whole line (the preset's part rebuilt + ours) passes vLLM 0.33's flag table;
* P/D: the top level is the decode pool, ``spec.prefill`` the prefill pool (own replicas, TP, template), each
  with its NixlConnector ``--kv-transfer-config`` (the preset then adds none) and the NIXL side-channel env;
* ``router: {route: {}, gateway: {}, scheduler: {}}`` asks for KServe's managed HTTPRoute, Gateway and llm-d
  scheduler (InferencePool + endpoint picker);
* the engine image is the plan's vLLM 0.33 image (``--image`` overrides); the preset runs the container as
  non-root, so we set ``runAsUser: 1000`` for the vLLM image, whose default user is root.
"""

from __future__ import annotations

import shlex
from typing import Any

from recommender.deploy.k8s import scheduling
from recommender.deploy.platform import (
    SERVER_FLAGS,
    checked_flags,
    escaped,
    gpu_resources,
    hf_model_uri,
    hf_token_env,
    metadata,
    nixl_env,
    probes,
    render_yaml,
)
from recommender.deploy.spec import DeploySpec, PoolSpec, refuse_multinode
from recommender.deploy.vllm_cmd import HTTP_PORT, image_for

API_VERSION = "serving.kserve.io/v1alpha2"
#: what the preset's vllm serve line sets itself (from spec.model, spec.parallelism, its --port)
PRESET_FLAGS = SERVER_FLAGS | {"--served-model-name", "--tensor-parallel-size"}
PRESET_MODEL_PATH = "/mnt/models"
NON_ROOT_UID = 1000


#: the P/D decode preset runs vLLM on 8001 behind llm-d's routing sidecar on 8000
DECODE_SIDECAR_VLLM_PORT = 8001


def preset_argv(spec: DeploySpec, pool: PoolSpec) -> list[str]:
    """The part of the ``vllm serve`` line KServe's preset writes (after ``vllm serve``), for the check."""
    port = DECODE_SIDECAR_VLLM_PORT if pool.role == "decode" else HTTP_PORT
    return [PRESET_MODEL_PATH, "--served-model-name", spec.served_model_names[0], "--port", str(port),
            "--tensor-parallel-size", str(pool.tp)]


def main_container(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """Container ``main``: our flags as the preset's ``$@``, image, GPUs, HF token, NIXL env, startup budget."""
    flags = checked_flags(spec, pool, drop=PRESET_FLAGS, platform_argv=preset_argv(spec, pool))
    startup = probes(pool)["startupProbe"]
    return {
        "name": "main",
        "image": spec.cluster.image or image_for(pool),
        "args": escaped([shlex.quote(a) for a in flags]),
        "env": [hf_token_env(), *nixl_env(pool)],
        "resources": gpu_resources(pool),
        "securityContext": {"runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID},
        # the preset's probe (path, port, scheme) stays; only the budget for download + load is ours
        "startupProbe": {"periodSeconds": startup["periodSeconds"], "failureThreshold": startup["failureThreshold"]},
    }


def _workload(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    return {"replicas": pool.replicas, "parallelism": {"tensor": pool.tp},
            "template": {**scheduling(spec, pool), "containers": [main_container(spec, pool)]}}


def service(spec: DeploySpec) -> dict[str, Any]:
    """The LLMInferenceService object."""
    main = spec.pools[-1]  # decode pool of a P/D plan, the only pool otherwise
    body: dict[str, Any] = {
        "model": {"uri": hf_model_uri(spec, "kserve"), "name": spec.served_model_names[0]},
        **_workload(spec, main),
        "router": {"route": {}, "gateway": {}, "scheduler": {}},
    }
    if spec.disaggregated:
        body["prefill"] = _workload(spec, spec.pools[0])
    return {"apiVersion": API_VERSION, "kind": "LLMInferenceService",
            "metadata": metadata(spec, spec.name, "engine"), "spec": body}


def render_kserve(spec: DeploySpec) -> dict[str, str]:
    """``kserve.yaml``."""
    refuse_multinode(spec, "kserve")
    return render_yaml(spec, "kserve.yaml", [service(spec)],
                       "Apply with: kubectl apply -f kserve.yaml (KServe with LLMInferenceService; Secret hf-token, "
                       "key token, for gated models)")
