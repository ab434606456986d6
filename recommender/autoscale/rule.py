"""The scaling rule of an autoscaling plan, derived from the load model and the pod start-up time.

For the plan's configuration (one aggregated pool), with ``c1`` the largest arrival rate ONE replica serves
with every SLO met and utilisation at most the policy cap (bisection on the analytic load model,
``recommender.replan.predict``):

    startup_s  = image_pull_s + weight_bytes / weight_load_bytes_per_s + engine_init_s
    delay_s    = startup_s + polling_s + metric_window_s   (from a rise in traffic to a new replica serving)
    g          = max_t lambda(t + delay_s) / lambda(t)     (how much the day's profile rises within delay_s)
    target     = c1 / (g (1 + headroom))                   requests/s per replica the autoscaler aims at
    replicas   = ceil(metric / target)                     (the HPA rule for an AverageValue metric)
    min, max   = ceil(trough / target) (>= 1), ceil(peak / target)
    scale-down stabilisation = max(policy minimum (15 min), 3 x startup_s)

The metric is the arrival rate, read as ``sum(rate(vllm:request_success_total[window]))`` (completions track
arrivals in a stable deployment). A longer start-up raises ``g``, so it lowers the target and never lowers
min replicas. ``headroom`` is the search policy's (counted once: the target, not the sizing, carries it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recommender.autoscale.profile import DiurnalProfile
from recommender.errors import ConfigError
from recommender.plan import Plan
from recommender.profiles import EngineProfile
from recommender.replan.predict import predict_plan
from recommender.search.policy import SearchPolicy
from recommender.workload import Workload
from recommender.yamlfile import read_yaml_file

MAX_STARTUP_S = 3600.0


class _AutoscalePolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    image_pull_s: float = Field(120.0, ge=0.0, le=MAX_STARTUP_S)
    weight_load_bytes_per_s: float = Field(1.0e9, gt=1e6, le=1e12)
    engine_init_s: float = Field(60.0, ge=0.0, le=MAX_STARTUP_S)
    polling_s: float = Field(15.0, ge=1.0, le=600.0)
    metric_window_s: float = Field(60.0, ge=10.0, le=3600.0)
    min_scale_down_stabilisation_s: float = Field(900.0, ge=0.0, le=6 * 3600.0)
    slo_window_s: float = Field(300.0, ge=60.0, le=3600.0)


@dataclass(frozen=True, kw_only=True)
class AutoscalePolicy:
    """``policies/autoscale.yaml``: the start-up model and the autoscaler's clock (seconds, bytes/s)."""

    image_pull_s: float = 120.0
    weight_load_bytes_per_s: float = 1.0e9
    engine_init_s: float = 60.0
    polling_s: float = 15.0
    metric_window_s: float = 60.0
    min_scale_down_stabilisation_s: float = 900.0
    slo_window_s: float = 300.0


def load_autoscale_policy(path: str | Path | None = None) -> AutoscalePolicy:
    """Read ``policies/autoscale.yaml`` (or ``path``); every key optional."""
    from recommender.search.policy import default_policy_path

    p = Path(path) if path else default_policy_path().parent / "autoscale.yaml"
    doc = read_yaml_file(p, "autoscale policy", "see policies/autoscale.yaml") if p.exists() or path else {}
    try:
        spec = _AutoscalePolicySpec.model_validate(doc or {})
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"{p}: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
    return AutoscalePolicy(**spec.model_dump())


@dataclass(frozen=True, kw_only=True)
class ScalingRule:
    """What the autoscaler is given, and where each number came from."""

    metric: str
    replica_capacity_per_s: float  # c1
    target_per_replica_per_s: float
    min_replicas: int
    max_replicas: int
    startup_s: float
    polling_s: float
    metric_window_s: float
    scale_down_stabilisation_s: float
    growth_within_delay: float  # g
    headroom: float
    gpus_per_replica: int
    tolerance: float = 0.1  # the HPA's default: no scaling while metric / target is within 10% of 1

    def desired(self, rate_per_s: float) -> int:
        """``clamp(ceil(rate / target), min, max)``."""
        want = math.ceil(rate_per_s / self.target_per_replica_per_s - 1e-9) if rate_per_s > 0 else 0
        return max(self.min_replicas, min(self.max_replicas, want))


def startup_s(weight_bytes: float, policy: AutoscalePolicy) -> float:
    """``image_pull_s + weight_bytes / weight_load_bytes_per_s + engine_init_s``."""
    return policy.image_pull_s + weight_bytes / policy.weight_load_bytes_per_s + policy.engine_init_s


def replica_capacity_per_s(plan: Plan, workload: Workload, *, profile: EngineProfile, search: SearchPolicy,
                           rel_tol: float = 0.005) -> float:
    """``c1``: the largest rate one replica of the plan's configuration serves within every SLO and the
    utilisation cap (bisection; the load model's latencies grow with the rate)."""
    def meets(rate: float) -> bool:
        w = replace(workload, arrival_rate_per_s=rate, offline_requests=None, deadline_s=None)
        return predict_plan(plan, w, profile=profile, policy=search, replicas=(1,)).meets

    lo, hi = 0.0, max(workload.effective_rate_per_s, 1e-3)
    while meets(hi):
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            break
    if lo == 0.0:
        lo = hi / 1024.0
        if not meets(lo):
            raise ConfigError("one replica of this configuration cannot meet the SLOs at any rate; "
                              "plan it with `recommend` first (the static plan says why)")
    while hi - lo > rel_tol * lo:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


def derive_rule(*, capacity_per_s: float, profile: DiurnalProfile, startup: float, policy: AutoscalePolicy,
                headroom: float, gpus_per_replica: int, model_name: str) -> ScalingRule:
    """The rule from ``c1``, the profile and the start-up time (formulas in the module docstring)."""
    if not (math.isfinite(startup) and 0.0 < startup <= MAX_STARTUP_S):
        raise ConfigError(f"pod start-up time must be in (0 s, 1 h], got {startup:g} s; "
                          "set image_pull_s, weight_load_bytes_per_s and engine_init_s in policies/autoscale.yaml")
    delay = startup + policy.polling_s + policy.metric_window_s
    g = profile.max_growth(delay)
    target = capacity_per_s / (g * (1.0 + headroom))
    lo = max(1, math.ceil(profile.trough_rate_per_s / target - 1e-9))
    hi = max(lo, math.ceil(profile.peak_rate_per_s / target - 1e-9))
    window = int(policy.metric_window_s)
    return ScalingRule(
        metric=f'sum(rate(vllm:request_success_total{{model_name="{model_name}"}}[{window}s]))',
        replica_capacity_per_s=capacity_per_s, target_per_replica_per_s=target, min_replicas=lo, max_replicas=hi,
        startup_s=startup, polling_s=policy.polling_s, metric_window_s=policy.metric_window_s,
        scale_down_stabilisation_s=max(policy.min_scale_down_stabilisation_s, 3.0 * startup),
        growth_within_delay=g, headroom=headroom, gpus_per_replica=gpus_per_replica)
