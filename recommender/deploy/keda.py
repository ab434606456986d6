"""KEDA ``ScaledObject`` (``keda.sh/v1alpha1``) for the engine Deployments of ``k8s.yaml``: ``keda.yaml``.

Checked against ``config/crd/bases/keda.sh_scaledobjects.yaml`` of kedacore/keda ``8b4f083c`` (2026-08-20).
One ScaledObject per pool (P/D: prefill and decode scale apart), each scaling the pool's Deployment
(``<name>`` or ``<name>-prefill`` / ``<name>-decode``) on a Prometheus trigger. The rule comes from the plan's
modelled operating point (the row's mean latencies at the workload's rate ``lambda``):

* metric: requests in the engine, ``vllm:num_requests_running + vllm:num_requests_waiting`` summed over the pool's
  pods (``model_name`` = the first served name, pods ``<deployment>-*``), ``metricType: AverageValue``, so the HPA
  compares the per-replica average with the threshold;
* threshold: the per-replica concurrency at which the plan was modelled to meet its SLO, by Little's law
  ``L = lambda / replicas x W`` with ``W`` the mean time a request spends in that pool (aggregated and decode:
  mean E2E, less mean TTFT for decode; prefill: mean TTFT), capped at ``max_num_seqs``. Keeping each replica
  at or below the modelled point keeps it where the SLO was modelled to hold. rag rank 1: 4 / 4 x 14.75 s =
  14.75 requests per replica;
* ``minReplicaCount = ceil(replicas x load_utilisation)``: the fewest replicas still below saturation at the
  planned rate (fewer would queue without bound if traffic returns to it while new pods start);
  ``maxReplicaCount = 2 x replicas``: bursts to twice the planned rate;
* ``pollingInterval`` 15 s; HPA behaviour: scale up at once (+100% per 60 s), scale down one pod at a time
  after a stabilisation window of the pod start-up budget (the startup probe's: 300 s + checkpoint bytes /
  150 MB/s, capped at the HPA's 1800 s policy period), so a pod is not removed sooner than one could be
  brought back; ``fallback``: the plan's replicas when Prometheus cannot be read 3 times in a row.

An offline job (no arrival rate) or a row without modelled mean latencies is refused in one line. Apply it
beside ``k8s.yaml``; from then on the HPA owns ``replicas`` (drop it from the Deployments or re-apply them
with ``--server-side`` field ownership). Prometheus: ``PROMETHEUS_URL``, the re-planner's default.
"""

from __future__ import annotations

import math
from typing import Any

from recommender.deploy.k8s import STARTUP_PERIOD_S, deployment_name, startup_failure_threshold
from recommender.deploy.platform import metadata, render_yaml
from recommender.deploy.spec import DeploySpec, PoolSpec
from recommender.errors import DeployError

API_VERSION = "keda.sh/v1alpha1"
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
POLLING_INTERVAL_S = 15
COOLDOWN_S = 300
MAX_POLICY_PERIOD_S = 1800  # HPA scaling policy periodSeconds upper bound
BURST_FACTOR = 2


def _promql_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def query(spec: DeploySpec, pool: PoolSpec) -> str:
    """Requests running + waiting over the pool's pods."""
    matchers = [f"model_name={_promql_string(spec.served_model_names[0])}",
                f"pod=~{_promql_string(deployment_name(spec, pool) + '-.*')}"]
    if spec.cluster.namespace:
        matchers.append(f"namespace={_promql_string(spec.cluster.namespace)}")
    sel = "{" + ",".join(matchers) + "}"
    return f"sum(vllm:num_requests_running{sel}) + sum(vllm:num_requests_waiting{sel})"


def time_in_pool_s(spec: DeploySpec, pool: PoolSpec) -> float:
    """Mean seconds a request spends in ``pool`` at the modelled point (see the module docstring)."""
    if spec.arrival_rate_per_s is None:
        raise DeployError("keda: the plan is an offline job (no arrival rate): nothing to autoscale; "
                          "use --format k8s")
    if spec.ttft_mean_s is None or spec.e2e_mean_s is None or spec.load_utilisation is None:
        raise DeployError(f"keda: plan {spec.plan_id} carries no modelled mean TTFT/E2E or load_utilisation "
                          f"(latency_percentiles); regenerate it with `recommend --format json`")
    if pool.role == "prefill":
        return spec.ttft_mean_s
    if pool.role == "decode":
        return max(spec.e2e_mean_s - spec.ttft_mean_s, 0.0)
    return spec.e2e_mean_s


def threshold(spec: DeploySpec, pool: PoolSpec) -> float:
    """Per-replica requests in the engine at the modelled point: ``lambda / replicas x W``, <= max_num_seqs."""
    wait_s = time_in_pool_s(spec, pool)
    assert spec.arrival_rate_per_s is not None
    return min(spec.arrival_rate_per_s / pool.replicas * wait_s, float(pool.max_num_seqs))


def replica_bounds(spec: DeploySpec, pool: PoolSpec) -> tuple[int, int]:
    """(min, max) replicas: ``ceil(replicas x load_utilisation)`` (at least 1), ``2 x replicas``."""
    util = spec.load_utilisation if spec.load_utilisation is not None else 1.0
    low = max(1, math.ceil(pool.replicas * min(util, 1.0) - 1e-9))
    return low, max(low, BURST_FACTOR * pool.replicas)


def scale_down_window_s(pool: PoolSpec) -> int:
    """The pod start-up budget of the startup probe, capped at the HPA's longest policy period."""
    return min(STARTUP_PERIOD_S * startup_failure_threshold(pool.checkpoint_bytes), MAX_POLICY_PERIOD_S)


def scaled_object(spec: DeploySpec, pool: PoolSpec) -> dict[str, Any]:
    """The ScaledObject of one pool's Deployment."""
    target = deployment_name(spec, pool)
    low, high = replica_bounds(spec, pool)
    window_s = scale_down_window_s(pool)
    comp = "engine" if pool.role == "both" else pool.role
    return {
        "apiVersion": API_VERSION, "kind": "ScaledObject", "metadata": metadata(spec, target, comp),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "pollingInterval": POLLING_INTERVAL_S,
            "cooldownPeriod": COOLDOWN_S,
            "minReplicaCount": low,
            "maxReplicaCount": high,
            "fallback": {"failureThreshold": 3, "replicas": pool.replicas},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 60}]},
                "scaleDown": {"stabilizationWindowSeconds": window_s,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": window_s}]},
            }}},
            "triggers": [{
                "type": "prometheus", "name": "requests-per-replica", "metricType": "AverageValue",
                "metadata": {"serverAddress": PROMETHEUS_URL, "query": query(spec, pool),
                             "threshold": f"{threshold(spec, pool):.2f}"},
            }],
        },
    }


def render_keda(spec: DeploySpec) -> dict[str, str]:
    """``keda.yaml``: one ScaledObject per pool."""
    return render_yaml(spec, "keda.yaml", [scaled_object(spec, p) for p in spec.pools],
                       "Apply beside k8s.yaml: kubectl apply -f keda.yaml (KEDA installed, Prometheus scraping the "
                       f"engine pods at {PROMETHEUS_URL})")
