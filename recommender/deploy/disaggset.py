"""LeaderWorkerSet project outputs: a ``DisaggregatedSet`` for a P/D plan, a ``LeaderWorkerSet`` for an aggregated one.

File ``disaggregatedset.yaml``. Checked against kubernetes-sigs/lws ``060ab4da`` (2026-08-21):
``disaggregatedset.x-k8s.io/v1`` DisaggregatedSet (KEP-766, part of LWS since v0.9.0) and
``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet.

* P/D plan: one DisaggregatedSet with roles ``prefill`` and ``decode`` (prefill first), each a LeaderWorkerSet
  spec with the pool's ``replicas`` and groups of one pod (``leaderWorkerTemplate.size: 1``: one replica is one
  TP group on one node; a replica over several nodes, pipeline stages or one engine over the trays of a GB200 /
  GB300 rack, is a group of the Kubernetes output's Ray leader and workers, with its IMEX ComputeDomain) whose
  pod is the Kubernetes output's engine pod: the same container
  (:func:`recommender.deploy.k8s.engine_container`: the checked ``vllm serve`` argv with its NixlConnector
  ``kv_producer`` / ``kv_consumer``, GPUs, HF token Secret, NIXL side channel, probes), the same node
  placement and volumes. The controller rolls both roles out together, keeping the prefill:decode ratio.
  In front: the Kubernetes output's production-stack router (``disaggregated_prefill_orchestrated``), which
  finds the two roles by the pod label ``model``, and its Service.
* aggregated plan: a DisaggregatedSet needs two roles, so the file holds a LeaderWorkerSet with the pool's
  replicas (one pod per group) and a ClusterIP Service, for clusters that run LWS instead of Deployments.
* both: the HF cache PersistentVolumeClaim of the Kubernetes output.
"""

from __future__ import annotations

from typing import Any

from recommender.deploy.k8s import (
    compute_domains,
    engine_container,
    hf_cache_pvc,
    LWS_API_VERSION,
    leader_worker_template,
    router_objects,
    scheduling,
    serving_pod_labels,
    service,
    shm_size,
)
from recommender.deploy.platform import metadata, render_yaml
from recommender.deploy.spec import DeploySpec, PoolSpec

DS_API_VERSION = "disaggregatedset.x-k8s.io/v1"


def pod_template(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """The engine pod of one pool: the Kubernetes output's container, placement and volumes."""
    return {"metadata": {"labels": serving_pod_labels(spec, pool)},
            "spec": {**scheduling(spec, pool), "containers": [engine_container(spec, pool)],
                     "volumes": [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{spec.name}-hf-cache"}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(pool.tp)}}]}}


def lws_spec(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """A LeaderWorkerSet spec: ``replicas`` groups, replaced one at a time with no surge. A group is one pod, or
    for a replica over several nodes the Kubernetes output's Ray leader and workers
    (:func:`recommender.deploy.k8s.leader_worker_template`)."""
    group = (leader_worker_template(spec, pool, serving_pod_labels(spec, pool)) if pool.nodes_per_replica > 1
             else {"size": 1, "workerTemplate": pod_template(spec, pool)})
    return {"replicas": pool.replicas, "leaderWorkerTemplate": group,
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1}}}


def disaggregated_set(spec: DeploySpec) -> dict[str, Any]:
    """The DisaggregatedSet of a P/D plan: roles prefill and decode."""
    roles = [{"name": p.role, "spec": lws_spec(spec, p)} for p in spec.pools]
    return {"apiVersion": DS_API_VERSION, "kind": "DisaggregatedSet", "metadata": metadata(spec, spec.name, "engine"),
            "spec": {"roles": roles}}


def leader_worker_set(spec: DeploySpec) -> dict[str, Any]:
    """The LeaderWorkerSet of an aggregated plan."""
    return {"apiVersion": LWS_API_VERSION, "kind": "LeaderWorkerSet", "metadata": metadata(spec, spec.name, "engine"),
            "spec": lws_spec(spec, spec.pools[0])}


def objects(spec: DeploySpec) -> list[dict[str, Any]]:
    """PVC, the ComputeDomain of a pool whose engine spans trays, then the set, then what routes to it."""
    if spec.disaggregated:
        return [hf_cache_pvc(spec), *compute_domains(spec), disaggregated_set(spec), *router_objects(spec),
                service(spec, "router")]
    return [hf_cache_pvc(spec), *compute_domains(spec), leader_worker_set(spec), service(spec, "engine")]


def render_disaggset(spec: DeploySpec) -> dict[str, str]:
    """``disaggregatedset.yaml``."""
    kind = "DisaggregatedSet" if spec.disaggregated else "LeaderWorkerSet (aggregated plan)"
    return render_yaml(spec, "disaggregatedset.yaml", objects(spec),
                       f"{kind}; apply with: kubectl apply -f disaggregatedset.yaml (LWS v0.9+ installed; Secret "
                       f"hf-token, key token, for gated models)")
