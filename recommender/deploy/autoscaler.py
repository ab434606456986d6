"""Autoscaler objects of ``recommend autoscale``: a KEDA ``ScaledObject`` and a plain HPA ``autoscaling/v2``.

``deploy --format keda`` (``recommender.deploy.keda``) scales a plan from the plan alone, on requests in the
engine at the modelled operating point; this module renders the rule that ``recommend autoscale`` derived for
a day of traffic and certified in a day-long replay (``recommender.autoscale``), on the arrival rate.

Both scale the engine ``Deployment`` of ``recommender.deploy.k8s`` (same name) on the arrival rate,
``sum(rate(vllm:request_success_total{model_name="<served name>"}[<window>s]))``, with an ``AverageValue``
target: the HPA wants ``ceil(rate / target)`` replicas, within ``[min, max]``; scale-up at once (at most
doubling per ``polling`` seconds), scale-down after the stabilisation window, one pod per minute. The
numbers come from ``recommender.autoscale`` (the rule derived from the load model and the start-up time).

- ``keda-scaledobject.yaml``: KEDA's Prometheus scaler (keda.sh/v1alpha1, checked against KEDA's CRD schema).
- ``hpa.yaml``: for clusters without KEDA, an HPA on an ``External`` metric that a Prometheus adapter
  serves under the name ``vllm_request_rate`` (the adapter rule is in the file's header comment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recommender.deploy.k8s import deployment_name
from recommender.deploy.platform import metadata, render_yaml
from recommender.deploy.spec import DeploySpec
from recommender.errors import DeployError

DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
EXTERNAL_METRIC = "vllm_request_rate"


@dataclass(frozen=True, kw_only=True)
class AutoscalerSettings:
    """What the autoscaler objects carry (seconds; requests/s per replica)."""

    min_replicas: int
    max_replicas: int
    target_per_replica_per_s: float
    polling_s: int
    metric_window_s: int
    scale_down_stabilisation_s: int
    prometheus_url: str = DEFAULT_PROMETHEUS

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise DeployError(f"autoscaler: min replicas {self.min_replicas} must be >= 1 and <= max "
                              f"{self.max_replicas}")
        if not self.target_per_replica_per_s > 0:
            raise DeployError("autoscaler: the target rate per replica must be > 0")
        url = self.prometheus_url
        if not url.startswith(("http://", "https://")) or any(c.isspace() or ord(c) < 32 for c in url):
            raise DeployError(f"autoscaler: Prometheus URL {url!r} must be http(s):// with no spaces or control characters")


def rate_query(spec: DeploySpec, window_s: int) -> str:
    """The PromQL of the arrival rate (the served name is a checked repo id: no quote can reach the query)."""
    name = spec.served_model_names[0]
    if '"' in name or "\\" in name:
        raise DeployError(f"served model name {name!r} cannot be put in a PromQL label matcher")
    return f'sum(rate(vllm:request_success_total{{model_name="{name}"}}[{int(window_s)}s]))'


def _behavior(s: AutoscalerSettings) -> dict[str, Any]:
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": int(s.polling_s)},
                                 {"type": "Pods", "value": 2, "periodSeconds": int(s.polling_s)}]},
        "scaleDown": {"stabilizationWindowSeconds": int(s.scale_down_stabilisation_s), "selectPolicy": "Min",
                      "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
    }


def _target(spec: DeploySpec) -> str:
    if spec.disaggregated or len(spec.pools) != 1:
        raise DeployError("the autoscaler objects scale one aggregated pool; this plan is prefill/decode disaggregated")
    return deployment_name(spec, spec.pools[0])


def _threshold(s: AutoscalerSettings) -> str:
    return f"{s.target_per_replica_per_s:.4g}"


def scaled_object(spec: DeploySpec, s: AutoscalerSettings) -> dict[str, Any]:
    """The KEDA ScaledObject (Prometheus trigger, AverageValue)."""
    target = _target(spec)
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": metadata(spec, target, "autoscaler"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicaCount": int(s.min_replicas), "maxReplicaCount": int(s.max_replicas),
            "pollingInterval": int(s.polling_s), "cooldownPeriod": int(s.scale_down_stabilisation_s),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(s)}},
            "triggers": [{"type": "prometheus", "name": "arrival-rate", "metricType": "AverageValue",
                          "metadata": {"serverAddress": s.prometheus_url,
                                       "query": rate_query(spec, s.metric_window_s),
                                       "threshold": _threshold(s)}}],
        },
    }


def hpa(spec: DeploySpec, s: AutoscalerSettings) -> dict[str, Any]:
    """The HPA v2 on the adapter's external metric."""
    target = _target(spec)
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": metadata(spec, target, "autoscaler"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": int(s.min_replicas), "maxReplicas": int(s.max_replicas),
            "metrics": [{"type": "External", "external": {
                "metric": {"name": EXTERNAL_METRIC, "selector": {"matchLabels": {"model_name": _label(spec)}}},
                "target": {"type": "AverageValue", "averageValue": _threshold(s)}}}],
            "behavior": _behavior(s),
        },
    }


def _label(spec: DeploySpec) -> str:
    """A label value for the served name ('/' is not allowed in label values: the adapter maps it to '_')."""
    return spec.served_model_names[0].replace("/", "_")[:63].strip("-_.")


def render_autoscaler(spec: DeploySpec, s: AutoscalerSettings) -> dict[str, str]:
    """``keda-scaledobject.yaml`` and ``hpa.yaml`` (each with the plan header)."""
    rule = (f"replicas = ceil(arrival rate / {_threshold(s)} req/s), {s.min_replicas}..{s.max_replicas} "
            f"(recommend autoscale)")
    adapter = (f"{rule}. Without KEDA, serve the rate with prometheus-adapter: an external rule with seriesQuery "
               f"'vllm:request_success_total', name {{as: {EXTERNAL_METRIC}}}, metricsQuery "
               f"sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[{int(s.metric_window_s)}s])) by (model_name)")
    return {**render_yaml(spec, "keda-scaledobject.yaml", [scaled_object(spec, s)], rule),
            **render_yaml(spec, "hpa.yaml", [hpa(spec, s)], adapter)}
