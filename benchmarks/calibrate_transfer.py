"""Does a calibration on one configuration carry to the engine's other configurations on the same GPU family?

    python3 benchmarks/calibrate_transfer.py [--out FILE.md] [--engines trtllm,lmdeploy,vllm]

``recommend calibrate`` writes a fit of one configuration (one model, GPU and TP) as that model's override only
(``recommender.calibrate.api.model_scoped``): the other models keep the start profile's values. This script
measures the alternative it was chosen over, at every strength: the same fit written into the GPU family's block
(so every model on that family reads it), moved a fraction ``w`` of the way from the start values,

    v_family = v_start_family + w * (v_fit - v_start_as_fitted)        (clipped to the parameter's bounds)

``w = 0`` is what ships (other models unchanged), ``w = 1`` the fit written family-wide as it came.

The splits are ``benchmarks/bench_accuracy.py``'s user's case, without leakage: per engine the configurations
are dealt into four folds; for every ordered pair of folds (test, train) the start profile is the
``fit_profiles.py`` pipeline fitted on the two other folds, each configuration of the train fold is
calibrated alone (``fit_user_rows``, the check off: every fit is written), and scored on the test fold's
configurations of the same GPU family (a fit on one family is never applied to another). Neither the start
nor the calibration saw those rows. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_accuracy as ba  # noqa: E402
import fit_profiles as fp  # noqa: E402

from recommender.calibrate.api import UserFit, family_scoped, fit_user_rows  # noqa: E402
from recommender.calibrate.fit import ape  # noqa: E402
from recommender.calibrate.measurements import Measurement, predict  # noqa: E402
from recommender.profiles import BOUNDS, EngineProfile  # noqa: E402

#: Fractions of the one-configuration fit written into the family's block (0: the shipped behaviour).
WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class Split:
    """One configuration's calibration scored on the test fold's configurations of its family."""

    train: str
    test_rows: int
    start_median: float                  # median APE % of the start profile on the test rows
    median_by_weight: dict[float, float]  # median APE % with the fit written family-wide at strength w


def family_written(train: list[Measurement], start: EngineProfile, uf: UserFit, w: float) -> EngineProfile:
    """``start`` with ``uf`` (the unchecked calibration of ``train``, one configuration) written into the family's
    block at strength ``w``."""
    res = uf.result
    family = start.for_gpu(train[0].gpu, "")
    values = {}
    for n in res.fitted:
        lo, hi = BOUNDS[n]
        v = float(getattr(family, n)) + w * (float(getattr(res.values, n)) - float(getattr(uf.base, n)))
        values[n] = min(hi, max(lo, v))
    return family_scoped(train, start, dataclasses.replace(res, profile=res.profile.replace(**values)))


def _median_ape(ms: Sequence[Measurement], profile: EngineProfile) -> float:
    return statistics.median(ape(predict(m, profile), m.value) for m in ms)


def engine_splits(engine: str, pub: list[Measurement], amd: list[Measurement], prior: EngineProfile | None) -> list[Split]:
    """Every (test fold, train configuration) split of ``engine``'s rows (see the module docstring)."""
    out: list[Split] = []
    for both, test_fold, train_fold, start in ba.user_case_splits(engine, pub, amd, prior):
        for cfg in train_fold:
            train = [m for m in both if m.group("config") == cfg]
            test = [m for m in both if m.group("config") in test_fold and m.group("family") == train[0].group("family")]
            if not test:
                continue
            uf = fit_user_rows(train, start, check=False)
            if not uf.result.fitted:
                continue
            by_w = {w: _median_ape(test, family_written(train, start, uf, w)) for w in WEIGHTS}
            out.append(Split(cfg, len(test), _median_ape(test, start), by_w))
    return out


def table(rows: dict[str, list[Split]]) -> list[str]:
    """Per engine and strength: mean over splits of the test rows' median error, and splits lower / higher."""
    lines = ["| rows of | splits | w | start: mean of medians % | calibrated: mean of medians % | splits lower | splits higher |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for engine, splits in rows.items():
        if not splits:
            continue
        start = statistics.mean(s.start_median for s in splits)
        for w in WEIGHTS:
            cal = [s.median_by_weight[w] for s in splits]
            lower = sum(c < s.start_median - 1e-9 for c, s in zip(cal, splits))
            higher = sum(c > s.start_median + 1e-9 for c, s in zip(cal, splits))
            lines.append(f"| {engine} | {len(splits)} | {w:g} | {start:.2f} | {statistics.mean(cal):.2f} | {lower} | {higher} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    ap.add_argument("--engines", default="trtllm,lmdeploy,vllm")
    args = ap.parse_args(argv)
    t0 = time.time()
    pub, amd = ba.read_rows()
    prior = fp.fit_pipeline("trtllm", [m for m in pub if m.engine == "trtllm"], [], None, families=False)
    rows: dict[str, list[Split]] = {}
    for engine in args.engines.split(","):
        rows[engine] = engine_splits(engine, pub, amd, prior if engine == "vllm" else None)
        print(f"  {engine}: {len(rows[engine])} splits ({time.time() - t0:.0f}s)", file=sys.stderr)
    text: list[Any] = [
        "# One configuration's calibration written family-wide: does it carry?", "",
        f"Generated by `python3 benchmarks/calibrate_transfer.py` in {time.time() - t0:.0f} s (module docstring: the "
        "splits). A split is one configuration calibrated alone and scored on other configurations of its GPU family "
        "that neither it nor its start profile saw; w is the fraction of the fit written into the family's block "
        "(0: what `recommend calibrate` does, the fit is that model's override only).", "", *table(rows), ""]
    report = "\n".join(text)
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
