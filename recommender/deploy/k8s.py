"""Plain Kubernetes manifests for a plan (one multi-document YAML file, ``kubectl apply -f``).

Layout (vLLM docs "Deployment with GPUs", llm-d / vLLM P/D guides; reference README sections 5, 6):

* aggregated: PersistentVolumeClaim (HF cache) + one Deployment + a ClusterIP Service;
* disaggregated: the PVC, a ``-prefill`` and a ``-decode`` Deployment (own TP and replicas,
  NixlConnector ``kv_producer`` / ``kv_consumer``, NIXL side channel on port 5600 with
  ``VLLM_NIXL_SIDE_CHANNEL_HOST`` = ``status.podIP``), and in front of them production-stack's router
  (``lmcache/lmstack-router``, ``--routing-logic disaggregated_prefill_orchestrated``) with the
  ServiceAccount / Role / RoleBinding its pod discovery needs, behind the Service.

Engine containers run ``command: ["vllm", "serve"]`` with the checked argv, request ``tp`` GPUs
(``nvidia.com/gpu`` or ``amd.com/gpu`` from the catalog), mount ``/dev/shm`` as a memory emptyDir and
the HF cache volume, read ``HF_TOKEN`` from Secret ``hf-token`` (key ``token``, optional, so public
models need none), and probe ``/health`` on port 8000. The startup probe allows
``STARTUP_FIXED_S + checkpoint_bytes / STARTUP_LOAD_BYTES_PER_S`` seconds (download + load at
150 MB/s effective, plus 300 s for torch.compile and CUDA-graph capture): 407 s for 16 GB (8B bf16),
1240 s for 141 GB (70B bf16).
"""

from __future__ import annotations

import copy
import math
import shlex
from typing import Any

import yaml

from recommender.offers import RDMA_KINDS
from recommender.deploy.gpu_select import gpu_affinity
from recommender.deploy.spec import (
    DeploySpec,
    PoolSpec,
    comment_lines,
    dns_label,
    k8s_escape,
)
from recommender.deploy.vllm_cmd import (
    HTTP_PORT,
    NIXL_SIDE_CHANNEL_PORT,
    RAY_PORT,
    engine_options,
    image_for,
    serve_argv,
)

HF_CACHE_PATH = "/root/.cache/huggingface"
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
STARTUP_FIXED_S = 300.0
STARTUP_LOAD_BYTES_PER_S = 150e6
STARTUP_PERIOD_S = 10
GIB = 1024**3


class NoAliasDumper(yaml.SafeDumper):
    """SafeDumper that never emits anchors/aliases, even for an object referenced twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def startup_failure_threshold(checkpoint_bytes: float) -> int:
    """Startup-probe failures allowed: ceil((300 s + bytes / 150 MB/s) / 10 s)."""
    budget_s = STARTUP_FIXED_S + checkpoint_bytes / STARTUP_LOAD_BYTES_PER_S
    return math.ceil(budget_s / STARTUP_PERIOD_S)


def cache_size_gib(checkpoint_bytes: float) -> int:
    """HF cache volume: 1.25 x the checkpoint, rounded up to 10 GiB, at least 20 GiB."""
    return max(20, 10 * math.ceil(checkpoint_bytes * 1.25 / GIB / 10))


def shm_size(tp: int) -> str:
    """/dev/shm size: 2Gi for one GPU (vLLM docs), 20Gi with tensor parallelism (production-stack, llm-d)."""
    return "20Gi" if tp > 1 else "2Gi"


def host_requests(tp: int) -> tuple[str, str]:
    """CPU and memory requests of one engine pod: 2 + 4 per GPU cores, 16 GiB + 8 GiB per GPU."""
    return str(2 + 4 * tp), f"{16 + 8 * tp}Gi"


def component(pool: PoolSpec) -> str:
    """Kubernetes component label of a pool: engine (aggregated), prefill or decode."""
    return "engine" if pool.role == "both" else pool.role


def deployment_name(spec: DeploySpec, pool: PoolSpec) -> str:
    """``<name>`` for an aggregated pool, ``<name>-prefill`` / ``<name>-decode`` otherwise."""
    return spec.name if pool.role == "both" else f"{spec.name}-{pool.role}"


def selector_labels(spec: DeploySpec, comp: str) -> dict[str, str]:
    """Labels that never change between plans (selectors are immutable)."""
    return {"app.kubernetes.io/name": "vllm-router" if comp == "router" else "vllm",
            "app.kubernetes.io/instance": spec.name, "app.kubernetes.io/component": comp}


def plan_labels(spec: DeploySpec, comp: str) -> dict[str, str]:
    """Selector labels plus the plan that produced the object."""
    return {**selector_labels(spec, comp), "app.kubernetes.io/managed-by": "recommender",
            "recommender/plan-id": dns_label(spec.plan_id, 63), "recommender/plan-rank": str(spec.rank),
            "recommender/workload": dns_label(spec.workload_name, 63)}


def plan_annotations(spec: DeploySpec) -> dict[str, str]:
    """Free-text plan facts (annotations have no format limits)."""
    return {"recommender/plan": spec.plan_id, "recommender/plan-source": spec.plan_name,
            "recommender/model": spec.hf_repo, "recommender/modelled": spec.summary}


def serving_pod_labels(spec: DeploySpec, pool: PoolSpec) -> dict[str, str]:
    """The labels of a pool's serving pods (a Deployment's, a multi-node group's leader): the plan's, and in a P/D
    plan the pod label ``model`` by which production-stack's router tells the roles apart."""
    labels = plan_labels(spec, component(pool))
    if spec.disaggregated:
        labels["model"] = deployment_name(spec, pool)
    return labels


def _meta(name: str, spec: DeploySpec, comp: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if spec.cluster.namespace:
        meta["namespace"] = spec.cluster.namespace
    return {**meta, "labels": plan_labels(spec, comp), "annotations": plan_annotations(spec)}


def scheduling(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """Pod-spec fields that put an engine pod on the plan's GPU model: the node affinity of ``--gpu-label``
    (``recommender.deploy.gpu_select``), plus the user's node selector and tolerations."""
    out: dict[str, Any] = {}
    affinity = gpu_affinity(pool.gpu, spec.cluster.gpu_label) or {}
    if spec.kv_link is not None and spec.kv_link.same_instance and pool.role == "decode":
        # the plan puts P and D on one instance (the KV never leaves it): decode pods go where prefill pods run
        prefill = next(p for p in spec.pools if p.role == "prefill")
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": selector_labels(spec, component(prefill))},
             "topologyKey": "kubernetes.io/hostname"}]}
    if affinity:
        out["affinity"] = affinity
    if spec.cluster.node_selector:
        out["nodeSelector"] = dict(spec.cluster.node_selector)
    if spec.cluster.tolerations:
        out["tolerations"] = [dict(t) for t in spec.cluster.tolerations]
    return out


def _http_probe(period_s: int, failures: int, path: str = "/health") -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _pvc(spec: DeploySpec) -> dict[str, Any]:
    """The HF cache every engine pod mounts: ReadWriteMany where more than one pod does (replicas, or the pods of a
    multi-node replica, each on its own node, each loading its shard of the weights), else ReadWriteOnce."""
    pods = sum(p.replicas * p.nodes_per_replica for p in spec.pools)
    size = cache_size_gib(max(p.checkpoint_bytes for p in spec.pools))
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(f"{spec.name}-hf-cache", spec, "cache"),
            "spec": {"accessModes": ["ReadWriteMany" if pods > 1 else "ReadWriteOnce"],
                     **({"storageClassName": spec.cluster.storage_class} if spec.cluster.storage_class else {}),
                     "resources": {"requests": {"storage": f"{size}Gi"}}}}


def engine_container(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """The vLLM container of one pool (shared by the k8s form and the tests)."""
    argv = serve_argv(engine_options(spec, pool), "0.0.0.0", HTTP_PORT)
    gpus = str(pool.gpus_per_pod)
    cpu, memory = host_requests(pool.gpus_per_pod)
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": HF_CACHE_PATH},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY, "optional": True}}},
    ]
    ports: list[dict[str, Any]] = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]
    if pool.role != "both":
        env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]
        ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    rdma = rdma_devices(spec, pool)
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory, pool.gpu.k8s_resource: gpus, **rdma}
    limits: dict[str, Any] = {pool.gpu.k8s_resource: gpus, **rdma}
    if rdma and rdma_kind(spec, pool) == "efa":
        env += [{"name": "FI_PROVIDER", "value": "efa"}, {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}]
    out: dict[str, Any] = {
        "name": "vllm",
        "image": spec.cluster.image or image_for(pool),
        "command": ["vllm", "serve"],
        "args": [k8s_escape(a) for a in argv],  # Kubernetes expands $(VAR) in args; the names are validated too
        "env": env,
        "ports": ports,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [{"name": "hf-cache", "mountPath": HF_CACHE_PATH}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "startupProbe": _http_probe(STARTUP_PERIOD_S, startup_failure_threshold(pool.checkpoint_bytes)),
        "readinessProbe": _http_probe(5, 3),
        "livenessProbe": _http_probe(10, 3),
    }
    if rdma:  # RDMA registers (pins) the memory it moves (the KV cache, a stage's activations)
        out["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return out


#: The device resource of InfiniBand/RoCE NICs when the offer names none: the NVIDIA Network Operator's RDMA
#: shared device plugin in its sample configuration (clusters may name it otherwise: edit to match).
DEFAULT_RDMA_RESOURCE = "rdma/rdma_shared_device_a"


def rdma_kind(spec: DeploySpec, pool: PoolSpec) -> str:
    """The RDMA NIC kind a pod talks over, "" for none: a P/D pod's when the plan's KV path is RDMA (across
    instances), a pipeline stage's when its offer's NIC is (the stages pass activations every step)."""
    link = spec.kv_link
    if pool.role != "both" and link is not None and link.rdma:
        return link.kind
    if pool.pp > 1 and pool.stage_network in RDMA_KINDS:
        return pool.stage_network
    return ""


def rdma_devices(spec: DeploySpec, pool: PoolSpec) -> dict[str, str]:
    """The RDMA NIC devices a pod requests where it talks over RDMA (:func:`rdma_kind`: a P/D pod's KV path, so NIXL
    moves the KV by RDMA instead of falling back to TCP; a pipeline stage's NIC, so NCCL passes activations over it):
    the offer's device resource x ceil(tp x devices per GPU) (AWS p5: 4 EFA per GPU), else one shared RDMA device."""
    if not rdma_kind(spec, pool):
        return {}
    if pool.rdma_resource and pool.rdma_per_gpu > 0:
        return {pool.rdma_resource: str(max(1, math.ceil(pool.tp * pool.rdma_per_gpu - 1e-9)))}
    return {DEFAULT_RDMA_RESOURCE: "1"}


def _engine_deployment(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    if pool.nodes_per_replica > 1:
        return _engine_leader_worker_set(spec, pool)
    comp = component(pool)
    pod_labels = serving_pod_labels(spec, pool)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(deployment_name(spec, pool), spec, comp),
        "spec": {
            "replicas": pool.replicas,
            # the plan sizes the cluster exactly: replace pods one at a time instead of surging extra GPUs
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "selector": {"matchLabels": selector_labels(spec, comp)},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": plan_annotations(spec)},
                "spec": {
                    **scheduling(spec, pool),
                    "containers": [engine_container(spec, pool)],
                    "volumes": [
                        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{spec.name}-hf-cache"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(pool.gpus_per_replica)}},
                    ],
                },
            },
        },
    }


#: GPU Feature Discovery's node label naming a node's NVLink partition (``<cluster UUID>.<clique id>``): trays
#: with the same value reach each other over NVLink (NVIDIA/k8s-dra-driver-gpu docs/install.md)
CLIQUE_LABEL = "nvidia.com/gpu.clique"
#: the label LWS gives every pod of one group (kubernetes-sigs/lws api/leaderworkerset/v1: GroupUniqueHashLabelKey)
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
#: the pod's name for its claim on the ComputeDomain's IMEX channel
IMEX_CLAIM = "imex-channel"
#: the API version of the LeaderWorkerSets a multi-node replica runs as (kubernetes-sigs/lws)
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"


def compute_domain_name(spec: DeploySpec, pool: PoolSpec) -> str:
    """``<deployment name>-imex``: the ComputeDomain of one pool's multi-tray replicas."""
    return f"{deployment_name(spec, pool)}-imex"


def imex_channel_template(spec: DeploySpec, pool: PoolSpec) -> str:
    """The ResourceClaimTemplate the ComputeDomain's controller creates and the pods claim: ``<domain>-channel``."""
    return f"{compute_domain_name(spec, pool)}-channel"


def compute_domain(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """The ComputeDomain (``resource.nvidia.com/v1beta1``, NVIDIA's DRA driver for GPUs) whose IMEX channel lets the
    pods of an engine on several trays of one NVL72 rack map each other's GPU memory, so NCCL's all-reduce between
    the trays runs over NVLink (multi-node NVLink) and not the network. ``numNodes`` 0, as the driver recommends
    with its default IMEX daemons named by DNS; the controller creates the ResourceClaimTemplate the pods claim."""
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": _meta(compute_domain_name(spec, pool), spec, component(pool)),
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": imex_channel_template(spec, pool)}}}}


def _group_in_one_clique(spec: DeploySpec, pool: PoolSpec, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Pods of one group on trays of one NVLink partition, each holding the IMEX channel: a required pod affinity
    to the pods of its own group (``matchLabelKeys``: the group's LWS hash) with the clique label as topology,
    and the claim on the pool's ComputeDomain channel (in the pod and its container)."""
    terms = pod.setdefault("affinity", {}).setdefault("podAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
    terms.append({"labelSelector": {"matchLabels": {"app.kubernetes.io/instance": spec.name}},
                  "matchLabelKeys": [LWS_GROUP_KEY], "topologyKey": CLIQUE_LABEL})
    pod["resourceClaims"] = [{"name": IMEX_CLAIM, "resourceClaimTemplateName": imex_channel_template(spec, pool)}]
    container["resources"]["claims"] = [{"name": IMEX_CLAIM}]


def leader_worker_template(spec: DeploySpec, pool: PoolSpec, leader_labels: dict[str, str]) -> dict[str, Any]:
    """``leaderWorkerTemplate`` of a multi-node replica: a group of ``nodes_per_replica`` pods of ``gpus_per_pod``
    GPUs (a pipeline stage per node, or one engine over the trays of a GB200 / GB300 rack). The leader
    (``leader_labels``) starts the Ray head and ``vllm serve`` (``--distributed-executor-backend ray``); the workers
    (component ``<comp>-worker``, no probes, no port) join its Ray cluster at ``$(LWS_LEADER_ADDRESS)`` (set by the
    LWS controller). A pod restart recreates its group. Over trays, each pod also holds the pool's ComputeDomain
    IMEX channel and the group stays in one NVLink partition (:func:`_group_in_one_clique`). Shared by the
    Kubernetes output and the LeaderWorkerSet / DisaggregatedSet output."""
    leader = engine_container(spec, pool)
    serve = "exec vllm serve " + " ".join(shlex.quote(a) for a in serve_argv(engine_options(spec, pool), "0.0.0.0", HTTP_PORT))
    leader["command"] = ["/bin/sh", "-c"]
    leader["args"] = [k8s_escape(f"ray start --head --port={RAY_PORT} && {serve}")]
    worker = {k: v for k, v in engine_container(spec, pool).items()
              if k not in ("startupProbe", "readinessProbe", "livenessProbe", "ports")}
    worker["command"] = ["/bin/sh", "-c"]
    worker["args"] = [f"ray start --address=$(LWS_LEADER_ADDRESS):{RAY_PORT} --block"]  # kubelet expands it
    volumes = [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{spec.name}-hf-cache"}},
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(pool.gpus_per_pod)}}]

    def template(labels: dict[str, str], container: dict[str, Any]) -> dict[str, Any]:
        pod: dict[str, Any] = {**copy.deepcopy(scheduling(spec, pool)), "containers": [container], "volumes": volumes}
        if pool.nodes_per_stage > 1:
            _group_in_one_clique(spec, pool, pod, container)
        return {"metadata": {"labels": labels, "annotations": plan_annotations(spec)}, "spec": pod}

    return {"size": pool.nodes_per_replica, "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": template(leader_labels, leader),
            "workerTemplate": template(plan_labels(spec, f"{component(pool)}-worker"), worker)}


def compute_domains(spec: DeploySpec) -> list[dict[str, Any]]:
    """The ComputeDomain of each pool whose engine spans trays (none elsewhere)."""
    return [compute_domain(spec, p) for p in spec.pools if p.nodes_per_stage > 1]


def _engine_leader_worker_set(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """A multi-node replica as a LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``): ``replicas`` groups of
    :func:`leader_worker_template`. The Service selects the leaders only (workers carry the component
    ``<comp>-worker``); in a P/D plan the leaders carry the router's pod label ``model`` as the Deployments do."""
    comp = component(pool)
    return {
        "apiVersion": LWS_API_VERSION, "kind": "LeaderWorkerSet",
        "metadata": _meta(deployment_name(spec, pool), spec, comp),
        "spec": {"replicas": pool.replicas,
                 "leaderWorkerTemplate": leader_worker_template(spec, pool, serving_pod_labels(spec, pool))},
    }


def _service(spec: DeploySpec, comp: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec.name, spec, comp),
            "spec": {"type": "ClusterIP", "selector": selector_labels(spec, comp),
                     "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}]}}


def router_args(spec: DeploySpec) -> list[str]:
    """production-stack router flags for orchestrated P/D with Kubernetes pod discovery."""
    prefill, decode = (deployment_name(spec, p) for p in spec.pools)
    return ["--host", "0.0.0.0", "--port", str(HTTP_PORT), "--service-discovery", "k8s",
            "--k8s-namespace", "$(POD_NAMESPACE)", "--k8s-port", str(HTTP_PORT),
            "--k8s-label-selector", f"app.kubernetes.io/name=vllm,app.kubernetes.io/instance={spec.name}",
            "--routing-logic", "disaggregated_prefill_orchestrated",
            "--prefill-model-labels", prefill, "--decode-model-labels", decode]


def _router_objects(spec: DeploySpec) -> list[dict[str, Any]]:
    name = f"{spec.name}-router"
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, spec, "router")}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, spec, "router"),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, spec, "router"),
               "subjects": [{"kind": "ServiceAccount", "name": name}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}}
    container = {
        "name": "router", "image": spec.cluster.router_image, "args": router_args(spec),
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
        "readinessProbe": _http_probe(5, 3), "livenessProbe": _http_probe(10, 3),
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, spec, "router"),
        "spec": {"replicas": 1, "selector": {"matchLabels": selector_labels(spec, "router")},
                 "template": {"metadata": {"labels": plan_labels(spec, "router")},
                              "spec": {"serviceAccountName": name, "containers": [container],
                                       **({"tolerations": [dict(t) for t in spec.cluster.tolerations]}
                                          if spec.cluster.tolerations else {})}}},
    }
    return [account, role, binding, deployment]


def manifests(spec: DeploySpec) -> list[dict[str, Any]]:
    """All Kubernetes objects for the plan, in apply order."""
    objs = [_pvc(spec), *compute_domains(spec)] + [_engine_deployment(spec, p) for p in spec.pools]
    if spec.disaggregated:
        objs += _router_objects(spec) + [_service(spec, "router")]
    else:
        objs.append(_service(spec, "engine"))
    return objs


def render_k8s(spec: DeploySpec) -> dict[str, str]:
    """``k8s.yaml``: header comment + the objects as one multi-document YAML stream."""
    header = "\n".join(comment_lines(spec)) + "\n# Apply with: kubectl apply -f k8s.yaml (create Secret hf-token with key token for gated models)\n"
    body = yaml.dump_all(manifests(spec), Dumper=NoAliasDumper, sort_keys=False, default_flow_style=False, width=1_000_000)
    return {"k8s.yaml": header + "---\n" + body}


# the same objects under public names, for the LeaderWorkerSet / DisaggregatedSet output (recommender.deploy.disaggset)
hf_cache_pvc = _pvc
router_objects = _router_objects
service = _service
