"""Error bands of one configuration's estimate (``recommend estimate``), by the plan rows' error model.

A plan row's bands (:mod:`recommender.search.bands`) come from the held-out error of its evidence class (engine x
GPU family x weight dtype x model class): the modelled step times are off by a factor ``g = exp(sigma z)``,
``z`` standard normal, and TTFT by ``exp(sigma_ttft z)``. ``estimate`` states the same p10-p90 band
(``z = -/+ 1.2816``) around its own numbers, so one configuration explained and the plan that ranks it carry
one stated error:

- a static batch, a closed loop at a fixed concurrency, one decode step (no clock outside the engine): every
  time scales exactly, ``TPOT x g``, ``e2e x g``, ``TTFT x exp(sigma_ttft z)``, token rates ``/ g``;
- open-loop arrivals at ``R`` req/s (``--rate``): the deployment with every step ``g`` times as long behaves as
  the modelled one at ``g R`` with every time ``x g`` (time rescaling), so each latency is ``g L(g R)``
  (TTFT's ``exp(sigma_ttft z) L(g R)``); at the slow end the pool may saturate (no finite latency);
- a finite run (``--bench``, what ``vllm bench serve`` reports): the same rescaling of the run at ``g R``
  (all at once stays all at once): latencies ``g L`` (TTFT ``exp(sigma_ttft z) L``), the duration ``x g``, the
  throughputs ``/ g``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from recommender.errors import ConfigError
from recommender.estimator import bench_run, under_load
from recommender.perf.steady import Estimate, Load
from recommender.perf.step import Deployment
from recommender.search.bands import Z90, EvidenceClass, class_for

#: what a steady estimate's band covers: times (x g) and token rates (/ g)
STEADY_TIMES = ("ttft_s", "tpot_s", "e2e_s")
STEADY_RATES = ("output_tokens_per_s", "total_tokens_per_s")


@dataclass(frozen=True)
class EstimateBands:
    """p10 / p90 of each metric (fast end first for times; low end first for rates); None: no finite value."""

    evidence: EvidenceClass
    ranges: Mapping[str, tuple[float | None, float | None]]
    rate_per_s: float | None = None  # open-loop arrivals (``--rate``): each end is the model at g x this rate

    def to_dict(self) -> dict[str, Any]:
        """The JSON record, keyed as a plan row's ``bands``: class, its rows, sigmas, ``metric: [p10, p90]``."""
        c = self.evidence
        out: dict[str, Any] = {"class": c.label, "class_rows": c.rows + c.ttft_rows, "sigma": round(c.sigma, 4),
                               "sigma_ttft": round(c.sigma_ttft, 4)}
        out.update({k: [_round(lo), _round(hi)] for k, (lo, hi) in self.ranges.items()})
        return out


def estimate_class(dep: Deployment) -> EvidenceClass:
    """The evidence class of a deployment: its profile, model, GPU and weight dtype (:func:`bands.class_for`)."""
    return class_for(dep.profile, dep.model, dep.gpu.id, dep.weight_dtype)


def _scale(metric: str, cls: EvidenceClass, z: float) -> float:
    """The factor a metric's modelled value takes at error ``z``: TTFT's own, times x g, rates / g."""
    if "ttft" in metric:
        return math.exp(cls.sigma_ttft * z)
    g = math.exp(cls.sigma * z)
    return 1.0 / g if metric.endswith(("tokens_per_s", "throughput")) else g


def steady_bands(dep: Deployment, est: Estimate) -> EstimateBands:
    """Bands of a static batch, a closed loop or one decode step: each metric x its factor at ``z = -/+ 1.2816``."""
    cls = estimate_class(dep)
    ranges: dict[str, tuple[float | None, float | None]] = {}
    for k in STEADY_TIMES + STEADY_RATES:
        v = getattr(est, k)
        if v is None or not math.isfinite(v) or v <= 0:
            continue
        lo, hi = (v * _scale(k, cls, z) for z in (-Z90, Z90))
        ranges[k] = (min(lo, hi), max(lo, hi))
    return EstimateBands(evidence=cls, ranges=ranges)


def open_loop_bands(dep: Deployment, load: Load, est: Estimate, rate_per_s: float, replicas: int,
                    at: Callable[[float], Mapping[str, object]] | None = None, *,
                    shared_prefix_fraction: float = 0.0) -> EstimateBands:
    """Bands of ``--rate``: each latency of :func:`recommender.estimator.under_load` at ``g R``, times ``g`` (TTFT's
    own factor instead); a slow end whose pool saturates (or whose rate is out of range) has no value. ``at``: the
    model at a rate (default ``under_load`` of this deployment)."""
    cls = estimate_class(dep)
    run = at or (lambda r: under_load(dep, load, est, r, replicas, shared_prefix_fraction=shared_prefix_fraction))
    ends: list[Mapping[str, object] | None] = []
    for z in (-Z90, Z90):
        try:
            res = run(rate_per_s * math.exp(cls.sigma * z))
        except ConfigError:
            res = None
        ends.append(res if res is not None and res.get("stable") else None)
    ranges: dict[str, tuple[float | None, float | None]] = {}
    shown = [k for k in (ends[0] or ends[1] or {}) if k.endswith("_s") and k[:4] in ("ttft", "tpot", "e2e_")]
    keys = [k for k in ("ttft_s", "tpot_s", "e2e_s") if k in shown] + [k for k in shown if k.count("_") == 2]
    for k in keys:
        vals: list[float | None] = []
        for z, res in zip((-Z90, Z90), ends):
            v = None if res is None else res.get(k)
            vals.append(float(v) * _scale(k, cls, z) if isinstance(v, (int, float)) and math.isfinite(v) else None)
        ranges[k] = (vals[0], vals[1])
    return EstimateBands(evidence=cls, ranges=ranges, rate_per_s=rate_per_s)


#: ``vllm bench serve`` result keys a finite run's band covers (latencies in ms, the duration, the throughputs)
BENCH_KEYS = ("duration", "request_throughput", "output_throughput", "total_token_throughput")


def finite_bands(dep: Deployment, load: Load, *, replicas: int = 1, seed: int = 0,
                 run: Callable[[Load], Mapping[str, object]] | None = None) -> EstimateBands:
    """Bands of a ``--bench`` run: :func:`recommender.estimator.bench_run` at ``g x`` the request rate (same seed),
    each result key x its factor (:func:`_scale`; the duration x g). ``run``: the model of a load (default
    ``bench_run`` of this deployment)."""
    cls = estimate_class(dep)
    go = run or (lambda ld: bench_run(dep, ld, replicas=replicas, seed=seed))
    ends = []
    for z in (-Z90, Z90):
        g = math.exp(cls.sigma * z)
        rate = load.rate_per_s
        res = go(dataclasses.replace(load, rate_per_s=rate * g if rate is not None and math.isfinite(rate) else rate))
        ends.append({k: float(v) * _scale(k, cls, z) for k, v in res.items()
                     if (k in BENCH_KEYS or k.endswith("_ms")) and isinstance(v, (int, float)) and math.isfinite(v)})
    keys = [k for k in ends[0] if k in ends[1]]
    return EstimateBands(evidence=cls, ranges={k: (min(ends[0][k], ends[1][k]), max(ends[0][k], ends[1][k])) for k in keys},
                         rate_per_s=load.rate_per_s)


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)
