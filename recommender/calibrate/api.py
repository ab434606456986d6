"""The library side of ``recommend calibrate``: read results, fit, estimate held-out error, write the profile."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from recommender import progress
from recommender.calibrate.fit import (ErrorStats, FamilyReport, FitOptions, FitResult, HeldOut, family_sigma,
                                       error_stats, fit_profile, held_out, summarize)
from recommender.calibrate.measurements import Measurement, Skip, deployment, predict
from recommender.calibrate.readers import file_of, measurement_skips, read_results
from recommender.calibrate.report import fit_summary, profile_document, write_profile
from recommender.catalog import Catalog, default_catalog
from recommender.errors import CalibrationError
from recommender.perf.step import default_limits
from recommender.profiles import (FIT_PARAMETERS, MOE_PARAMETERS, SHAPE_PARAMETERS, EngineProfile, FamilyFit, ModelFit, gpu_family,
                                  resolve_profile)

HELD_OUT_KEYS = ("source", "file", "model", "gpu", "config", "quantity", "row")
#: Folds of the held-out estimate (leave-one-group-out with more groups are dealt into this many).
KFOLD = 5


@dataclass(frozen=True)
class CalibrateRequest:
    """What ``recommend calibrate`` was asked (``defaults``: field -> value for runs whose files do not say)."""

    results: tuple[str, ...]
    out: str
    engine: str = "vllm"
    profile_file: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    held_out_by: str = "source"
    parameters: tuple[str, ...] | None = None


@dataclass(frozen=True)
class CalibrationRun:
    result: FitResult
    files: tuple[str, ...]
    skipped: tuple[Skip, ...]
    out: Path
    conditions: tuple[str, ...] = ()                       # the engine conditions the rows were predicted under
    planner_error: Mapping[str, ErrorStats] = field(default_factory=dict)   # fitted profile, vLLM defaults
    families: tuple[FamilyReport, ...] = ()
    classes: tuple[Mapping[str, Any], ...] = ()            # fit.classes written (evidence_classes)
    #: the rest of the profile's ``fit:`` block (generalisation check, scope, coverage, classes, ...): the JSON report
    #: states what the written file and the text report state
    extra: Mapping[str, Any] = field(default_factory=dict)


def row_conditions(ms: list[Measurement], limit: int = 6) -> tuple[str, ...]:
    """Distinct engine conditions of the rows, one line each (what each row was predicted under)."""
    seen: dict[str, int] = {}
    for m in ms:
        lim = m.limits
        layout = f" (tp {m.tp} x dp {m.dp}{', expert parallel' if m.ep else ''})" if m.dp > 1 or m.ep else ""
        key = (f"{m.engine} on {m.tp * m.dp} x {m.gpu}{layout}: max_num_seqs {lim.max_num_seqs}, max_num_batched_tokens "
               f"{lim.max_num_batched_tokens}, chunked prefill {'on' if lim.chunked_prefill else 'off'}, "
               f"gpu-memory-utilization {m.gpu_memory_utilization:.3g}")
        seen[key] = seen.get(key, 0) + 1
    lines = [f"{k} ({n} rows)" for k, n in sorted(seen.items(), key=lambda kv: -kv[1])]
    return tuple(lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else []))


def planner_conditions_error(ms: list[Measurement], profile: EngineProfile, catalog: Catalog) -> dict[str, ErrorStats]:
    """Error of ``profile`` when every row is predicted under the conditions the planner deploys
    (vLLM 0.33's defaults for the GPU, gpu-memory-utilization 0.92) instead of the ones it ran under."""
    moved = [dataclasses.replace(m, limits=default_limits(catalog.gpu(m.gpu)), gpu_memory_utilization=0.92) for m in ms]
    return summarize(moved, [predict(m, profile, catalog) for m in moved])


def coverage(ms: list[Measurement], catalog: Catalog) -> dict[str, dict[str, int]]:
    """Rows per GPU family, GPU, model and weight/KV dtype pair: what the profile's evidence covers (the planner
    marks plans on a covered family as measured; ``recommender.search.recommend_rows.measured_rows``)."""
    out: dict[str, dict[str, int]] = {"families": {}, "gpus": {}, "models": {}, "dtypes": {}}
    for m in ms:
        for key, value in (("families", catalog.gpu(m.gpu).arch), ("gpus", m.gpu), ("models", m.model),
                           ("dtypes", f"{m.weight_dtype}/{m.kv_dtype}")):
            out[key][value] = out[key].get(value, 0) + 1
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def select_engine(ms: tuple[Measurement, ...], engine: str) -> tuple[list[Measurement], list[Skip]]:
    """Rows of ``engine``; rows of other engines are skipped (a fit on one engine is no claim about another)."""
    keep = [m for m in ms if m.engine == engine]
    skip = measurement_skips((m for m in ms if m.engine != engine),
                             lambda m: f"engine {m.engine!r} is not the one calibrated ({engine!r})")
    return keep, skip


def held_in_memory(ms: list[Measurement], start: EngineProfile, cat: Catalog) -> tuple[list[Measurement], list[Skip]]:
    """Rows whose weights fit their GPUs, and skips for the others: a run whose stated layout cannot even hold the
    weights (DeepSeek-V3 on one H200: 673 GB on 151) has no figures to predict, and fitted it would pull every parameter
    toward nonsense; its stated layout or dtype is wrong, not the run. (Only the weights against the GPU's memory: the
    reserves are vLLM's, and gpt-fast ran Llama-3.1-70B int8 on one A100 80GB, 1.2 GB inside what they leave.)"""
    keep: list[Measurement] = []
    out: list[Measurement] = []
    why: dict[str, str] = {}
    for m in ms:
        mem = deployment(m, start, cat).memory()
        if mem.weights_bytes_per_gpu <= mem.memory_bytes_per_gpu:
            keep.append(m)
            continue
        out.append(m)
        why[m.id] = (f"{m.model} ({m.weight_dtype}) does not fit {m.tp * m.dp} x {m.gpu}: its weights take "
                     f"{mem.weights_bytes_per_gpu / 1e9:.1f} GB per GPU of {mem.memory_bytes_per_gpu / 1e9:.1f}; check the "
                     "run's tp / data_parallel_size and weight dtype")
    return keep, measurement_skips(out, lambda m: why[m.id])


@dataclass(frozen=True)
class UserFit:
    """What :func:`fit_user_rows` decided: the fit, its k-fold check and whether it replaced the start profile."""

    result: FitResult
    check: HeldOut | None      # k-fold by configuration (by row for one configuration) on the user's rows
    kept: bool                 # False: held out, the fit was no better than the start profile, which is kept
    base: EngineProfile        # the start profile specialised to the rows' GPU family
    opts: FitOptions = FitOptions()
    families: tuple[FamilyReport, ...] = ()


def user_base(ms: list[Measurement], start: EngineProfile) -> EngineProfile:
    """The start profile as the user's rows see it: with their GPU family's parameters where all rows share one
    family (an MI300X user starts from the ``cdna3`` fit, not the NVIDIA-fitted engine values), and the family's
    override for their model (and the terms the start borrows for it) where all rows are of one model; the start's
    other families stay, for other GPUs."""
    fams = {m.group("family") for m in ms}
    if len(fams) != 1:
        return start
    models = {m.model for m in ms}
    spec = start.for_gpu(ms[0].gpu, ms[0].model if len(models) == 1 else "")
    if len(models) == 1:
        # the terms the start borrows for this model (vLLM: SGLang's DeepSeek experts) are lifted with the rest; the
        # rule would otherwise lend them again over whatever the fit tries (its parameters showed "no effect")
        spec = spec.replace(borrow_model_terms=None)
    return spec.replace(family="", families=tuple(f for f in start.families if f.family != spec.family))


#: The routed experts' terms a calibration of one MoE model's rows fits by default (:func:`parameters_for`).
MOE_DEFAULT = ("moe_layer_overhead_s", "expert_bandwidth_efficiency")
#: What a user's set-up owns rather than the engine's physics (their API server, tokeniser, client): fitted
#: freely from the start value, not pulled back toward it.
UNANCHORED = ("request_overhead_s",)


def anchor_width(ms: list[Measurement]) -> float:
    """Relative width of the anchor to the start profile (rows of two or more configurations):
    :func:`~recommender.calibrate.fit.family_sigma` of the rows, shrunk by ``sqrt(configurations / 4)`` below four
    configurations (rows of few configurations tell little about others: bandwidth, overheads and collectives
    trade off within one). Rows of one configuration are fitted unanchored: that configuration is what the user
    measured, and the robust data term cannot outweigh a quadratic anchor (a fit of 9 rows of one H100 run moved
    its error 28.8 -> 28.6% anchored, to about 2% free)."""
    n_cfg = len({m.group("config") for m in ms})
    return family_sigma(len(ms)) * min(1.0, (n_cfg / 4.0) ** 0.5)


def check_by(ms: list[Measurement]) -> str:
    """The k-fold of the generalisation check: whole configurations, or rows when there is only one."""
    return "config" if len({m.group("config") for m in ms}) >= 2 else "row"


def fit_user_rows(ms: list[Measurement], start: EngineProfile, parameters: tuple[str, ...] = FIT_PARAMETERS,
                  catalog: Catalog | None = None, check: bool = True) -> UserFit:
    """The profile ``recommend calibrate`` writes for these rows.

    The fit starts from :func:`user_base` and, over two or more configurations, is anchored to it
    (``FitOptions.prior``, relative width :func:`anchor_width`: few rows or configurations move it little). It replaces
    the start profile only if it generalises: k-fold by configuration over the user's rows (every
    configuration predicted by a fit that did not see it) must give a lower median error than the start
    profile on the same rows. Rows spanning GPU families then get per-family fits (kept only where they help
    held out). A kept fit of rows of one GPU family is written into that family's block (:func:`family_scoped`;
    ``result.scope_gpu``), of rows of one configuration as the family's override for that model
    (:func:`model_scoped`; ``result.scope_model``), not as the profile's own values. Without ``check`` the fit is
    kept unconditionally."""
    cat = catalog or default_catalog()
    fams = sorted({m.group("family") for m in ms})
    if len(fams) >= 2:
        return _fit_per_family(ms, start, parameters, cat, fams, check)
    base = user_base(ms, start)
    one_config = len({m.group("config") for m in ms}) < 2
    opts = FitOptions(parameters=tuple(parameters), prior=None if one_config else base.replace(families=()),
                      prior_sigma=anchor_width(ms), unanchored=UNANCHORED)
    res = fit_profile(ms, base, opts, cat, engine=start.engine)
    h: HeldOut | None = None
    kept = True
    if check and len(ms) >= 4:
        try:
            h = held_out(ms, base, by=check_by(ms), opts=opts, catalog=cat, max_folds=KFOLD)
        except CalibrationError:
            h = None
        if h is not None and not h.after["all"].median_ape < h.before["all"].median_ape:
            kept = False
            res = dataclasses.replace(res, profile=base.replace(engine=start.engine, source=res.profile.source),
                                      fitted=(), after=res.before, after_by_source=res.before_by_source)
    res = dataclasses.replace(res, profile=res.profile.replace(families=base.families))
    if gpu_family(ms[0].gpu):
        # a kept fit is the family's (rows of one configuration: the model's override); without one the start stays
        # exactly as it was (``base`` lifts the family's and the model's values to the engine level, which the
        # other families and models would read)
        if not (kept and res.fitted):
            prof = start.replace(source=res.profile.source)
        else:
            prof = model_scoped(ms, start, res) if one_config else family_scoped(ms, start, res)
        experts = not one_config and kept and any(n in MOE_PARAMETERS for n in res.fitted)
        res = dataclasses.replace(res, profile=prof, scope_gpu=ms[0].gpu, scope_model=ms[0].model if one_config else "",
                                  experts_model=ms[0].model if experts else "")
    return UserFit(result=res, check=h, kept=kept, base=base, opts=opts)


def model_scoped(ms: list[Measurement], start: EngineProfile, res: FitResult) -> EngineProfile:
    """The start profile with ``res``'s fitted parameters written as its GPU family's override for the rows' one
    model (:class:`~recommender.profiles.ModelFit`), replacing an earlier one for that model; everything else stays
    the start's. Rows of one configuration fit bandwidth, per-step overhead and collectives as a trade-off that holds
    for what was measured: applied to the engine's other models they made them worse (``benchmarks/bench_accuracy.py``,
    the user's case: LMDeploy 10.3 -> 15.1%, vLLM 26.9 -> 24.8% median but p90 35.4 -> 42.0%)."""
    fam = gpu_family(ms[0].gpu)
    values = {n: float(getattr(res.profile, n)) for n in res.fitted}
    mf = ModelFit(ms[0].model, len(ms), tuple(sorted(values.items())),
                  f"recommend calibrate: {len(ms)} rows of one configuration ({ms[0].group('config')})")
    old = _family_block(start, fam)
    block = dataclasses.replace(old, models=tuple(sorted((*(m for m in old.models if m.model != mf.model), mf),
                                                         key=lambda m: m.model)))
    return _with_block(start, block, res)


def _family_block(start: EngineProfile, fam: str) -> FamilyFit:
    """``start``'s block for GPU family ``fam``, or an empty one."""
    return next((f for f in start.families if f.family == fam), None) or FamilyFit(fam, 0, ())


def _with_block(start: EngineProfile, block: FamilyFit, res: FitResult) -> EngineProfile:
    """``start`` with ``block`` in place of its family's block (families in name order), and ``res``'s source and
    fit record."""
    fams = {f.family: f for f in start.families} | {block.family: block}
    return start.replace(families=tuple(fams[k] for k in sorted(fams)), source=res.profile.source, fit=res.profile.fit)


def family_scoped(ms: list[Measurement], start: EngineProfile, res: FitResult) -> EngineProfile:
    """The start profile with ``res``'s fitted parameters written into the block of the rows' one GPU family
    (rows of two or more configurations); the engine-level values, the other families and this family's other
    parameters, release epochs and evidence stay the start's. A model the rows measured loses its override where the
    fit saw it without one (rows of several models: ``user_base`` applies none) and keeps only the parameters
    not fitted where the fit saw it with one (rows of one model); other models keep theirs. Written as the
    engine's own values, a fit of MI300X rows would have become every family's without a block of its own."""
    fam = gpu_family(ms[0].gpu)
    fitted = {n: float(getattr(res.profile, n)) for n in res.fitted}
    values = {n: v for n, v in fitted.items() if n not in MOE_PARAMETERS}
    experts = {n: v for n, v in fitted.items() if n in MOE_PARAMETERS}   # one MoE model's (calibrate's rule)
    measured = {m.model for m in ms}
    old = _family_block(start, fam)
    models: list[ModelFit] = []
    n_cfg = len({m.group("config") for m in ms})
    for mf in old.models:
        left = tuple((k, v) for k, v in mf.parameters if k not in fitted)
        if mf.model not in measured:
            models.append(mf)
        elif len(measured) == 1 and left and not experts:
            models.append(dataclasses.replace(mf, parameters=left))
    if experts:
        (model,) = measured
        kept = dict(mf.parameters) if (mf := old.model_fit(model)) is not None else {}
        kept = {k: v for k, v in kept.items() if k not in fitted} | experts
        models.append(ModelFit(model, len(ms), tuple(sorted(kept.items())),
                               f"recommend calibrate: the routed experts' terms, {len(ms)} rows of {n_cfg} configurations"))
    block = dataclasses.replace(
        old, rows=len(ms), parameters=tuple(sorted({**dict(old.parameters), **values}.items())),
        models=tuple(sorted(models, key=lambda m: m.model)),
        source=f"recommend calibrate: {len(ms)} {fam} rows of {n_cfg} configurations")
    return _with_block(start, block, res)


def _fit_per_family(ms: list[Measurement], start: EngineProfile, parameters: tuple[str, ...], cat: Catalog,
                    fams: list[str], check: bool) -> UserFit:
    """Rows spanning GPU families: each family is calibrated on its own rows as above (from its own start
    values, anchored, kept only if its k-fold check beats them) and written as that family's override; the
    engine-level parameters stay the start profile's (a fit on H100 rows is no claim about an MI300X)."""
    by_family = {f.family: f for f in start.families}
    reports: list[FamilyReport] = []
    fits: list[FitResult] = []
    for fam in fams:
        rows = [m for m in ms if m.group("family") == fam]
        uf = fit_user_rows(rows, start, parameters, cat, check)
        fits.append(uf.result)
        eng = uf.check.before["all"] if uf.check is not None else None
        got = uf.check.after["all"] if uf.check is not None else None
        fitted = {n: float(getattr(uf.result.values, n)) for n in uf.result.fitted}
        reports.append(FamilyReport(fam, len(rows), family_sigma(len(rows)), f"{uf.check.folds} by {uf.check.by}"
                                    if uf.check is not None else "-", eng, got, fitted, uf.kept and bool(fitted),
                                    "" if uf.kept else "held out, the fit is no better than the start profile"))
        if uf.kept and fitted and fam:   # the family's block as fit_user_rows wrote it (one configuration: the model's)
            block = next(f for f in uf.result.profile.families if f.family == fam)
            if not uf.result.scope_model and got and eng:
                block = dataclasses.replace(block, source=f"recommend calibrate: {len(rows)} {fam} rows; held out "
                                            f"{got.median_ape:.1f}% vs the start profile's {eng.median_ape:.1f}%")
            by_family[fam] = block
    prof = start.replace(families=tuple(by_family[k] for k in sorted(by_family)))
    whole = fit_profile(ms, start, FitOptions(parameters=()), cat, engine=start.engine)   # before-errors only
    after = [predict(m, prof, cat) for m in ms]
    before = [predict(m, start, cat) for m in ms]
    res = dataclasses.replace(whole, profile=prof, fitted=tuple(sorted({n for f in fits for n in f.fitted})),
                              before=summarize(ms, before), before_by_source=summarize(ms, before, "source"),
                              after=summarize(ms, after), after_by_source=summarize(ms, after, "source"))
    return UserFit(result=res, check=None, kept=any(r.kept for r in reports), base=start, families=tuple(reports))


def start_evidence(start: EngineProfile, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The start profile's held-out evidence (``fit.held_out_by_config``) for the GPU families this calibration left
    as they were: every family its rows do not cover, and the scope's family where the fit is one model's
    override (its other models keep the start's values). Without it a plan on an untouched family (vLLM's B200,
    4 rows) read as unmeasured and ranked below measured ones."""
    block = (start.fit or {}).get("held_out_by_config")
    if not isinstance(block, Mapping) or not isinstance(block.get("by_family"), Mapping):
        return {}
    scope = extra.get("scope") or {}
    touched = set((extra.get("coverage") or {}).get("families") or ())
    if scope.get("model"):   # one model's override: the family's other models keep the start's values
        touched.discard(scope.get("family"))
    kept = {f: v for f, v in block["by_family"].items() if f not in touched}
    if not kept:
        return {}
    return {"by": block.get("by"), "source": f"the start profile ({start.source or start.engine})", "by_family": kept}


def evidence_classes(ms: list[Measurement], h: HeldOut | None, cat: Catalog) -> list[dict[str, Any]]:
    """The ``fit.classes`` of a kept fit: per evidence class of the user's rows (engine x GPU family x weight dtype x
    model class), the rows and the median of their held-out errors in ``h`` (the report's: each group, by default
    each results file, predicted by a fit that did not see it). Plans and estimates with this profile take their
    bands from it (``recommender.search.bands``) instead of the shipped profile's classes, whose errors were
    measured for values this fit replaced; [] without per-row held-out errors. For a fit of one GPU family (the
    caller's rule: rows of several get per-family fits, kept or not, that one held-out figure does not describe)."""
    if h is None or not h.row_apes:
        return []
    by_id = {m.id: m for m in ms}
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for rid, err in zip(h.row_ids, h.row_apes):
        m = by_id[rid]
        key = (m.engine, m.group("family"), m.weight_dtype, "moe" if cat.model(m.model).is_moe else "dense")
        groups.setdefault(key, []).append(err)
    return [{"engine": e, "family": f, "dtype": d, "model_class": c, "rows": len(v),
             "held_out": {"median_ape_pct": round(error_stats(v).median_ape, 2), "by": h.by}}
            for (e, f, d, c), v in sorted(groups.items()) if f]


def parameters_for(ms: list[Measurement], asked: tuple[str, ...] | None, cat: Catalog) -> tuple[str, ...]:
    """The parameters a calibration fits: ``asked`` (``--parameters``), else :data:`FIT_PARAMETERS`; with rows of one
    MoE model, :data:`MOE_DEFAULT` (its routed experts' decode terms, written as that model's: :func:`family_scoped`)
    and the user's own request overhead instead. Rows of one model cannot tell a per-MoE-layer time from a per-step
    one, nor the experts' bandwidth from the dense weights' (DeepSeek-V3's weights are 96% experts): fitted as the
    engine's ``step_overhead_s`` and ``hbm_bandwidth_efficiency``, a MoE model's costs became every dense model's on
    the family (``benchmarks/calibrate_moe.py``: hbm_bandwidth_efficiency 0.50-0.53 written for B200).
    ``expert_compute_efficiency`` is fitted only when asked: the prompts of a user's runs seldom pin it, and fitted on
    1k-token prompts it put H200 8k:1k TTFT 16% -> 81% off. Rows of several MoE models (and no dense one) fit the
    request overhead alone: their experts' terms are each model's (calibrate one model's rows at a time), and their
    dense parameters fitted family-wide moved dense models (a DeepSeek-V3 + Qwen3-30B-A3B fit wrote Hopper's
    bandwidth). Naming the experts' terms for rows of several models is refused: one value for experts that differ."""
    models = sorted({m.model for m in ms})
    one_moe = len(models) == 1 and cat.model(models[0]).is_moe
    if asked is None:
        if one_moe:
            return MOE_DEFAULT + UNANCHORED
        # rows of MoE models only: nothing in them is a dense model's physics either; the user's front end is theirs
        return UNANCHORED if all(cat.model(m).is_moe for m in models) else FIT_PARAMETERS
    experts = [p for p in asked if p in MOE_PARAMETERS]
    if experts and not one_moe:
        raise CalibrationError(f"--parameters: {', '.join(experts)} are one MoE model's terms and the rows are of "
                               f"{', '.join(models)}; calibrate them on rows of one MoE model")
    return asked


def calibrate(req: CalibrateRequest, catalog: Catalog | None = None) -> CalibrationRun:
    """Read ``req.results``, fit the engine's profile, add held-out error, write ``req.out`` atomically."""
    cat = catalog or default_catalog()
    if req.held_out_by not in HELD_OUT_KEYS:
        raise CalibrationError(f"--held-out-by {req.held_out_by!r}: one of {', '.join(HELD_OUT_KEYS)}")
    fittable = FIT_PARAMETERS + SHAPE_PARAMETERS + MOE_PARAMETERS
    bad = [p for p in req.parameters or () if p not in fittable]
    if bad:
        raise CalibrationError(f"--parameters: {', '.join(bad)} cannot be fitted; fittable: {', '.join(fittable)}")
    start = resolve_profile(req.engine, req.profile_file)
    defaults = dict(req.defaults)
    defaults.setdefault("engine_default", req.engine)
    read = read_results(req.results, defaults, cat)
    ms, other = select_engine(read.measurements, req.engine)
    ms, unheld = held_in_memory(ms, start, cat)
    skipped = tuple(read.skipped) + tuple(other) + tuple(unheld)
    if not ms:
        engines = sorted({m.engine for m in read.measurements})
        raise CalibrationError(f"no measurements of engine {req.engine!r} in {', '.join(read.files)} "
                               f"(found: {', '.join(engines) or 'none'}); pass --engine")
    params = parameters_for(ms, req.parameters, cat)
    used = {file_of(m) for m in ms}   # fit.data: the files that gave rows (the others are under fit.skipped)
    files = tuple(f for f in read.files if f in used)
    name = Path(req.out).stem
    by = "file" if req.held_out_by == "file" else req.held_out_by
    groups = {m.group(by) for m in ms}
    if len(groups) < 2 and len(ms) >= 2 * KFOLD:
        by = "row"   # one source: k-fold over rows instead of leaving a source out
    with progress.bar(f"calibrate: fit on {len(ms)} rows", total=2, unit="stage") as bar:
        bar.set_postfix_str(f"fit, checked {min(KFOLD, len({m.group(check_by(ms)) for m in ms}))}-fold by {check_by(ms)}")
        uf = fit_user_rows(ms, start, tuple(params), cat)
        src = f"recommend calibrate: {len(ms)} measurements from {', '.join(Path(f).name for f in files)}"
        if not uf.kept:
            src += " (the fit did not beat the start profile held out: the start profile's values are kept)"
        res = dataclasses.replace(uf.result, profile=uf.result.profile.replace(source=src))
        bar.update(1)
        bar.set_postfix_str(f"held-out, {min(KFOLD, len(groups))} folds by {by}")
        if uf.check is not None and by == check_by(ms):
            res = res.with_held_out(uf.check)
        else:
            try:
                res = res.with_held_out(held_out(ms, uf.base, by=by, opts=uf.opts, catalog=cat, max_folds=KFOLD))
            except CalibrationError:
                pass
        bar.update(1)
    fam_reports = list(uf.families)
    planner = planner_conditions_error(ms, res.profile, cat)
    extra: dict[str, Any] = {"start_profile": start.source or start.engine}
    if uf.check is not None:
        extra["generalisation_check"] = {
            "by": check_by(ms), "folds": uf.check.folds, "kept": uf.kept,
            "start_median_ape_pct": round(uf.check.before["all"].median_ape, 2),
            "fit_median_ape_pct": round(uf.check.after["all"].median_ape, 2)}
    extra |= {"error_under_planner_conditions": {k: v.to_dict() for k, v in planner.items()},
              "coverage": coverage(ms, cat)}
    if res.fitted and res.scope_gpu:   # where the fit was written: a plan elsewhere predicts with the start's values
        extra["scope"] = {"family": gpu_family(res.scope_gpu), **({"model": res.scope_model} if res.scope_model else {})}
    carried = start_evidence(start, extra)
    if carried:
        extra["held_out_by_config"] = carried
    shown = res.held_out[-1] if res.held_out else uf.check   # the held-out error the report prints
    # one GPU family (uf.check): rows of several get per-family fits, kept or not, that one report does not describe
    classes = evidence_classes(ms, shown, cat) if res.fitted and uf.kept and uf.check is not None else []
    if classes:
        extra["classes"] = classes
    doc = profile_document(res.profile, fit_summary(res, files, skipped, extra))
    header = (f"Engine profile {name!r} written by `recommend calibrate` ({req.engine}).\n"
              "Use it with --profile on estimate, the recommender and replan.")
    path = write_profile(req.out, doc, header)
    return CalibrationRun(result=res, files=files, skipped=skipped, out=path, conditions=row_conditions(ms),
                          planner_error=planner, families=tuple(fam_reports), classes=tuple(classes), extra=extra)


__all__ = ["CalibrateRequest", "CalibrationRun", "calibrate", "fit_user_rows", "UserFit", "user_base", "select_engine", "HELD_OUT_KEYS"]
