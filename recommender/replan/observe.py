"""From an Observation to the Workload the planner sizes for, plus the SLO-risk check.

* Forecast (requests/s) over the rate points of the last ``lookback_s``: ``mean`` = the highest mean rate
  over ``window_s`` (requests / seconds of the points ending within one window length; a window mean is the
  estimate of a Poisson process's rate, the plans' sizing basis, and the highest of the lookback holds the
  fleet through a dip like ``peak`` does); ``peak`` = max of the sub-window rates; ``ewma`` = exponentially weighted mean in time order with
  ``level += a * (rate - level)``, ``a = 1 - 2 ** (-duration_s / halflife_s)`` (the first point seeds it).
* Planned rate = ``max(forecast * (1 + headroom), min_rate_per_s)``: the plan is sized with headroom.
* Lengths: the observed distributions (empirical samples from logs, histogram buckets from metrics)
  when at least ``min_requests`` requests were seen, else the base workload's (and a note says so).
* Prefix share: the observed fraction of prompt tokens served from the prefix cache when the source
  reports it, else the base workload's ``shared_prefix_fraction``.
* Observed SLO risk: an observed percentile above ``limit_s * slo_risk_factor`` (with at least
  ``slo_risk_min_requests`` observations). The predicted risk (the current plan under the model at the
  forecast) is ``recommender.replan.predict``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterable, Mapping, Sequence

from recommender.catalog import default_catalog
from recommender.errors import ConfigError, RecommenderError
from recommender.plan import LengthSummary, Plan, WorkloadEcho
from recommender.replan.observation import Observation, RatePoint
from recommender.replan.policy import Policy
from recommender.workload import LengthDist, Slo, Workload


def forecast_rate_per_s(points: Iterable[RatePoint], policy: Policy, now_s: float) -> float:
    """Forecast arrival rate from rate points ending within ``policy.lookback_s`` of ``now_s``."""
    pts = sorted((p for p in points if p.end_s >= now_s - policy.lookback_s and p.duration_s > 0),
                 key=lambda p: p.end_s)
    if not pts:
        return 0.0
    if policy.forecast_method == "mean":
        return _highest_window_mean(pts, policy.window_s)
    if policy.forecast_method == "peak":
        return max(p.rate_per_s for p in pts)
    level = pts[0].rate_per_s
    for p in pts[1:]:
        a = 1.0 - 2.0 ** (-p.duration_s / policy.ewma_halflife_s)
        level += a * (p.rate_per_s - level)
    return level


def _highest_window_mean(pts: Sequence[RatePoint], window_s: float) -> float:
    """The highest mean rate over ``window_s`` of time-ordered rate points: for each point, the
    duration-weighted mean of the points ending within ``window_s`` up to it, counted when they cover at least
    90% of ``min(window_s, all the points' time)`` (a partial window is a noisier estimate)."""
    total_s = sum(p.duration_s for p in pts)
    need_s = 0.9 * min(window_s, total_s)
    best = 0.0
    for i, last in enumerate(pts):
        inside = [p for p in pts[: i + 1] if p.end_s > last.end_s - window_s + 1e-6]
        seconds = sum(p.duration_s for p in inside)
        if seconds >= need_s - 1e-9:
            best = max(best, sum(p.rate_per_s * p.duration_s for p in inside) / seconds)
    return best


def rate_points_from_observed(observed: Mapping[str, Any] | None) -> list[RatePoint]:
    """Rate points stored in a history row's observed JSON (``[end_s, duration_s, rate]`` triples)."""
    out = []
    for triple in (observed or {}).get("rate_points", []) or []:
        try:
            out.append(RatePoint(float(triple[0]), float(triple[1]), float(triple[2])))
        except (TypeError, ValueError, IndexError):
            continue
    return out


def merge_points(earlier: Iterable[RatePoint], current: Iterable[RatePoint]) -> list[RatePoint]:
    """Union keyed by end time; the current observation wins on equal end times."""
    by_end = {round(p.end_s, 3): p for p in earlier}
    by_end.update({round(p.end_s, 3): p for p in current})
    return sorted(by_end.values(), key=lambda p: p.end_s)


def _dist_from_summary(d: LengthSummary | None, what: str) -> LengthDist:
    """Rebuild a length distribution from a plan's summary (min, p50, p90, p99, max; weights 0, 0.5, 0.4,
    0.09, 0.01 between them)."""
    if d is None:
        raise ConfigError(f"the current plan's workload has no {what} summary; pass --workload FILE")
    if d.dist == "constant" or d.min == d.max:
        return LengthDist.constant(int(d.max or d.p50 or d.mean or 1))
    if d.p50 is None and d.p90 is None and d.p99 is None:
        mean = float(d.mean)  # only mean/max known: a normal with a 25% spread, clipped to [min, max]
        return LengthDist.normal(mean, 0.25 * mean, int(d.min or 1), int(d.max) if d.max else None)
    keys = [(d.min, 0.0), (d.p50, 0.5), (d.p90, 0.4), (d.p99, 0.09), (d.max, 0.01)]
    edges: list[float] = []
    counts: list[float] = []
    for v, w in keys:
        if v is None:
            continue
        e = float(v)
        if edges and e <= edges[-1]:
            counts[-1] += w
        else:
            edges.append(e)
            counts.append(w)
    if not edges or sum(counts) <= 0:
        raise ConfigError(f"the current plan's {what} summary is unusable; pass --workload FILE")
    return LengthDist.histogram(edges, counts)


def base_workload_from_plan(plan: Plan, where: str = "current plan") -> Workload:
    """The workload a plan was made for (model, SLOs, lengths from their summaries).

    GPU types are restricted to those the plan's rank-1 row already uses, at the prices the user gave for them
    (``--price`` / ``prices:``, which the plan carries); pass the original workload file to widen that.
    """
    row = plan.top
    gpus = tuple(sorted({p.gpu for p in row.pools} | {row.gpu}))
    return _base_workload(plan.workload, plan.slos, gpus, where)


@functools.lru_cache(maxsize=32)
def _base_workload(wl: WorkloadEcho, slos: tuple[Slo, ...], gpus: tuple[str, ...], where: str) -> Workload:
    if not wl.model:
        raise ConfigError(f"{where}: workload.model is missing; pass --workload FILE")
    return Workload(
        model=_model_name(wl), prompt_tokens=_dist_from_summary(wl.prompt_tokens, "prompt_tokens"),
        output_tokens=_dist_from_summary(wl.output_tokens, "output_tokens"),
        arrival_rate_per_s=wl.arrival_rate_per_s, shared_prefix_fraction=wl.shared_prefix_fraction,
        gpus=gpus, slos=slos, name=wl.name or "workload", source=wl.source, inventory=wl.inventory,
        usd_per_gpu_hour_overrides={p.gpu: p.usd_per_gpu_hour for p in wl.prices if p.gpu in gpus})


def _model_name(wl: WorkloadEcho) -> str:
    """The name the re-planner plans for: the plan's checkpoint where it is a repo of the plan's catalog model (an
    alias such as deepseek-ai/DeepSeek-R1 for deepseek-v3), so a new plan deploys the same weights; else the model."""
    if wl.hf_repo and wl.hf_repo != wl.model:
        try:
            if default_catalog().model_id(wl.hf_repo) == wl.model:
                return wl.hf_repo
        except RecommenderError:  # a name the resolver refuses: plan for the catalog id, as before
            pass
    return wl.model


def _max_model_len(plan: Plan) -> int | None:
    return plan.top.max_model_len or plan.workload.max_model_len


def _clip(dist: LengthDist, cap: int | None) -> LengthDist:
    """A histogram distribution clipped to ``cap`` tokens (vLLM rejects longer requests anyway)."""
    if cap is None or dist.kind != "histogram" or dist.max_tokens <= cap:
        return dist
    edges: list[float] = []
    counts: list[float] = []
    for e, w in zip(dist.samples, dist.weights):
        e = min(e, cap)
        if edges and e <= edges[-1]:
            counts[-1] += w
        else:
            edges.append(e)
            counts.append(w)
    return LengthDist.histogram(edges, counts)


def observed_workload(obs: Observation, base: Workload, current: Plan, policy: Policy,
                      forecast_per_s: float) -> tuple[Workload, list[str]]:
    """The workload to plan for and notes on what was kept from ``base``."""
    notes = []
    rate = forecast_per_s * (1.0 + policy.headroom)
    if rate < policy.min_rate_per_s:
        notes.append(f"planned rate {rate:.4f} req/s raised to the policy floor {policy.min_rate_per_s} req/s")
        rate = policy.min_rate_per_s
    cap = _max_model_len(current)
    lengths: dict[str, LengthDist] = {}
    for key, lo in (("prompt_tokens", obs.prompt_tokens), ("output_tokens", obs.output_tokens)):
        dist = lo.to_length_dist() if lo.count >= policy.min_requests else None
        if dist is None:
            notes.append(f"{lo.count} requests observed (< {policy.min_requests}): kept the plan's {key} distribution")
            dist = getattr(base, key)
        lengths[key] = _clip(dist, cap)
    prefix = base.shared_prefix_fraction
    if obs.prefix_share is not None:
        prefix = min(0.95, max(0.0, obs.prefix_share))
        if abs(prefix - base.shared_prefix_fraction) > 1e-3:
            notes.append(f"observed prefix-cache share {prefix:.2f} (the plan assumed {base.shared_prefix_fraction:.2f})")
    wl = dataclasses.replace(base, arrival_rate_per_s=rate, offline_requests=None, deadline_s=None,
                             shared_prefix_fraction=prefix, source=f"replan:{obs.source}:{','.join(obs.where)}",
                             prompt_tokens=lengths["prompt_tokens"], output_tokens=lengths["output_tokens"])
    return wl, notes


def slo_risks(obs: Observation, slos: Sequence[Slo], policy: Policy) -> list[str]:
    """Human reasons why the current plan's SLOs are at risk by what was observed."""
    out = []
    for slo in slos:
        h = obs.latency.get(slo.metric)
        if h is None or h.count < policy.slo_risk_min_requests:
            continue
        v = obs.latency_s(slo.metric, slo.percentile)
        if v is not None and v > slo.limit_s * policy.slo_risk_factor:
            out.append(f"observed {slo.metric} {slo.percentile} {v * 1e3:.0f} ms > {slo.limit_s * 1e3:.0f} ms SLO"
                       + (f" x {policy.slo_risk_factor:g}" if policy.slo_risk_factor != 1 else ""))
    return out


def slo_attainment(obs: Observation, slos: Sequence[Slo], policy: Policy) -> list[dict[str, Any]]:
    """Observed value of each SLO's metric at its percentile, next to the limit."""
    out = []
    for slo in slos:
        v = obs.latency_s(slo.metric, slo.percentile)
        h = obs.latency.get(slo.metric)
        n = int(round(h.count)) if h is not None else 0
        out.append({"metric": slo.metric, "percentile": slo.percentile, "limit_s": slo.limit_s,
                    "observed_s": None if v is None or math.isnan(v) else round(v, 5), "observations": n,
                    "ok": None if v is None else bool(v <= slo.limit_s)})
    return out
