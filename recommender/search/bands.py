"""Error bands and P(SLO met) for plan rows, from the held-out error of their evidence class (issue #24, 1-2).

**Evidence class** of a row: engine x GPU family x weight dtype x model class (dense / MoE). Its rows and
error come from data, never from code, first found of:

1. the profile's own ``fit.classes`` (``{engine, family, dtype, model_class, rows, held_out: {median_ape_pct}}``;
   ``recommend calibrate`` writes them for a kept fit of one GPU family, from the held-out error its report prints;
   a calibration of one configuration (``fit.scope.model``) only for that model): one log-sd ``m / 0.6745`` for
   every metric;
2. ``catalogs/evidence.yaml`` (written by ``benchmarks/bench_bands.py --write``): per class and metric kind
   (``ttft``; ``decode`` = TPOT, ITL, e2e, output throughput) the rows of the published and InferenceX
   measurements of that class and ``sigma_fit`` = the 80th percentile of ``|ln g|`` / 1.2816 over their
   predictions by fits that did not see the row's configuration (``g`` = measured / predicted time), so that a
   p10-p90 band holds 80% of held-out rows; a class absent from the file has no rows;
3. without that file, the profile's held-out report ``by: gpu`` for the family (its rows and median APE).

Error model: the modelled step times are off by a factor ``g``, lognormal with log-sd ``sigma``. With ``n`` rows
the class's sigma is shrunk toward a wide prior ``s0``: ``sigma^2 = (n sigma_fit^2 + N0 s0'^2) / (n + N0)``,
``s0' = max(s0, sigma_fit)`` (a class never looks better than its own rows), ``N0 = 5`` rows of prior weight; a
class with no rows gets ``s0`` itself. Fewer rows, never a narrower band. ``s0`` (``evidence.yaml`` ``prior``,
per model class and metric kind): the widest held-out error of any measured class of that model class and
kind, at least ``PRIOR_SIGMA = 0.5`` (p10-p90 of x0.53 - x1.90).

If every step takes ``g`` times as long, the deployment at rate ``lambda`` behaves as the modelled one at
``g lambda`` with every time x ``g`` (time rescaling), so a latency percentile is ``g L(g lambda)`` and the
capacity is ``capacity / g``. One standard-normal error ``z`` per row (comonotone): ``g = exp(sigma z)`` sets
the load and TPOT / e2e; TTFT's own error scales its value, ``exp(sigma_ttft z) L_ttft(g lambda)`` (a wide TTFT
error does not make the pools saturate sooner). The p10-p90 band is at ``z = -/+ 1.2816``; P(an SLO met) =
``Phi(z*)``, ``z*`` the largest ``z`` with that SLO met and the pools stable (bisection); 0.5 at ``z* = 0`` (the
point prediction exactly at a limit). P(all SLOs) is the smallest of them (one ``z`` for all).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Mapping, Sequence

from recommender.catalog import default_catalog
from recommender.load import Disaggregated, PoolSpec, Traffic, analyze, analyze_disaggregated
from recommender.profiles import EngineProfile
from recommender.search.evaluate import Evaluation, SearchContext
from recommender.search.evidence_table import class_entry, evidence_table
from recommender.search.recommend_rows import RankedRow
from recommender.workload import LengthDist

PRIOR_SIGMA = 0.5
PRIOR_ROWS = 5.0
Z90 = 1.2816  # standard normal 90th percentile
MEDIAN_ABS_Z = 0.6745  # median of |N(0, 1)|
METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class EvidenceClass:
    engine: str
    family: str
    dtype: str
    model_class: str  # "dense" | "moe"
    rows: int  # rows behind the decode-side error (TPOT, ITL, e2e, throughput)
    sigma: float  # log-sd of the modelled step times' error: TPOT, e2e, capacity
    ttft_rows: int = 0
    ttft_sigma: float | None = None  # TTFT's log-sd (None: sigma)
    pd_rows: int = 0  # a P/D plan's: the disaggregated rows behind its band (with_disaggregated)

    @property
    def label(self) -> str:
        base = f"{self.engine}/{self.family}/{self.dtype}/{self.model_class}"
        return f"{base} + P/D" if self.pd_rows else base

    @property
    def sigma_ttft(self) -> float:
        return self.sigma if self.ttft_sigma is None else self.ttft_sigma

    def sigma_of(self, metric: str) -> float:
        """The log-sd a metric's band and P(SLO met) use: TTFT's for ttft, the decode side's otherwise."""
        return self.sigma_ttft if metric == "ttft" else self.sigma


def _median_ape(stats: Any) -> float | None:
    v = stats.get("median_ape_pct") if isinstance(stats, Mapping) else None
    return float(v) / 100.0 if isinstance(v, (int, float)) and v > 0 else None


def held_out_sigma(rows: int, held_out: Any) -> float:
    """The shrunk log-sd of a class whose held-out record gives its median APE ``m`` (``median_ape_pct``): the
    lognormal's ``m / 0.6745``, shrunk by :func:`class_sigma` (a ``fit.classes`` entry, written by calibrate)."""
    m = _median_ape(held_out)
    return class_sigma(rows, None if m is None else m / MEDIAN_ABS_Z)


def class_sigma(rows: int, fit_sigma: float | None, prior: float = PRIOR_SIGMA) -> float:
    """The shrunk log-sd (module docstring); the prior at 0 rows or without a fitted error."""
    if rows <= 0 or fit_sigma is None:
        return prior
    s0 = max(prior, fit_sigma)
    return math.sqrt((rows * fit_sigma ** 2 + PRIOR_ROWS * s0 ** 2) / (rows + PRIOR_ROWS))


def prior_sigma(table: Mapping[str, Any] | None, model_class: str, kind: str) -> float:
    """The wide prior of a model class and metric kind (``ttft`` / ``decode``): the table's, at least PRIOR_SIGMA."""
    v = (((table or {}).get("prior") or {}).get("sigma") or {}).get(model_class, {}).get(kind)
    return max(PRIOR_SIGMA, float(v)) if isinstance(v, (int, float)) else PRIOR_SIGMA


def class_from_table(table: Mapping[str, Any], engine: str, family: str, dtype: str, model_class: str) -> EvidenceClass:
    """The class's rows and shrunk sigmas from an evidence table (no entry: no rows, the priors)."""
    entry = class_entry(table, engine, family, dtype, model_class)
    out: dict[str, tuple[int, float]] = {}
    for kind in ("decode", "ttft"):
        k = entry.get(kind) or {}
        n = int(k.get("rows") or 0)
        s = k.get("sigma")
        out[kind] = (n, class_sigma(n, float(s) if isinstance(s, (int, float)) and s > 0 else None,
                                    prior_sigma(table, model_class, kind)))
    return EvidenceClass(engine, family, dtype, model_class, out["decode"][0], out["decode"][1],
                         out["ttft"][0], out["ttft"][1])


def with_disaggregated(cls: EvidenceClass, table: Mapping[str, Any] | None) -> EvidenceClass:
    """A P/D plan's class: per kind (TTFT, decode side) the wider of its pools' class and the table's
    ``disaggregated`` entry (real P/D runs predicted held out, ``benchmarks/bench_bands.py``),
    that entry's sigma shrunk to its rows like a class's (:func:`class_sigma`, prior ``PRIOR_SIGMA``). The pools'
    classes measure single-node serving; the P/D path adds a prefill queue, a KV hand-off and a second engine,
    whose error only P/D runs show (InferenceX: TTFT measured at a median 1.27x the model's with the handoff, p10-p90 x0.36 - x2.80). Without the entry, or
    without one of its kinds, that kind keeps the pools' class."""
    pd = (table or {}).get("disaggregated")
    if not isinstance(pd, Mapping):
        return cls
    sig: dict[str, tuple[int, float]] = {}
    for kind in ("decode", "ttft"):
        k = pd.get(kind)
        n = int(k.get("rows") or 0) if isinstance(k, Mapping) else 0
        s = k.get("sigma") if isinstance(k, Mapping) else None
        if n > 0 and isinstance(s, (int, float)) and s > 0:
            sig[kind] = (n, class_sigma(n, float(s)))
    if not sig:
        return cls
    dec, ttft = sig.get("decode", (0, 0.0)), sig.get("ttft", (0, 0.0))
    return dataclasses.replace(cls, sigma=max(cls.sigma, dec[1]), ttft_sigma=max(cls.sigma_ttft, ttft[1]),
                               pd_rows=max(dec[0], ttft[0]))


def evidence_class(ctx: SearchContext, gpu: str, dtype: str) -> EvidenceClass:
    """The class of one pool (GPU, weight dtype) under ``ctx``'s profile and model."""
    return class_for(ctx.profile, ctx.model, gpu, dtype)


def class_for(prof: EngineProfile, model: Any, gpu: str, dtype: str) -> EvidenceClass:
    """The class of ``model`` on ``gpu`` at weight ``dtype`` under ``prof`` (a plan's pool, or one ``estimate``)."""
    fit: Mapping[str, Any] = prof.fit or {}
    gpus = default_catalog().gpus
    family = gpus[gpu].arch if gpu in gpus else gpu
    fam_of_profile, fam_rows = prof.evidence(gpu)
    family = fam_of_profile or family
    model_class = "moe" if getattr(model, "is_moe", False) or getattr(model, "num_experts", 0) else "dense"
    scope = fit.get("scope")
    scoped = scope.get("model") if isinstance(scope, Mapping) else None
    own = not scoped or scoped == getattr(model, "id", None)  # a calibration of one model: its classes are that model's
    for c in fit.get("classes") or () if own else ():  # a per-class table, when the fit provides one
        if isinstance(c, Mapping) and (c.get("family"), c.get("dtype"), c.get("model_class")) == (
                family, dtype, model_class) and c.get("engine", prof.engine) == prof.engine:
            n = int(c.get("rows") or 0)
            return EvidenceClass(prof.engine, family, dtype, model_class, n, held_out_sigma(n, c.get("held_out")))
    table = evidence_table()
    if table is not None:
        return class_from_table(table, prof.engine, family, dtype, model_class)
    rows, fit_sigma = legacy_family_error(fit, family, fam_rows)
    return EvidenceClass(prof.engine, family, dtype, model_class, rows, class_sigma(rows, fit_sigma))


def legacy_family_error(fit: Mapping[str, Any], family: str, fam_rows: int) -> tuple[int, float | None]:
    """Without an evidence table: the family's rows (held-out report ``by: gpu`` on GPUs of the family + the
    family fit's rows) and their held-out median APE as a log-sd (row weighted; else the report's overall)."""
    gpus = default_catalog().gpus
    rows, weighted, overall = fam_rows, 0.0, None
    for report in fit.get("held_out") or ():
        if not isinstance(report, Mapping) or report.get("by") != "gpu":
            continue
        overall = _median_ape((report.get("held_out") or {}).get("all"))
        for g, stats in (report.get("per_group") or {}).items():
            if not isinstance(stats, Mapping) or g not in gpus or gpus[g].arch != family:
                continue
            cnt = (stats.get("start") or {}).get("n")
            m = _median_ape(stats.get("held_out"))
            if isinstance(cnt, int) and cnt > 0:
                rows += cnt
                if m is not None:
                    weighted += cnt * m
        break
    fam_group_rows = rows - fam_rows
    m = weighted / fam_group_rows if fam_group_rows > 0 and weighted > 0 else overall
    return rows, None if m is None else m / MEDIAN_ABS_Z


def row_class(ctx: SearchContext, ev: Evaluation) -> EvidenceClass:
    """The row's class: its least-evidenced pool's (the widest band); a P/D row's widened by the measured P/D
    error (:func:`with_disaggregated`)."""
    classes = [evidence_class(ctx, p.gpu, p.weight_dtype) for p in ev.pools]
    cls = max(classes, key=lambda c: (c.sigma, c.sigma_ttft))
    return with_disaggregated(cls, evidence_table()) if ev.candidate.disaggregated else cls


def analyze_fixed(ctx: SearchContext, ev: Evaluation, rate_per_s: float, output: LengthDist | None = None) -> Any:
    """The analytic model of ``ev``'s pools (replicas fixed) at ``rate_per_s`` with the workload's lengths
    (``output``: other output lengths); None when a pool has no cost model."""
    w = ctx.workload
    costs = [ctx.pool_cost(p)[0] for p in ev.pools]
    traffic = Traffic(rate_per_s=rate_per_s, prompt=w.prompt_tokens, output=output or w.output_tokens,
                      shared_prefix_fraction=w.shared_prefix_fraction)
    if any(c is None for c in costs):
        return None
    if ev.candidate.disaggregated:
        pp, dp = ev.pools
        return analyze_disaggregated(
            Disaggregated(prefill=PoolSpec(cost=costs[0], limits=pp.limits, replicas=pp.replicas),  # type: ignore[arg-type]
                          decode=PoolSpec(cost=costs[1], limits=dp.limits, replicas=dp.replicas),  # type: ignore[arg-type]
                          kv_link=ctx.kv_link(ev.candidate)), traffic)
    p = ev.pools[0]
    return analyze(PoolSpec(cost=costs[0], limits=p.limits, replicas=p.ranks), traffic)  # type: ignore[arg-type]


def _at(ctx: SearchContext, ev: Evaluation, g: float) -> dict[str, float] | None:
    """Latency at each SLO's percentile (and every metric at the row's percentile) with step times x g."""
    res = analyze_fixed(ctx, ev, ctx.workload.effective_rate_per_s * g)
    if res is None or not res.stable:
        return None
    out = {}
    for m in METRICS:
        for pct in ("p50", "p90", "p95", "p99", "mean"):
            v = getattr(res, f"{m}_s").at(pct)
            out[f"{m}@{pct}"] = g * v if math.isfinite(v) else math.inf
    return out


def bands_of(ctx: SearchContext, ev: Evaluation, percentiles: Mapping[str, str],
             load_utilisation: float | None) -> dict[str, Any]:
    """The row's ``bands`` record: class, p10/p90 of TTFT, TPOT, e2e (each at ``percentiles[metric]``, the
    plan's headline) and capacity, and P(SLO met) per SLO and for all of them (None: offline or no SLOs).

    One standard-normal error ``z`` for the row (comonotone): the step times are ``g = exp(sigma z)`` times
    the model's, so the load is the model's at ``g lambda`` and TPOT / e2e are ``g L(g lambda)``; TTFT's own
    error scales its value, ``exp(sigma_ttft z) L(g lambda)``. Bands at ``z = -/+ 1.2816``; P(an SLO met) =
    ``Phi(z*)``, ``z*`` the largest ``z`` with the pools stable and the SLO met."""
    cls = row_class(ctx, ev)
    w = ctx.workload
    cache: dict[float, dict[str, float] | None] = {}

    def at(z: float) -> dict[str, float] | None:
        """Every metric at every percentile at error ``z`` (None: the pools saturate)."""
        if z not in cache:
            g = math.exp(cls.sigma * z)
            lat = _at(ctx, ev, g)
            cache[z] = None if lat is None else {
                k: v * math.exp(cls.sigma_of(k.split("@")[0]) * z) / g for k, v in lat.items()}
        return cache[z]

    out: dict[str, Any] = {"class": cls.label, "class_rows": cls.rows + cls.ttft_rows + cls.pd_rows, "sigma": round(cls.sigma, 4),
                           "sigma_ttft": round(cls.sigma_ttft, 4)}
    fast, slow = at(-Z90), at(Z90)
    for m in METRICS:
        key = f"{m}@{percentiles[m]}"
        out[f"{m}_s"] = [None if fast is None else _round(fast[key]), None if slow is None else _round(slow[key])]
    lo_g, hi_g = math.exp(-Z90 * cls.sigma), math.exp(Z90 * cls.sigma)
    rate = w.effective_rate_per_s
    if load_utilisation and load_utilisation > 0 and math.isfinite(load_utilisation) and rate > 0:
        cap = rate / load_utilisation
        out["capacity_per_s"] = [round(cap / hi_g, 4), round(cap / lo_g, 4)]
    if w.is_offline or not w.slos:
        out["p_slo"] = None
        return out
    each: dict[str, float] = {}
    for s in w.slos:
        z = _largest_z(lambda x, s=s: (lat := at(x)) is not None and lat[f"{s.metric}@{s.percentile}"] <= s.limit_s)
        each[f"{s.metric}@{s.percentile}"] = _p(z)
    out["p_slo_each"] = each
    out["p_slo"] = min(each.values())  # one z for all: every SLO holds iff the least likely one does
    return out


def p_slo(r: RankedRow) -> float:
    """P(all SLOs met) of a row with bands; 1.0 without SLOs (nothing to miss), 0.0 without bands."""
    if r.bands is None:
        return 0.0
    p = r.bands.get("p_slo")
    return 1.0 if p is None else float(p)


def with_bands(ctx: SearchContext, rows: Sequence[RankedRow]) -> list[RankedRow]:
    """``rows`` with their ``bands`` (computed once per row), headline percentiles per metric as the plan's."""
    w = ctx.workload
    default = w.slos[0].percentile if w.slos else "p90"
    pcts = {m: next((s.percentile for s in w.slos if s.metric == m), default) for m in METRICS}
    return [r if r.bands is not None else dataclasses.replace(r, bands=bands_of(ctx, r.evaluation, pcts, r.load_utilisation))
            for r in rows]


def _round(v: float) -> float | None:
    return round(v, 6) if math.isfinite(v) else None


def _p(z: float) -> float:
    if math.isinf(z):
        return 0.0 if z < 0 else 1.0
    return round(NormalDist().cdf(z), 4)


def _largest_z(ok: Any, steps: int = 8) -> float:
    """Largest z in [-4, 4] with ok(z) (monotone: larger z, slower), by bisection; -inf when even z = -4 fails,
    inf when even z = 4 holds."""
    lo, hi = -4.0, 4.0
    if not ok(lo):
        return -math.inf
    if ok(hi):
        return math.inf
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
