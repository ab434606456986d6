"""How far rank 1 holds: GPU price, arrival rate and output length, each moved alone (issue #24, item 3).

* **Price** of each GPU type rank 1 runs on, scaled by ``f`` (every offer of that GPU alike, so the cheapest
  offer stays the cheapest): a plan's $/M tokens is linear in ``f``,
  ``cost_i(f) = cost_i x (A_i + f B_i) / (A_i + B_i)`` with ``B_i`` its USD/h on that GPU and ``A_i`` the rest.
  Over every feasible plan the search evaluated (``ctx.evaluator``), the first ``f > 1`` at which one costs
  less than rank 1 is ``f* = min over j (a_j - a_1) / (b_1 - b_j)`` for ``b_1 > b_j`` (``a = cost A/(A+B)``,
  ``b = cost B/(A+B)``); the threshold is ``f*`` x what rank 1 pays per GPU-hour today, the per-GPU price of the
  offer it rents (:func:`paid_per_gpu_hour`: a pipeline rents only offers naming a NIC) (none: rank 1 uses that GPU no
  more than any cheaper-to-be plan does). The shape search evaluates, after its proof, every entry whose cost
  bound is below rank 1's cost at these thresholds capped at ``PRICE_SETTLE_FACTOR`` (1.25) x today's price
  (``search.shapes.price_settle_cost``), so no unevaluated plan overtakes first; a threshold beyond that factor,
  or none, is reported as "until at least" 1.25 x today's price (none and no other GPU in the space: "at any
  price", every plan's cost scales alike).
* **Arrival rate**: rank 1 as deployed (its replicas fixed) under the analytic model at rate ``x`` (no
  headroom): the largest ``x`` at which it is stable and meets every SLO, by bisection to 0.1%.
* **Output length**: the same with every output length scaled by ``k`` (the distribution's mean, spread and
  bounds), rate fixed: the largest ``k``.

Other plans are re-sized as the rate or lengths move, so "another plan becomes cheaper" is answered for the
price only; rate and output length say where the deployed rank 1 stops meeting its SLOs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from recommender.search.evaluate import Evaluation, SearchContext
from recommender.workload import LengthDist

MAX_SCALE = 64.0
#: price thresholds are settled up to this factor of today's GPU price (the shape search evaluates every plan
#: that could overtake rank 1 before it, ``search.shapes.price_settle_cost``); beyond it one says "at least"
PRICE_SETTLE_FACTOR = 1.25
REL_TOL = 1e-3


@dataclass(frozen=True)
class PriceThreshold:
    gpu: str
    usd_per_gpu_hour: float  # today's: the per-GPU price of the offer rank 1 rents (paid_per_gpu_hour)
    overtaken_at_usd_per_gpu_hour: float | None  # None: no evaluated plan overtakes rank 1 as this price rises
    overtaken_by: str = ""
    at_least: bool = False  # the first overtaking is beyond PRICE_SETTLE_FACTOR x today: "until at least"


@dataclass(frozen=True)
class Sensitivity:
    prices: tuple[PriceThreshold, ...]
    rate_per_s: float
    max_rate_per_s: float | None  # None: not computed (offline job) or beyond MAX_SCALE x
    max_output_scale: float | None

    def text(self) -> str:
        """'Rank 1 stays cheapest until h200 > $4.10/GPU-h (now $3.50); as deployed it meets its SLOs up to
        9.62 req/s (1.20x) and output lengths x1.35.'"""
        parts = []
        for p in self.prices:
            if p.at_least:
                parts.append(f"stays cheapest until at least {p.gpu} > ${p.overtaken_at_usd_per_gpu_hour:.2f}/GPU-h "
                             f"(now ${p.usd_per_gpu_hour:.2f}; {PRICE_SETTLE_FACTOR:g}x, the range the search settles)")
            elif p.overtaken_at_usd_per_gpu_hour is None:
                parts.append(f"stays cheapest at any {p.gpu} price (now ${p.usd_per_gpu_hour:.2f}/GPU-h)")
            else:
                parts.append(f"stays cheapest until {p.gpu} > ${p.overtaken_at_usd_per_gpu_hour:.2f}/GPU-h (now "
                             f"${p.usd_per_gpu_hour:.2f}; then {p.overtaken_by})")
        head = "Rank 1 " + "; ".join(parts) if parts else "Rank 1"
        tail = []
        if self.max_rate_per_s is not None:
            tail.append(f"meets its SLOs up to {self.max_rate_per_s:.3g} req/s "
                        f"({self.max_rate_per_s / self.rate_per_s:.2f}x)")
        if self.max_output_scale is not None:
            tail.append(f"output lengths x{self.max_output_scale:.2f}")
        if not parts:
            return "Rank 1 as deployed " + " and ".join(tail) + "." if tail else ""
        return head + ("; as deployed it " + " and ".join(tail) if tail else "") + "."

    def to_dict(self) -> dict[str, Any]:
        return {"prices": [dataclasses.asdict(p) for p in self.prices], "rate_per_s": self.rate_per_s,
                "max_rate_per_s": self.max_rate_per_s, "max_output_scale": self.max_output_scale,
                "text": self.text()}


def gpu_share(ev: Evaluation, gpu: str) -> tuple[float, float]:
    """(a, b): the part of ev's $/M tokens that does not / does scale with ``gpu``'s price."""
    total = sum(p.usd_per_hour for p in ev.pools)
    on = sum(p.usd_per_hour for p in ev.pools if p.gpu == gpu)
    if total <= 0:
        return ev.usd_per_million_tokens, 0.0
    return ev.usd_per_million_tokens * (total - on) / total, ev.usd_per_million_tokens * on / total


def paid_per_gpu_hour(ev: Evaluation, gpu: str, cheapest: float) -> float:
    """What ``ev`` pays per GPU-hour of ``gpu`` today: the per-GPU price of the offer its first pool on ``gpu``
    rents (a pipeline rents only offers that name their NIC, so it may not be the cheapest), else ``cheapest``
    (the cheapest offer's). Every offer of ``gpu`` scales alike, so a threshold is ``f*`` x this price."""
    for p in ev.pools:
        if p.gpu == gpu:
            return p.rental.offer.usd_per_gpu_hour if p.rental is not None else p.usd_per_gpu_hour
    return cheapest


def price_thresholds(ctx: SearchContext, first: Evaluation, *, complete: bool = False) -> tuple[PriceThreshold, ...]:
    """Per GPU type of ``first``: the price at which an evaluated feasible plan first ranks above it. With
    ``prefer_measured``, a plan on a GPU family without measurements ranks above a measured rank 1 only once
    it is cheaper by the evidence band (``recommend_rows.prefer_measured``): ``cost_1(f) > (1 + band) cost_j(f)``;
    at a tie (``f* = 1``) any rise flips the rank and the threshold is today's price."""
    from recommender.search.recommend_rows import evidence_band, evidence_of

    out = []
    others = [e for e in ctx.evaluator if e.feasible and e.candidate.key != first.candidate.key]
    measured_first = ctx.policy.prefer_measured and evidence_of(ctx, first).measured
    band = evidence_band(ctx)
    measured: dict[tuple[str, ...], bool] = {}  # per pool GPUs: whether the plan is measured (evidence_of)

    def unmeasured(e: Evaluation) -> bool:
        key = tuple(p.gpu for p in e.pools)
        if key not in measured:
            measured[key] = evidence_of(ctx, e).measured
        return not measured[key]

    for gpu in dict.fromkeys(p.gpu for p in first.pools):
        a1, b1 = gpu_share(first, gpu)
        best: tuple[float, str] | None = None
        for e in others:
            aj, bj = gpu_share(e, gpu)
            m = 1.0 + band if measured_first and unmeasured(e) else 1.0
            aj, bj = aj * m, bj * m
            if b1 <= bj or aj + bj < a1 + b1 - 1e-12:
                continue  # never overtakes as the price rises, or cheaper already (ranked below by evidence)
            f = (aj - a1) / (b1 - bj)
            if f >= 1.0 - 1e-9 and (best is None or f < best[0] - 1e-12):
                best = (max(f, 1.0), e.candidate.key)
        now = paid_per_gpu_hour(first, gpu, ctx.prices.get(gpu, 0.0))
        # exact when the whole space was evaluated, or it has no other GPU (every plan's cost scales alike)
        exact = complete or (best is None and not any(g != gpu for g in ctx.prices))
        if not exact and (best is None or best[0] > PRICE_SETTLE_FACTOR):  # unevaluated plans may overtake first beyond it
            out.append(PriceThreshold(gpu, now, round(PRICE_SETTLE_FACTOR * now, 4), "", at_least=True))
        else:
            out.append(PriceThreshold(gpu, now, None if best is None else round(best[0] * now, 4),
                                      "" if best is None else best[1]))
    return tuple(out)


def scaled(d: LengthDist, k: float) -> LengthDist:
    """``d`` with every length x ``k`` (at least one token)."""
    if d.kind == "constant":
        return LengthDist.constant(max(1, round(d.mean_param * k)))
    if d.kind in ("normal", "lognormal"):
        return LengthDist(d.kind, d.mean_param * k, d.std_param * k, max(1, round(d.min_tokens * k)),
                          max(1, round(d.max_tokens * k)))
    if d.kind == "empirical":
        return LengthDist.empirical([max(1, round(x * k)) for x in d.samples])
    return LengthDist.histogram([e * k for e in d.samples], list(d.weights))


def meets_at(ctx: SearchContext, ev: Evaluation, rate_per_s: float, output: LengthDist) -> bool:
    """Rank 1's pools (replicas fixed) under the analytic model at ``rate_per_s`` with ``output`` lengths:
    stable and every SLO met (the utilisation cap is the sizing margin, not an SLO)."""
    from recommender.search.bands import analyze_fixed

    res = analyze_fixed(ctx, ev, rate_per_s, output)
    if res is None or not res.stable:
        return False
    return all(getattr(res, f"{s.metric}_s").at(s.percentile) <= s.limit_s for s in ctx.workload.slos)


def _largest(ok: Any) -> float | None:
    """Largest scale ``x >= 1`` with ok(x) (monotone), to REL_TOL; None if ok(1) fails or ok(MAX_SCALE) holds."""
    if not ok(1.0):
        return None
    lo, hi = 1.0, 2.0
    while ok(hi):
        lo, hi = hi, hi * 2.0
        if hi > MAX_SCALE:
            return None
    while hi / lo - 1.0 > REL_TOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def sensitivity(ctx: SearchContext, first: Evaluation, *, complete: bool = False, prices: bool = True) -> Sensitivity:
    """``complete``: the search evaluated the whole space (its price thresholds are exact, never "at least");
    ``prices`` False: no price thresholds (rank 1 was chosen by ``--confidence``, not as the cheapest plan, so
    "stays cheapest until" would compare it with plans that rank below it for their P(SLO met))."""
    w = ctx.workload
    rate = float(w.effective_rate_per_s)
    max_rate = max_out = None
    if not w.is_offline and rate > 0:
        k = _largest(lambda x: meets_at(ctx, first, rate * x, w.output_tokens))
        max_rate = None if k is None else round(rate * k, 4)
        out_k = _largest(lambda x: meets_at(ctx, first, rate, scaled(w.output_tokens, x)))
        max_out = None if out_k is None else round(out_k, 4)
    return Sensitivity(prices=price_thresholds(ctx, first, complete=complete) if prices else (), rate_per_s=rate,
                       max_rate_per_s=max_rate,
                       max_output_scale=max_out)
