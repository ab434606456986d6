"""The library side of ``recommend calibrate``: read results, fit, estimate held-out error, write the profile."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from recommender import progress
from recommender.calibrate.fit import FitOptions, FitResult, fit_profile, held_out
from recommender.calibrate.measurements import Measurement, Skip
from recommender.calibrate.readers import read_results
from recommender.calibrate.report import fit_summary, profile_document, write_profile
from recommender.catalog import Catalog, default_catalog
from recommender.errors import CalibrationError
from recommender.profiles import FIT_PARAMETERS, resolve_profile

HELD_OUT_KEYS = ("source", "file", "model", "gpu", "config", "quantity")


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
    bad = [p for p in params if p not in FIT_PARAMETERS]
    if bad:
        raise CalibrationError(f"--parameters: {', '.join(bad)} cannot be fitted; fittable: {', '.join(FIT_PARAMETERS)}")
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
    with progress.bar(f"calibrate: fit on {len(ms)} rows", total=2 if len(groups) >= 2 else 1, unit="stage") as bar:
        res = fit_profile(ms, start, opts, cat, engine=req.engine,
                          source=f"recommend calibrate: {len(ms)} measurements from {', '.join(Path(f).name for f in read.files)}")
        bar.update(1)
        if len(groups) >= 2:
            bar.set_postfix_str(f"held-out, {len(groups)} folds by {by}")
            try:
                res = res.with_held_out(held_out(ms, start, by=by, opts=opts, catalog=cat))
            except CalibrationError:
                pass
            bar.update(1)
    doc = profile_document(res.profile, fit_summary(res, read.files, skipped, {"start_profile": start.source or start.engine}))
    header = (f"Engine profile {name!r} written by `recommend calibrate` ({req.engine}).\n"
              "Use it with --profile on estimate, the recommender and replan.")
    path = write_profile(req.out, doc, header)
    return CalibrationRun(result=res, files=read.files, skipped=skipped, out=path)


__all__ = ["CalibrateRequest", "CalibrationRun", "calibrate", "select_engine", "HELD_OUT_KEYS"]
