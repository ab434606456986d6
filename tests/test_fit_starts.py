"""The engine fits of ``benchmarks/fit_profiles.py`` start from two GEMM efficiencies and keep the lower objective.

From the provisional start alone (compute efficiency 0.55) TensorRT-LLM's 356 published rows (published.csv:
TRT017 = TensorRT-LLM 0.17 perf overview, TRT061, TRTBLOG) stopped in a local minimum with twice the error of the
shipped fit, so the held-out figures of every benchmark that runs the pipeline were those of a worse fit.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from bench_module import benchmark

from recommender.calibrate.fit import FitOptions, fit_profile
from recommender.calibrate.measurements import predict
from recommender.calibrate.readers import read_published_csv

DATA = Path(__file__).resolve().parent / "data" / "measurements"


def _median_ape(ms, prof) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(abs(predict(m, prof) / m.value - 1.0) * 100.0 for m in ms)


@pytest.mark.slow  # about 25 s on 2 cores: two fits of 356 rows, and a third from one start
def test_the_trtllm_fit_keeps_the_start_with_the_lower_objective() -> None:
    fp = benchmark("fit_profiles")
    ms = [m for m in read_published_csv(DATA / "published.csv").measurements if m.engine == "trtllm"]
    assert len(ms) == 356
    opts = FitOptions(parameters=fp.ENGINE_PARAMETERS)
    best = fp.fit_engine_rows("trtllm", ms, opts)
    one = fit_profile(ms, fp.fit_start("trtllm"), opts, engine="trtllm")
    assert math.isfinite(best.cost) and best.cost < one.cost
    # the provisional start alone: 11.2% median (2026-12-06); both starts: 6.75%, as the shipped profile (6.6%)
    assert _median_ape(ms, best.profile) < 7.5 < 10.0 < _median_ape(ms, one.profile)
    assert best.start.compute_efficiency == 0.8 and best.profile.compute_efficiency > 0.7


def test_the_objective_belongs_to_the_solution_not_the_start() -> None:
    ms = [m for m in read_published_csv(DATA / "published.csv").measurements if m.engine == "lmdeploy"][:30]
    fp = benchmark("fit_profiles")
    opts = FitOptions(parameters=("hbm_bandwidth_efficiency",))
    lo, hi = (fit_profile(ms, fp.fit_start("lmdeploy").replace(hbm_bandwidth_efficiency=h), opts, engine="lmdeploy")
              for h in (0.5, 0.95))
    assert lo.profile.hbm_bandwidth_efficiency == pytest.approx(hi.profile.hbm_bandwidth_efficiency, rel=1e-3)
    assert lo.cost == pytest.approx(hi.cost, rel=1e-3) and lo.cost > 0.0
    nothing = fit_profile(ms, fp.fit_start("lmdeploy"), FitOptions(parameters=()), engine="lmdeploy")
    assert math.isnan(nothing.cost)                     # nothing fitted: no objective
