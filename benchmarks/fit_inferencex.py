"""Fit the few MoE-serving parameters InferenceX measures, per engine x GPU family, held out by whole configuration.

    python3 benchmarks/fit_inferencex.py [--no-write] [--folds 3] [--out benchmarks/results/inferencex-fit.md]

On the single-node DeepSeek-R1 rows of ``tests/data/measurements/inferencex-dsr1.csv`` (predicted as
``benchmarks/bench_inferencex.py`` predicts them), in stages, each a physical parameter with its own evidence:

A. per engine profile (``sglang``, ``atom``, ``trtllm``: ``bench_inferencex.ENGINE``) x GPU family x release epoch
   (:data:`RELEASE_SPLITS`: the current releases, and where a family's rows show a step change of the kernels, the
   releases before it as their own group, written as the family's ``releases:`` override), on every row without MTP (fp8 and
   fp4, the fp4 kernels' efficiency as the catalog has it from stage C's last run), TPOT:
   ``moe_layer_overhead_s`` (fixed time of a MoE layer per step: router, top-k, permute, grouped-GEMM launches) and
   ``expert_bandwidth_efficiency`` (the grouped expert GEMMs' share of the profile's HBM efficiency);
B. the same groups, on every scored row (fp4 and MTP too: a front end's cost does not depend on them), TTFT:
   ``server_request_overhead_s`` (s per request: the HTTP serving front end's fixed cost, which InferenceX's
   client-side TTFT includes and an engine's own timer does not), after stages C-D;
C. per architecture, on fp4 rows without MTP, TPOT: the fp4 kernels' ``bandwidth`` efficiency in
   ``catalogs/kernel-support.yaml`` (NVFP4 on Blackwell, MXFP4 on CDNA4);
E. the same groups, on the rows that publish a mean TTFT (178 of 740, each with its median too; the others publish
   only the median, which the first wave does not reach), the excess of the mean over the median:
   ``first_wave_overhead_s`` (s the first wave of a run waits on a cold server; the per-request cost of stage B is in
   both statistics and cancels), between two passes of stage B (B, then E with B's values, then B again with E's);
   it ships where it lowers the group's held-out TTFT mean absolute log error and MAPE on those rows against none;
D. one per-position acceptance rate (DeepSeek-R1's MTP head on InferenceX's random-token prompts), fitted twice:
   on every MTP row's TPOT at concurrency <= 64, and on the TPOT gain of MTP / non-MTP pairs (same configuration and
   concurrency); the pair fit is written to ``catalogs/models/deepseek-v3.yaml`` ``speculative.acceptance_rate``;
   then per engine profile on its own MTP rows at concurrency <= 64, held out by configuration, written as
   ``speculative.by_engine.<engine>`` where it beats the shared rate held out (:func:`stage_d_by_engine`; stages B
   and E then predict each engine's MTP rows at its own rate).

Loss: stages A and C the Huber loss of ``ln(pred / measured)`` averaged per configuration, configurations weighted by
their rows as random effects (:func:`robust_log_loss`; every date of a point is a row); stages B and D mean absolute
log error (robust: a closed loop's queueing rows, minutes of TTFT, would otherwise set a
constant per-request cost).
Held out: the configurations (GPU, engine, parallelism, MTP, dtype, ISL/OSL: every concurrency and date of one)
are split into ``--folds`` folds; stages A-B are refitted without each fold and predict it.
Writes the stage-A and stage-B parameters into ``families:`` of ``catalogs/profiles/{sglang,atom,trtllm}.yaml``
(an older release epoch's as the family's ``releases:`` list; each family's held-out figures, every epoch of it, as
``held_out_inferencex``: rows, configurations, TTFT / TPOT / output throughput MAPE; merged into what is there: the
routed experts' terms, :data:`MODEL_STAGES`, as the family's override for DeepSeek-V3 / R1 (``models: deepseek-v3``), not
for every MoE model on the family; the front end's and the first wave's costs for every model served by that engine
on that family, behind its HTTP server: not the offline rows of ``published.csv``, timed by the engine), the
``efficiency:`` rows and the acceptance rate, unless ``--no-write``. A group's stage-B value ships only where it
lowers that group's held-out TTFT error against none, both the loss (mean absolute log error) and the MAPE; of the
two candidate sets (the front end's cost alone, or with the experts' compute rate) the one with the lower held-out
TTFT + TPOT MAPE ships (:func:`stage_b_candidate`).
Stages A and C share the fp4 rows (A reads the fp4 kernels' efficiency that C wrote last), so a rerun moves them a
little (coordinate descent): the shipped values are the third run's after the MI355X release split (MXFP4 bandwidth
0.933 -> 0.963 -> 0.977 -> 0.984: the split's current-release expert efficiency and the fp4 bandwidth trade against
each other on those rows; the TTFT / TPOT / throughput MAPE stayed 35.1 / 11.8 / 15.6 over the three runs); after
the robust loss (2026-12-06) the second run's (MXFP4 0.997 -> 0.963 -> 0.947, held out 24.8 / 11.9 / 13.5 -> 24.3 /
11.8 / 13.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import yaml  # noqa: E402
from scipy.optimize import minimize, minimize_scalar  # noqa: E402

import bench_inferencex as bx  # noqa: E402
from recommender.catalog import default_catalog  # noqa: E402
from recommender.estimator import acceptance_by_engine, default_acceptance  # noqa: E402
from recommender.profiles import BOUNDS, EngineProfile, engine_profile, release_key  # noqa: E402

STAGE_A = ("moe_layer_overhead_s", "expert_bandwidth_efficiency")
STAGE_B = ("server_request_overhead_s", "expert_compute_efficiency")
STAGE_E = ("first_wave_overhead_s",)
STAGES = STAGE_A + STAGE_B + STAGE_E
#: the parameters that describe DeepSeek-R1's routed experts: written as the family's override for that model
#: (``families.<family>.models.deepseek-v3``, :class:`recommender.profiles.ModelFit`), not for every MoE model of the
#: family: on TensorRT-LLM's 90 Mixtral rows on Hopper (``published.csv``, trtllm-bench) they raised the median error
#: 5.1 -> 15.9% (8 experts top-2 are not 256 fine-grained experts top-8). The front end's and the first wave's costs
#: are the engine's on the family, for every model.
MODEL_STAGES = ("moe_layer_overhead_s", "expert_bandwidth_efficiency", "expert_compute_efficiency")
#: MTP rows above this concurrency queue for KV (measured TTFT of minutes, SGLang retracting requests): their TPOT
#: says more about preemption than about acceptance, so stage D fits on the rows at or below it
MTP_MAX_CONC = 64
ENGINE = bx.ENGINE
#: (engine, family) -> the first release of the current kernels: rows of older releases are fitted as their own group
#: and ship as the family's ``releases: [{before: ...}]`` override. SGLang on MI355X: the September 2025 ROCm dev
#: image (``sgl-dev-v0.5.2``, 61 rows) runs 26% slower per decode step than one set of parameters predicts, v0.5.5 and
#: later (86 rows) 16% faster (median measured / predicted TPOT, benchmarks/results/inferencex-fit.md); one set for
#: both fits neither (TPOT 24.5% / 22.6%).
RELEASE_SPLITS: dict[tuple[str, str], str] = {("sglang", "cdna4"): "0.5.5"}
Group = tuple[str, str, str]  # (engine, family, epoch): epoch "" = the current releases, "<0.5.5" = those before
#: MTP per-position acceptance for a prediction: one rate for every row, or per engine profile (``"trtllm"``) with
#: ``""`` for the engines without their own; None = the model catalog's (``estimator.default_acceptance``)
Acceptance = float | dict[str, float] | None


def acceptance_for(acceptance: Acceptance, c: bx.Case) -> float | None:
    """The rate ``acceptance`` gives case ``c``'s engine (:data:`Acceptance`)."""
    if isinstance(acceptance, dict):
        return acceptance.get(ENGINE[c.framework], acceptance.get(""))
    return acceptance


def family(gpu: str) -> str:
    return default_catalog().gpu(gpu).arch


def group_of(c: bx.Case) -> Group:
    eng, fam = ENGINE[c.framework], family(c.gpu)
    split = RELEASE_SPLITS.get((eng, fam))
    old = split is not None and (rk := release_key(c.release)) is not None and rk < (release_key(split) or ())
    return eng, fam, f"<{split}" if old else ""


def current(key: Group) -> Group:
    """The current-release group of the same engine and family."""
    return key[0], key[1], ""


def layered(params: dict[Group, dict[str, float]], key: Group) -> dict[str, float]:
    """A group's parameters as the profile applies them: an older epoch's over its family's current ones."""
    return {**(params.get(current(key), {}) if key[2] else {}), **params.get(key, {})}


def label(key: Group) -> str:
    return f"{key[1]} {key[2]}" if key[2] else key[1]


def base_profile(engine: str, gpu: str) -> EngineProfile:
    """The shipped engine profile with the GPU family's shipped parameters applied, families dropped, and the
    parameters this script fits back at their neutral defaults (so "before" is the model without them)."""
    return engine_profile(engine).for_gpu(gpu).replace(families=(), moe_layer_overhead_s=0.0, expert_bandwidth_efficiency=1.0,
                                                       server_request_overhead_s=0.0, expert_compute_efficiency=1.0,
                                                       first_wave_overhead_s=0.0)


Preds = dict[int, dict[str, float] | str]


class Predictor:
    """Predictions of a list of cases under trial parameters, each distinct point predicted once."""

    def __init__(self, cases: Sequence[bx.Case]):
        self.cases = list(cases)
        self.points: dict[tuple[Any, ...], list[int]] = defaultdict(list)
        for i, c in enumerate(self.cases):
            # a point of two release epochs, or of rows publishing the mean and the median TTFT: one prediction each
            self.points[(c.config, c.conc, group_of(c), c.ttft_statistic)].append(i)

    def run(self, params: dict[Group, dict[str, float]], catalog: Any = None,
            acceptance: Acceptance = None) -> Preds:
        out: Preds = {}
        for idx in self.points.values():
            c = self.cases[idx[0]]
            key = group_of(c)
            prof = base_profile(key[0], c.gpu).replace(**layered(params, key))
            p = bx.predict(c, profile=prof, catalog=catalog, acceptance_rate=acceptance_for(acceptance, c))
            for i in idx:
                out[i] = p
        return out


#: Huber's tuning constant, 1.345 standard deviations (95% efficiency when errors are normal), of the date-to-date
#: scatter: 0.119, the sd of ln(predicted / measured) TPOT between the dates of one point (same configuration and
#: concurrency; 642 rows with more than one date, the fit of 2026-12-05, :func:`log_residual_components`)
HUBER_LOG_DELTA = 0.16
#: between-configuration over within-configuration variance of ln(predicted / measured) TPOT: 0.114^2 / 0.129^2
#: (same fit; the sd of the 73 configurations' mean residual and of the rows about their configuration's mean)
CONFIG_VARIANCE_RATIO = 0.78


def log_errors(cases: Sequence[bx.Case], preds: Preds, metric: str) -> list[tuple[bx.Case, float]]:
    """(case, ``ln(pred / measured)``) for every case with a prediction and a measured ``metric``."""
    return [(c, math.log(p[metric] / c.measured[metric])) for i, c in enumerate(cases)
            if isinstance(p := preds[i], dict) and metric in c.measured and p[metric] > 0]


def huber(x: float, delta: float = HUBER_LOG_DELTA) -> float:
    """``x^2`` within ``delta`` of 0, ``2 delta |x| - delta^2`` beyond (continuous, with a continuous slope)."""
    a = abs(x)
    return a * a if a <= delta else 2.0 * delta * a - delta * delta


def robust_log_loss(cases: Sequence[bx.Case], preds: Preds, metric: str) -> float:
    """Stage A's and C's loss: the Huber loss (:data:`HUBER_LOG_DELTA`) of ``ln(pred / measured)``, averaged within
    each configuration, the configurations weighted ``n / (1 + rho n)`` (``n`` its rows, ``rho`` =
    :data:`CONFIG_VARIANCE_RATIO`).

    Huber: a row two or three times off its configuration's other dates (a release's regression, a run that queued) pulls
    the fit linearly, not quadratically. The weights are the random-effects ones: the dates and concurrencies of one
    configuration share that configuration's model error (variance ``s_b^2``) besides their own (``s_w^2``), so its
    mean residual has variance ``s_b^2 + s_w^2 / n`` and weight ``n / (s_w^2 + n s_b^2)``, proportional to
    ``n / (1 + rho n)``: nearly one per configuration from a few rows on, where a plain mean over rows let a
    configuration measured on 30 dates outweigh 15 measured once."""
    by: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for c, e in log_errors(cases, preds, metric):
        by[c.config].append(huber(e))
    if not by:
        return math.inf
    w = {k: len(v) / (1.0 + CONFIG_VARIANCE_RATIO * len(v)) for k, v in by.items()}
    return sum(w[k] * statistics.fmean(v) for k, v in by.items()) / sum(w.values())


def log_residual_components(cases: Sequence[bx.Case], preds: Preds, metric: str) -> dict[str, float]:
    """Where :data:`HUBER_LOG_DELTA` and :data:`CONFIG_VARIANCE_RATIO` come from, on ``ln(pred / measured)``:
    ``within_point`` (sd about the mean of the dates of one configuration and concurrency, points with more than one
    date), ``within_config`` (sd about the configuration's mean, configurations with more than one row),
    ``between_config`` (sd of the configurations' means), and the row and configuration counts."""
    pts: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    cfg: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for c, e in log_errors(cases, preds, metric):
        pts[(c.config, c.conc)].append(e)
        cfg[c.config].append(e)

    def spread(groups: dict[tuple[Any, ...], list[float]]) -> tuple[float, int]:
        dev = [x - statistics.fmean(v) for v in groups.values() if len(v) > 1 for x in v]
        return (statistics.pstdev(dev) if len(dev) > 1 else math.nan), len(dev)

    wp, n_wp = spread(pts)
    wc, _ = spread(cfg)
    means = [statistics.fmean(v) for v in cfg.values()]
    return {"within_point": wp, "within_config": wc,
            "between_config": statistics.pstdev(means) if len(means) > 1 else math.nan,
            "rows_within_point": float(n_wp), "configurations": float(len(means))}


def male(cases: Sequence[bx.Case], preds: Preds, metric: str) -> float:
    """Mean absolute log error (stage D: robust to the few rows whose TPOT other terms miss)."""
    errs = [abs(e) for _, e in log_errors(cases, preds, metric)]
    return statistics.fmean(errs) if errs else math.inf


def mape(cases: Sequence[bx.Case], preds: Preds, metric: str) -> float:
    errs = [bx.ape(p[metric], c.measured[metric]) for i, c in enumerate(cases)
            if isinstance(p := preds[i], dict) and metric in c.measured]
    return statistics.fmean(errs) if errs else math.nan


def _clip(name: str, v: float) -> float:
    lo, hi = BOUNDS[name]
    return min(max(v, lo), hi)


def fit_group(cases: Sequence[bx.Case], start: dict[str, float]) -> dict[str, float]:
    """Stage A on one group's cases (module docstring): TPOT :func:`robust_log_loss` over ``moe_layer_overhead_s`` and
    ``expert_bandwidth_efficiency``."""
    pr = Predictor(cases)
    key = group_of(cases[0])

    def a_loss(x: Sequence[float]) -> float:
        trial = {**start, "moe_layer_overhead_s": _clip("moe_layer_overhead_s", x[0] * 1e-6),
                 "expert_bandwidth_efficiency": _clip("expert_bandwidth_efficiency", x[1])}
        return robust_log_loss(cases, pr.run({key: trial}), "tpot")

    res = minimize(a_loss, [40.0, 0.7], method="Powell", bounds=[(0.0, 500.0), (0.1, 1.0)],
                   options={"xtol": 1e-2, "ftol": 1e-4, "maxfev": 80})
    return {**start, "moe_layer_overhead_s": round(_clip("moe_layer_overhead_s", res.x[0] * 1e-6), 8),
            "expert_bandwidth_efficiency": round(_clip("expert_bandwidth_efficiency", res.x[1]), 4)}


def fit_stage_b(cases: Sequence[bx.Case], stage_a: dict[str, float], catalog: Any = None,
                acceptance: Acceptance = None, names: Sequence[str] = STAGE_B) -> dict[str, float]:
    """Stage B on one group's cases, the stage-A parameters fixed: ``server_request_overhead_s`` (s) alone, minimising
    the TTFT mean absolute log error, or (``names`` = both) with ``expert_compute_efficiency``, minimising the TTFT +
    TPOT mean absolute log error (the experts' compute rate sets the MoE prefill, and a little of a large decode step)."""
    pr = Predictor(cases)
    key = group_of(cases[0])
    lo, hi = BOUNDS["server_request_overhead_s"]
    if tuple(names) == ("server_request_overhead_s",):
        x = scalar_fit(lambda v: male(cases, pr.run({key: {**stage_a, "server_request_overhead_s": v}}, catalog,
                                                     acceptance), "ttft"), lo, hi)
        return {"server_request_overhead_s": round(x, 4)}

    def loss(x: Sequence[float]) -> float:
        trial = {**stage_a, "server_request_overhead_s": _clip("server_request_overhead_s", x[0]),
                 "expert_compute_efficiency": _clip("expert_compute_efficiency", x[1])}
        p = pr.run({key: trial}, catalog, acceptance)
        return male(cases, p, "ttft") + male(cases, p, "tpot")

    res = minimize(loss, [0.05, 0.8], method="Powell", bounds=[(lo, min(hi, 0.5)), (0.2, 1.0)],
                   options={"xtol": 2e-3, "ftol": 1e-4, "maxfev": 60})
    return {"server_request_overhead_s": round(_clip("server_request_overhead_s", res.x[0]), 4),
            "expert_compute_efficiency": round(_clip("expert_compute_efficiency", res.x[1]), 4)}


def mean_rows(cases: Sequence[bx.Case]) -> list[bx.Case]:
    """The rows that publish a mean and a median TTFT (stage E fits the first wave's share of the mean on them)."""
    return [c for c in cases if c.ttft_statistic == "mean" and "ttft" in c.measured
            and bx._num(c.row.get("ttft_median_ms", "")) is not None]


def as_median(c: bx.Case) -> bx.Case:
    """The same row predicted for its median TTFT (the steady closed loop's)."""
    return dataclasses.replace(c, row={**c.row, "ttft_mean_ms": ""})


def fit_stage_e(cases: Sequence[bx.Case], fixed: dict[str, float], catalog: Any = None,
                acceptance: Acceptance = None) -> dict[str, float]:
    """Stage E on one group's rows (every other parameter ``fixed``): ``first_wave_overhead_s`` (s) from the rows that
    publish a mean and a median TTFT, on the measured excess of the mean over the median (the first wave's share;
    the per-request cost stage B fits is in both and cancels): minimises the mean absolute log error of
    ``measured median + predicted (mean - median)`` against the measured mean; {} when there are none. A run's mean
    TTFT is linear in it (``+ N / M`` of it, :func:`recommender.estimator.finite_run`), so predictions at 0 and 1 s
    give every trial value."""
    mc = mean_rows(cases)
    if not mc:
        return {}
    key = group_of(mc[0])
    pr, pm = Predictor(mc), Predictor([as_median(c) for c in mc])
    p0 = pr.run({key: {**fixed, "first_wave_overhead_s": 0.0}}, catalog, acceptance)
    p1 = pr.run({key: {**fixed, "first_wave_overhead_s": 1.0}}, catalog, acceptance)
    med = pm.run({key: {**fixed, "first_wave_overhead_s": 0.0}}, catalog, acceptance)
    pts = [(float(c.row["ttft_median_ms"]) / 1e3 + p0[i]["ttft"] - med[i]["ttft"], p1[i]["ttft"] - p0[i]["ttft"],
            c.measured["ttft"]) for i, c in enumerate(mc)
           if isinstance(p0[i], dict) and isinstance(p1[i], dict) and isinstance(med[i], dict)]
    if not pts:
        return {}
    lo, hi = BOUNDS["first_wave_overhead_s"]
    x = scalar_fit(lambda v: statistics.fmean(abs(math.log(max(a + v * b, 1e-6) / m)) for a, b, m in pts), lo, hi)
    return {"first_wave_overhead_s": round(x, 3)}


def fit_b_e(cases: Sequence[bx.Case], a: dict[str, float], catalog: Any = None, acceptance: Acceptance = None,
            names: Sequence[str] = STAGE_B, with_e: bool = True) -> dict[str, float]:
    """Stages B and E of one group, A fixed (``a``): B, then E over it, then B again with E's value (the first wave
    lengthens the mean-TTFT rows B fits its per-request cost on); E left out where ``with_e`` is false."""
    b = fit_stage_b(cases, a, catalog, acceptance, names)
    if not with_e:
        return b
    e = fit_stage_e(cases, {**a, **b}, catalog, acceptance)
    if not e:
        return b
    return {**fit_stage_b(cases, {**a, **e}, catalog, acceptance, names), **e}


#: stage B's candidate parameter sets, simplest first; a group ships the one with the lowest held-out TTFT + TPOT
#: MAPE among those that beat none on the held-out TTFT loss and MAPE
STAGE_B_VARIANTS: tuple[tuple[str, ...], ...] = (("server_request_overhead_s",), STAGE_B)


def fit_all(cases: Sequence[bx.Case], catalog: Any = None, acceptance: Acceptance = None) -> dict[str, float]:
    """Stages A (on the rows without MTP) and B (on every row) of one group: what ships for it."""
    base = stage_a_rows(cases)
    a = fit_group(base, {}) if base else {}
    return {**a, **fit_stage_b(cases, a, catalog, acceptance)}


def stage_a_rows(cases: Sequence[bx.Case]) -> list[bx.Case]:
    """The rows stage A fits on: scored, without MTP (fp8 and fp4 alike: the fp4 rows' kernels are the catalog's)."""
    return [c for c in scored(cases) if not c.mtp]


def scored(cases: Sequence[bx.Case]) -> list[bx.Case]:
    return [c for c in cases if "closed_loop_check_ratio" not in c.row["quality_flags"]]


def mtp_rows(cases: Sequence[bx.Case]) -> list[bx.Case]:
    """The scored MTP rows stage D fits acceptance on: concurrency <= :data:`MTP_MAX_CONC`, with a TPOT."""
    return [c for c in scored(cases) if c.mtp and c.conc <= MTP_MAX_CONC and "tpot" in c.measured]


def folds_of(cases: Sequence[bx.Case], k: int) -> list[set[tuple[Any, ...]]]:
    """The cases' configurations dealt round-robin into ``k`` folds; ``k`` = 0: one fold per configuration (leave one
    configuration out)."""
    configs = sorted({c.config for c in cases}, key=str)
    k = k if k > 0 else len(configs)
    return [set(configs[i::k]) for i in range(k)]


def held_out_folds(cases: Sequence[bx.Case], folds: int, predict: Callable[[list[bx.Case], list[bx.Case]], Preds],
                   need_train: bool = True) -> Preds:
    """Every case predicted by ``predict(train, test)``, ``train`` = the cases outside its fold of whole configurations
    (:func:`folds_of`): case index -> prediction. A fold with no training case is skipped unless ``need_train`` is
    False."""
    held: Preds = {}
    for fold in folds_of(cases, folds):
        train = [c for c in cases if c.config not in fold]
        test_idx = [i for i, c in enumerate(cases) if c.config in fold]
        if not test_idx or (need_train and not train):
            continue
        tp = predict(train, [cases[i] for i in test_idx])
        held.update({test_idx[j]: p for j, p in tp.items()})
    return held


def scalar_fit(loss: Callable[[float], float], lo: float, hi: float) -> float:
    return float(minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 5e-3}).x)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--folds", type=int, default=3, help="folds of configurations per group (0: leave one out)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "inferencex-fit.md")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    cases = bx.single_node_cases(bx.DEFAULT_CSV)
    base = stage_a_rows(cases)
    groups: dict[Group, list[bx.Case]] = defaultdict(list)
    for c in base:
        groups[group_of(c)].append(c)
    params: dict[Group, dict[str, float]] = {}
    unshipped: set[Group] = set()
    lines = ["# InferenceX fit: MoE-serving parameters per engine x GPU family", "",
             "Written by `python3 benchmarks/fit_inferencex.py` (module docstring: stages, loss, held-out rule).", "",
             "## Stage A (rows without MTP, fp8 and fp4), held out by whole configuration", "",
             "| engine | family | rows | configs | moe_layer_overhead_s | expert_bandwidth_efficiency | "
             "TPOT MAPE % before / fitted / held out | shipped |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for key, gc in sorted(groups.items()):
        fitted = fit_group(gc, {})
        params[key] = fitted
        pr = Predictor(gc)
        # "before" = without this group's fit: an older epoch runs its family's current parameters
        before, after = pr.run({k: v for k, v in params.items() if k == current(key) != key}), pr.run({**params, key: fitted})
        held = held_out_folds(gc, a.folds, lambda train, test: Predictor(test).run({**params, key: fit_group(train, {})}))
        nconf = len({c.config for c in gc})
        # ship a group's stage-A parameters only where they lower the held-out loss the fit minimises
        # (robust_log_loss of TPOT), as fit_profiles.py keeps a fit only where it lowers the held-out error
        held_loss, before_loss = robust_log_loss(gc, held, "tpot"), robust_log_loss(gc, before, "tpot")
        shipped = held_loss < before_loss
        if not shipped:
            unshipped.add(key)
        lines.append(f"| {key[0]} | {label(key)} | {len(gc)} | {nconf} | {fitted['moe_layer_overhead_s'] * 1e6:.1f} us | "
                     f"{fitted['expert_bandwidth_efficiency']:.3f} | "
                     f"{mape(gc, before, 'tpot'):.1f} / {mape(gc, after, 'tpot'):.1f} / {mape(gc, held, 'tpot'):.1f} | "
                     f"{'yes' if shipped else 'no'} (held-out loss {held_loss:.4f} vs {before_loss:.4f}) |")
        print(lines[-1], flush=True)
    fitted_all = dict(params)
    params = {k: v for k, v in params.items() if k not in unshipped}   # stages C-D build on what ships
    # C: fp4 kernel bandwidth efficiency per architecture
    lines += ["", "## Stage C: fp4 kernels' bandwidth efficiency (fp4 rows without MTP, TPOT)", "",
              "| architecture | dtype | rows | bandwidth | TPOT MAPE % before / fitted |", "|---|---|---:|---:|---|"]
    effs: dict[tuple[str, str], float] = {}
    for arch, dtype in (("blackwell", "fp4"), ("cdna4", "mxfp4")):
        fc = [c for c in cases if not c.mtp and c.weight_dtype == dtype and family(c.gpu) == arch]
        if not fc:
            continue
        pr = Predictor(fc)
        bw = scalar_fit(lambda x: robust_log_loss(fc, pr.run(params, _with(default_catalog(), arch, dtype, x)), "tpot"), 0.2, 1.0)
        effs[(arch, dtype)] = round(bw, 3)
        b0, b1 = pr.run(params, _with(default_catalog(), arch, dtype, 1.0)), pr.run(params, _with(default_catalog(), arch, dtype, bw))
        lines.append(f"| {arch} | {dtype} | {len(fc)} | {bw:.3f} | {mape(fc, b0, 'tpot'):.1f} / {mape(fc, b1, 'tpot'):.1f} |")
        print(lines[-1], flush=True)
    cat = default_catalog()
    for (arch, dtype), bw in effs.items():
        cat = _with(cat, arch, dtype, bw)
    # D: acceptance rate on every MTP row
    mc = [c for c in cases if c.mtp and c.conc <= MTP_MAX_CONC]
    pr = Predictor(mc)
    acc = round(scalar_fit(lambda x: male(mc, pr.run(params, cat, x), "tpot"), 0.2, 1.0), 3)
    d0, d1 = pr.run(params, cat, 0.7), pr.run(params, cat, acc)
    lines += ["", "## Stage D: MTP per-position acceptance (every MTP row, TPOT)", "",
              f"{len(mc)} rows at concurrency <= {MTP_MAX_CONC}: acceptance {acc:.3f}; TPOT MAPE {mape(mc, d0, 'tpot'):.1f}% "
              f"at the 0.7 fallback -> {mape(mc, d1, 'tpot'):.1f}% fitted.", ""]
    for fw in sorted({c.framework for c in mc}):
        sub = [i for i, c in enumerate(mc) if c.framework == fw]
        cs = [mc[i] for i in sub]
        lines.append(f"- {fw}: {len(sub)} rows, TPOT MAPE {mape(cs, {j: d1[i] for j, i in enumerate(sub)}, 'tpot'):.1f}%")
    # D': on MTP vs non-MTP pairs (same configuration and concurrency): the measured TPOT gain
    pairs = mtp_pairs(cases)
    if pairs:
        on = [p[0] for p in pairs]
        off = Predictor([p[1] for p in pairs]).run(params, cat)
        pon = Predictor(on)

        def gain_loss(x: float) -> float:
            pred_on = pon.run(params, cat, x)
            errs = [abs(math.log((off[i]["tpot"] / pred_on[i]["tpot"]) / g))  # type: ignore[index]
                    for i, (_, _, g) in enumerate(pairs) if isinstance(off[i], dict) and isinstance(pred_on[i], dict)]
            return statistics.fmean(errs) if errs else math.inf

        acc_pair = round(scalar_fit(gain_loss, 0.2, 1.0), 3)
        p_on = pon.run(params, cat, acc_pair)
        gains = [(g, off[i]["tpot"] / p_on[i]["tpot"]) for i, (_, _, g) in enumerate(pairs)  # type: ignore[index]
                 if isinstance(off[i], dict) and isinstance(p_on[i], dict)]
        lines += [f"On {len(pairs)} MTP / non-MTP pairs (same GPU, engine, parallelism, dtype, ISL/OSL and concurrency; "
                  f"measured TPOT median over dates): acceptance {acc_pair:.3f}; measured gain median "
                  f"{statistics.median(g for g, _ in gains):.2f}x, predicted {statistics.median(q for _, q in gains):.2f}x. "
                  f"This pair fit is the shipped default (the gain is what MTP changes; the absolute fit above also "
                  f"absorbs the profile's error on those rows).", ""]
        acc = acc_pair
    d_lines, eng_acc = stage_d_by_engine(cases, params, cat, acc, a.folds)
    lines += d_lines
    shared_acc, acc = acc, {"": acc, **{eng: v["acceptance_rate"] for eng, v in eng_acc.items()}}
    b_lines, b_vals, b_unshipped = stage_b(cases, params, a.folds, cat, acc)
    for key, v in b_vals.items():
        if key not in b_unshipped:
            params.setdefault(key, {}).update(v)
    # E over the first pass of B, then B again with E's values (module docstring)
    e_lines, e_vals = stage_e(cases, params, a.folds, cat, acc)
    lines += e_lines
    for key, v in e_vals.items():
        params.setdefault(key, {}).update(v)
    b_lines, b_vals, b_unshipped = stage_b(cases, params, a.folds, cat, acc)
    lines += b_lines
    for key in {group_of(c) for c in scored(cases)}:
        kept = {k: v for k, v in params.get(key, {}).items() if k not in STAGE_B}
        if key in b_vals and key not in b_unshipped:
            kept.update(b_vals[key])
        if kept:
            params[key] = kept
        else:
            params.pop(key, None)
    held_lines, held_by = held_out_all(cases, a.folds, cat, acc, params)
    lines += held_lines
    lines += ["",
              f"Fitted in {time.perf_counter() - t0:.0f} s."]
    print("\n".join(lines[-3:]), flush=True)
    a.out.write_text("\n".join(lines) + "\n")
    if not a.no_write:
        rows: dict[Group, int] = defaultdict(int)
        for c in scored(cases):
            rows[group_of(c)] += 1
        write(params, effs, shared_acc, rows, unshipped, held_by, eng_acc)
        record_shipped_held_out(cases, a.folds)
    del fitted_all
    return 0


def record_shipped_held_out(cases: Sequence[bx.Case], folds: int) -> None:
    """Rewrite each profile family's ``held_out_inferencex`` from the files as written: the same held-out run with
    the shipped (rounded) parameters, kernel table and acceptance read back, as ``bench_inferencex.py --held-out``
    and ``readme_figures.py`` compute it (the run's own unrounded values moved a figure by 0.1)."""
    from recommender.catalog import default_catalog, default_kernel_support
    from recommender.profiles import engine_profile

    for cached in (engine_profile, default_catalog, default_kernel_support):
        cached.cache_clear()
    sc = scored(cases)
    shipped_a, shipped_b = shipped_groups(sc)
    held = held_out_by_profile(held_out_predictions(sc, folds, None, None, shipped_b, shipped_a))
    for eng in sorted({e for e, _ in held}):
        path = ROOT / "catalogs" / "profiles" / f"{eng}.yaml"
        path.write_text(merge_held_out(path.read_text(), {f: v for (e, f), v in held.items() if e == eng}))


def stage_d_by_engine(cases: Sequence[bx.Case], params: dict[Group, dict[str, float]], cat: Any, shared: float,
                      folds: int) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Stage D per engine profile: the acceptance rate its own MTP rows at concurrency <= :data:`MTP_MAX_CONC` fit (TPOT
    mean absolute log error), held out by whole configuration (refitted without each of ``folds`` folds of the engine's
    MTP configurations, predicting the fold). An engine's rate ships where its held-out TPOT error, both the loss and
    the MAPE, beats the shared pair fit ``shared`` on the same rows: the engines verify drafts their own way (a
    different verifier, draft loop and sampling), so one rate for all of them is the engines' average, not each
    one's. Returns the report lines and engine -> {acceptance_rate, rows, configurations, held-out TPOT MAPE % of
    the shared rate and of the engine's}."""
    mc = mtp_rows(cases)
    lines = ["", "### Per engine (its own MTP rows at concurrency <= 64, TPOT; held out by configuration)", "",
             "| engine | rows | configs | acceptance | TPOT MAPE % shared / fitted / held out | held-out TPOT MALE shared / "
             "fitted | shipped |", "|---|---:|---:|---:|---|---|---|"]
    out: dict[str, dict[str, float]] = {}
    for eng in sorted({ENGINE[c.framework] for c in mc}):
        ec = [c for c in mc if ENGINE[c.framework] == eng]
        rate = fit_rate(ec, cat, params)
        pr = Predictor(ec)
        base, fitted = pr.run(params, cat, shared), pr.run(params, cat, rate)
        held = held_out_folds(ec, folds, lambda train, test: Predictor(test).run(params, cat, fit_rate(train, cat, params)))
        ok = len(held) == len(ec) and male(ec, held, "tpot") < male(ec, base, "tpot") and mape(ec, held, "tpot") < mape(ec, base, "tpot")
        nconf = len({c.config for c in ec})
        if ok:
            out[eng] = {"acceptance_rate": rate, "rows": len(ec), "configurations": nconf,
                        "shared_tpot_mape_pct": round(mape(ec, base, "tpot"), 1),
                        "held_out_tpot_mape_pct": round(mape(ec, held, "tpot"), 1)}
        lines.append(f"| {eng} | {len(ec)} | {nconf} | {rate:.3f} | {mape(ec, base, 'tpot'):.1f} / {mape(ec, fitted, 'tpot'):.1f}"
                     f" / {mape(ec, held, 'tpot') if len(held) == len(ec) else math.nan:.1f} | {male(ec, base, 'tpot'):.3f} / "
                     f"{male(ec, held, 'tpot') if len(held) == len(ec) else math.nan:.3f} | {'yes' if ok else 'no'} |")
        print(lines[-1], flush=True)
    return lines + [""], out


def stage_b(cases: Sequence[bx.Case], params: dict[Group, dict[str, float]], folds: int, cat: Any,
            acc: Acceptance) -> tuple[list[str], dict[Group, dict[str, float]], set[Group]]:
    """Stage B per engine x family on every scored row (the shipped stage A, C and D fixed), held out by whole
    configuration; a group's value ships where its held-out TTFT mean absolute log error and MAPE both beat none."""
    groups: dict[Group, list[bx.Case]] = defaultdict(list)
    for c in scored(cases):
        groups[group_of(c)].append(c)
    out = ["", "## Stage B: the front end's cost per request and the experts' compute rate (every row, TTFT + TPOT)", "",
           "`server_request_overhead_s`: seconds each request adds to its client-timed TTFT; `expert_compute_efficiency`: "
           "the routed experts' grouped GEMMs' share of the GEMMs' compute rate (MoE prefill). Fitted per engine x family "
           "on every scored row of the group (fp4 and MTP too; TTFT + TPOT mean absolute log error), stages A, C, D "
           "and E as shipped (this is B's second pass, over E); held out: refitted without each fold of whole configurations.", "",
           "| engine | family | rows | configs | server_request_overhead_s | expert_compute_efficiency | "
           "TTFT MAPE % none / fitted / held out | TPOT MAPE % none / held out | held-out TTFT MALE none / held out | "
           "shipped |", "|---|---|---:|---:|---:|---:|---|---|---|---|"]
    out[-3] += (" Each group tries the front end's cost alone, then with the experts' compute rate, and ships the "
                "candidate with the lowest held-out TTFT + TPOT MAPE among those whose held-out TTFT loss and MAPE "
                "beat none (none where neither does).")
    vals: dict[Group, dict[str, float]] = {}
    unshipped: set[Group] = set()
    for key, gc in sorted(groups.items()):
        a = {k: v for k, v in layered(params, key).items() if k in STAGE_A + STAGE_E}
        pr = Predictor(gc)
        none = pr.run({key: a}, cat, acc)
        n0 = male(gc, none, "ttft")
        best: tuple[float, dict[str, float], Preds, Preds] | None = None
        for names in STAGE_B_VARIANTS:
            x = fit_stage_b(gc, a, cat, acc, names)
            held = held_out_folds(gc, folds, lambda train, test: Predictor(test).run(
                {key: {**a, **fit_stage_b(train, a, cat, acc, names)}}, cat, acc))
            fitted = pr.run({key: {**a, **x}}, cat, acc)
            h, hm = male(gc, held, "ttft"), mape(gc, held, "ttft")
            ok, score = stage_b_candidate(held_ttft_loss=h, held_ttft_mape=hm, held_tpot_mape=mape(gc, held, "tpot"),
                                          none_ttft_loss=n0, none_ttft_mape=mape(gc, none, "ttft"))
            out.append(f"| {key[0]} | {label(key)} | {len(gc)} | {len({c.config for c in gc})} | "
                       f"{x['server_request_overhead_s'] * 1e3:.1f} ms | "
                       f"{x['expert_compute_efficiency']:.3f} |" if "expert_compute_efficiency" in x else
                       f"| {key[0]} | {label(key)} | {len(gc)} | {len({c.config for c in gc})} | "
                       f"{x['server_request_overhead_s'] * 1e3:.1f} ms | - |")
            out[-1] += (f" {mape(gc, none, 'ttft'):.1f} / {mape(gc, fitted, 'ttft'):.1f} / {hm:.1f} | "
                        f"{mape(gc, none, 'tpot'):.1f} / {mape(gc, held, 'tpot'):.1f} | {n0:.3f} / {h:.3f} | "
                        f"{'candidate' if ok else 'no'} |")
            print(out[-1], flush=True)
            if ok and (best is None or score < best[0]):
                best = (score, x, fitted, held)
        if best is None:
            unshipped.add(key)
        else:
            vals[key] = best[1]
            out.append(f"| {key[0]} | {label(key)} | | | shipped: {', '.join(best[1])} | | | | | yes |")
    return out, vals, unshipped


def stage_e(cases: Sequence[bx.Case], params: dict[Group, dict[str, float]], folds: int, cat: Any,
            acc: Acceptance) -> tuple[list[str], dict[Group, dict[str, float]]]:
    """Stage E per engine x family on the rows that publish a mean TTFT (stages A-D as shipped), held out by whole
    configuration; a group's value ships where its held-out TTFT mean absolute log error and MAPE both beat none."""
    groups: dict[Group, list[bx.Case]] = defaultdict(list)
    for c in mean_rows(scored(cases)):
        groups[group_of(c)].append(c)
    out = ["", "## Stage E: the first wave's wait on a cold server (rows that publish a mean TTFT)", "",
           "`first_wave_overhead_s`: seconds the requests a run sends at once when it starts wait beyond their "
           "prefills; a run of M requests at concurrency N moves its mean TTFT by N / M of it (InferenceX: M = 10 N). "
           "Fitted per engine x family on the rows that publish a mean and a median TTFT, on the excess of the mean "
           "over the median (mean absolute log error of measured median + predicted excess against the measured mean; "
           "the median rows do not see it), between two passes of stage B; the errors below are of the whole "
           "predicted mean; held out: refitted without each fold of "
           "whole configurations.", "",
           "| engine | family | mean-TTFT rows | configs | first_wave_overhead_s | TTFT MAPE % none / fitted / held out | "
           "held-out TTFT MALE none / held out | shipped |", "|---|---|---:|---:|---:|---|---|---|"]
    vals: dict[Group, dict[str, float]] = {}
    for key, gc in sorted(groups.items()):
        fixed = {k: v for k, v in layered(params, key).items() if k != "first_wave_overhead_s"}
        pr = Predictor(gc)
        none = pr.run({key: {**fixed, "first_wave_overhead_s": 0.0}}, cat, acc)
        x = fit_stage_e(gc, fixed, cat, acc)
        if not x:
            continue
        held = held_out_folds(gc, folds, lambda train, test: Predictor(test).run(
            {key: {**fixed, "first_wave_overhead_s": 0.0, **(fit_stage_e(train, fixed, cat, acc) if train else {})}}, cat, acc),
            need_train=False)
        fitted = pr.run({key: {**fixed, **x}}, cat, acc)
        n0, h = male(gc, none, "ttft"), male(gc, held, "ttft")
        ok = h < n0 and mape(gc, held, "ttft") < mape(gc, none, "ttft")
        if ok:
            vals[key] = x
        out.append(f"| {key[0]} | {label(key)} | {len(gc)} | {len({c.config for c in gc})} | "
                   f"{x['first_wave_overhead_s']:.2f} s | {mape(gc, none, 'ttft'):.1f} / {mape(gc, fitted, 'ttft'):.1f} / "
                   f"{mape(gc, held, 'ttft'):.1f} | {n0:.3f} / {h:.3f} | {'yes' if ok else 'no'} |")
        print(out[-1], flush=True)
    return out, vals


def stage_b_candidate(*, held_ttft_loss: float, held_ttft_mape: float, held_tpot_mape: float, none_ttft_loss: float,
                      none_ttft_mape: float) -> tuple[bool, float]:
    """(is a candidate, its rank score) for one stage-B parameter set of a group, from its held-out errors.

    A candidate lowers both the held-out TTFT loss (mean absolute log error) and the held-out TTFT MAPE against no
    stage-B parameter; candidates rank by held-out TTFT + TPOT MAPE (%, lower ships), the two errors the second set
    is fitted on: the experts' compute rate sets the MoE prefill, and prefill steps lengthen the decoding requests'
    TPOT."""
    ok = held_ttft_loss < none_ttft_loss and held_ttft_mape < none_ttft_mape
    return ok, held_ttft_mape + held_tpot_mape


def acceptances(cat: Any, acc: Acceptance) -> dict[str, float]:
    """``acc`` as engine -> rate with ``""`` the shared one; None = the model catalog's (the shared rate and every
    ``speculative.by_engine`` entry); a float = that rate for every engine."""
    if isinstance(acc, dict):
        return dict(acc)
    if acc is not None:
        return {"": acc}
    model = cat.models[bx.MODEL]
    return {"": default_acceptance(cat, model)[0], **{e: a for e, (a, _) in acceptance_by_engine(cat, model).items()}}


def fit_rate(cases: Sequence[bx.Case], cat: Any, params: dict[Group, dict[str, float]] | None) -> float:
    """Stage D's fit of one engine's acceptance on its MTP ``cases`` (TPOT mean absolute log error), the other
    parameters ``params`` (None: the shipped profiles)."""
    if params is None:
        def run(x: float) -> Preds:
            return {i: bx.predict(c, catalog=cat, acceptance_rate=x) for i, c in enumerate(cases)}
    else:
        pr = Predictor(cases)

        def run(x: float) -> Preds:
            return pr.run(params, cat, x)
    return round(scalar_fit(lambda x: male(cases, run(x), "tpot"), 0.2, 1.0), 3)


def held_out_predictions(cases: Sequence[bx.Case], folds: int, cat: Any = None, acc: Acceptance = None,
                         shipped_b: dict[Group, tuple[str, ...]] | None = None,
                         shipped_a: set[Group] | None = None,
                         params: dict[Group, dict[str, float]] | None = None) -> list[tuple[bx.Case, dict[str, float] | str]]:
    """Every scored row predicted with its group's stage-A and stage-B parameters fitted WITHOUT its configuration.

    ``folds`` folds of whole configurations per engine x family (both release epochs of a family share the folds, so
    a configuration is out of every epoch's fit at once); in each fold the current releases' group is fitted first
    (stage A on the training rows without MTP, stages B and E on all its training rows), then an older epoch's over
    it, as the profile layers them; the fp4 rows as shipped. An engine with its own MTP acceptance
    (:func:`acceptances`) refits it per fold on its MTP rows at concurrency <= :data:`MTP_MAX_CONC` outside the fold
    (:func:`fit_rate`, every other parameter as ``params``, None: shipped), the shared rate where it has none there;
    the shared rate is the shipped one.
    Groups in ``shipped_b`` (``shipped_a``) refit the stage-B and -E parameters it names (stage A); the others keep
    what the profile gives them without (``None``: every group refits every stage)."""
    cat = cat or default_catalog()
    rates = acceptances(cat, acc)
    mtp = mtp_rows(cases)
    fams: dict[tuple[str, str], list[bx.Case]] = defaultdict(list)
    for c in scored(cases):
        fams[group_of(c)[:2]].append(c)
    held: list[tuple[bx.Case, dict[str, float] | str]] = []
    for fam, fc in sorted(fams.items()):
        for fold in folds_of(fc, folds):
            train = [c for c in fc if c.config not in fold]
            test = [c for c in fc if c.config in fold]
            if not test:
                continue
            fold_acc: Acceptance = rates
            if fam[0] in rates:  # without any of its MTP rows outside the fold, the engine gets the shared rate
                own = [c for c in mtp if ENGINE[c.framework] == fam[0] and c.config not in fold]
                fold_acc = ({**rates, fam[0]: fit_rate(own, cat, params)} if own
                            else {k: v for k, v in rates.items() if k != fam[0]})
            fitted: dict[Group, dict[str, float]] = {}
            for key in sorted({group_of(c) for c in fc}):
                tr = [c for c in train if group_of(c) == key]
                start = layered(fitted, key)
                base = stage_a_rows(tr)
                fp = fit_group(base, start) if base and (shipped_a is None or key in shipped_a) else dict(start)
                if tr and (shipped_b is None or key in shipped_b):
                    names = STAGE_B + STAGE_E if shipped_b is None else shipped_b[key]
                    b_names = tuple(n for n in names if n in STAGE_B)
                    if b_names:
                        fp.update(fit_b_e(tr, fp, cat, fold_acc, b_names, with_e="first_wave_overhead_s" in names))
                    else:
                        fp.update(fit_stage_e(tr, fp, cat, fold_acc))
                fitted[key] = fp
            preds = Predictor(test).run(fitted, cat, fold_acc)
            held += [(c, preds[i]) for i, c in enumerate(test)]
    return held


def shipped_groups(cases: Sequence[bx.Case]) -> tuple[set[Group], dict[Group, tuple[str, ...]]]:
    """(groups whose stage A ships, groups whose stage B or E ships -> the stage-B and -E parameters they ship), read from the
    shipped profiles: a current group's family, an older epoch's ``releases:`` override, naming the parameter."""
    a: set[Group] = set()
    b: dict[Group, tuple[str, ...]] = {}
    for c in cases:
        key = group_of(c)
        f = engine_profile(key[0]).family_fit(c.gpu)
        if f is None:
            continue
        r = f.release_fit(c.release) if key[2] else None
        m = f.model_fit(bx.MODEL)
        current_names = {**dict(f.parameters), **(dict(m.parameters) if m is not None else {})}
        names = dict(r.parameters) if r is not None else ({} if key[2] else current_names)
        if "moe_layer_overhead_s" in names:
            a.add(key)
        if "server_request_overhead_s" in names or "first_wave_overhead_s" in names:
            b[key] = tuple(n for n in STAGE_B + STAGE_E if n in names)
    return a, b


def error_table(pairs: Sequence[tuple[bx.Case, dict[str, float] | str]], title: str) -> list[str]:
    """MAPE of TTFT / TPOT / output throughput overall, by GPU, engine and parallelism class."""
    def cells(sub: Sequence[tuple[bx.Case, dict[str, float] | str]]) -> str:
        row = [f"{statistics.fmean(errs):.1f}" if (errs := [bx.ape(p[k], c.measured[k]) for c, p in sub
                                                              if isinstance(p, dict) and k in c.measured]) else "-"
               for k in bx.METRICS]
        return f"{len(sub)} | " + " | ".join(row)

    out = [f"| {title} | rows | TTFT MAPE % | TPOT MAPE % | output tput MAPE % |", "|---|---:|---:|---:|---:|",
           f"| all | {cells(pairs)} |"]
    for label, f in (("GPU", lambda c: c.gpu), ("engine", lambda c: c.framework), ("parallelism", lambda c: c.parallel)):
        for g in sorted({f(c) for c, _ in pairs}):
            out.append(f"| {label} {g} | {cells([(c, p) for c, p in pairs if f(c) == g])} |")
    return out


def held_out_all(cases: Sequence[bx.Case], folds: int, cat: Any, acc: Acceptance,
                 params: dict[Group, dict[str, float]]) -> tuple[list[str], dict[tuple[str, str], dict[str, float]]]:
    """Every scored row predicted with parameters fitted WITHOUT its configuration (:func:`held_out_predictions`),
    beside the same rows with the parameters this run ships, overall and by GPU / engine / parallelism; and per
    (engine profile, family) the held-out figures the profile records (:func:`held_out_by_profile`)."""
    sc = scored(cases)
    shipped_b = {k: tuple(n for n in STAGE_B + STAGE_E if n in v) for k, v in params.items()
                 if "server_request_overhead_s" in v or "first_wave_overhead_s" in v}
    shipped_a = {k for k, v in params.items() if "moe_layer_overhead_s" in v}
    held = held_out_predictions(sc, folds, cat, acc, shipped_b, shipped_a, params)
    ship_preds = Predictor(sc).run(params, cat, acc)
    ins = [(c, ship_preds[i]) for i, c in enumerate(sc)]
    out = ["", "## Every row, held out by configuration", "",
           f"Stage-A and stage-B parameters refitted per engine x family without each of {folds} folds of whole "
           "configurations (stage A on the other folds' rows without MTP, stage B on all their rows), predicting "
           "every row of the held-out fold (fp4 and MTP too, with the shipped fp4 rows and acceptance).", ""]
    out += error_table(held, "held out by configuration") + [""]
    out += error_table(ins, "in sample (the parameters shipped)")
    comp = log_residual_components(sc, ship_preds, "tpot")
    out += ["", f"Stage A's loss (`robust_log_loss`), on every row's ln(predicted / measured TPOT) in sample: sd "
            f"{comp['within_point']:.3f} between the dates of one point ({comp['rows_within_point']:.0f} rows), "
            f"{comp['within_config']:.3f} about a configuration's mean, {comp['between_config']:.3f} between "
            f"{comp['configurations']:.0f} configurations' means. The loss uses Huber delta {HUBER_LOG_DELTA} (1.345 x the "
            f"first) and configuration variance ratio {CONFIG_VARIANCE_RATIO} ((third / second)^2), as the fit of "
            "2026-12-05 measured them."]
    print("\n".join(out[-32:]), flush=True)
    return out, held_out_by_profile(held)


def held_out_by_profile(held: Sequence[tuple[bx.Case, dict[str, float] | str]]) -> dict[tuple[str, str], dict[str, float]]:
    """(engine profile, family) -> {rows, configurations, ttft / tpot / output_tput mape_pct}: the held-out error of
    the rows behind that profile family (every release epoch of it), written into its ``families:`` block as
    ``held_out_inferencex`` and quoted by a plan's evidence note and the README."""
    by: dict[tuple[str, str], list[tuple[bx.Case, dict[str, float] | str]]] = defaultdict(list)
    for c, p in held:
        by[group_of(c)[:2]].append((c, p))
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key, sub in sorted(by.items()):
        d: dict[str, float] = {"rows": len(sub), "configurations": len({c.config for c, _ in sub})}
        for metric, name in (("ttft", "ttft_mape_pct"), ("tpot", "tpot_mape_pct"), ("tput", "output_tput_mape_pct")):
            errs = [bx.ape(p[metric], c.measured[metric]) for c, p in sub if isinstance(p, dict) and metric in c.measured]
            d[name] = round(statistics.fmean(errs), 1) if errs else math.nan
        out[key] = d
    return out


def mtp_pairs(cases: Sequence[bx.Case]) -> list[tuple[bx.Case, bx.Case, float]]:
    """(an MTP case, its non-MTP twin, measured TPOT gain = median non-MTP / median MTP over dates) per point."""
    by: dict[tuple[Any, ...], list[bx.Case]] = defaultdict(list)
    for c in cases:
        if "tpot" in c.measured and "closed_loop_check_ratio" not in c.row["quality_flags"]:
            by[(c.gpu, c.framework, c.tp, c.dp, c.ep, c.weight_dtype, c.row["isl"], c.row["osl"], c.conc, c.mtp > 0)].append(c)
    out = []
    for k, on in by.items():
        if not k[-1]:
            continue
        off = by.get((*k[:-1], False))
        if off:
            g = statistics.median(c.measured["tpot"] for c in off) / statistics.median(c.measured["tpot"] for c in on)
            out.append((on[0], off[0], g))
    return out


def _with(cat: Any, arch: str, dtype: str, bandwidth: float) -> Any:
    gpus = {}
    for gid, g in cat.gpus.items():
        if g.kernels.arch == arch:
            effs = {**g.kernels.efficiencies, dtype: dataclasses.replace(g.kernels.efficiency(dtype), bandwidth=bandwidth)}
            g = dataclasses.replace(g, kernels=dataclasses.replace(g.kernels, efficiencies=effs))
        gpus[gid] = g
    return dataclasses.replace(cat, gpus=gpus)


NOTE = ("server_request_overhead_s (every model behind this engine's HTTP server), first_wave_overhead_s (a benchmark "
        "run's first wave); the routed experts' terms for DeepSeek-V3 / R1 under models: fitted by benchmarks/fit_inferencex.py "
        "on {n} InferenceX DeepSeek-R1 rows (benchmarks/results/inferencex-fit.md)")
MODEL_NOTE = ("moe_layer_overhead_s, expert_bandwidth_efficiency, expert_compute_efficiency of DeepSeek-R1's routed experts "
              "(256 experts, top 8): fitted by benchmarks/fit_inferencex.py on {n} InferenceX rows (benchmarks/results/inferencex-fit.md)")


def merge_families(text: str, fams: dict[str, dict[str, float]], rows: dict[str, int], drop: set[str] | None = None,
                   releases: dict[str, list[tuple[str, int, dict[str, float]]]] | None = None) -> str:
    """Put the stage-A parameters into a profile's ``families:`` by text edits (the rest of the file unchanged):
    an existing family gets the parameter lines (replaced when present) and a ``moe_source`` line; a new family
    is added as a block after ``families:`` (its ``rows`` = the InferenceX rows behind it). ``releases``: per family,
    (before, rows, parameters) of older release epochs, written as the block's ``releases:`` list (replacing one
    written before)."""
    drop = drop or set()
    releases = releases or {}
    doc = yaml.safe_load(text) or {}
    have = dict(doc.get("families") or {})
    for fam in list(have):
        # a family this script wrote before (only its parameters): drop its block and write it again
        if ((fam in fams or fam in drop) and "fit_inferencex" in str(have[fam].get("source"))
                and set(have[fam].get("parameters") or {}) <= set(STAGES)):
            block = re.search(rf"\n  {fam}:\n(?:    .*\n|      .*\n)*", text)
            assert block is not None
            text = text.replace(block.group(0), "\n", 1)
            del have[fam]
    if "families:" not in text:
        text = text.rstrip("\n") + "\nfamilies:\n"
    for fam, p in sorted(fams.items()):
        vals = {k: float(v) for k, v in p.items() if k in STAGES and k not in MODEL_STAGES}
        model = _model_text(rows.get(fam, 0), {k: float(v) for k, v in p.items() if k in MODEL_STAGES})
        note = NOTE.format(n=rows.get(fam, 0))
        if fam in have:
            block = re.search(rf"\n  {fam}:\n(?:    .*\n|      .*\n)*", text)
            assert block is not None
            b = re.sub(r"\n    releases:\n(?:    - .*\n|      .*\n)*", "\n", block.group(0))
            b = re.sub(r"\n    models:\n(?:      .*\n)*", "\n", b)
            for k in STAGES:
                b = re.sub(rf"\n      {k}: .*", "", b)
            b = re.sub(r"\n    moe_source: .*", "", b)
            b = b.replace("\n    parameters:\n", "\n    parameters:\n" + "".join(f"      {k}: {v:.6g}\n" for k, v in vals.items()), 1)
            b = b.replace("\n    parameters:\n", f"\n    moe_source: {yaml.safe_dump(note, width=10**6).strip()}\n    parameters:\n", 1)
            text = text.replace(block.group(0), b.rstrip("\n") + "\n" + _releases_text(releases.get(fam, [])) + model)
        else:
            add = (f"  {fam}:\n    rows: {rows.get(fam, 0)}\n    source: {yaml.safe_dump(note, width=10**6).strip()}\n"
                   "    parameters:\n" + "".join(f"      {k}: {v:.6g}\n" for k, v in vals.items())
                   + _releases_text(releases.get(fam, [])) + model)
            text = text.replace("\nfamilies:\n", "\nfamilies:\n" + add, 1)
    return text


def _model_text(n: int, vals: dict[str, float]) -> str:
    """A family block's ``models:`` entry for DeepSeek-R1's expert parameters (:data:`MODEL_STAGES`), "" for none."""
    if not vals:
        return ""
    note = MODEL_NOTE.format(n=n)
    return (f"    models:\n      {bx.MODEL}:\n        rows: {n}\n        source: {yaml.safe_dump(note, width=10**6).strip()}\n"
            "        parameters:\n" + "".join(f"          {k}: {v:.6g}\n" for k, v in vals.items()))


def merge_held_out(text: str, held: dict[str, dict[str, float]]) -> str:
    """Write each family's ``held_out_inferencex:`` mapping (replacing one written before) at the end of its block;
    a family without a block here is left out (its rows run the engine profile)."""
    for fam, d in sorted(held.items()):
        block = re.search(rf"\n  {fam}:\n(?:    .*\n|      .*\n)*", text)
        if block is None:
            continue
        b = re.sub(r"\n    held_out_inferencex:\n(?:      .*\n)*", "\n", block.group(0))
        add = "    held_out_inferencex:\n" + "".join(f"      {k}: {int(v) if k in ('rows', 'configurations') else v}\n"
                                                   for k, v in d.items())
        text = text.replace(block.group(0), b.rstrip("\n") + "\n" + add)
    return text


def _releases_text(rel: Sequence[tuple[str, int, dict[str, float]]]) -> str:
    """A family block's ``releases:`` list (older engine releases' stage parameters), "" for none."""
    if not rel:
        return ""
    out = "    releases:\n"
    for before, n, p in sorted(rel):
        note = NOTE.format(n=n) + f", releases before {before}"
        out += (f"    - before: '{before}'\n      rows: {n}\n      source: {yaml.safe_dump(note, width=10**6).strip()}\n"
                "      parameters:\n" + "".join(f"        {k}: {float(v):.6g}\n" for k, v in p.items() if k in STAGES))
    return out


def write(params: dict[Group, dict[str, float]], effs: dict[tuple[str, str], float], acc: float,
          rows: dict[Group, int], unshipped: set[Group] | None = None,
          held: dict[tuple[str, str], dict[str, float]] | None = None,
          eng_acc: dict[str, dict[str, float]] | None = None) -> None:
    """Merge the fits into the profiles, the kernel table and the model catalog (text edits keep the comments)."""
    by_engine: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    releases: dict[str, dict[str, list[tuple[str, int, dict[str, float]]]]] = defaultdict(lambda: defaultdict(list))
    for key, p in params.items():
        eng, fam, epoch = key
        if epoch:
            releases[eng][fam].append((epoch.lstrip("<"), rows.get(key, 0), p))
        else:
            by_engine[eng][fam] = p
    unshipped = unshipped or set()
    for eng in sorted({k[0] for k in params} | {k[0] for k in unshipped}):
        path = ROOT / "catalogs" / "profiles" / f"{eng}.yaml"
        drop = {k[1] for k in unshipped if k[0] == eng and not k[2]}
        fam_rows = {k[1]: n for k, n in rows.items() if k[0] == eng and not k[2]}
        text = merge_families(path.read_text(), by_engine.get(eng, {}), fam_rows, drop, releases.get(eng, {}))
        path.write_text(merge_held_out(text, {f: v for (e, f), v in (held or {}).items() if e == eng}))
    ks = ROOT / "catalogs" / "kernel-support.yaml"
    text = ks.read_text()
    for (_arch, dtype), bw in effs.items():
        text = re.sub(rf"(\n      {dtype}: {{bandwidth: )[0-9.]+", rf"\g<1>{bw:.3f}", text, count=1)
    ks.write_text(text)
    mpath = ROOT / "catalogs" / "models" / "deepseek-v3.yaml"
    mt = mpath.read_text()
    mt = re.sub(r"(\n  acceptance_rate: )[0-9.]+", rf"\g<1>{acc:.3f}", mt, count=1)
    mpath.write_text(merge_by_engine(mt, eng_acc or {}))


def merge_by_engine(text: str, eng_acc: dict[str, dict[str, float]]) -> str:
    """The model file's ``speculative.by_engine`` block (the last block of ``speculative:``) rewritten from stage D's
    per-engine rates (:func:`stage_d_by_engine`); dropped where none ships."""
    text = re.sub(r"\n  by_engine:\n(    .*\n)*", "\n", text if text.endswith("\n") else text + "\n")
    text = text.rstrip("\n") + "\n"
    if not eng_acc:
        return text
    block = ["  by_engine:",
             "    # Per engine profile where its own MTP rows fit a rate that beats the shared one held out by configuration",
             "    # (benchmarks/fit_inferencex.py stage D, benchmarks/results/inferencex-fit.md): `recommend estimate --engine`",
             "    # and the InferenceX predictions use it; vLLM plans use acceptance_rate above."]
    for eng, v in sorted(eng_acc.items()):
        block.append(f"    {eng}: {{acceptance_rate: {v['acceptance_rate']:.3f}, rows: {int(v['rows'])}, configurations: "
                     f"{int(v['configurations'])}, held_out_tpot_mape_pct: {v['held_out_tpot_mape_pct']:.1f}, "
                     f"shared_rate_tpot_mape_pct: {v['shared_tpot_mape_pct']:.1f}, source: \"fitted on InferenceX DeepSeek-R1 "
                     f"{eng} MTP rows (benchmarks/fit_inferencex.py stage D)\"}}")
    return text + "\n".join(block) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
