"""Calibration of the plans' error bands: how often a measured value falls inside its p10-p90 band, per evidence class.

    python3 benchmarks/bench_bands.py [--out benchmarks/results/bands.md] [--write [--evidence FILE]] [--cache FILE.json]
                                      [--folds 12]

Evidence class = engine x GPU family x weight dtype x model class (dense / MoE), as ``recommender/search/bands.py``
defines it. Every row below is predicted by a fit that did not see its **configuration** (model x GPU x TP for the
published rows; GPU x engine x parallelism x MTP x dtype x ISL/OSL for InferenceX):

- ``tests/data/measurements/published.csv`` (copy of ``../shared/reference/measurements/published.csv``): per engine,
  the profile refitted by ``benchmarks/fit_profiles.py``'s own pipeline (``fit_pipeline``: the engine fit, vLLM's on
  the full trtllm fit's physics, then the per-family stage) on the other configurations, dealt round-robin into
  ``--folds`` folds;
- ``tests/data/measurements/amd-mi300x.csv`` (16 rows, one configuration: Llama-3.1-405B, MI300X x 8): the vLLM
  engine profile fitted on every published vLLM row (none on MI300X), i.e. what a planner knows without them;
- ``tests/data/measurements/inferencex-dsr1.csv`` (single-node DeepSeek-R1 rows): ``benchmarks/fit_inferencex.py``'s
  stage-A parameters refitted per engine x family without each of 3 folds of whole configurations, predicted as
  ``benchmarks/bench_inferencex.py`` predicts them.

- the disaggregated rows of ``inferencex-dsr1.csv``, predicted as P/D plans by ``benchmarks/bench_inferencex_disagg.py``
  with the one constant fitted on them (the P/D handoff) held out by configuration, those within the search policy's ``max_utilisation``: not a class of their own but
  ``evidence.yaml``'s ``disaggregated`` entry, which widens a P/D plan's band (``bands.with_disaggregated``).

Each row gives a slowdown ``g`` = measured / predicted for a time (TTFT, TPOT, ITL, e2e), predicted / measured for a
rate (output tokens/s): the factor the band is about (``bands.py``: every step ``g`` times as long). The band of a
row is ``[exp(-1.2816 sigma), exp(+1.2816 sigma)]`` around the prediction, ``sigma`` its class's log-sd.

Calibration is itself held out: the sigma a row is judged by is built (``bands.class_sigma``) from its class's rows
of the OTHER configurations, so no row widens its own band. ``--write`` writes the classes built from all rows into
``catalogs/evidence.yaml``, which the planner reads. Coverage is reported per class and metric, and against the
sigma the planner used before (the profile's held-out median APE by GPU, ``legacy``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

PUBLISHED = ROOT / "tests/data/measurements/published.csv"
AMD_CSV = ROOT / "tests/data/measurements/amd-mi300x.csv"
DEFAULT_OUT = ROOT / "benchmarks/results/bands.md"
EVIDENCE = ROOT / "catalogs/evidence.yaml"
Z90 = 1.2816
RATE_QUANTITIES = ("output_tokens_per_s",)
KIND = {"ttft_s": "ttft", "tpot_s": "tpot", "itl_intercept_s": "tpot", "itl_slope_s_per_token": "tpot",
        "e2e_s": "e2e", "output_tokens_per_s": "tput", "ttft": "ttft", "tpot": "tpot", "tput": "tput"}
#: the band's metric kinds (``bands.EvidenceClass``): TTFT has its own error; the rest are decode-side
BAND_KIND = {"ttft": "ttft", "tpot": "decode", "e2e": "decode", "tput": "decode"}


@dataclass(frozen=True)
class Row:
    """One held-out prediction: its evidence class, configuration, metric and log slowdown ``ln g``."""

    source: str
    gpu: str
    engine: str
    family: str
    dtype: str
    model_class: str
    config: str
    metric: str
    log_g: float

    @property
    def cls(self) -> tuple[str, str, str, str]:
        return (self.engine, self.family, self.dtype, self.model_class)


def _log_g(quantity: str, predicted: float, measured: float) -> float | None:
    if not (predicted > 0 and measured > 0 and math.isfinite(predicted)):
        return None
    r = math.log(measured / predicted)
    return -r if quantity in RATE_QUANTITIES else r


def _model_class(model: str) -> str:
    from recommender.catalog import default_catalog

    return "moe" if default_catalog().models[model].is_moe else "dense"


def published_rows(folds: int) -> list[Row]:
    """Published and MI300X rows, each predicted by an engine fit without its configuration."""
    import fit_profiles as fp

    from recommender.calibrate.measurements import Measurement, predict
    from recommender.calibrate.readers import read_published_csv
    from recommender.profiles import gpu_family

    ms = read_published_csv(PUBLISHED).measurements
    amd = read_published_csv(AMD_CSV).measurements if AMD_CSV.exists() else []
    out: list[Row] = []
    trt_full = None

    def add(src: str, m: Measurement, pred: float) -> None:
        lg = _log_g(m.quantity, pred, m.value)
        if lg is not None:
            out.append(Row(src, m.gpu, m.engine, gpu_family(m.gpu) or m.gpu, m.weight_dtype, _model_class(m.model),
                           m.group("config"), KIND[m.quantity], lg))

    for engine in fp.ENGINES:
        em = [m for m in ms if m.engine == engine]
        prior = trt_full if engine == "vllm" else None
        names = sorted({m.group("config") for m in em})
        k = min(folds, len(names))
        for i in range(k):
            fold = set(names[i::k])
            train = [m for m in em if m.group("config") not in fold]
            test = [m for m in em if m.group("config") in fold]
            if len(train) < 3:
                continue
            # the very pipeline that writes the shipped profiles (engine fit, then per-family stage)
            prof = fp.fit_pipeline(engine, train, [], prior)
            for m in test:
                add("published", m, predict(m, prof))
        full = fp.fit_pipeline(engine, em, [], prior, families=False)  # no MI300X row seen
        if engine == "trtllm":
            trt_full = full
        for m in amd:
            if m.engine == engine:
                add("amd-mi300x", m, predict(m, full))
        print(f"  published {engine}: {len(em)} rows, {len(names)} configurations", file=sys.stderr, flush=True)
    return out


def inferencex_rows(folds: int = 3, held: Sequence[tuple[Any, Any]] | None = None) -> list[Row]:
    """InferenceX DeepSeek-R1 single-node rows, stage-A and stage-B parameters refitted without each fold of
    configurations (``fit_inferencex.held_out_predictions``; stage B only for the groups that ship it), or
    ``held``: those (case, prediction) pairs already computed."""
    import bench_inferencex as bx
    import fit_inferencex as fx

    from recommender.catalog import default_catalog

    cases = fx.scored(bx.single_node_cases(bx.DEFAULT_CSV))
    if held is None:
        shipped_a, shipped_b = fx.shipped_groups(cases)
        held = fx.held_out_predictions(cases, folds, default_catalog(), None, shipped_b, shipped_a)
    out: list[Row] = []
    for c, p in held:
        if isinstance(p, str):
            continue
        key = fx.group_of(c)
        for metric in bx.METRICS:
            if metric in c.measured:
                lg = _log_g("output_tokens_per_s" if metric == "tput" else metric, p[metric], c.measured[metric])
                if lg is not None:
                    out.append(Row("inferencex", c.gpu, key[0], key[1], c.weight_dtype, "moe", "|".join(map(str, c.config)),
                                   metric, lg))
    print(f"  inferencex: {len(cases)} rows", file=sys.stderr, flush=True)
    return out


def load_rows(cache: Path | None, folds: int) -> list[Row]:
    if cache is not None and cache.exists():
        return [Row(**r) for r in json.loads(cache.read_text())]
    rows = published_rows(folds) + inferencex_rows() + disagg_rows()
    if cache is not None:
        cache.write_text(json.dumps([asdict(r) for r in rows]))
    return rows


def q80_sigma(log_gs: Sequence[float]) -> float | None:
    """``sigma_fit``: the 80th percentile of ``|ln g|`` (linear interpolation) / 1.2816, so that
    ``|ln g| <= 1.2816 sigma`` (inside the p10-p90 band) for 80% of the rows; None without rows."""
    a = sorted(abs(x) for x in log_gs)
    if not a:
        return None
    pos = 0.8 * (len(a) - 1)
    i = int(pos)
    q = a[i] if i + 1 >= len(a) else a[i] + (pos - i) * (a[i + 1] - a[i])
    return q / Z90


ClassKey = tuple[str, str, str, str, str]  # engine, family, dtype, model class, band kind


def by_class(rows: Sequence[Row]) -> dict[ClassKey, list[Row]]:
    out: dict[ClassKey, list[Row]] = defaultdict(list)
    for r in rows:
        out[(*r.cls, BAND_KIND[r.metric])].append(r)
    return out


def priors(fits: dict[ClassKey, float | None], skip: tuple[str, str, str, str] | None = None) -> dict[tuple[str, str], float]:
    """Per (model class, kind): the widest sigma_fit of any class (but ``skip``), at least ``bands.PRIOR_SIGMA``."""
    from recommender.search.bands import PRIOR_SIGMA

    out: dict[tuple[str, str], float] = {}
    for mc in ("dense", "moe"):
        for kind in ("ttft", "decode"):
            vals = [v for k, v in fits.items() if v is not None and k[3] == mc and k[4] == kind and k[:4] != skip]
            out[(mc, kind)] = max([PRIOR_SIGMA, *vals])
    return out


PD_SOURCE = "inferencex-disagg"


def disagg_rows() -> list[Row]:
    """InferenceX's disaggregated DeepSeek-R1 rows predicted as P/D plans (``bench_inferencex_disagg.py``; the one
    constant fitted on them, the P/D handoff, held out by configuration) at a predicted utilisation within the search policy's
    ``max_utilisation``: the ``disaggregated`` entry of ``catalogs/evidence.yaml``, which widens a P/D plan's band."""
    import bench_inferencex_disagg as bd

    from recommender.catalog import default_catalog
    from recommender.search.policy import load_search_policy

    cat = default_catalog()
    pairs = bd.held_out_pairs(bd.disagg_cases(bd.bx.DEFAULT_CSV))
    out = []
    for c, p in bd.within_utilisation(pairs, load_search_policy().max_utilisation):
        gpu = bd.GPU[c.gpu]
        for metric in ("ttft", "tpot", "tput"):
            lg = _log_g("output_tokens_per_s" if metric == "tput" else metric, p[metric], c.measured.get(metric, 0.0))
            if lg is not None:
                out.append(Row(PD_SOURCE, gpu, bd.FRAMEWORK[c.framework][1], cat.gpu(gpu).arch, c.weight_dtype, "moe",
                               "|".join(map(str, c.point[:-2])), metric, lg))
    print(f"  inferencex disaggregated: {len(out)} errors", file=sys.stderr, flush=True)
    return out


def split_pd(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """(single-node rows: the per-class evidence, disaggregated rows: the P/D entry)."""
    return [r for r in rows if r.source != PD_SOURCE], [r for r in rows if r.source == PD_SOURCE]


def pd_entry(pd: Sequence[Row]) -> dict[str, Any]:
    """``evidence.yaml``'s ``disaggregated`` mapping: per kind (``ttft``, ``decode``) the rows, configurations,
    sigma_fit (the same 80th-percentile rule as a class) and median ln g (bias) of the P/D rows."""
    from recommender.search.policy import load_search_policy

    out: dict[str, Any] = {
        "source": "benchmarks/bench_inferencex_disagg.py: InferenceX's disaggregated DeepSeek-R1 rows (Dynamo SGLang / "
                  "TensorRT-LLM, MoRI SGLang) predicted as P/D plans, the P/D handoff held out by configuration",
        "max_utilisation": load_search_policy().max_utilisation}
    for kind in ("ttft", "decode"):
        v = [r for r in pd if BAND_KIND[r.metric] == kind]
        if v:
            out[kind] = {"rows": len(v), "configs": len({r.config for r in v}),
                         "sigma": round(q80_sigma([r.log_g for r in v]) or 0.0, 4),
                         "median_log_g": round(statistics.median(r.log_g for r in v), 4)}
    return out


@dataclass
class Cover:
    n: int = 0
    inside: int = 0
    below: int = 0  # measured faster than the band's fast end
    legacy_inside: int = 0

    def add(self, log_g: float, sigma: float, legacy_sigma: float) -> None:
        self.n += 1
        self.inside += abs(log_g) <= Z90 * sigma
        self.below += log_g < -Z90 * sigma
        self.legacy_inside += abs(log_g) <= Z90 * legacy_sigma

    def pct(self, k: int) -> str:
        return f"{100.0 * k / self.n:.0f}%" if self.n else "-"


def legacy_sigma(engine: str, gpu: str, cache: dict[tuple[str, str], float]) -> float:
    """The sigma the planner used before this benchmark: the shipped profile's held-out median APE by GPU."""
    from recommender.profiles import engine_profile
    from recommender.search.bands import class_sigma, legacy_family_error

    if (engine, gpu) not in cache:
        prof = engine_profile(engine)
        fam, fam_rows = prof.evidence(gpu)
        from recommender.profiles import gpu_family

        n, s = legacy_family_error(prof.fit or {}, fam or gpu_family(gpu), fam_rows)
        cache[(engine, gpu)] = class_sigma(n, s)
    return cache[(engine, gpu)]


def calibrate(rows: Sequence[Row]) -> tuple[dict[ClassKey, Cover], dict[ClassKey, float], dict[str, Cover]]:
    """Coverage per class and kind with each row judged by the sigma of its class's OTHER configurations (and a
    prior from the other classes), beside the legacy sigma; the held-out sigma per class (mean over rows);
    totals per source x kind, kind and overall."""
    from recommender.search.bands import class_sigma

    classes = by_class(rows)
    fits = {k: q80_sigma([r.log_g for r in v]) for k, v in classes.items()}
    cover: dict[ClassKey, Cover] = {}
    used: dict[ClassKey, float] = {}
    totals: dict[str, Cover] = defaultdict(Cover)
    lcache: dict[tuple[str, str], float] = {}
    for k, v in sorted(classes.items()):
        pri = priors(fits, skip=k[:4])[(k[3], k[4])]
        c = Cover()
        sig_sum = 0.0
        for r in v:
            other = [o.log_g for o in v if o.config != r.config]
            sigma = class_sigma(len(other), q80_sigma(other), pri)
            sig_sum += sigma
            ls = legacy_sigma(r.engine, r.gpu, lcache)
            c.add(r.log_g, sigma, ls)
            for t in (f"{r.source} {k[4]}", k[4], "all"):
                totals[t].add(r.log_g, sigma, ls)
        cover[k], used[k] = c, sig_sum / len(v)
    return cover, used, totals


def evidence_doc(rows: Sequence[Row]) -> dict[str, Any]:
    """``catalogs/evidence.yaml``: per class and kind its rows, configurations, sigma_fit and median ln g (bias);
    the priors per model class and kind; the P/D rows' ``disaggregated`` entry."""
    rows, pd = split_pd(rows)
    classes = by_class(rows)
    fits = {k: q80_sigma([r.log_g for r in v]) for k, v in classes.items()}
    pri = priors(fits)
    entries: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for k, v in sorted(classes.items()):
        e = entries.setdefault(k[:4], {"engine": k[0], "family": k[1], "dtype": k[2], "model_class": k[3]})
        e[k[4]] = {"rows": len(v), "configs": len({r.config for r in v}), "sigma": round(fits[k] or 0.0, 4),
                   "median_log_g": round(statistics.median(r.log_g for r in v), 4),
                   "sources": sorted({r.source for r in v})}
    return {"source": "benchmarks/bench_bands.py --write: held-out (by configuration) predictions of "
                      "tests/data/measurements/{published,amd-mi300x,inferencex-dsr1}.csv",
            "sigma_is": "80th percentile of |ln g| / 1.2816, g = measured / predicted time (predicted / measured rate)",
            "kinds": {"ttft": ["ttft"], "decode": ["tpot", "itl", "e2e", "output_tokens_per_s"]},
            "prior": {"rows": 5, "sigma": {mc: {kind: round(pri[(mc, kind)], 4) for kind in ("ttft", "decode")}
                                           for mc in ("dense", "moe")},
                      "is": "per model class and kind: the widest sigma of any class here, at least 0.5"},
            "classes": list(entries.values()),
            **({"disaggregated": pd_entry(pd)} if pd else {})}


def report(rows: Sequence[Row], seconds: float) -> str:
    doc = evidence_doc(rows)
    rows, pd = split_pd(rows)
    cover, used, totals = calibrate(rows)
    classes = by_class(rows)
    lines = ["# Calibration of the error bands (p10-p90) on held-out rows", "",
             f"Generated by `python3 benchmarks/bench_bands.py` in {seconds:.0f} s (module docstring: the held-out "
             "rule). A row is inside when its measured value lies in the p10-p90 band of its evidence class "
             "(`recommender/search/bands.py`), built from the class's rows of the other configurations (a "
             "configuration that is its class's only one is judged by the prior). Target: 80%. *below* = measured "
             "faster than the band's fast end (the rest of the misses are slower than its slow end). *legacy* = the "
             "same rows under the sigma the planner used before (the profile's held-out median APE by GPU, "
             "one sigma for every metric, 0.5 prior).", "",
             "| rows | kind | n | inside p10-p90 | below | legacy inside |", "|---|---|---:|---:|---:|---:|"]
    order = {"": 0, "published": 1, "amd-mi300x": 2, "inferencex": 3}
    kinds = {"all": 0, "decode": 1, "ttft": 2}
    for t in sorted(totals, key=lambda x: (order.get(x.rpartition(" ")[0], 9), kinds.get(x.rpartition(" ")[2], 9))):
        c = totals[t]
        name, _, kind = t.rpartition(" ")
        lines.append(f"| {name or 'all sources'} | {kind} | {c.n} | {c.pct(c.inside)} | {c.pct(c.below)} | "
                     f"{c.pct(c.legacy_inside)} |")
    lines += ["", "## Per evidence class (engine / GPU family / weight dtype / model class)", "",
              "| class | kind | rows | configs | sigma (held out) | inside p10-p90 | below | legacy inside | median ln g |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k, c in sorted(cover.items()):
        v = classes[k]
        lines.append(f"| {'/'.join(k[:4])} | {k[4]} | {c.n} | {len({r.config for r in v})} | {used[k]:.3f} | "
                     f"{c.pct(c.inside)} | {c.pct(c.below)} | {c.pct(c.legacy_inside)} | "
                     f"{statistics.median(r.log_g for r in v):+.2f} |")
    pri = doc["prior"]["sigma"]
    lines += ["", "Priors (a class with no rows; `catalogs/evidence.yaml` `prior`): " + "; ".join(
        f"{mc} TTFT {p['ttft']}, decode {p['decode']}" for mc, p in pri.items()) + ".", ""]
    if pd:
        e = doc["disaggregated"]
        lines += ["## P/D plans (`catalogs/evidence.yaml` `disaggregated`)", "",
                  "InferenceX's disaggregated rows predicted as P/D plans, the one constant fitted on them (the P/D handoff) "
                  "held out by configuration "
                  "(`bench_inferencex_disagg.py`), those the model runs at a utilisation within the search policy's "
                  f"`max_utilisation` ({e['max_utilisation']:g}). A P/D plan's band takes the wider of its pools' class "
                  "and this entry per kind (`recommender/search/bands.py`); its sigma is these rows' own 80th "
                  "percentile, so 80% lie inside by construction (each predicted held out).", "",
                  "| kind | rows | configs | sigma | band p10-p90 | median ln g (measured / predicted) |",
                  "|---|---:|---:|---:|---|---:|"]
        for kind in ("ttft", "decode"):
            if kind in e:
                k = e[kind]
                lines.append(f"| {kind} | {k['rows']} | {k['configs']} | {k['sigma']:.3f} | "
                             f"x{math.exp(-Z90 * k['sigma']):.2f} - x{math.exp(Z90 * k['sigma']):.2f} | "
                             f"{k['median_log_g']:+.2f} (x{math.exp(k['median_log_g']):.2f}) |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--cache", type=Path, default=None, help="held-out predictions: read if there, else written")
    ap.add_argument("--folds", type=int, default=12)
    ap.add_argument("--write", action="store_true", help=f"write the classes into {EVIDENCE.relative_to(ROOT)}")
    ap.add_argument("--evidence", type=Path, default=EVIDENCE, help="where --write writes the classes")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = load_rows(a.cache, a.folds)
    text = report(rows, time.perf_counter() - t0)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)
    if a.write:
        import yaml

        header = ("# Evidence classes of the plans' error bands (recommender/search/bands.py): rows and held-out error\n"
                  "# per engine x GPU family x weight dtype x model class and metric kind.\n"
                  "# Written by benchmarks/bench_bands.py --write; rerun it rather than editing.\n")
        a.evidence.write_text(header + yaml.safe_dump(evidence_doc(rows), sort_keys=False, width=120))
        print(f"wrote {a.evidence}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
