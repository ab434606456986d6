"""The autoscaler renderer: KEDA ``ScaledObject`` (``keda.sh/v1alpha1``) and plain HPA (``autoscaling/v2``) objects.

One renderer (:func:`scaled_object`, :func:`hpa`) draws an :class:`Autoscaler` (the query, threshold, replica
bounds, clock and HPA behaviour) for a Deployment of ``k8s.yaml``; two rules fill it in:

* ``deploy --format keda`` (:func:`plan_autoscaler`, :func:`render_keda`: ``keda.yaml``): from the plan alone,
  on requests in the engine at the plan's modelled operating point (below);
* ``recommend autoscale --emit`` (:func:`rate_autoscaler`, :func:`render_autoscaler`: ``keda-scaledobject.yaml``
  and ``hpa.yaml``): the rule ``recommender.autoscale`` derived for a day of traffic and certified in a
  day-long replay, on the arrival rate ``sum(rate(vllm:request_success_total{model_name=...}[<window>s]))``
  (held by ``max_over_time(...[<hold>s:<polling>s])`` when the rule holds it), ``AverageValue`` = the target:
  the HPA wants ``ceil(rate / target)`` replicas within ``[min, max]``; scale-up at once (at most doubling, or
  +2 pods, per ``polling`` seconds), scale-down after the stabilisation window, one pod per minute.
  ``hpa.yaml`` is the same rule for clusters without KEDA, on an ``External`` metric that prometheus-adapter
  serves as ``vllm_request_rate_<deployment>`` (:func:`external_metric_name`) with the rule in the file's header
  comment (:func:`adapter_rule`: the same PromQL, its ``model_name`` matcher in the rule, not namespaced). The HPA
  selects no labels: vLLM's ``model_name`` is the served name (``meta-llama/Llama-3.1-70B-Instruct``) and a
  Kubernetes label value cannot hold ``/``, so a selector could never match it.

``deploy --format keda``'s rule. Checked against ``config/crd/bases/keda.sh_scaledobjects.yaml`` of kedacore/keda ``8b4f083c`` (2026-08-20).
One ScaledObject per pool (P/D: prefill and decode scale apart), each scaling the pool's Deployment (its LeaderWorkerSet for a replica over several nodes)
(``<name>`` or ``<name>-prefill`` / ``<name>-decode``) on a Prometheus trigger. The rule comes from the plan's
modelled operating point (the row's mean latencies at the workload's rate ``lambda``):

* metric: requests in the engine, ``vllm:num_requests_running + vllm:num_requests_waiting`` summed over the pool's
  pods (``model_name`` = the first served name, pods ``<deployment>-*``), ``metricType: AverageValue``, so the HPA
  compares the per-replica average with the threshold;
* threshold: the per-replica concurrency at which the plan was modelled to meet its SLO, by Little's law
  ``L = lambda / replicas x W`` with ``W`` the mean time a request spends in that pool (aggregated and decode:
  mean E2E, less mean TTFT for decode; prefill: mean TTFT), capped at what one replica runs at once:
  ``max_num_seqs x data_parallel_size`` (a data-parallel replica is one engine of that many attention ranks, each
  with its own ``max_num_seqs``, and the metric sums them all). Keeping each replica
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
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from recommender.deploy.k8s import LWS_API_VERSION, STARTUP_PERIOD_S, deployment_name, startup_failure_threshold
from recommender.deploy.platform import metadata, render_yaml
from recommender.deploy.spec import DeploySpec, PoolSpec
from recommender.errors import DeployError

API_VERSION = "keda.sh/v1alpha1"
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
POLLING_INTERVAL_S = 15
COOLDOWN_S = 300
MAX_POLICY_PERIOD_S = 1800  # HPA scaling policy periodSeconds upper bound
MAX_STABILISATION_S = 3600  # HPA stabilizationWindowSeconds upper bound
BURST_FACTOR = 2
EXTERNAL_METRIC = "vllm_request_rate"

Policy = tuple[str, int, int]  # HPA scaling policy: (type, value, periodSeconds)


def check_prometheus_url(url: str, what: str = "autoscaler: Prometheus URL") -> str:
    """The Prometheus server a trigger queries: ``http(s)://host[:port][/path]``, no credentials (they would sit
    in the manifest in clear: KEDA takes them from a TriggerAuthentication), no spaces or control characters;
    else one DeployError line naming ``what``."""
    bad = any(c.isspace() or not c.isprintable() for c in url)
    parts = None if bad else urlsplit(url)
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        raise DeployError(f"{what} {url!r} must be an http(s)://host[:port] URL with no credentials, spaces or "
                          f"control characters; e.g. {PROMETHEUS_URL}")
    try:
        _ = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError:
        raise DeployError(f"{what} {url!r}: the port must be a number in 0..65535") from None
    return url


@dataclass(frozen=True, kw_only=True)
class Autoscaler:
    """What one autoscaler object carries (seconds; the threshold in the metric's unit, per replica)."""

    min_replicas: int
    max_replicas: int
    query: str
    threshold: str
    trigger_name: str
    component: str
    polling_s: int
    cooldown_s: int  # KEDA cooldownPeriod
    scale_up: tuple[Policy, ...]
    scale_down: tuple[Policy, ...]
    scale_down_stabilisation_s: int
    select_policy: tuple[str, str] | None = None  # (scaleUp, scaleDown) selectPolicy, when set
    fallback_replicas: int | None = None
    prometheus_url: str = PROMETHEUS_URL

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise DeployError(f"autoscaler: min replicas {self.min_replicas} must be >= 1 and <= max "
                              f"{self.max_replicas}")
        if not 0 <= self.scale_down_stabilisation_s <= MAX_STABILISATION_S:
            raise DeployError(f"autoscaler: scale-down stabilisation {self.scale_down_stabilisation_s} s must be in "
                              f"[0, {MAX_STABILISATION_S}] s (the HPA's limit)")
        check_prometheus_url(self.prometheus_url)

    def behavior(self) -> dict[str, Any]:
        """The HPA v2 ``behavior`` (the same block in the ScaledObject's ``horizontalPodAutoscalerConfig``)."""
        def rules(window_s: int, policies: tuple[Policy, ...], select: str | None) -> dict[str, Any]:
            out: dict[str, Any] = {"stabilizationWindowSeconds": window_s}
            if select:
                out["selectPolicy"] = select
            out["policies"] = [{"type": k, "value": v, "periodSeconds": p} for k, v, p in policies]
            return out
        up, down = self.select_policy or (None, None)
        return {"scaleUp": rules(0, self.scale_up, up),
                "scaleDown": rules(self.scale_down_stabilisation_s, self.scale_down, down)}


def scale_target(spec: DeploySpec, pool: PoolSpec) -> dict[str, str]:
    """The object of ``k8s.yaml`` that runs the pool: its Deployment, or for a replica over several nodes its
    LeaderWorkerSet (whose CRD has the ``/scale`` subresource: one replica is one group)."""
    name = deployment_name(spec, pool)
    if pool.nodes_per_replica > 1:
        return {"apiVersion": LWS_API_VERSION, "kind": "LeaderWorkerSet", "name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def scaled_object(spec: DeploySpec, pool: PoolSpec, a: Autoscaler) -> dict[str, Any]:
    """The KEDA ScaledObject of one pool's Deployment or LeaderWorkerSet (Prometheus trigger, ``AverageValue``)."""
    target = deployment_name(spec, pool)
    body: dict[str, Any] = {
        "scaleTargetRef": scale_target(spec, pool),
        "pollingInterval": a.polling_s, "cooldownPeriod": a.cooldown_s,
        "minReplicaCount": a.min_replicas, "maxReplicaCount": a.max_replicas,
    }
    if a.fallback_replicas is not None:
        body["fallback"] = {"failureThreshold": 3, "replicas": a.fallback_replicas}
    body["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": a.behavior()}}
    body["triggers"] = [{"type": "prometheus", "name": a.trigger_name, "metricType": "AverageValue",
                         "metadata": {"serverAddress": a.prometheus_url, "query": a.query, "threshold": a.threshold}}]
    return {"apiVersion": API_VERSION, "kind": "ScaledObject", "metadata": metadata(spec, target, a.component),
            "spec": body}


def external_metric_name(spec: DeploySpec, pool: PoolSpec) -> str:
    """The external metric the HPA reads: ``vllm_request_rate_<deployment>`` (``-`` as ``_``), one per Deployment.

    One name per Deployment because the HPA cannot select the model: vLLM labels its series with the served name
    (``model_name="meta-llama/Llama-3.1-70B-Instruct"``) and a Kubernetes label value cannot hold ``/``, so the
    adapter rule (:func:`adapter_rule`) matches ``model_name`` itself and the HPA names the metric, no selector."""
    return f"{EXTERNAL_METRIC}_{deployment_name(spec, pool).replace('-', '_')}"


def hpa(spec: DeploySpec, pool: PoolSpec, a: Autoscaler) -> dict[str, Any]:
    """The same rule as a plain ``autoscaling/v2`` HPA on prometheus-adapter's external metric
    (:func:`external_metric_name`; the adapter's rule, :func:`adapter_rule`, carries the query)."""
    target = deployment_name(spec, pool)
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(spec, target, a.component),
        "spec": {
            "scaleTargetRef": scale_target(spec, pool),
            "minReplicas": a.min_replicas, "maxReplicas": a.max_replicas,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": external_metric_name(spec, pool)},
                "target": {"type": "AverageValue", "averageValue": a.threshold}}}],
            "behavior": a.behavior(),
        },
    }


# --------------------------------------------------------------------------- deploy --format keda: from the plan
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
    """Per-replica requests in the engine at the modelled point: ``lambda / replicas x W``, at most the sequences one
    replica runs at once, ``max_num_seqs`` on each of its ``data_parallel_size`` ranks."""
    wait_s = time_in_pool_s(spec, pool)
    assert spec.arrival_rate_per_s is not None
    return min(spec.arrival_rate_per_s / pool.replicas * wait_s, float(pool.max_num_seqs * pool.data_parallel_size))


def replica_bounds(spec: DeploySpec, pool: PoolSpec) -> tuple[int, int]:
    """(min, max) replicas: ``ceil(replicas x load_utilisation)`` (at least 1), ``2 x replicas``."""
    util = spec.load_utilisation if spec.load_utilisation is not None else 1.0
    low = max(1, math.ceil(pool.replicas * min(util, 1.0) - 1e-9))
    return low, max(low, BURST_FACTOR * pool.replicas)


def scale_down_window_s(pool: PoolSpec) -> int:
    """The pod start-up budget of the startup probe, capped at the HPA's longest policy period."""
    return min(STARTUP_PERIOD_S * startup_failure_threshold(pool.checkpoint_bytes), MAX_POLICY_PERIOD_S)


def plan_autoscaler(spec: DeploySpec, pool: PoolSpec) -> Autoscaler:
    """``deploy --format keda``'s rule for one pool (the module docstring)."""
    low, high = replica_bounds(spec, pool)
    window_s = scale_down_window_s(pool)
    return Autoscaler(
        min_replicas=low, max_replicas=high, query=query(spec, pool), threshold=f"{threshold(spec, pool):.2f}",
        trigger_name="requests-per-replica", component="engine" if pool.role == "both" else pool.role,
        polling_s=POLLING_INTERVAL_S, cooldown_s=COOLDOWN_S, scale_up=(("Percent", 100, 60),),
        scale_down=(("Pods", 1, window_s),), scale_down_stabilisation_s=window_s, fallback_replicas=pool.replicas)


def render_keda(spec: DeploySpec) -> dict[str, str]:
    """``keda.yaml``: one ScaledObject per pool."""
    return render_yaml(spec, "keda.yaml", [scaled_object(spec, p, plan_autoscaler(spec, p)) for p in spec.pools],
                       "Apply beside k8s.yaml: kubectl apply -f keda.yaml (KEDA installed, Prometheus scraping the "
                       f"engine pods at {PROMETHEUS_URL})")


# --------------------------------------------------------------------------- recommend autoscale: the day's rule
@dataclass(frozen=True, kw_only=True)
class AutoscalerSettings:
    """The rule ``recommend autoscale`` derived (seconds; requests/s per replica)."""

    min_replicas: int
    max_replicas: int
    target_per_replica_per_s: float
    polling_s: int
    metric_window_s: int
    scale_down_stabilisation_s: int
    metric_hold_s: int = 0
    prometheus_url: str = PROMETHEUS_URL

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise DeployError(f"autoscaler: min replicas {self.min_replicas} must be >= 1 and <= max "
                              f"{self.max_replicas}")
        if not self.target_per_replica_per_s > 0:
            raise DeployError("autoscaler: the target rate per replica must be > 0")
        if self.metric_hold_s < 0:
            raise DeployError("autoscaler: the metric hold must be >= 0 s")
        check_prometheus_url(self.prometheus_url)


SUCCESS_SERIES = "vllm:request_success_total"  # vLLM's counter of finished requests, labels model_name, engine, ...


def _model_matcher(spec: DeploySpec) -> str:
    """``model_name="<served name>"``: vLLM's label value, verbatim (the served name is a checked repo id: no quote
    or backslash can reach the query)."""
    name = spec.served_model_names[0]
    if '"' in name or "\\" in name or not name.isprintable():
        raise DeployError(f"served model name {name!r} cannot be put in a PromQL label matcher")
    return f'model_name="{name}"'


def rate_query(spec: DeploySpec, window_s: int, hold_s: int = 0, polling_s: int = POLLING_INTERVAL_S,
               series: str = SUCCESS_SERIES) -> str:
    """The PromQL of the arrival rate, held over ``hold_s`` by ``max_over_time`` when > 0. ``series``: the
    metric name (the adapter rule passes its template ``<<.Series>>``)."""
    rate = f"sum(rate({series}{{{_model_matcher(spec)}}}[{int(window_s)}s]))"
    return f"max_over_time({rate}[{int(hold_s)}s:{int(polling_s)}s])" if hold_s > 0 else rate


def _single_pool(spec: DeploySpec) -> PoolSpec:
    if spec.disaggregated or len(spec.pools) != 1:
        raise DeployError("the autoscaler objects scale one aggregated pool; this plan is prefill/decode disaggregated")
    return spec.pools[0]


def rate_autoscaler(spec: DeploySpec, s: AutoscalerSettings) -> Autoscaler:
    """The day's rule as an :class:`Autoscaler` on the arrival rate."""
    return Autoscaler(
        min_replicas=s.min_replicas, max_replicas=s.max_replicas,
        query=rate_query(spec, s.metric_window_s, s.metric_hold_s, s.polling_s),
        threshold=f"{s.target_per_replica_per_s:.4g}", trigger_name="arrival-rate", component="autoscaler",
        polling_s=int(s.polling_s), cooldown_s=int(s.scale_down_stabilisation_s),
        scale_up=(("Percent", 100, int(s.polling_s)), ("Pods", 2, int(s.polling_s))), scale_down=(("Pods", 1, 60),),
        scale_down_stabilisation_s=int(s.scale_down_stabilisation_s), select_policy=("Max", "Min"),
        prometheus_url=s.prometheus_url)


def adapter_rule(spec: DeploySpec, s: AutoscalerSettings) -> dict[str, Any]:
    """prometheus-adapter's external rule (an entry of its config's ``externalRules``, the chart's
    ``rules.external``) that serves :func:`external_metric_name`: found by the served model's series, not
    namespaced (the KEDA query reads every namespace too), and queried with the ScaledObject's own PromQL, the
    ``model_name`` matcher written in the rule. No ``<<.LabelMatchers>>``: the HPA has no selector to pass, as no
    label value can spell vLLM's ``model_name`` (it holds ``/``)."""
    pool = _single_pool(spec)
    return {
        "seriesQuery": f"{SUCCESS_SERIES}{{{_model_matcher(spec)}}}",
        "resources": {"namespaced": False},
        "name": {"matches": f"^{SUCCESS_SERIES}$", "as": external_metric_name(spec, pool)},
        "metricsQuery": rate_query(spec, s.metric_window_s, s.metric_hold_s, s.polling_s, series="<<.Series>>"),
    }


def render_autoscaler(spec: DeploySpec, s: AutoscalerSettings) -> dict[str, str]:
    """``keda-scaledobject.yaml`` and ``hpa.yaml`` (each with the plan header; ``hpa.yaml``'s header carries the
    prometheus-adapter rule as YAML comment lines, :func:`adapter_rule`)."""
    pool = _single_pool(spec)
    a = rate_autoscaler(spec, s)
    rule = (f"replicas = ceil(arrival rate / {a.threshold} req/s), {s.min_replicas}..{s.max_replicas} "
            f"(recommend autoscale)")
    block = yaml.safe_dump({"externalRules": [adapter_rule(spec, s)]}, sort_keys=False, default_flow_style=False,
                           width=1_000_000).rstrip("\n").split("\n")
    adapter = "\n# ".join([f"{rule}. Without KEDA, prometheus-adapter serves the rate as external metric "
                           f"{external_metric_name(spec, pool)} with this rule in its config (chart value "
                           "rules.external):", *(f"  {line}" for line in block)])
    return {**render_yaml(spec, "keda-scaledobject.yaml", [scaled_object(spec, pool, a)], rule),
            **render_yaml(spec, "hpa.yaml", [hpa(spec, pool, a)], adapter)}
