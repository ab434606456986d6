"""The scaling rule of an autoscaling plan, derived from the load model, the pod start-up time and the day's traffic.

For the plan's configuration (one aggregated pool), with ``c1`` the largest arrival rate ONE replica serves
with every SLO met and utilisation at most the policy cap (bisection on the analytic load model,
``recommender.replan.predict``), ``m(t)`` the metric (arrivals of the last ``metric_window_s`` / that window,
read every ``polling_s``), ``r_w`` the arrival rate of SLO window ``w`` (``slo_window_s``)::

    startup_s  = image_pull_s + weight_bytes / weight_load_bytes_per_s + engine_init_s
    g          = max_t lambda(t + startup + polling + window) / lambda(t)   (the profile's rise meanwhile)
    T_burst    = tile requests / trough rate      (a tiled trace's bursts recur once a tile; 0 for Poisson)
    hold_b     = max(min_scale_down_stabilisation_s, T_burst)
    B          = quantile_w [ r_w / max{ m(s) : w + slo_window - hold_b <= s <= w - polling - startup } ]
    target     = c1 / ((1 + tolerance) max(B, g))  requests/s per replica (tolerance: the HPA's 10%)
    replicas   = ceil(metric / target)             (the HPA rule for an AverageValue metric)
    min, max   = ceil(trough / target) (>= 1), ceil(max(peak, max_t m(t)) / target)
    cooldown   = max(hold_b, 3 x startup, slo_window + startup + 2 polling)
    S          = min(cooldown, 3600 s)   the HPA's scale-down stabilisation (its API caps it at an hour)
    H          = cooldown - S            held in the query: max_over_time(rate(...)[H:polling])

Why: a window's replicas were asked for at least ``startup + polling`` before it starts, on the highest
reading the autoscaler still held (the stabilisation window and the query's hold keep the largest
recommendation of the last ``cooldown``); ``B`` is how far a window's rate exceeds that reading, at the
policy's ``slo_window_goal`` quantile of the day's windows (0.99: the share of windows the rule is sized
to cover), so ``target x B <= c1`` keeps a window's replicas within what the model says meets the SLO,
and ``1 + tolerance`` covers the HPA leaving the count alone within 10% of the target. Holding the
readings for one burst period ``T_burst`` means a burst always finds the replicas the previous one
needed: no scale-down between bursts, so none to undo (a flap); the diurnal trend alone moves the count.
Without arrivals (a rule from the profile alone) ``B = 1``. With the plan and the day,
``recommender.autoscale.coverage`` raises the target while the controller, run on the day, still covers
``slo_window_goal`` of the windows (the two worst cases above seldom meet). A longer start-up shortens ``B``'s interval
(every window's ratio grows) and raises ``g``, so it lowers the target and never lowers min replicas.

The metric is the arrival rate, read as ``sum(rate(vllm:request_success_total[window]))`` (completions track
arrivals in a stable deployment). The search policy's headroom is not applied: ``B`` and the tolerance are
the margin, measured rather than assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
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
#: autoscaling/v2 validation: ``behavior.scaleDown.stabilizationWindowSeconds`` must be in [0, 3600]
MAX_HPA_STABILISATION_S = 3600.0
#: the HPA's default tolerance: no scaling while metric / (replicas x target) is within 10% of 1
HPA_TOLERANCE = 0.1


class _AutoscalePolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    image_pull_s: float = Field(120.0, ge=0.0, le=MAX_STARTUP_S)
    weight_load_bytes_per_s: float = Field(1.0e9, gt=1e6, le=1e12)
    engine_init_s: float = Field(60.0, ge=0.0, le=MAX_STARTUP_S)
    polling_s: float = Field(15.0, ge=1.0, le=600.0)
    metric_window_s: float = Field(60.0, ge=10.0, le=3600.0)
    min_scale_down_stabilisation_s: float = Field(900.0, ge=0.0, le=6 * 3600.0)
    slo_window_s: float = Field(300.0, ge=60.0, le=3600.0)
    slo_window_goal: float = Field(0.99, ge=0.5, le=1.0)


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
    slo_window_goal: float = 0.99  # the share of SLO windows the rule is sized to cover (B's quantile)


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
    """What the autoscaler is given, and where each number came from (seconds, requests/s)."""

    metric: str  # the PromQL the KEDA trigger / HPA adapter reads
    replica_capacity_per_s: float  # c1
    target_per_replica_per_s: float
    min_replicas: int
    max_replicas: int
    startup_s: float
    polling_s: float
    metric_window_s: float
    metric_hold_s: float  # H: the query's max_over_time hold (0: the plain rate)
    scale_down_stabilisation_s: float  # S: the HPA's scale-down stabilisation window, <= 3600
    growth_within_delay: float  # g
    burst: float  # B
    gpus_per_replica: int
    tolerance: float = HPA_TOLERANCE
    burst_target_per_replica_per_s: float = 0.0  # c1 / ((1 + tolerance) max(B, g)); the target unless raised by
    window_coverage: float | None = None  # the share of SLO windows its replicas cover (recommender.autoscale.coverage)

    @property
    def cooldown_s(self) -> float:
        """``H + S``: how long a rate must stay low before a replica goes (a later scale-up within it is a flap)."""
        return self.metric_hold_s + self.scale_down_stabilisation_s

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


def metric_series(arrival_s: np.ndarray, *, polling_s: float, window_s: float, start_s: float,
                  end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """``(t, m(t))``: the metric at every poll in ``[start_s, end_s)``: arrivals in ``(t - window, t]`` / window."""
    t = np.arange(start_s, end_s, polling_s)
    came = np.searchsorted(arrival_s, t, "right") - np.searchsorted(arrival_s, t - window_s, "right")
    return t, came / window_s


def wrapped(arrival_s: np.ndarray, period_s: float, before_s: float) -> np.ndarray:
    """The day's arrivals with its last ``before_s`` seconds put before 0 (the day repeats: what the
    autoscaler saw before midnight is the end of the day)."""
    a = np.asarray(arrival_s, dtype=float)
    tail = a[a >= period_s - before_s] - period_s
    return np.concatenate([tail, a])


def burst_factor(arrival_s: np.ndarray, *, period_s: float, slo_window_s: float, polling_s: float,
                 metric_window_s: float, hold_s: float, startup_s: float, quantile: float = 1.0) -> float:
    """``B = quantile_w r_w / max_{s in [w + slo_window - hold, w - polling - startup]} m(s)`` over the day's SLO
    windows ``w`` (``r_w``: the window's arrivals / its length; ``m``: the metric at each poll), at least 1:
    how far a window's rate can exceed the highest reading that the replicas serving it were scaled for (a
    reading later than ``w - polling - startup`` brings its pods too late; one older than the hold is
    forgotten). A longer start-up shortens the interval, so ``B`` never falls (while the interval is not
    empty, ``startup <= hold - slo_window - polling``; beyond, the one reading at ``w - polling - startup``),
    and each window's ratio never falls, so neither does their ``quantile`` (the policy's ``slo_window_goal``).
    The polls are multiples of ``polling_s`` whatever the start-up (an offset grid would read other instants)."""
    first = -math.ceil((hold_s + startup_s) / polling_s - 1e-9) * polling_s  # polls on one grid for every start-up
    a = wrapped(arrival_s, period_s, -first + metric_window_s)
    t, m = metric_series(a, polling_s=polling_s, window_s=metric_window_s, start_s=first, end_s=period_s)
    edges = np.arange(0.0, period_s, slo_window_s)
    counts = np.diff(np.searchsorted(a, np.append(edges, period_s)))
    hi = np.searchsorted(t, edges - polling_s - startup_s, "right")
    lo = np.minimum(np.searchsorted(t, edges + slo_window_s - hold_s, "left"), np.maximum(hi - 1, 0))
    ratios = []
    for k, (i, j) in enumerate(zip(lo, hi)):
        seen = float(np.max(m[i:j])) if j > i else 0.0
        span = min(slo_window_s, period_s - float(edges[k]))
        if seen > 0 and counts[k] >= 10:
            ratios.append(float(counts[k]) / span / seen)
    return max(1.0, float(np.quantile(ratios, quantile))) if ratios else 1.0


def derive_rule(*, capacity_per_s: float, profile: DiurnalProfile, startup: float, policy: AutoscalePolicy,
                gpus_per_replica: int, model_name: str, arrival_s: np.ndarray | None = None,
                burst_period_s: float | None = None) -> ScalingRule:
    """The rule from ``c1``, the profile, the start-up time and (when given) the day's arrivals and the period
    of its bursts (formulas in the module docstring)."""
    if not (math.isfinite(startup) and 0.0 < startup <= MAX_STARTUP_S):
        raise ConfigError(f"pod start-up time must be in (0 s, 1 h], got {startup:g} s; "
                          "set image_pull_s, weight_load_bytes_per_s and engine_init_s in policies/autoscale.yaml")
    g = profile.max_growth(startup + policy.polling_s + policy.metric_window_s)
    recur = float(burst_period_s or 0.0)
    hold_b = max(policy.min_scale_down_stabilisation_s, recur)
    b = 1.0 if arrival_s is None else burst_factor(
        arrival_s, period_s=profile.period_s, slo_window_s=policy.slo_window_s, polling_s=policy.polling_s,
        metric_window_s=policy.metric_window_s, hold_s=hold_b, startup_s=startup,
        quantile=policy.slo_window_goal)
    target = capacity_per_s / ((1.0 + HPA_TOLERANCE) * max(b, g))
    cooldown = max(hold_b, 3.0 * startup, policy.slo_window_s + startup + 2.0 * policy.polling_s)
    stab = min(cooldown, MAX_HPA_STABILISATION_S)
    hold = math.ceil((cooldown - stab) / policy.polling_s - 1e-9) * policy.polling_s
    top = profile.peak_rate_per_s
    if arrival_s is not None:
        _, m = metric_series(np.asarray(arrival_s, dtype=float), polling_s=policy.polling_s,
                             window_s=policy.metric_window_s, start_s=policy.metric_window_s, end_s=profile.period_s)
        top = max(top, float(np.max(m, initial=0.0)))
    lo = max(1, math.ceil(profile.trough_rate_per_s / target - 1e-9))
    hi = max(lo, math.ceil(top / target - 1e-9))
    window = int(policy.metric_window_s)
    rate = f'sum(rate(vllm:request_success_total{{model_name="{model_name}"}}[{window}s]))'
    metric = f"max_over_time({rate}[{int(hold)}s:{int(policy.polling_s)}s])" if hold > 0 else rate
    return ScalingRule(
        metric=metric, replica_capacity_per_s=capacity_per_s, target_per_replica_per_s=target, min_replicas=lo,
        max_replicas=hi, startup_s=startup, polling_s=policy.polling_s, metric_window_s=policy.metric_window_s,
        metric_hold_s=float(hold), scale_down_stabilisation_s=stab, growth_within_delay=g, burst=b,
        gpus_per_replica=gpus_per_replica, burst_target_per_replica_per_s=target)
