"""Stage A's loss in ``benchmarks/fit_inferencex.py``: Huber on the log error, configurations as random effects."""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from bench_module import benchmark

ROOT = Path(__file__).resolve().parents[1]


def _fx():
    return benchmark("fit_inferencex")


def _cases(fx, spec: list[tuple[str, int, float]]):
    """Cases of made-up configurations: (configuration label, concurrency, measured TPOT s) each, from one real row."""
    bx = fx.bx
    base = next(c for c in bx.single_node_cases(bx.DEFAULT_CSV) if "tpot" in c.measured)
    out = []
    for label, conc, tpot in spec:
        row = {**base.row, "isl": label}   # the label makes its own configuration (Case.config reads isl)
        out.append(dataclasses.replace(base, row=row, conc=conc, measured={"tpot": tpot}))
    return out


def test_huber_is_quadratic_inside_delta_and_linear_beyond():
    fx = _fx()
    d = fx.HUBER_LOG_DELTA
    assert fx.huber(0.1) == pytest.approx(0.01)
    assert fx.huber(-0.1) == pytest.approx(0.01)
    assert fx.huber(d) == pytest.approx(d * d)
    # beyond delta each further unit of log error costs 2 delta: 0.5 -> 1.0 adds 0.16
    assert fx.huber(1.0) - fx.huber(0.5) == pytest.approx(2 * d * 0.5)
    assert fx.huber(0.5) == pytest.approx(2 * 0.16 * 0.5 - 0.16**2)  # 0.1344 at delta 0.16


def test_robust_log_loss_weights_configurations_as_random_effects():
    """Configuration A: 4 rows at log errors +-0.1 (Huber 0.01 each, mean 0.01), weight 4 / (1 + 0.78 x 4) = 0.97087;
    B: 1 row at +0.5 (Huber 2 x 0.16 x 0.5 - 0.0256 = 0.1344), weight 1 / 1.78 = 0.56180.
    Loss = (0.97087 x 0.01 + 0.56180 x 0.1344) / (0.97087 + 0.56180) = 0.055598."""
    fx = _fx()
    assert fx.HUBER_LOG_DELTA == 0.16 and fx.CONFIG_VARIANCE_RATIO == 0.78
    cases = _cases(fx, [("A", 4, 0.010)] * 4 + [("B", 4, 0.020)])
    errs = [0.1, -0.1, 0.1, -0.1, 0.5]
    preds = {i: {"tpot": c.measured["tpot"] * math.exp(e)} for i, (c, e) in enumerate(zip(cases, errs))}
    assert fx.robust_log_loss(cases, preds, "tpot") == pytest.approx(0.055598, rel=1e-4)
    # a plain mean over rows would have given (4 x 0.01 + 0.1344) / 5 = 0.03488: B's one row counts for more here
    assert (4 * 0.01 + 0.1344) / 5 == pytest.approx(0.03488)
    # rows without a prediction are left out; none at all is infinite
    assert fx.robust_log_loss(cases, {i: "does not fit" for i in range(5)}, "tpot") == math.inf


def test_log_residual_components_by_hand():
    """A at concurrency 4 on two dates (log errors +0.1, -0.1) and at 8 once (+0.3); B once (0.0).
    Within a point: sd of (+0.1, -0.1) about 0 = 0.1. Within a configuration: A's errors about their mean 0.1 are
    0, -0.2, +0.2: sd sqrt(0.08 / 3) = 0.16330. Between: the means 0.1 and 0.0: sd 0.05."""
    fx = _fx()
    cases = _cases(fx, [("A", 4, 0.01), ("A", 4, 0.01), ("A", 8, 0.02), ("B", 4, 0.03)])
    errs = [0.1, -0.1, 0.3, 0.0]
    preds = {i: {"tpot": c.measured["tpot"] * math.exp(e)} for i, (c, e) in enumerate(zip(cases, errs))}
    comp = fx.log_residual_components(cases, preds, "tpot")
    assert comp["within_point"] == pytest.approx(0.1)
    assert comp["within_config"] == pytest.approx(math.sqrt(0.08 / 3))
    assert comp["between_config"] == pytest.approx(0.05)
    assert comp["rows_within_point"] == 2 and comp["configurations"] == 2


def test_the_loss_constants_match_the_residuals_the_shipped_fit_reports():
    """The committed fit report measures the residuals' spread on the shipped fit; the loss's constants must still be
    what those say (Huber's 1.345 sd of the date-to-date scatter, the variance ratio), within the drift of a refit."""
    fx = _fx()
    text = (ROOT / "benchmarks" / "results" / "inferencex-fit.md").read_text()
    m = re.search(r"in sample: sd ([0-9.]+) between the dates of one point \((\d+) rows\), ([0-9.]+) about a "
                  r"configuration's mean, ([0-9.]+) between (\d+) configurations' means", text)
    assert m is not None, "inferencex-fit.md lost the residual components line: rerun benchmarks/fit_inferencex.py"
    within_point, within_config, between = float(m[1]), float(m[3]), float(m[4])
    assert int(m[2]) > 500 and int(m[5]) > 60
    assert 1.345 * within_point == pytest.approx(fx.HUBER_LOG_DELTA, abs=0.02)
    assert (between / within_config) ** 2 == pytest.approx(fx.CONFIG_VARIANCE_RATIO, abs=0.25)
