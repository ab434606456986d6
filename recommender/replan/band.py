"""Is the observed traffic the traffic the plan was sized for? (the sizing basis, docs/sizing-basis.md)

A plan is sized on the MEAN-rate basis (``policies/search.yaml`` ``rate_basis: mean``): its workload's
``arrival_rate_per_s`` = lambda is the mean rate of a Poisson process, and its replicas meet the SLOs and
the utilisation cap at ``lambda_s = lambda x (1 + headroom)`` (recorded in the plan as
``search.sized_rate_per_s``). The analytic model already holds Poisson arrivals at that rate, so the windows
of such traffic fluctuate around lambda without being load the plan lacks. The re-planner therefore tests the
observed traffic against the record, at a stated false-alarm rate ``alpha`` (``band.false_alarm``):

* mean rate: ``n`` requests over ``T`` seconds. With ``N ~ Poisson(mu T)``, ``sqrt(N)`` is nearly normal
  with sd 1/2 (Anscombe), so the mean is inside the band when
  ``sqrt(lambda T) - z/2 <= sqrt(n) <= sqrt(lambda_s T) + z/2`` with ``z = Phi^-1(1 - alpha/2)``;
  from the basis rate (below: traffic fell) up to the sized rate (above: the headroom is used up).
* peak window: the busiest of the ``k`` sub-windows (``c_i`` requests in ``d_i`` seconds) is a *burst*
  only when ``sqrt(c_i) > sqrt(lambda_s d_i) + z_k/2`` with ``z_k = Phi^-1(1 - alpha/k)`` (Bonferroni over
  the ``k`` windows: Poisson traffic at the sized rate calls a burst in at most ``alpha`` of the runs);
  a burst is then evaluated under the model at its rate (``runner``), and acts only when the model says an
  SLO fails there.
* lengths: each observed mean length within ``z x sd / sqrt(n)`` (+ 1 token for the plan's rounding) of
  the plan's mean; the prefix-cache share, when reported, within 0.05 of the plan's.

All three inside: the traffic is the plan's own and the plan stands without a search. Otherwise the
re-planner evaluates the plan under the model (``runner``). Each test is two- or one-sided at ``alpha``,
so a run on the plan's own traffic leaves the band with probability at most about ``3 alpha``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from recommender.plan import Plan
from recommender.replan.observation import LengthObservation, Observation

PREFIX_SHARE_TOLERANCE = 0.05


@dataclass(frozen=True)
class SizingRecord:
    """What a plan says it was sized for (req/s)."""

    basis: str  # "mean"
    basis_rate_per_s: float
    headroom: float
    sized_rate_per_s: float

    def text(self) -> str:
        """'sized for 4.80 req/s (mean 4.00 + 20%)'."""
        return (f"sized for {self.sized_rate_per_s:.2f} req/s ({self.basis} {self.basis_rate_per_s:.2f} "
                f"+ {self.headroom:.0%})")


def sizing_record(plan: Plan) -> SizingRecord | None:
    """The plan's record (``search.rate_basis``, ``sized_rate_per_s``, ``headroom``); a plan written before the
    record existed is read on the mean basis with its ``search.headroom`` (:meth:`Plan.sized_rate_per_s`; a
    version-1 or hand-written plan without one: 0, its rate is the sized rate). None for offline plans."""
    rate = plan.workload.arrival_rate_per_s
    if rate is None or rate <= 0:
        return None
    m = plan.search
    h = m.headroom
    sized = m.sized_rate_per_s if m.sized_rate_per_s is not None else rate * (1.0 + h)
    return SizingRecord(basis=m.rate_basis or "mean", basis_rate_per_s=float(rate), headroom=float(h),
                        sized_rate_per_s=float(sized))


def z_two_sided(alpha: float) -> float:
    return statistics.NormalDist().inv_cdf(1.0 - alpha / 2.0)


def z_one_sided(alpha: float) -> float:
    return statistics.NormalDist().inv_cdf(1.0 - alpha)


def count_edges(rate_per_s: float, seconds: float, z: float) -> tuple[float, float]:
    """(low, high) counts Poisson traffic at ``rate_per_s`` over ``seconds`` stays within at ``z``
    (``(sqrt(mu) -+ z/2)^2``, low floored at 0)."""
    root = math.sqrt(max(0.0, rate_per_s * seconds))
    return max(0.0, root - z / 2.0) ** 2, (root + z / 2.0) ** 2


def _sd(lo: LengthObservation) -> float | None:
    if len(lo.samples) >= 2:
        return statistics.pstdev(lo.samples)
    h = lo.histogram
    if h is None or h.count <= 0:
        return None
    mids, ws, prev = [], [], 0.0
    for edge, w in zip(h.upper_edges, h.bucket_counts()):
        mid = prev if math.isinf(edge) else (prev + edge) / 2.0
        mids.append(mid)
        ws.append(w)
        prev = edge if math.isfinite(edge) else prev
    tot = sum(ws)
    mean = sum(m * w for m, w in zip(mids, ws)) / tot
    return math.sqrt(sum(w * (m - mean) ** 2 for m, w in zip(mids, ws)) / tot)


@dataclass(frozen=True)
class BandCheck:
    """The observed traffic against a plan's :class:`SizingRecord` (rates in req/s)."""

    record: SizingRecord
    false_alarm: float
    requests: float
    span_s: float
    mean_per_s: float
    mean_low_per_s: float  # lowest mean rate Poisson traffic at the basis rate shows over span_s
    mean_high_per_s: float  # highest mean rate Poisson traffic at the sized rate shows over span_s
    peak_per_s: float  # the busiest sub-window's rate (0 without sub-windows)
    peak_edge_per_s: float  # the highest sub-window rate Poisson noise at the sized rate explains
    subwindow_s: float
    windows: int
    lengths: str = ""  # why the lengths or prefix share differ from the plan's ('' when as planned)
    burst: bool = False  # a sub-window above what Poisson noise at the sized rate explains (its own length)
    burst_per_s: float = 0.0  # the rate of the busiest such sub-window (the burst's level)

    @property
    def rate_inside(self) -> bool:
        return self.mean_low_per_s <= self.mean_per_s <= self.mean_high_per_s

    @property
    def inside(self) -> bool:
        """The plan's own traffic: mean rate, peak window and lengths all inside."""
        return self.rate_inside and not self.burst and not self.lengths

    def where(self) -> str:
        """What was compared and the verdict (the issue's wording)."""
        head = (f"{self.record.text()}; observed mean {self.mean_per_s:.2f} req/s over {self.span_s:.0f} s, "
                f"peak window {self.peak_per_s:.2f} req/s")
        if self.inside:
            return f"{head}: inside the band"
        why = []
        if self.mean_per_s > self.mean_high_per_s:
            why.append(f"the mean is above the {self.mean_high_per_s:.2f} req/s that Poisson traffic at the sized "
                       f"rate reaches over {self.span_s:.0f} s")
        elif self.mean_per_s < self.mean_low_per_s:
            why.append(f"the mean is below the {self.mean_low_per_s:.2f} req/s that Poisson traffic at the planned "
                       f"{self.record.basis_rate_per_s:.2f} req/s reaches over {self.span_s:.0f} s")
        if self.burst and self.mean_per_s <= self.mean_high_per_s:  # above the band, the whole window is up
            why.append(f"the peak window is above the {self.peak_edge_per_s:.2f} req/s that Poisson noise at the sized "
                       f"rate explains over {self.windows} windows of {self.subwindow_s:.0f} s (a burst)")
        if self.lengths:
            why.append(self.lengths)
        return f"{head}: outside the band ({'; '.join(why)})"

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {"basis": r.basis, "basis_rate_per_s": r.basis_rate_per_s, "headroom": r.headroom,
                "sized_rate_per_s": round(r.sized_rate_per_s, 6), "false_alarm": self.false_alarm,
                "observed_mean_per_s": round(self.mean_per_s, 5), "span_s": round(self.span_s, 3),
                "mean_band_per_s": [round(self.mean_low_per_s, 5), round(self.mean_high_per_s, 5)],
                "peak_window_per_s": round(self.peak_per_s, 5), "peak_edge_per_s": round(self.peak_edge_per_s, 5),
                "burst_per_s": round(self.burst_per_s, 5) if self.burst else None,
                "subwindow_s": self.subwindow_s, "windows": self.windows, "lengths": self.lengths,
                "inside": self.inside, "burst": self.burst, "text": self.where()}


def _lengths_differ(obs: Observation, plan: Plan, z: float, min_requests: int) -> str:
    out = []
    for key, lo, summary in (("prompt", obs.prompt_tokens, plan.workload.prompt_tokens),
                             ("output", obs.output_tokens, plan.workload.output_tokens)):
        if lo.count < min_requests or summary is None:
            continue  # too few to replace the plan's distribution: the plan's lengths are used (observe.py)
        sd = _sd(lo)
        if sd is None:
            out.append(f"no {key} length spread observed")
            continue
        allowed = z * sd / math.sqrt(lo.count) + 1.0
        if abs(lo.mean_tokens - summary.mean) > allowed:
            out.append(f"mean {key} length {lo.mean_tokens:.0f} vs {summary.mean:.0f} planned "
                       f"(more than the {allowed:.0f} tokens of sampling noise)")
    share = obs.prefix_share
    if share is not None and abs(share - plan.workload.shared_prefix_fraction) > PREFIX_SHARE_TOLERANCE:
        out.append(f"prefix-cache share {share:.2f} vs {plan.workload.shared_prefix_fraction:.2f} planned")
    return "; ".join(out)


def check_band(obs: Observation, plan: Plan, *, false_alarm: float, subwindow_s: float,
               min_requests: int) -> BandCheck | None:
    """Test ``obs`` against the plan's record (module docstring); None for a plan without a rate."""
    rec = sizing_record(plan)
    if rec is None:
        return None
    n = float(obs.requests)
    rate = float(obs.arrival_rate_per_s)
    span = n / rate if rate > 0 and n > 0 else float(obs.window_s)
    z = z_two_sided(false_alarm)
    lo_n, _ = count_edges(rec.basis_rate_per_s, span, z)
    _, hi_n = count_edges(rec.sized_rate_per_s, span, z)
    pts = [p for p in obs.rate_points if p.duration_s > 0]
    k = max(1, len(pts))
    zk = z_one_sided(false_alarm / k)
    typical_s = statistics.median(p.duration_s for p in pts) if pts else subwindow_s
    edge = count_edges(rec.sized_rate_per_s, typical_s, zk)[1] / typical_s
    peak, burst_rate = 0.0, 0.0
    for p in pts:  # each sub-window against its own length (a partial last window has fewer requests)
        c = p.rate_per_s * p.duration_s
        if math.sqrt(c) > math.sqrt(rec.sized_rate_per_s * p.duration_s) + zk / 2.0:
            burst_rate = max(burst_rate, p.rate_per_s)
        peak = max(peak, p.rate_per_s)
    return BandCheck(record=rec, false_alarm=false_alarm, requests=n, span_s=span, mean_per_s=rate,
                     mean_low_per_s=lo_n / span if span > 0 else 0.0,
                     mean_high_per_s=hi_n / span if span > 0 else math.inf, peak_per_s=peak,
                     peak_edge_per_s=edge, subwindow_s=typical_s, windows=len(pts),
                     lengths=_lengths_differ(obs, plan, z, min_requests), burst=burst_rate > 0,
                     burst_per_s=burst_rate)
