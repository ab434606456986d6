"""The library side of ``recommend calibrate``: read results, fit, estimate held-out error, write the profile."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from recommender import progress
from recommender.calibrate.fit import (ErrorStats, FamilyReport, FitOptions, FitResult, fit_families, fit_profile,
                                       held_out, summarize)
from recommender.calibrate.measurements import Measurement, Skip, predict
from recommender.calibrate.readers import read_results
from recommender.calibrate.report import fit_summary, profile_document, write_profile
from recommender.catalog import Catalog, default_catalog
from recommender.errors import CalibrationError
from recommender.perf.step import default_limits
from recommender.profiles import FIT_PARAMETERS, SHAPE_PARAMETERS, EngineProfile, resolve_profile

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


def row_conditions(ms: list[Measurement], limit: int = 6) -> tuple[str, ...]:
    """Distinct engine conditions of the rows, one line each (what each row was predicted under)."""
    seen: dict[str, int] = {}
    for m in ms:
        lim = m.limits
        key = (f"{m.engine} on {m.tp} x {m.gpu}: max_num_seqs {lim.max_num_seqs}, max_num_batched_tokens "
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
    skip = [Skip(m.id, f"engine {m.engine!r} is not the one calibrated ({engine!r})") for m in ms if m.engine != engine]
    return keep, skip


def calibrate(req: CalibrateRequest, catalog: Catalog | None = None) -> CalibrationRun:
    """Read ``req.results``, fit the engine's profile, add held-out error, write ``req.out`` atomically."""
    cat = catalog or default_catalog()
    if req.held_out_by not in HELD_OUT_KEYS:
        raise CalibrationError(f"--held-out-by {req.held_out_by!r}: one of {', '.join(HELD_OUT_KEYS)}")
    params = req.parameters or FIT_PARAMETERS
    fittable = FIT_PARAMETERS + SHAPE_PARAMETERS
    bad = [p for p in params if p not in fittable]
    if bad:
        raise CalibrationError(f"--parameters: {', '.join(bad)} cannot be fitted; fittable: {', '.join(fittable)}")
    start = resolve_profile(req.engine, req.profile_file)
    defaults = dict(req.defaults)
    defaults.setdefault("engine_default", req.engine)
    read = read_results(req.results, defaults, cat)
    ms, other = select_engine(read.measurements, req.engine)
    skipped = tuple(read.skipped) + tuple(other)
    if not ms:
        engines = sorted({m.engine for m in read.measurements})
        raise CalibrationError(f"no measurements of engine {req.engine!r} in {', '.join(read.files)} "
                               f"(found: {', '.join(engines) or 'none'}); pass --engine")
    opts = FitOptions(parameters=tuple(params))
    name = Path(req.out).stem
    by = "file" if req.held_out_by == "file" else req.held_out_by
    groups = {m.group(by) for m in ms}
    if len(groups) < 2 and len(ms) >= 2 * KFOLD:
        by = "row"   # one source: k-fold over rows instead of leaving a source out
    spans_families = len({m.group("family") for m in ms}) >= 2
    with progress.bar(f"calibrate: fit on {len(ms)} rows", total=3 if spans_families else 2, unit="stage") as bar:
        res = fit_profile(ms, start, opts, cat, engine=req.engine,
                          source=f"recommend calibrate: {len(ms)} measurements from {', '.join(Path(f).name for f in read.files)}")
        bar.update(1)
        bar.set_postfix_str(f"held-out, {min(KFOLD, len({m.group(by) for m in ms}))} folds by {by}")
        try:
            res = res.with_held_out(held_out(ms, start, by=by, opts=opts, catalog=cat, max_folds=KFOLD))
        except CalibrationError:
            pass
        bar.update(1)
        fam_reports: list[FamilyReport] = []
        if spans_families:
            bar.set_postfix_str("per-GPU-family fits")
            fam_prof, fam_reports = fit_families(ms, res.profile, catalog=cat)
            res = dataclasses.replace(res, profile=fam_prof)
            bar.update(1)
    planner = planner_conditions_error(ms, res.profile, cat)
    extra = {"start_profile": start.source or start.engine,
             "error_under_planner_conditions": {k: v.to_dict() for k, v in planner.items()},
             "coverage": coverage(ms, cat)}
    doc = profile_document(res.profile, fit_summary(res, read.files, skipped, extra))
    header = (f"Engine profile {name!r} written by `recommend calibrate` ({req.engine}).\n"
              "Use it with --profile on estimate, the recommender and replan.")
    path = write_profile(req.out, doc, header)
    return CalibrationRun(result=res, files=read.files, skipped=skipped, out=path, conditions=row_conditions(ms),
                          planner_error=planner, families=tuple(fam_reports))


__all__ = ["CalibrateRequest", "CalibrationRun", "calibrate", "select_engine", "HELD_OUT_KEYS"]
