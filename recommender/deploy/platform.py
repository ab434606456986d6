"""What the platform renderers (KServe, llm-d, Dynamo, DisaggregatedSet) share.

Each platform owns part of the ``vllm serve`` line itself: KServe's and llm-d's templates put in the model
(``/mnt/models`` or the ``hf://`` id), ``--port``, ``--served-model-name`` and ``--tensor-parallel-size`` from their
own fields; Dynamo's worker takes ``--model`` and speaks HTTP through its frontend. So a renderer asks
:func:`engine_flags` for the pool's flags minus the ones its platform sets, and :func:`checked_flags` checks the
WHOLE line the platform will run (the platform's part, rebuilt, plus ours) against vLLM 0.33's flag table.
The flags themselves come from :func:`recommender.deploy.vllm_cmd.serve_groups`, the one plan -> engine-settings
step every output uses; nothing here decides a flag.

Also here: the HF token from Secret ``hf-token`` (key ``token``, optional: public models need none; never
inline), the NIXL side-channel env of P/D pools, object metadata with the plan's labels, probes sized like
the Kubernetes output's, and the YAML stream every platform file is written as.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import yaml

from recommender.deploy.k8s import (
    HF_TOKEN_KEY,
    HF_TOKEN_SECRET,
    STARTUP_PERIOD_S,
    NoAliasDumper,
    host_requests,
    plan_annotations,
    plan_labels,
    startup_failure_threshold,
)
from recommender.deploy.spec import DeploySpec, PoolSpec, comment_lines, k8s_escape
from recommender.deploy.vllm_cmd import HTTP_PORT, NIXL_SIDE_CHANNEL_PORT, engine_options, serve_groups
from recommender.deploy.vllm_flags import check_serve_args
from recommender.errors import DeployError

#: flags a platform that runs the HTTP server itself (its template, its frontend) sets in its own way
SERVER_FLAGS = frozenset({"--host", "--port"})


def engine_flags(spec: DeploySpec, pool: PoolSpec, *, drop: Collection[str] = ()) -> list[list[str]]:
    """The pool's ``vllm serve`` flag groups (model group excluded), without the groups whose flag is in ``drop``."""
    groups = serve_groups(engine_options(spec, pool))
    return [g for g in groups[1:] if g[0] not in drop]


def checked_flags(spec: DeploySpec, pool: PoolSpec, *, drop: Collection[str], platform_argv: Sequence[str]) -> list[str]:
    """:func:`engine_flags`, flattened, after checking ``platform_argv + flags`` (the line the platform runs,
    its own part first) with vLLM 0.33's flag table (raises ``VllmFlagError``)."""
    flags = [a for g in engine_flags(spec, pool, drop=drop) for a in g]
    check_serve_args([*platform_argv, *flags])
    return flags


def hf_model_uri(spec: DeploySpec, target: str) -> str:
    """``hf://<repo>`` of the checkpoint every pool loads (one model per service on KServe and llm-d)."""
    models = {p.weights.model for p in spec.pools}
    if len(models) != 1:
        raise DeployError(f"{target}: the pools load different checkpoints ({', '.join(sorted(models))}) but {target} "
                          f"serves one model per service; use --format k8s or give one --checkpoint")
    model = models.pop()
    if model.startswith("/"):
        raise DeployError(f"{target}: model {model!r} is a local path; {target} downloads from an hf:// URI, so give "
                          f"a Hugging Face repo (--checkpoint ORG/NAME) or use --format k8s")
    return f"hf://{model}"


def hf_token_env() -> dict[str, Any]:
    """``HF_TOKEN`` from Secret ``hf-token`` key ``token`` (optional), the same Secret as the Kubernetes output."""
    return {"name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY, "optional": True}}}


def nixl_env(pool: PoolSpec) -> list[dict[str, Any]]:
    """The NIXL side channel of a P/D pool: this pod's IP and port 5600 (none for an aggregated pool)."""
    if pool.role == "both":
        return []
    return [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]


def gpu_resources(pool: PoolSpec) -> dict[str, Any]:
    """Requests and limits of one engine container: ``tp x data_parallel_size`` GPUs of the catalog resource, host
    CPU and memory."""
    cpu, memory = host_requests(pool.gpus_per_replica)
    gpus = str(pool.gpus_per_replica)
    return {"requests": {"cpu": cpu, "memory": memory, pool.gpu.k8s_resource: gpus},
            "limits": {pool.gpu.k8s_resource: gpus}}


def probes(pool: PoolSpec, *, port: int | str = HTTP_PORT, scheme: str | None = None) -> dict[str, Any]:
    """startup / readiness / liveness on ``/health``; the startup budget is the Kubernetes output's
    (300 s + checkpoint bytes / 150 MB/s, in 10 s periods)."""
    get: dict[str, Any] = {"path": "/health", "port": port, **({"scheme": scheme} if scheme else {})}

    def probe(period_s: int, failures: int) -> dict[str, Any]:
        return {"httpGet": dict(get), "periodSeconds": period_s, "timeoutSeconds": 5, "failureThreshold": failures}

    return {"startupProbe": probe(STARTUP_PERIOD_S, startup_failure_threshold(pool.checkpoint_bytes)),
            "readinessProbe": probe(5, 3), "livenessProbe": probe(10, 3)}


def metadata(spec: DeploySpec, name: str, comp: str) -> dict[str, Any]:
    """Object metadata: name, the namespace of ``--namespace``, the plan's labels and annotations."""
    meta: dict[str, Any] = {"name": name}
    if spec.cluster.namespace:
        meta["namespace"] = spec.cluster.namespace
    return {**meta, "labels": plan_labels(spec, comp), "annotations": plan_annotations(spec)}


def escaped(args: Sequence[str]) -> list[str]:
    """Container args with ``$`` doubled so Kubernetes never expands ``$(VAR)`` in them."""
    return [k8s_escape(a) for a in args]


def render_yaml(spec: DeploySpec, file_name: str, objects: Sequence[dict[str, Any]], how: str) -> dict[str, str]:
    """``file_name``: the plan header, a how-to comment line and the objects as one YAML stream."""
    header = "\n".join(comment_lines(spec)) + f"\n# {how}\n"
    body = yaml.dump_all(list(objects), Dumper=NoAliasDumper, sort_keys=False, default_flow_style=False,
                         width=1_000_000)
    return {file_name: header + "---\n" + body}
