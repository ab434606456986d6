"""Fit an engine profile's efficiency parameters to measurements: robust least squares on log relative error.

For measurements ``y_i`` and predictions ``f_i(p)`` of the serving model at profile parameters ``p``::

    r_i(p)  = w_i x ln(f_i(p) / y_i)                       (log relative error; symmetric in over/under)
    w_i^2   = n_g^(-1/2) / mean                             (n_g = rows of the row's (source, quantity) group:
                                                             a group's total weight grows as sqrt(n_g), so a
                                                             373-row table does not drown an 8-row one)
    minimise  sum_i rho(r_i^2) + sum_j ((p_j - q_j) / (sigma q_j))^2       rho = soft_l1, f_scale 0.1
                                                            (the prior term stays quadratic)

The second sum is an optional prior (``FitOptions.prior``: anchor values ``q`` and relative width
``sigma``) for engines or GPU families with few rows; a parameter whose anchor is 0 (a term the
anchor does not have, e.g. ``gemm_m_half_tokens``) is not pulled. ``scipy.optimize.least_squares`` (trust-region reflective)
works on ``u_j = p_j / s_j`` (``s_j`` = start value, or a tenth of the upper bound when that is 0)
inside ``profiles.BOUNDS``. One global parameter set for all rows: never one constant per row.

Which parameters the data constrains: with ``J`` the Jacobian of the weighted residuals with respect
to ``ln p`` and ``sigma_r`` the robust residual scale (1.4826 x MAD, at least 2%), the standard error
of ``ln p_j`` is ``sigma_r x sqrt(sum_k V_jk^2 / s_k^2)`` (SVD ``J = U S V^T``; infinite when ``p_j``
loads on a direction with ``s_k < 1e-6 s_max``). Parameters whose standard error exceeds
``FitOptions.max_log_se`` (0.5: not known to within a factor ~1.6) are frozen at their start value,
one at a time, worst first (ties: the one with the least effect on the residuals), and reported as
*unconstrained*; parameters that move no prediction at all are frozen before the fit, and so are the
per-step latencies (``STEP_LATENCY_PARAMETERS``) unless at least 3 rows ran at most 16 sequences per
step: at large batches a fixed cost per step is amortised and absorbs whatever per-sequence cost the
model lacks (on TRT017, which has no small batches, it fits 15.7 ms per step, which would put an 8B
model's batch-1 token latency on H100 at ~24 ms against the 6.4 ms vLLM measures).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from recommender.calibrate.measurements import Measurement, deployment, predict, predict_many
from recommender.catalog import Catalog, default_catalog
from recommender.errors import CalibrationError
from recommender.perf.step import Deployment
from recommender.profiles import BOUNDS, FIT_PARAMETERS, EngineProfile, FamilyFit

#: Residual given to a prediction the model cannot make (non-finite or <= 0): a factor e^3 off.
BAD_RESIDUAL = 3.0
#: Fixed costs per step (or per layer per step). At large batches they are amortised over hundreds of
#: sequences and trade off against per-sequence costs, so only rows with small batches separate them.
STEP_LATENCY_PARAMETERS = ("step_overhead_s", "allreduce_latency_s", "allreduce_latency_pcie_s", "layer_launch_overhead_s",
                           "layer_overhead_s")
SMALL_BATCH = 16


def small_batch(m: Measurement) -> bool:
    """Whether the measurement ran at most :data:`SMALL_BATCH` sequences per step (``max`` loads never do)."""
    return m.load.mode != "max" and m.load.batch <= SMALL_BATCH


@dataclass(frozen=True)
class FitOptions:
    """How to fit (see module docstring)."""

    parameters: tuple[str, ...] = FIT_PARAMETERS
    loss: str = "soft_l1"
    f_scale: float = 0.1                  # log error where the robust loss turns linear (~10 %)
    prior: EngineProfile | None = None    # anchor values q_j (None: no penalty)
    prior_sigma: float = 0.3              # relative width of the anchor
    max_log_se: float = 0.5               # standard error of ln p above which a parameter is unconstrained
    min_residual_scale: float = 0.02      # floor of the robust residual scale (2 %)
    max_nfev: int = 200
    detect_unconstrained: bool = True
    min_small_batch_rows: int = 3         # rows at <= SMALL_BATCH sequences needed to fit per-step latencies
    unanchored: tuple[str, ...] = ()      # parameters the prior does not pull (set-up specific, e.g. the API server)


@dataclass(frozen=True)
class ErrorStats:
    """Absolute percentage error |predicted / measured - 1| x 100 over some rows."""

    n: int
    median_ape: float
    p90_ape: float

    def to_dict(self) -> dict[str, float]:
        return {"n": self.n, "median_ape_pct": round(self.median_ape, 2), "p90_ape_pct": round(self.p90_ape, 2)}


def error_stats(ape: Sequence[float]) -> ErrorStats:
    a = np.asarray([x for x in ape if math.isfinite(x)], dtype=float)
    if a.size == 0:
        return ErrorStats(0, math.nan, math.nan)
    return ErrorStats(int(a.size), float(np.median(a)), float(np.percentile(a, 90)))


def ape(pred: float, meas: float) -> float:
    return abs(pred / meas - 1.0) * 100.0 if math.isfinite(pred) and pred > 0 else math.inf


def summarize(ms: Sequence[Measurement], preds: Sequence[float], by: str = "quantity") -> dict[str, ErrorStats]:
    """Error statistics per group (``by``: quantity, source, model, gpu, ...) plus ``"all"``."""
    groups: dict[str, list[float]] = {}
    for m, p in zip(ms, preds):
        e = ape(p, m.value)
        groups.setdefault(m.group(by), []).append(e)
        groups.setdefault("all", []).append(e)
    return {k: error_stats(v) for k, v in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0]))}


@dataclass(frozen=True)
class HeldOut:
    """Errors on rows predicted by a fit that did not see them (leave-one-group-out)."""

    by: str
    folds: int
    before: Mapping[str, ErrorStats]      # start profile on the same rows
    after: Mapping[str, ErrorStats]       # held-out predictions
    per_group: Mapping[str, tuple[ErrorStats, ErrorStats]] = field(default_factory=dict)
    row_ids: tuple[str, ...] = field(default=(), compare=False)   # the rows that were held out
    row_apes: tuple[float, ...] = field(default=(), compare=False)  # their held-out absolute % errors, in that order

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "folds": self.folds,
                "start": {k: v.to_dict() for k, v in self.before.items()},
                "held_out": {k: v.to_dict() for k, v in self.after.items()},
                "per_group": {g: {"start": b.to_dict(), "held_out": a.to_dict()} for g, (b, a) in self.per_group.items()}}


@dataclass(frozen=True)
class FitResult:
    """A fitted profile, how well it fits, and what the data could not tell."""

    profile: EngineProfile
    start: EngineProfile
    fitted: tuple[str, ...]
    unconstrained: tuple[str, ...]
    at_bound: tuple[str, ...]
    log_standard_errors: Mapping[str, float]
    singular_values: tuple[float, ...]
    residual_scale: float
    before: Mapping[str, ErrorStats]
    after: Mapping[str, ErrorStats]
    before_by_source: Mapping[str, ErrorStats]
    after_by_source: Mapping[str, ErrorStats]
    n_rows: int
    predictions: tuple[tuple[str, float, float, float], ...] = ()   # (id, measured, before, after)
    unconstrained_reasons: Mapping[str, str] = field(default_factory=dict)
    held_out: tuple[HeldOut, ...] = ()
    #: the objective at the solution (``least_squares``' cost: half the sum of the robust loss of the residuals,
    #: the anchor's included); NaN when nothing was fitted. Fits of the same rows from other starts compare by it.
    cost: float = field(default=math.nan, compare=False)
    #: where the fit is written: a GPU of the family whose block holds it (rows of one GPU family), and the model id
    #: where it is that model's override (:class:`~recommender.profiles.ModelFit`: rows of one configuration);
    #: "" = the profile's own parameters are the fit
    scope_gpu: str = ""
    scope_model: str = ""
    #: the one model of a family-scoped fit's rows whose block holds the routed experts' terms it fitted ("" for none)
    experts_model: str = ""

    def with_held_out(self, *h: HeldOut) -> "FitResult":
        return dataclasses.replace(self, held_out=self.held_out + tuple(h))

    @property
    def values(self) -> EngineProfile:
        """The profile as the fitted rows see it: ``profile`` with the family of ``scope_gpu`` and the override for
        ``scope_model`` (or the experts' terms of ``experts_model``) applied."""
        return self.profile.for_gpu(self.scope_gpu, self.scope_model or self.experts_model) if self.scope_gpu else self.profile


# -- the engine -----------------------------------------------------------------------------------
def _scale(name: str, start: EngineProfile) -> float:
    v = float(getattr(start, name))
    return v if v > 0 else BOUNDS[name][1] / 10.0


def _weights(ms: Sequence[Measurement]) -> np.ndarray:
    counts: dict[tuple[str, str], int] = {}
    for m in ms:
        counts[(m.source, m.quantity)] = counts.get((m.source, m.quantity), 0) + 1
    w2 = np.array([counts[(m.source, m.quantity)] ** -0.5 for m in ms])
    return np.sqrt(w2 / w2.mean())


def _gaussian_under_loss(q: float, opts: FitOptions) -> float:
    """A residual whose robust loss equals ``q^2``: the prior stays Gaussian while the data are robust.

    least_squares minimises ``f^2 rho((r / f)^2)``; for soft_l1 ``rho(z) = 2 (sqrt(1 + z) - 1)``, so
    ``r = f sqrt((1 + q^2 / (2 f^2))^2 - 1)`` (sign kept)."""
    if opts.loss == "linear":
        return q
    if opts.loss != "soft_l1":
        raise CalibrationError(f"prior penalty supports loss 'linear' or 'soft_l1', not {opts.loss!r}")
    f = opts.f_scale
    return math.copysign(f * math.sqrt((1.0 + q * q / (2.0 * f * f)) ** 2 - 1.0), q)


class _Problem:
    """Residuals of a set of measurements as a function of some parameters (others fixed at ``base``)."""

    def __init__(self, ms: Sequence[Measurement], base: EngineProfile, names: Sequence[str],
                 opts: FitOptions, catalog: Catalog) -> None:
        self.ms, self.base, self.names, self.opts = list(ms), base, tuple(names), opts
        self.deps: list[Deployment] = [deployment(m, base, catalog) for m in self.ms]
        self.y = np.array([m.value for m in self.ms])
        self.w = _weights(self.ms)
        self.s = np.array([_scale(n, base) for n in self.names])

    def profile(self, u: np.ndarray) -> EngineProfile:
        return self.base.replace(**{n: float(v * s) for n, v, s in zip(self.names, u, self.s)})

    def predictions(self, prof: EngineProfile) -> np.ndarray:
        return np.array(predict_many(self.ms, prof, self.deps))

    def data_residuals(self, u: np.ndarray) -> np.ndarray:
        f = self.predictions(self.profile(u))
        ok = np.isfinite(f) & (f > 0)
        r = np.full(len(f), BAD_RESIDUAL)
        r[ok] = np.log(f[ok] / self.y[ok])
        return self.w * r

    def residuals(self, u: np.ndarray) -> np.ndarray:
        r = self.data_residuals(u)
        prior = self.opts.prior
        if prior is None:
            return r
        pen = []
        for n, v, s in zip(self.names, u, self.s):
            if float(getattr(prior, n)) == 0.0 or n in self.opts.unanchored:   # an anchor at 0 is a switched-off term
                pen.append(0.0)
                continue
            q = float(getattr(prior, n))
            pen.append(_gaussian_under_loss((v * s - q) / (self.opts.prior_sigma * q), self.opts))
        return np.concatenate([r, np.asarray(pen)])

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([BOUNDS[n][0] for n in self.names]) / self.s
        hi = np.array([BOUNDS[n][1] for n in self.names]) / self.s
        return lo, hi

    def start(self) -> np.ndarray:
        lo, hi = self.bounds()
        u0 = np.array([float(getattr(self.base, n)) for n in self.names]) / self.s
        return np.clip(u0, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))


def _log_jacobian(prob: _Problem, u: np.ndarray, rel_step: float = 0.02) -> np.ndarray:
    """d r_i / d ln p_j by central differences of ``rel_step`` in ln p (clipped at the bounds)."""
    lo, hi = prob.bounds()
    cols = []
    for j in range(len(u)):
        up, dn = u.copy(), u.copy()
        base = max(u[j], 1e-3 * (hi[j] - lo[j]))  # a parameter at 0 moves by a small absolute step
        up[j] = min(hi[j], base * math.exp(rel_step))
        dn[j] = max(lo[j], u[j] - (base * math.exp(rel_step) - base))
        step = math.log(up[j] / base) - (math.log(dn[j] / base) if dn[j] > 0 else -(base - dn[j]) / base)
        cols.append((prob.data_residuals(up) - prob.data_residuals(dn)) / step if step > 0 else np.zeros(len(prob.ms)))
    return np.column_stack(cols) if cols else np.zeros((len(prob.ms), 0))


def _log_se(prob: _Problem, u: np.ndarray, opts: FitOptions) -> tuple[np.ndarray, np.ndarray, float]:
    """(standard error of ln p_j, singular values of J, robust residual scale)."""
    r = prob.data_residuals(u) / prob.w
    mad = float(np.median(np.abs(r - np.median(r)))) * 1.4826
    sigma = max(mad, opts.min_residual_scale)
    J = _log_jacobian(prob, u)
    if J.shape[1] == 0:
        return np.zeros(0), np.zeros(0), sigma
    _, sv, vt = np.linalg.svd(J, full_matrices=False)
    # se_j^2 = sigma^2 sum_k V_jk^2 / s_k^2; a direction with s_k ~ 0 leaves every parameter loading on it unknown
    tiny = sv <= 1e-6 * max(float(sv[0]), 1e-300)
    inv2 = np.where(tiny, 0.0, 1.0 / np.maximum(sv, 1e-150) ** 2)   # 1e-300 squared is 0: a warned 1 / 0 where tiny
    v2 = vt.T ** 2
    se = sigma * np.sqrt(v2 @ inv2)
    se[(v2[:, tiny] > 1e-6).any(axis=1)] = math.inf
    se[np.linalg.norm(J, axis=0) < 1e-9] = math.inf
    return se, sv, sigma


def _solve(prob: _Problem, opts: FitOptions) -> tuple[np.ndarray, float]:
    """(the solution, its objective: scipy's ``least_squares`` cost, half the sum of the robust loss of the residuals,
    the prior's included)."""
    if not prob.names:
        return np.zeros(0), math.nan
    lo, hi = prob.bounds()
    res = least_squares(prob.residuals, prob.start(), bounds=(lo, hi), loss=opts.loss, f_scale=opts.f_scale,
                        diff_step=1e-3, max_nfev=opts.max_nfev, x_scale="jac", method="trf")
    return res.x, float(res.cost)


def fit_profile(ms: Sequence[Measurement], start: EngineProfile, opts: FitOptions | None = None,
                catalog: Catalog | None = None, engine: str | None = None, source: str = "") -> FitResult:
    """Fit ``opts.parameters`` of ``start`` to ``ms``; unconstrained parameters keep their start value."""
    opts = opts or FitOptions()
    cat = catalog or default_catalog()
    start = start.replace(families=(), family="")   # one parameter set for these rows: no per-family overrides
    if not ms:
        raise CalibrationError("nothing to fit: no measurements")
    unknown = [n for n in opts.parameters if n not in BOUNDS]
    if unknown:
        raise CalibrationError(f"unknown profile parameter(s) {', '.join(unknown)}; fittable: {', '.join(FIT_PARAMETERS)}")
    free = list(opts.parameters)
    why: dict[str, str] = {}
    prob = _Problem(ms, start, free, opts, cat)
    u = prob.start()
    if opts.detect_unconstrained and free:  # parameters that do not move any prediction are dropped first
        J = _log_jacobian(prob, u)
        for n, c in zip(free, np.linalg.norm(J, axis=0)):
            if c < 1e-9:
                why[n] = "no effect on any of these predictions"
        n_small = sum(1 for m in ms if small_batch(m))
        if n_small < opts.min_small_batch_rows:
            for n in STEP_LATENCY_PARAMETERS:
                if n in free and n not in why:
                    why[n] = (f"per-step latency seen only amortised over large batches ({n_small} rows at "
                              f"<= {SMALL_BATCH} sequences, {opts.min_small_batch_rows} needed)")
        free = [n for n in free if n not in why]
    cost = math.nan
    for _ in range(len(opts.parameters) + 1):
        prob = _Problem(ms, start, free, opts, cat)
        u, cost = _solve(prob, opts)
        if not opts.detect_unconstrained or not free:
            break
        se, _, _ = _log_se(prob, u, opts)
        if not se.size or float(np.max(se)) <= opts.max_log_se:
            break
        # worst first; among equally unknown ones (infinite), the one that moves the residuals least
        effect = np.linalg.norm(_log_jacobian(prob, u), axis=0)
        worst = max(range(len(free)), key=lambda j: (se[j], -effect[j]))
        why[free[worst]] = f"standard error of ln p {se[worst]:.3g} > {opts.max_log_se:g}"
        free.pop(worst)
    prof = prob.profile(u) if free else start
    prof = prof.replace(engine=engine or start.engine, source=source or start.source)
    se, sv, sigma = _log_se(prob, u, opts) if free else (np.zeros(0), np.zeros(0), 0.0)
    lo, hi = prob.bounds()
    at_bound = tuple(n for n, v, l, h in zip(free, u, lo, hi) if v <= l + 1e-6 * (h - l) or v >= h - 1e-6 * (h - l))
    before = prob.predictions(start)
    after = prob.predictions(prof)
    return FitResult(
        profile=prof, start=start, fitted=tuple(free), unconstrained=tuple(why), at_bound=at_bound,
        unconstrained_reasons=dict(why),
        log_standard_errors={n: float(s) for n, s in zip(free, se)},
        singular_values=tuple(float(x) for x in sv), residual_scale=sigma, cost=cost if free else math.nan,
        before=summarize(ms, before.tolist()), after=summarize(ms, after.tolist()),
        before_by_source=summarize(ms, before.tolist(), "source"), after_by_source=summarize(ms, after.tolist(), "source"),
        n_rows=len(ms),
        predictions=tuple((m.id, m.value, float(b), float(a)) for m, b, a in zip(ms, before, after)),
    )


def held_out(ms: Sequence[Measurement], start: EngineProfile, by: str = "source", opts: FitOptions | None = None,
             catalog: Catalog | None = None, max_folds: int = 12, min_train: int = 3) -> HeldOut:
    """Leave-one-group-out: fit on all other groups of ``by``, predict the held-out group, pool the errors.

    With more than ``max_folds`` groups, groups are dealt round-robin (sorted by name) into that many
    folds. Groups whose complement has fewer than ``min_train`` rows are not held out."""
    opts = opts or FitOptions()
    cat = catalog or default_catalog()
    names = sorted({m.group(by) for m in ms})
    folds: list[list[str]] = [[] for _ in range(min(max_folds, len(names)))]
    for i, n in enumerate(names):
        folds[i % len(folds)].append(n)
    rows: list[Measurement] = []
    pb: list[float] = []
    pa: list[float] = []
    per_group: dict[str, tuple[ErrorStats, ErrorStats]] = {}
    used = 0
    for fold in folds:
        test = [m for m in ms if m.group(by) in fold]
        train = [m for m in ms if m.group(by) not in fold]
        if len(train) < min_train or not test:
            continue
        used += 1
        fitted = fit_profile(train, start, opts, cat).profile
        b = [predict(m, start, cat) for m in test]
        a = [predict(m, fitted, cat) for m in test]
        rows += test
        pb += b
        pa += a
        for g in fold:
            idx = [i for i, m in enumerate(test) if m.group(by) == g]
            per_group[g] = (error_stats([ape(b[i], test[i].value) for i in idx]),
                            error_stats([ape(a[i], test[i].value) for i in idx]))
    if not rows:
        raise CalibrationError(f"held-out error needs at least two groups of {by!r} with {min_train}+ rows to train on")
    return HeldOut(by=by, folds=used, before=summarize(rows, pb), after=summarize(rows, pa), per_group=per_group,
                   row_ids=tuple(m.id for m in rows), row_apes=tuple(ape(a, m.value) for a, m in zip(pa, rows)))


def split_error(train: Sequence[Measurement], test: Sequence[Measurement], start: EngineProfile,
                opts: FitOptions | None = None, catalog: Catalog | None = None) -> tuple[FitResult, HeldOut]:
    """Fit on ``train``, report the error on ``test`` before (start profile) and after (fitted)."""
    cat = catalog or default_catalog()
    res = fit_profile(train, start, opts, cat)
    b = [predict(m, start, cat) for m in test]
    a = [predict(m, res.profile, cat) for m in test]
    return res, HeldOut(by="split", folds=1, before=summarize(test, b), after=summarize(test, a),
                        row_ids=tuple(m.id for m in test))


#: What a GPU family may change: achieved bandwidth, GEMM efficiency and its small-M curve.
FAMILY_PARAMETERS = ("hbm_bandwidth_efficiency", "compute_efficiency", "gemm_m_half_tokens")
#: CDNA3 (MI300X, vLLM ROCm): GEMM efficiency, its small-M curve and how much of it hides under the weight
#: stream (MI300X fp8 steps grow with every sequence from batch 1), and the per-layer time. Its rows are one
#: configuration: bandwidth, step overhead and xGMI latency cannot be told from these and stay the engine's.
CDNA3_PARAMETERS = ("compute_efficiency", "gemm_m_half_tokens", "gemm_curve_hidden_fraction", "layer_overhead_s")


def family_sigma(rows: int) -> float:
    """Width of a family's anchor to the engine profile: 0.3 at 20 rows, growing as sqrt(rows), in [0.1, 1]
    (a family with few rows is shrunk hard toward the engine profile)."""
    return min(1.0, max(0.1, 0.3 * (rows / 20.0) ** 0.5))


@dataclass(frozen=True)
class FamilyReport:
    """One GPU family's fit: held-out error of the engine profile and of the family fit on its rows."""

    family: str
    rows: int
    anchor_width: float
    folds: str
    engine_error: ErrorStats | None
    family_error: ErrorStats | None
    fitted: Mapping[str, float]
    kept: bool
    reason: str = ""


def fit_family(ms: Sequence[Measurement], engine_profile: EngineProfile, family: str,
               parameters: tuple[str, ...] | None = None, folds: int = 5, data: str = "",
               catalog: Catalog | None = None) -> tuple[FamilyFit | None, FamilyReport]:
    """Fit one GPU family's parameters anchored to the engine profile; keep them only if, held out, they beat it.

    Held out = k-fold within the family (by model when it has 3+, else by row): every row is
    predicted by a family fit that did not see it, against the engine profile on the same rows
    (which may have seen them: the comparison favours the engine profile)."""
    params = parameters or (CDNA3_PARAMETERS if family == "cdna3" else FAMILY_PARAMETERS)
    sigma = family_sigma(len(ms))
    opts = FitOptions(parameters=params, prior=engine_profile.replace(families=()), prior_sigma=sigma)
    res = fit_profile(ms, engine_profile, opts, catalog)
    by = "model" if len({m.model for m in ms}) >= 3 else "row"
    h = held_out(ms, engine_profile.replace(families=()), by=by, opts=opts, catalog=catalog, max_folds=folds)
    eng, fam = h.before["all"], h.after["all"]
    keep = bool(res.fitted) and fam.median_ape < eng.median_ape
    fitted = {n: float(getattr(res.profile, n)) for n in res.fitted}
    rep = FamilyReport(family, len(ms), sigma, f"{h.folds} by {by}", eng, fam, fitted, keep,
                       "" if keep else "held out, the family fit is no better than the engine profile")
    if not keep:
        return None, rep
    src = (f"{len(ms)} {family} rows{' of ' + data if data else ''}, anchored to the engine profile (width "
           f"{sigma:.2f}); held out {fam.median_ape:.1f}% vs the engine profile's {eng.median_ape:.1f}% median error")
    return FamilyFit(family, len(ms), tuple(sorted(fitted.items())), src), rep


def fit_families(ms: Sequence[Measurement], engine_profile: EngineProfile, min_rows: int = 8, data: str = "",
                 catalog: Catalog | None = None) -> tuple[EngineProfile, list[FamilyReport]]:
    """Per-GPU-family fits of ``engine_profile`` on rows spanning families (families with < ``min_rows`` keep it)."""
    groups: dict[str, list[Measurement]] = {}
    for m in ms:
        groups.setdefault(m.group("family"), []).append(m)
    fams = []
    reports: list[FamilyReport] = []
    for fam, fm in sorted(groups.items()):
        if len(fm) < min_rows:
            reports.append(FamilyReport(fam, len(fm), 0.0, "-", None, None, {}, False,
                                        f"too few rows (< {min_rows}): the engine profile"))
            continue
        ff, rep = fit_family(fm, engine_profile, fam, data=data, catalog=catalog)
        reports.append(rep)
        if ff is not None:
            fams.append(ff)
    return engine_profile.replace(families=tuple(fams)), reports


__all__ = ["FitOptions", "FamilyReport", "fit_family", "fit_families", "family_sigma", "FAMILY_PARAMETERS", "FitResult", "HeldOut", "ErrorStats", "fit_profile", "held_out", "split_error",
           "summarize", "error_stats", "ape"]
