"""Autoscaling plans for traffic over a day (``recommend autoscale``): configuration, rule, certification.

A workload file's ``day:`` block says how its traffic moves over a day::

    day:
      peak_to_trough: 3        # diurnal cosine around traffic.arrival_rate (the day's mean), >= 1
      peak_hour: 14            # 0-24
      trace: traces/azure-conv.csv   # optional: a request log whose burstiness is tiled over the day
      startup: 4min            # optional: pod start-up time (default: from policies/autoscale.yaml)

:func:`plan_autoscaling` (1) plans the configuration for the day's peak with the search (aggregated pools:
one pool is what an HPA scales), the static peak plan; (2) derives the rule for that configuration
(:mod:`recommender.autoscale.rule`) and raises its target while the controller on the day's arrivals still
covers the policy's share of SLO windows (:mod:`recommender.autoscale.coverage`); (3) certifies it in a day-long replay with the autoscaler in the loop
(:mod:`recommender.autoscale.replay`), against the static plan's and the ideal autoscaler's GPU-hours.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recommender import units
from recommender.autoscale.coverage import covered_rule, static_replicas_covering, window_capacities_per_s
from recommender.autoscale.profile import DayTraffic, DiurnalProfile, poisson_day, tiled_trace_day
from recommender.autoscale.replay import Certification, replay
from recommender.autoscale.rule import (
    MAX_STARTUP_S, AutoscalePolicy, ScalingRule, derive_rule, load_autoscale_policy, replica_capacity_per_s, startup_s,
)
from recommender.catalog import default_catalog
from recommender.errors import ConfigError
from recommender.load.topology import PoolSpec
from recommender.plan import Plan, layout_suffix, with_replicas
from recommender.profiles import EngineProfile, engine_profile
from recommender.replan.predict import pool_step_costs
from recommender.search.policy import SearchPolicy, load_search_policy
from recommender.workload import Workload

__all__ = ["AutoscalePlan", "AutoscalePolicy", "Certification", "DayTraffic", "DaySpec", "DiurnalProfile",
           "ScalingRule", "day_spec", "parse_startup_s", "plan_autoscaling", "static_peak_plan"]


class _DaySpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    peak_to_trough: float = Field(3.0, ge=1.0, le=100.0)
    peak_hour: float = Field(14.0, ge=0.0, lt=24.0)
    trace: str | None = Field(None, min_length=1, max_length=4096)
    startup: str | float | None = None


@dataclass(frozen=True, kw_only=True)
class DaySpec:
    """The ``day:`` block, checked: the profile, an optional trace path, an optional start-up override (s)."""

    profile: DiurnalProfile
    trace: Path | None
    startup_s: float | None


def parse_startup_s(value: str | float, what: str) -> float:
    """A pod start-up time (``4min``, ``252.66 s`` or seconds as a number) in (0 s, 1 h], else one ConfigError
    line naming ``what`` (``--startup``, ``day.startup``). Zero is refused, not read as "use the default"."""
    start = units.parse_duration_s(value, what) if isinstance(value, str) else float(value)
    if not (math.isfinite(start) and 0 < start <= MAX_STARTUP_S):
        raise ConfigError(f"{what} {value!r}: a pod start-up time must be in (0 s, 1 h]; e.g. 4min, or leave it out "
                          "for image pull + weights / storage bandwidth + engine start (policies/autoscale.yaml)")
    return start


def day_spec(workload: Workload) -> DaySpec:
    """The workload's ``day:`` block as a :class:`DaySpec` (one-line ConfigError when absent or invalid)."""
    if workload.day is None or workload.arrival_rate_per_s is None:
        raise ConfigError(f"workload {workload.name!r} has no day: block with an arrival_rate to move around; add "
                          "day: {peak_to_trough: 3, peak_hour: 14} (see examples/chat-day.yaml)")
    try:
        m = _DaySpecModel.model_validate(dict(workload.day))
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"{workload.source or workload.name}: day.{'.'.join(str(x) for x in first['loc'])}: "
                          f"{first['msg']}") from None
    start = None if m.startup is None else parse_startup_s(m.startup, "day.startup")
    trace = None
    if m.trace:
        base = Path(workload.source).parent if workload.source else Path(".")
        trace = Path(m.trace) if Path(m.trace).is_absolute() else base / m.trace
    profile = DiurnalProfile(mean_rate_per_s=workload.arrival_rate_per_s, peak_to_trough=m.peak_to_trough,
                             peak_hour=m.peak_hour)
    return DaySpec(profile=profile, trace=trace, startup_s=start)


def static_peak_plan(plan: Plan, *, replicas: int, peak_window_rate_per_s: float = 0.0) -> Plan:
    """The static peak plan as a plan document: ``plan``'s rank 1 (the day's configuration) at ``replicas``.

    ``plan`` is the search's plan for the day's smooth peak; unchanged when ``replicas`` is its rank 1's count.
    Otherwise only rank 1 is kept, resized by :func:`recommender.plan.with_replicas` with ``same_rate`` (whole
    instances re-rented, ``usd_per_hour`` from the pool prices): the same workload at the day's peak rate on more
    replicas, so the arrival rate and output tokens/s stay the search's, ``load_utilisation`` is the search's x
    old / new GPUs and $/M tokens follow $/h. The latencies stay those modelled at the search's count; more replicas at the same rate only
    lower them. The row's ``quality_note`` and the plan's ``why`` say so. ``search.sized_rate_per_s`` (what ``recommend
    replan``'s band holds the traffic to) is the search's x new / old replicas: the rate the count serves at the
    search's load per replica."""
    row = plan.top
    if len(row.pools) != 1:
        raise ConfigError("autoscaling plans one aggregated pool; this plan's rank 1 has "
                          f"{len(row.pools)} pools")
    old = row.pools[0].replicas
    if replicas < 1:
        raise ConfigError(f"static peak plan: {replicas} replicas; it needs at least 1")
    if replicas == old:
        return plan
    window = f" (the day's busiest 5-min window {peak_window_rate_per_s:.2f} req/s)" if peak_window_rate_per_s else ""
    note = (f"static peak plan of recommend autoscale: x{replicas} replicas for the day's SLO windows{window}, "
            f"the search's x{old} for its smooth peak; latencies as modelled at x{old}")
    resized = with_replicas(plan, (replicas,), note, same_rate=True)
    search = resized.search
    sized = plan.sized_rate_per_s()
    if sized is not None:  # capacity grows with the replicas: replan's band reads what this count was sized for
        search = dataclasses.replace(search, sized_rate_per_s=round(sized * replicas / old, 6))
    return dataclasses.replace(resized, search=search,
                               why=f"{note[0].upper()}{note[1:]}. The search at the smooth peak: {plan.why}")


@dataclass(frozen=True)
class AutoscalePlan:
    """The search's plan for the day's smooth peak (its rank 1 is the day's configuration; :meth:`peak_plan` is the
    static peak plan at ``static_replicas``), the rule and the certification."""

    static_plan: Plan
    rule: ScalingRule
    certification: Certification
    profile: DiurnalProfile
    traffic_source: str
    static_certification: Certification | None = None  # the static peak plan in the same replay, when asked
    static_replicas: int = 0  # the static peak plan's replicas: the search's, or the busiest window's need
    peak_window_rate_per_s: float = 0.0  # the day's busiest SLO window
    static_replicas_at_c1: int = 0  # ceil(busiest window / c1): the busiest window at the day's mean lengths

    def peak_plan(self) -> Plan:
        """The static peak plan the report names (rank 1 at ``static_replicas``): what ``--emit`` writes as
        ``plan.json`` and renders into the deployment files (:func:`static_peak_plan`)."""
        n = self.static_replicas or self.static_plan.top.pools[0].replicas
        return static_peak_plan(self.static_plan, replicas=n, peak_window_rate_per_s=self.peak_window_rate_per_s)

    def to_dict(self) -> dict[str, Any]:
        r = self.rule
        pool = self.static_plan.top.pools[0]
        return {
            "configuration": self.static_plan.top.id, "gpu": pool.gpu, "tp": pool.tp,
            "profile": {"mean_rate_per_s": self.profile.mean_rate_per_s, "peak_to_trough": self.profile.peak_to_trough,
                        "peak_hour": self.profile.peak_hour, "peak_rate_per_s": round(self.profile.peak_rate_per_s, 4),
                        "trough_rate_per_s": round(self.profile.trough_rate_per_s, 4), "traffic": self.traffic_source},
            "pools": [{"role": pool.role.value, "min_replicas": r.min_replicas, "max_replicas": r.max_replicas,
                       "static_replicas": self.static_replicas, "static_replicas_at_c1": self.static_replicas_at_c1,
                       "search_replicas": pool.replicas}],
            "peak_window_rate_per_s": round(self.peak_window_rate_per_s, 4),
            "rule": {"metric": r.metric, "target_per_replica_per_s": round(r.target_per_replica_per_s, 4),
                     "burst_target_per_replica_per_s": round(r.burst_target_per_replica_per_s, 4),
                     "window_coverage": None if r.window_coverage is None else round(r.window_coverage, 4),
                     "replica_capacity_per_s": round(r.replica_capacity_per_s, 4),
                     "growth_within_delay": round(r.growth_within_delay, 4), "burst": round(r.burst, 4),
                     "tolerance": r.tolerance, "polling_s": r.polling_s, "metric_window_s": r.metric_window_s,
                     "metric_hold_s": r.metric_hold_s, "scale_down_stabilisation_s": r.scale_down_stabilisation_s,
                     "cooldown_s": r.cooldown_s, "startup_s": round(r.startup_s, 1)},
            "day": self.certification.to_dict(),
            "static_day": self.static_certification.to_dict() if self.static_certification else None,
        }


def _day_traffic(spec: DaySpec, workload: Workload, seed: int) -> DayTraffic:
    if spec.trace is not None:
        from recommender.load.trace import read_trace

        rows = read_trace(str(spec.trace))
        a = np.array([r[0] for r in rows], dtype=float)
        cap_p, cap_o = workload.prompt_tokens.max_tokens, workload.output_tokens.max_tokens
        p = np.minimum(np.array([r[1] for r in rows], dtype=int), cap_p)  # the engine's max_model_len holds these
        o = np.minimum(np.array([r[2] for r in rows], dtype=int), cap_o)
        return tiled_trace_day(spec.profile, a, p, o, source=str(spec.trace))
    rng = random.Random(seed)
    p = np.array(workload.prompt_tokens.sample(rng, 20_000))
    o = np.array(workload.output_tokens.sample(rng, 20_000))
    return poisson_day(spec.profile, p, o, seed=seed)


def plan_autoscaling(workload: Workload, *, static_plan: Plan | None = None, profile: EngineProfile | None = None,
                     policy: SearchPolicy | None = None, autoscale_policy: AutoscalePolicy | None = None,
                     startup_override_s: float | None = None, seed: int = 0,
                     compare_static: bool = False) -> AutoscalePlan:
    """Plan, derive and certify (see the module docstring). ``static_plan``: the search's plan for the day's
    peak, when the caller ran it (it must be aggregated); otherwise the search runs here."""
    spec = day_spec(workload)
    # checked before the search: 0 s is refused, never read as "no override"
    override_s = None if startup_override_s is None else parse_startup_s(startup_override_s, "startup_override_s")
    profile = profile or engine_profile("vllm")
    search = policy or load_search_policy()
    auto = autoscale_policy or load_autoscale_policy()
    peak_w = dataclasses.replace(workload, arrival_rate_per_s=spec.profile.peak_rate_per_s)
    if static_plan is None:
        from recommender.search import SearchSettings, recommend

        static_plan = recommend(peak_w, settings=SearchSettings(seed=seed, verify=0), profile=profile,
                                policy=dataclasses.replace(search, disaggregation=False))
    if static_plan.top.disaggregated:
        raise ConfigError("autoscaling plans one aggregated pool; this plan's rank 1 is prefill/decode "
                          "disaggregated (set disaggregation: false in the search policy)")
    catalog = default_catalog()
    (pm,) = pool_step_costs(static_plan, peak_w, profile=profile, catalog=catalog)
    cost, limits, dep = pm.cost, pm.limits, pm.deployment
    c1 = replica_capacity_per_s(static_plan, peak_w, profile=profile, search=search)
    # what one pod reads: every GPU of its engine its share (DP ranks each their dense weights and their experts;
    # pp > 1: one stage's, the stages' pods loading in parallel)
    weight_bytes = dep.memory().weights_bytes_per_gpu * dep.tp * dep.dp
    start = override_s if override_s is not None else (
        spec.startup_s if spec.startup_s is not None else startup_s(weight_bytes, auto))
    served = static_plan.workload.hf_repo or workload.model
    day = _day_traffic(spec, workload, seed)
    rule = derive_rule(capacity_per_s=c1, profile=spec.profile, startup=start, policy=auto, gpus_per_replica=pm.pool.gpus_per_replica,
                       model_name=served, arrival_s=day.arrival_s, burst_period_s=day.burst_period_s(spec.profile))
    caps = window_capacities_per_s(static_plan, peak_w, day, profile=profile, search=search,
                                   window_s=auto.slo_window_s, period_s=spec.profile.period_s)
    rule, cov = covered_rule(rule, day, spec.profile, caps, window_s=auto.slo_window_s, goal=auto.slo_window_goal)
    rule = dataclasses.replace(rule, window_coverage=cov.covered)
    # the static plan: the search sized the smooth peak; the day's busiest SLO window needs ceil(peak / c1) at the
    # day's mean lengths, and its windows at their own lengths the count covering the goal (the autoscaler's test)
    peak_window = day.peak_window_rate_per_s(auto.slo_window_s, spec.profile.period_s)
    n_at_c1 = math.ceil(peak_window / c1 - 1e-9)
    n_covering = static_replicas_covering(day, caps, period_s=spec.profile.period_s, window_s=auto.slo_window_s,
                                          goal=auto.slo_window_goal)
    n_static = max(static_plan.top.pools[0].replicas, n_at_c1, n_covering)

    def run(r: ScalingRule) -> Certification:
        return replay(PoolSpec(cost=cost, limits=limits), r, day, spec.profile, workload.slos, static_replicas=n_static,
                      shared_prefix_fraction=workload.shared_prefix_fraction, slo_window_s=auto.slo_window_s,
                      ranks_per_replica=pm.pool.data_parallel_size)

    static = run(dataclasses.replace(rule, min_replicas=n_static, max_replicas=n_static)) if compare_static else None
    return AutoscalePlan(static_plan, rule, run(rule), spec.profile, day.source, static, static_replicas=n_static,
                         peak_window_rate_per_s=peak_window, static_replicas_at_c1=n_at_c1)


def summary_lines(ap: AutoscalePlan) -> list[str]:
    """The text report: configuration, rule, the day's figures."""
    r, c, p = ap.rule, ap.certification, ap.profile
    pool = ap.static_plan.top.pools[0]
    return [
        f"day        {p.mean_rate_per_s:g} req/s mean, {p.peak_to_trough:g}:1 peak-to-trough (peak "
        f"{p.peak_rate_per_s:.2f} req/s at {p.peak_hour:g}h, trough {p.trough_rate_per_s:.2f}); traffic {ap.traffic_source}",
        f"config     {ap.static_plan.top.id} ({pool.gpu} TP{pool.tp}{layout_suffix(pp=pool.pp, dp=pool.data_parallel_size, ep=pool.enable_expert_parallel, mtp=pool.num_speculative_tokens)}); static peak plan x{ap.static_replicas} (covers "
        f"the SLO windows at their own lengths; busiest 5-min window {ap.peak_window_rate_per_s:.2f} req/s = "
        f"x{ap.static_replicas_at_c1} at c1; the search's x{pool.replicas} at the smooth peak)",
        f"capacity   one replica meets the SLOs up to {r.replica_capacity_per_s:.3f} req/s",
        f"start-up   {units.fmt_seconds(r.startup_s)}; the profile rises x{r.growth_within_delay:.3f} within start-up + "
        f"polling + window; a window's rate exceeds the reading its replicas were scaled for by x{r.burst:.3f}",
        f"rule       burst target {r.burst_target_per_replica_per_s:.3f} req/s per replica = "
        f"{r.replica_capacity_per_s:.3f} / ({1 + r.tolerance:.2f} x {max(r.burst, r.growth_within_delay):.3f}); target "
        f"{r.target_per_replica_per_s:.3f} (the controller on the day covers "
        f"{'-' if r.window_coverage is None else f'{r.window_coverage:.1%}'} of the SLO windows at it); "
        f"replicas {r.min_replicas}..{r.max_replicas}",
        f"autoscaler poll {r.polling_s:g} s, rate over {r.metric_window_s:g} s held {r.metric_hold_s:g} s, scale-down "
        f"stabilisation {r.scale_down_stabilisation_s:g} s (cooldown {r.cooldown_s:g} s)",
        f"replay     {c.requests:,} requests: SLOs met in {c.windows_met}/{c.windows} windows ({c.attainment:.1%}), "
        f"{c.flaps} flaps, {c.scale_events} scale events, replicas {c.min_replicas_seen}..{c.max_replicas_seen}",
        f"GPU-hours  autoscaled {c.gpu_hours:.1f}, static peak {c.static_gpu_hours:.1f} "
        f"({c.gpu_hours / c.static_gpu_hours:.2f}x), ideal autoscaler {c.ideal_gpu_hours:.1f}",
    ]
