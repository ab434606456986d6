"""What one re-planning run saw: traffic rates, length distributions, latency histograms.

Every traffic source (vLLM ``/metrics``, request logs, a Prometheus server) produces one
:class:`Observation`; ``observe.py`` turns it into a :class:`~recommender.workload.Workload`.

Histogram quantiles follow Prometheus ``histogram_quantile`` exactly: with cumulative bucket counts
``c_i`` at upper edges ``le_i`` and total ``N`` (the ``+Inf`` bucket), the rank is ``r = q * N``;
in the first bucket ``i`` with ``c_i >= r`` the value is
``le_{i-1} + (le_i - le_{i-1}) * (r - c_{i-1}) / (c_i - c_{i-1})`` (``le_{-1} = 0``); a rank that falls
in the ``+Inf`` bucket returns the largest finite edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from recommender.errors import TrafficSourceError
from recommender.units import MAX_UNIX_S
from recommender.workload import LengthDist

QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}

#: physics limits of what a traffic source may report (above them the answer is refused, not acted on):
#: a million finished requests a second, ten billion tokens a second, 1e15 observations in a histogram
#: and a million requests running or queued are far beyond any deployment this tool plans.
MAX_REQUESTS_PER_S = 1e6
MAX_TOKENS_PER_S = 1e10
MAX_OBSERVATIONS = 1e15
MAX_GAUGE_REQUESTS = 1e6
#: a cumulative bucket may fall by this share of the total (Prometheus' extrapolated increase() per bucket);
#: it is then made monotone as histogram_quantile does; a larger fall is refused
MONOTONE_TOLERANCE = 1e-3


def check_number(value: object, what: str, *, limit: float, unit: str = "") -> float:
    """``value`` as a finite float in [0, limit], else a one-line TrafficSourceError naming ``what`` and the limit."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TrafficSourceError(f"{what}: {str(value)[:40]!r} is not a number") from None
    if not math.isfinite(x) or x < 0 or x > limit:
        raise TrafficSourceError(f"{what} is {x:g}{unit}: a traffic reading must be finite, non-negative and at most "
                                 f"{limit:g}{unit}; refused, keeping the current plan")
    return x


def check_histogram(h: "Histogram", what: str, *, tolerant: bool = False) -> "Histogram":
    """``h`` if its shape and values are physical: ascending non-negative finite edges ending in +Inf, finite
    non-negative cumulative counts that never fall, a finite non-negative sum; else a one-line
    TrafficSourceError. ``tolerant``: falls up to ``MONOTONE_TOLERANCE`` of the total are evened out
    (running maximum) instead of refused."""
    edges, counts = h.upper_edges, h.cumulative_counts
    if not edges:
        return h
    if len(edges) != len(counts):
        raise TrafficSourceError(f"{what}: {len(edges)} bucket edges but {len(counts)} counts")
    if not math.isinf(edges[-1]) or edges[-1] < 0:
        raise TrafficSourceError(f"{what} has no le=\"+Inf\" bucket")
    prev_e = -1.0
    for e in edges[:-1]:
        if not math.isfinite(e) or e < 0:
            raise TrafficSourceError(f"{what} has the bucket edge le={e:g}; edges must be finite and non-negative")
        if e <= prev_e:
            raise TrafficSourceError(f"{what}: bucket edges are not strictly ascending (le={e:g} after {prev_e:g})")
        prev_e = e
    for c in counts:
        check_number(c, f"{what} bucket count", limit=MAX_OBSERVATIONS)
    check_number(h.sum_value, f"{what} sum", limit=1e300)
    fixed: list[float] = []
    top = 0.0
    for e, c in zip(edges, counts):
        if c < top:
            if not tolerant or top - c > MONOTONE_TOLERANCE * max(counts[-1], 1.0):
                raise TrafficSourceError(f"{what}: cumulative bucket counts fall (le={e:g} has {c:g} < {top:g}); "
                                         f"a histogram's buckets never do")
            c = top
        top = c
        fixed.append(c)
    return h if tuple(fixed) == counts else Histogram(edges, tuple(fixed), h.sum_value)


def check_observation(obs: "Observation") -> "Observation":
    """The observation if every figure is physical (see the limits above); else a one-line TrafficSourceError.
    Every source's answer passes here before the re-planner uses it."""
    src = f"{obs.source} traffic at {', '.join(obs.where)[:120]}"
    check_number(obs.window_s, f"{src}: window", limit=1e9, unit=" s")
    if not (math.isfinite(obs.end_s) and 0 <= obs.end_s <= MAX_UNIX_S):
        raise TrafficSourceError(f"{src}: window end {obs.end_s:g} s is not a unix time between 1970 and 2100")
    check_number(obs.requests, f"{src}: finished requests", limit=MAX_REQUESTS_PER_S * max(obs.window_s, 1.0))
    check_number(obs.arrival_rate_per_s, f"{src}: arrival rate", limit=MAX_REQUESTS_PER_S, unit=" req/s")
    check_number(obs.prompt_tokens_per_s, f"{src}: prompt token rate", limit=MAX_TOKENS_PER_S, unit=" tokens/s")
    check_number(obs.output_tokens_per_s, f"{src}: output token rate", limit=MAX_TOKENS_PER_S, unit=" tokens/s")
    for p in obs.rate_points:
        check_number(p.rate_per_s, f"{src}: sub-window rate", limit=MAX_REQUESTS_PER_S, unit=" req/s")
        check_number(p.duration_s, f"{src}: sub-window length", limit=1e9, unit=" s")
        if not (math.isfinite(p.end_s) and 0 <= p.end_s <= MAX_UNIX_S):
            raise TrafficSourceError(f"{src}: sub-window end {p.end_s:g} s is not a unix time between 1970 and 2100")
    for key, lo in (("prompt tokens", obs.prompt_tokens), ("output tokens", obs.output_tokens)):
        check_number(lo.mean_tokens, f"{src}: mean {key}", limit=1e9, unit=" tokens")
        if lo.histogram is not None:
            check_histogram(lo.histogram, f"{src}: {key} histogram")
    for metric, h in obs.latency.items():
        check_histogram(h, f"{src}: {metric} histogram")
    for name, v in obs.gauges.items():
        check_number(v, f"{src}: gauge {name}", limit=MAX_GAUGE_REQUESTS)
    if obs.prefix_share is not None:
        check_number(obs.prefix_share, f"{src}: prefix-cache share", limit=1.0)
    return obs


class InsufficientDataError(TrafficSourceError):
    """Too little traffic to observe yet; the message says how much more is needed.

    Not a failure: the run keeps the current plan (exit code 11, recorded as 'unchanged').
    """

    exit_code = 11


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: ascending ``upper_edges`` (last is ``inf``), cumulative counts, sum."""

    upper_edges: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    sum_value: float = 0.0

    @property
    def count(self) -> float:
        """Observations in the histogram (the ``+Inf`` bucket)."""
        return self.cumulative_counts[-1] if self.cumulative_counts else 0.0

    @property
    def mean(self) -> float:
        """``sum / count``; NaN when empty."""
        return self.sum_value / self.count if self.count > 0 else math.nan

    def bucket_counts(self) -> tuple[float, ...]:
        """Per-bucket (non-cumulative) counts."""
        out, prev = [], 0.0
        for c in self.cumulative_counts:
            out.append(max(0.0, c - prev))
            prev = c
        return tuple(out)

    def quantile(self, q: float) -> float:
        """Prometheus ``histogram_quantile(q, ...)`` with linear interpolation inside a bucket; NaN if empty."""
        if not self.cumulative_counts or self.count <= 0 or not 0.0 <= q <= 1.0:
            return math.nan
        rank = q * self.count
        prev_edge, prev_cum = 0.0, 0.0
        for edge, cum in zip(self.upper_edges, self.cumulative_counts):
            if cum >= rank and cum > prev_cum:
                if math.isinf(edge):
                    return prev_edge
                lo = prev_edge if prev_edge < edge else 0.0
                return lo + (edge - lo) * (rank - prev_cum) / (cum - prev_cum)
            prev_edge, prev_cum = edge, cum
        finite = [e for e in self.upper_edges if math.isfinite(e)]
        return finite[-1] if finite else math.nan

    def at(self, percentile: str) -> float:
        """Value at 'p50'/'p90'/'p95'/'p99', or the mean for 'mean'."""
        return self.mean if percentile == "mean" else self.quantile(QUANTILES[percentile])

    def _check_same_edges(self, other: "Histogram") -> None:
        if self.upper_edges != other.upper_edges:
            raise TrafficSourceError(
                "histogram bucket edges changed between scrapes (engine restarted with other "
                "--custom-histogram-buckets?); delete the replan state file to start a fresh baseline")

    def plus(self, other: "Histogram") -> "Histogram":
        """Bucket-wise sum (e.g. two replicas)."""
        if not self.upper_edges:
            return other
        if not other.upper_edges:
            return self
        self._check_same_edges(other)
        return Histogram(self.upper_edges, tuple(a + b for a, b in zip(self.cumulative_counts, other.cumulative_counts)),
                         self.sum_value + other.sum_value)

    def minus(self, other: "Histogram") -> "Histogram":
        """Bucket-wise difference ``self - other`` (the observations between two scrapes)."""
        self._check_same_edges(other)
        return Histogram(self.upper_edges, tuple(a - b for a, b in zip(self.cumulative_counts, other.cumulative_counts)),
                         self.sum_value - other.sum_value)

    def to_json(self) -> dict[str, Any]:
        return {"le": [("+Inf" if math.isinf(e) else e) for e in self.upper_edges],
                "cumulative": list(self.cumulative_counts), "sum": self.sum_value}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Histogram":
        edges = tuple(math.inf if e == "+Inf" else float(e) for e in d["le"])
        return Histogram(edges, tuple(float(c) for c in d["cumulative"]), float(d["sum"]))


EMPTY_HISTOGRAM = Histogram((), (), 0.0)


@dataclass(frozen=True)
class LengthObservation:
    """Observed token lengths: bounded empirical ``samples`` (request logs) or a ``histogram`` (metrics)."""

    count: int
    mean_tokens: float
    samples: tuple[int, ...] = ()
    histogram: Histogram | None = None

    def to_length_dist(self) -> LengthDist | None:
        """Empirical samples, else the histogram's buckets; None when nothing was observed."""
        if self.samples:
            return LengthDist.empirical(self.samples)
        if self.histogram is not None and self.histogram.count > 0:
            edges, counts = list(self.histogram.upper_edges), list(self.histogram.bucket_counts())
            while len(counts) > 1 and counts[-1] <= 0:  # trailing empty buckets would inflate max_tokens
                edges.pop()
                counts.pop()
            return LengthDist.histogram(edges, counts)
        return None

    def summary(self) -> dict[str, Any]:
        """count, mean and p50/p90/p99 in tokens (from the samples or the histogram)."""
        d: dict[str, Any] = {"count": self.count, "mean": _round(self.mean_tokens, 1)}
        if self.samples:
            xs = self.samples
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                d[name] = xs[min(len(xs) - 1, int(q * len(xs)))]
        elif self.histogram is not None:
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                d[name] = _round(self.histogram.quantile(q), 1)
        return d


@dataclass(frozen=True)
class RatePoint:
    """Mean arrival rate ``rate_per_s`` over the ``duration_s`` seconds ending at ``end_s`` (unix time)."""

    end_s: float
    duration_s: float
    rate_per_s: float


@dataclass(frozen=True)
class Observation:
    """One window of traffic as a source saw it (all rates in requests or tokens per second)."""

    source: str  # "vllm-metrics" | "request-log" | "prometheus"
    where: tuple[str, ...]
    end_s: float  # unix time at the end of the window (the source's clock)
    window_s: float
    requests: float
    arrival_rate_per_s: float
    rate_points: tuple[RatePoint, ...]
    prompt_tokens: LengthObservation
    output_tokens: LengthObservation
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    latency: Mapping[str, Histogram] = field(default_factory=dict)  # "ttft", "tpot", "e2e", "queue"
    gauges: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    peak_rate_per_s: float | None = None  # a source that computes the recent peak itself (Prometheus)
    prefix_share: float | None = None  # fraction of prompt tokens served from the prefix cache, if reported

    @property
    def window(self) -> tuple[float, float]:
        """The observed time range (unix seconds)."""
        return (self.end_s - self.window_s, self.end_s)

    def latency_s(self, metric: str, percentile: str) -> float | None:
        """Observed ``metric`` ('ttft'/'tpot'/'e2e'/'queue') at ``percentile``; None without data."""
        h = self.latency.get(metric)
        if h is None or h.count <= 0:
            return None
        v = h.at(percentile)
        return None if math.isnan(v) else v

    def to_dict(self) -> dict[str, Any]:
        lat: dict[str, Any] = {}
        for metric, h in self.latency.items():
            if h.count > 0:
                lat[metric] = {"count": round(h.count), "mean": _round(h.mean, 4),
                               **{p: _round(h.quantile(q), 4) for p, q in QUANTILES.items()}}
        return {
            "source": self.source, "where": list(self.where), "end_s": self.end_s, "window_s": round(self.window_s, 3),
            "requests": round(self.requests, 1), "arrival_rate_per_s": round(self.arrival_rate_per_s, 4),
            "prompt_tokens_per_s": round(self.prompt_tokens_per_s, 1),
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "prompt_tokens": self.prompt_tokens.summary(), "output_tokens": self.output_tokens.summary(),
            "latency_s": lat, "gauges": dict(self.gauges),
            "rate_points": [[p.end_s, round(p.duration_s, 3), round(p.rate_per_s, 5)] for p in self.rate_points],
            "notes": list(self.notes), "window": [round(self.end_s - self.window_s, 3), round(self.end_s, 3)],
            "prefix_share": None if self.prefix_share is None else round(self.prefix_share, 4),
        }


def _round(x: float, nd: int) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)
