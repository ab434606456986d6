"""Fit the shipped engine profiles on the published measurements and report the error before and after.

    python benchmarks/fit_profiles.py [--csv tests/data/measurements/published.csv] [--no-write] [--quick] [--out FILE.md]

Writes ``catalogs/profiles/{vllm,trtllm,lmdeploy,gpt-fast,sglang,atom}.yaml`` and the Markdown report (the table
pasted into the README) to ``--out`` (default ``$TMPDIR/recommender-benchmarks/fit_profiles.md``, outside the
tracked tree, as ``bench_search.py``; ``benchmarks/results/fit_profiles.md`` is the committed copy), and prints the table.

Per engine (a fit on one engine is no claim about another):

- ``trtllm``: TRT017 + TRT061 + TRTBLOG rows;  ``lmdeploy``: LMD;  ``gpt-fast``: GPTFAST (A100 power-capped
  to 330 W: the profile absorbs the cap, so it describes that engine on that hardware);
- ``vllm``: VLLMFP8KV (23 rows, all TP 1) on the trtllm fit's physics (bandwidth, GEMM efficiency and
  curve, fp8 ratio, collectives: the same kernels), fitting only what is vLLM's own
  (:data:`VLLM_PARAMETERS`: step and layer overheads, attention efficiency); the MI300X rows fit
  its ``cdna3`` family;
- ``sglang`` and ``atom``: vLLM's fitted values at the engine level (no SGLang or ATOM rows in published.csv); their
  families' MoE and front-end parameters come from ``benchmarks/fit_inferencex.py`` (run it after this script).

"Before" is the provisional profile (the ``EngineProfile`` defaults that ``vllm.yaml`` held before any
fit) applied to every engine. Errors are absolute percentage errors ``|predicted / measured - 1|``;
held-out errors come from fits that did not see the rows (leave one source / model / GPU out, and a
fit on TRT017 alone tested on TRT061 + TRTBLOG).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recommender.atomic import atomic_write_text  # noqa: E402
from recommender.calibrate.fit import (ErrorStats, FitOptions, FitResult, HeldOut, ape, error_stats,  # noqa: E402
                                       fit_family, fit_profile, held_out, split_error, summarize)
from recommender.calibrate.measurements import Measurement, predict  # noqa: E402
from recommender.calibrate.readers import read_published_csv  # noqa: E402
from recommender.calibrate.report import fit_summary, parameter_table, profile_document, skipped_summary, write_profile  # noqa: E402
from recommender.profiles import FIT_PARAMETERS, EngineProfile, FamilyFit, gpu_family, load_profile  # noqa: E402

ENGINES = ("trtllm", "lmdeploy", "gpt-fast", "vllm")
#: What an engine fit may move: the calibrate set plus the GEMM curve's half point, the per-layer time under
#: CUDA graphs and the 8-bit GEMM efficiency ratio (issue 22); the fitter freezes what the rows cannot tell.
ENGINE_PARAMETERS = FIT_PARAMETERS + ("gemm_m_half_tokens", "layer_overhead_s", "fp8_gemm_efficiency_ratio",
                                      "attention_efficiency_ratio")
#: vLLM shares the kernels' physics with TensorRT-LLM (the same cuBLAS / CUTLASS GEMMs, flash attention, NCCL):
#: its fit starts from the trtllm profile and moves only what is its own: the per-step and per-layer
#: overheads and its attention backend's efficiency. Not the per-request cost: its only TTFT rows (VLLMFP8KV)
#: have one prompt length (~20k), where a fixed cost (0.13 s when fitted) cannot be told from a per-token one
#: or from slower long-context attention, and a fixed 0.13 s would be added to every short chat prompt.
VLLM_PARAMETERS = ("step_overhead_s", "layer_overhead_s", "attention_efficiency_ratio")
DESCRIPTION = {
    "trtllm": "TensorRT-LLM (trtllm-bench / gptSessionBenchmark; TRT017 + TRT061 + TRTBLOG)",
    "lmdeploy": "LMDeploy TurboMind v0.1 on A100-80GB (LMD)",
    "gpt-fast": "gpt-fast (torch.compile) on A100-80GB power-capped to 330 W (GPTFAST)",
    "vllm": "vLLM V1 (VLLMFP8KV, on the trtllm fit's physics)",
}


AMD_CSV = ROOT / "tests/data/measurements/amd-mi300x.csv"


def family_stage(engine: str, prof: EngineProfile, ms: list[Measurement], extra: list[Measurement],
                 csv_name: str, verbose: bool = True) -> tuple[EngineProfile, list[list[Any]]]:
    """Per-family fits of one engine's profile (``extra``: rows only families use, e.g. the MI300X file)."""
    fams: list[FamilyFit] = []
    rows: list[list[Any]] = []
    groups: dict[str, list[Measurement]] = {}
    for m in list(ms) + list(extra):
        groups.setdefault(gpu_family(m.gpu) or m.gpu, []).append(m)
    if len(groups) < 2 and not extra:
        return prof, rows
    for fam, fm in sorted(groups.items()):
        if len(fm) < 8:
            rows.append([engine, fam, len(fm), "-", "-", "-", "-", "-", "too few rows (< 8): engine profile"])
            continue
        t0 = time.time()
        ff, rep = fit_family(fm, prof, fam, data=AMD_CSV.name if fam == "cdna3" else csv_name)
        if verbose:
            print(f"    {engine}/{fam}: {len(fm)} rows, {'kept' if rep.kept else 'dropped'} ({time.time() - t0:.0f}s)",
                  file=sys.stderr)
        rows.append([engine, fam, len(fm), f"{rep.anchor_width:.2f}", rep.folds, _f(rep.engine_error), _f(rep.family_error),
                     ", ".join(f"{n} {v:.4g}" for n, v in rep.fitted.items()) or "-", "kept" if rep.kept else "dropped"])
        if ff is not None:
            fams.append(ff)
    return prof.replace(families=tuple(fams)), rows


def fit_pipeline(engine: str, ms: list[Measurement], extra: list[Measurement], prior: EngineProfile | None,
                 csv_name: str = "published.csv", families: bool = True) -> EngineProfile:
    """The shipped profile of one engine from these rows alone: the engine fit (from ``prior``'s physics) and the
    per-family stage. ``benchmarks/bench_accuracy.py`` runs it on the training folds of its held-out splits,
    so a held-out figure is the error of exactly this procedure on rows it did not see."""
    opts = FitOptions(parameters=VLLM_PARAMETERS if prior is not None else ENGINE_PARAMETERS)
    prof = engine_fit(engine, ms, prior, opts).profile if ms else start_of(engine, prior)
    if families:
        prof, _ = family_stage(engine, prof, ms, extra, csv_name, verbose=False)
    return prof


#: Folds of the held-out-by-configuration estimate (configurations = model / GPU / TP, dealt round-robin).
CONFIG_FOLDS = 5


def config_folds(ms: Sequence[Measurement], k: int = CONFIG_FOLDS) -> list[list[str]]:
    """The configurations of ``ms`` (``model/gpu/tpN``) dealt round-robin, sorted by name, into ``k`` folds."""
    names = sorted({m.group("config") for m in ms})
    folds: list[list[str]] = [[] for _ in range(min(k, len(names)))]
    for i, n in enumerate(names):
        folds[i % len(folds)].append(n)
    return folds


def held_out_by_config(engine: str, ms: list[Measurement], extra: list[Measurement], prior: EngineProfile | None,
                       k: int = CONFIG_FOLDS) -> dict[str, float]:
    """Row id -> prediction by :func:`fit_pipeline` fitted without the row's whole configuration (k-fold).

    A configuration (model, GPU, TP) is never split between training and test: its rows share the
    weights, the bandwidth and the collectives, so a point held out beside its neighbours is no test."""
    rows = list(ms) + list(extra)
    out: dict[str, float] = {}
    for fold in config_folds(rows, k):
        train = [m for m in ms if m.group("config") not in fold]
        train_x = [m for m in extra if m.group("config") not in fold]
        test = [m for m in rows if m.group("config") in fold]
        prof = fit_pipeline(engine, train, train_x, prior)
        for m in test:
            out[m.id] = predict(m, prof)
    return out


def evidence_block(ms: Sequence[Measurement], preds: dict[str, float]) -> dict[str, Any]:
    """The ``fit.held_out_by_config`` block of a profile: held-out error over all rows, per metric and per GPU
    family, with the rows and configurations behind each (``EngineProfile.held_out_evidence`` reads it)."""
    def stats(rows: Sequence[Measurement]) -> dict[str, Any]:
        e = error_stats([ape(preds[m.id], m.value) for m in rows if m.id in preds])
        return {"rows": len(rows), "configurations": len({m.group("config") for m in rows}),
                "median_ape_pct": round(e.median_ape, 2), "p90_ape_pct": round(e.p90_ape, 2)}
    fams = sorted({m.group("family") for m in ms})
    qs = sorted({m.quantity for m in ms})
    return {"folds": CONFIG_FOLDS, "by": "configuration (model / GPU / TP), k-fold", "all": stats(ms),
            "by_quantity": {q: stats([m for m in ms if m.quantity == q]) for q in qs},
            "by_family": {f: stats([m for m in ms if m.group("family") == f]) for f in fams}}


#: Where the shipped engine fits start the GEMM curve's hidden fraction: 1, a memory-bound GEMM hides its
#: small-M loss (NVIDIA decode at batch 1 runs at bandwidth: seed S0's 8-12 ms for 70B TP8, vLLM's ITL
#: intercepts). The published NVIDIA rows hold too few small batches to fit it; cdna3's family fit moves it.
HIDDEN_FRACTION = 1.0


def provisional(engine: str) -> EngineProfile:
    """The profile every engine had before fitting (vllm.yaml's provisional values = EngineProfile defaults)."""
    return EngineProfile(engine=engine, source="provisional")


def fit_start(engine: str) -> EngineProfile:
    """Where an engine fit starts: the provisional profile with the GEMM curve hidden under memory."""
    return provisional(engine).replace(gemm_curve_hidden_fraction=HIDDEN_FRACTION)


#: The GEMM efficiencies an engine fit starts from: the provisional 0.55 and 0.8, the two ends of what dense
#: tensor-core GEMMs reach at large M. From 0.55 alone, TensorRT-LLM's 356 rows stopped in a local minimum
#: (compute 0.48, all-reduce 0.48, fp8 ratio 1.0: 11.2 / 32.6% median / p90 in sample) where 0.8 reaches
#: 6.75 / 20.0% (compute 0.80, fp8 ratio 0.58: the shipped values); LMDeploy and gpt-fast end where they did.
START_COMPUTE_EFFICIENCIES = (0.55, 0.8)


def fit_engine_rows(engine: str, ms: list[Measurement], opts: FitOptions, source: str = "") -> FitResult:
    """The engine fit of ``ms`` from each of :data:`START_COMPUTE_EFFICIENCIES` (the rest :func:`fit_start`), the one
    with the lowest objective (``FitResult.cost``; the first on a tie)."""
    fits = [fit_profile(ms, fit_start(engine).replace(compute_efficiency=c), opts, engine=engine, source=source)
            for c in START_COMPUTE_EFFICIENCIES]
    return min(fits, key=lambda r: (r.cost if r.cost == r.cost else math.inf))


def start_of(engine: str, prior: EngineProfile | None) -> EngineProfile:
    """Where an engine fit starts: ``prior``'s physics (vLLM on the trtllm fit), else :func:`fit_start`."""
    return (prior.replace(engine=engine, source="start: the trtllm fit", families=()) if prior is not None
            else fit_start(engine))


def engine_fit(engine: str, ms: list[Measurement], prior: EngineProfile | None, opts: FitOptions,
               source: str = "") -> FitResult:
    """The engine fit of ``ms``: from ``prior`` where given, else from each of :data:`START_COMPUTE_EFFICIENCIES`."""
    if prior is not None:
        return fit_profile(ms, start_of(engine, prior), opts, engine=engine, source=source)
    return fit_engine_rows(engine, ms, opts, source)


#: Engine-level parameters that describe how the engine is configured, not fitted on these rows: kept from the
#: profile file as it was (TensorRT-LLM's ``dp_balance_timeout_steps`` = 60, InferenceX's ``attention_dp_config``).
CARRIED = ("dp_balance_timeout_steps",)


def carried(engine: str) -> dict[str, Any]:
    """The :data:`CARRIED` parameters of the shipped ``catalogs/profiles/<engine>.yaml`` that differ from the default,
    and its ``borrow_model_terms`` rule (vLLM's DeepSeek expert terms from SGLang's fit: data, not fitted here)."""
    path = ROOT / f"catalogs/profiles/{engine}.yaml"
    if not path.exists():
        return {}
    was = load_profile(path)
    out: dict[str, Any] = {n: float(getattr(was, n)) for n in CARRIED
                           if getattr(was, n) != getattr(EngineProfile(engine=engine), n)}
    if was.borrow_model_terms is not None:
        out["borrow_model_terms"] = was.borrow_model_terms
    return out


def _f(s: ErrorStats | None) -> str:
    return "-" if s is None or s.n == 0 else f"{s.median_ape:.1f} / {s.p90_ape:.1f}"


def _by_source_metric(ms: Sequence[Measurement], before: Sequence[float], after: Sequence[float]) -> list[list[Any]]:
    keys = sorted({(m.source, m.quantity) for m in ms})
    rows = []
    for src, q in keys:
        idx = [i for i, m in enumerate(ms) if m.source == src and m.quantity == q]
        sub = [ms[i] for i in idx]
        b = summarize(sub, [before[i] for i in idx])["all"]
        a = summarize(sub, [after[i] for i in idx])["all"]
        rows.append([src, q, b.n, _f(b), _f(a)])
    return rows


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fit_engine(engine: str, ms: list[Measurement], prior: EngineProfile | None, quick: bool) -> tuple[FitResult, list[HeldOut]]:
    # vLLM starts from the trtllm fit and moves only its own parameters (VLLM_PARAMETERS)
    opts = FitOptions(parameters=VLLM_PARAMETERS if prior is not None else ENGINE_PARAMETERS)
    src = sorted({m.source for m in ms})
    source = (f"fitted by benchmarks/fit_profiles.py on tests/data/measurements/published.csv "
              f"({'+'.join(src)}, {len(ms)} rows)" + (" on the trtllm fit's physics" if prior else ""))
    res = engine_fit(engine, ms, prior, opts, source)
    start = res.start   # the held-out splits below start where the kept fit did
    hos: list[HeldOut] = []
    for by in ("source", "model", "gpu") if not quick else ("model",):
        if len({m.group(by) for m in ms}) >= 2:
            hos.append(held_out(ms, start, by=by, opts=opts))
    if engine == "trtllm":
        train = [m for m in ms if m.source == "TRT017"]
        test = [m for m in ms if m.source != "TRT017"]
        if train and test:
            _, h = split_error(train, test, start, opts)
            hos.append(dataclasses.replace(h, by="split: fit TRT017, test TRT061+TRTBLOG"))
    return res.with_held_out(*hos), hos


#: where the Markdown report goes unless --out says otherwise: outside the tracked tree
DEFAULT_OUT = Path(tempfile.gettempdir()) / "recommender-benchmarks" / "fit_profiles.md"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "tests/data/measurements/published.csv"))
    ap.add_argument("--no-write", action="store_true", help="print only; do not overwrite the profiles")
    ap.add_argument("--quick", action="store_true", help="held-out by model only")
    ap.add_argument("--no-families", action="store_true", help="engine profiles only (no per-GPU-family fits)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="Markdown report (default outside the tracked tree: $TMPDIR/recommender-benchmarks/fit_profiles.md)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    t0 = time.time()
    read = read_published_csv(args.csv)
    csv_name = str(Path(args.csv).resolve().relative_to(ROOT)) if Path(args.csv).resolve().is_relative_to(ROOT) else args.csv
    amd = read_published_csv(AMD_CSV) if AMD_CSV.exists() and not args.no_families else None
    results: dict[str, FitResult] = {}
    family_rows: list[list[Any]] = []
    per_engine_rows: list[list[Any]] = []
    held_rows: list[list[Any]] = []
    param_blocks: list[str] = []
    for engine in ENGINES:
        ms = [m for m in read.measurements if m.engine == engine]
        prior = results["trtllm"].profile if engine == "vllm" else None
        res, hos = fit_engine(engine, ms, prior, args.quick)
        if not args.no_families:
            extra = [m for m in amd.measurements if m.engine == engine] if amd is not None else []
            fam_prof, fr = family_stage(engine, res.profile, ms, extra, csv_name)
            res = dataclasses.replace(res, profile=fam_prof)
            family_rows += fr
        results[engine] = res
        shown = ms + ([m for m in amd.measurements if m.engine == engine] if amd is not None and not args.no_families else [])
        before = [predict(m, provisional(engine)) for m in shown]
        after = [predict(m, res.profile) for m in shown]
        for r in _by_source_metric(shown, before, after):
            per_engine_rows.append([engine] + r)
        tot_b, tot_a = summarize(ms, before)["all"], summarize(ms, after)["all"]
        per_engine_rows.append([f"**{engine}**", "all", "all", tot_b.n, _f(tot_b), _f(tot_a)])
        for h in hos:
            # "start" on held-out rows is the provisional profile, whatever the fit started from
            idx_rows = [m for m in ms if m.id in h.row_ids] if h.row_ids else ms
            hb = summarize(idx_rows, [predict(m, provisional(engine)) for m in idx_rows])
            held_rows.append([engine, h.by, h.folds, h.after["all"].n, _f(hb["all"]), _f(h.after["all"])])
            for q, st in h.after.items():
                if q != "all" and len(h.after) > 2:
                    held_rows.append(["", f"  {q}", "", st.n, _f(hb.get(q)), _f(st)])
        note = (f"Unconstrained (kept at the start value): {', '.join(res.unconstrained) or 'none'}"
                + (f"; at a bound: {', '.join(res.at_bound)}" if res.at_bound else ""))
        param_blocks.append(f"**{engine}** - {DESCRIPTION[engine]}; {len(ms)} rows\n\n{parameter_table(res)}\n\n{note}\n")
        print(f"[{time.time() - t0:5.1f}s] {engine}: {len(ms)} rows, median APE {tot_b.median_ape:.1f}% -> "
              f"{tot_a.median_ape:.1f}%", file=sys.stderr)
    skipped = skipped_summary(read.skipped)
    md = ["# Engine profiles fitted on the published measurements", "",
          f"Generated by `python benchmarks/fit_profiles.py` from `{csv_name}` ({len(read.measurements)} rows used, "
          f"{len(read.skipped)} skipped). Error = absolute percentage error |predicted / measured - 1|, shown as "
          "median / p90 in %. *Before* = the provisional profile (vllm.yaml before fitting) for every engine; "
          "*after* = the engine's fitted profile.", "",
          "## Error per engine, source and metric (rows the fit saw)", "",
          _table(["engine", "source", "metric", "n", "before med / p90 %", "after med / p90 %"], per_engine_rows), "",
          "## Held-out error (rows the fit did not see)", "",
          "Each group (source, model or GPU) is predicted by a profile fitted on the other groups of the same engine; "
          "*start* is the provisional profile on the same rows.", "",
          _table(["engine", "held out", "folds", "n", "start med / p90 %", "held-out med / p90 %"], held_rows), "",
          "## Per-GPU-family parameters", "",
          "Each family's rows are fitted anchored to its engine's profile (width shrinks with fewer rows) and "
          "the family fit is kept only if, held out (k-fold within the family), it beats the engine profile "
          "on the same rows. A GPU whose family has no kept fit uses the engine profile (`EngineProfile.evidence`). "
          "The MI300X rows (`tests/data/measurements/amd-mi300x.csv`, vLLM ROCm) feed vLLM's `cdna3` family only.", "",
          _table(["engine", "family", "n", "anchor width", "held out", "engine profile med / p90 %",
                  "family fit held-out med / p90 %", "fitted", "decision"], family_rows) if family_rows else "(none)", "",
          "## Fitted parameters", "",
          "The 1-sigma factor is exp(standard error of ln p) from the Jacobian at the solution; parameters the "
          "rows cannot constrain (factor above 1.65, or no effect at all) keep their start value.", ""]
    md += param_blocks
    md += ["## Rows skipped", "", _table(["reason", "rows"], [[k, v] for k, v in skipped.items()]), "",
           "sglang: no SGLang rows; `sglang.yaml` carries vLLM's fitted values and says so in `source`.", ""]
    text = "\n".join(md)
    print(text)
    if not args.no_write:
        atomic_write_text(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
        evidence: dict[str, dict[str, Any]] = {}
        if not args.quick:
            for engine in ENGINES:
                ms = [m for m in read.measurements if m.engine == engine]
                extra_rows = [m for m in amd.measurements if m.engine == engine] if amd is not None else []
                prior = results["trtllm"].profile if engine == "vllm" else None
                preds = held_out_by_config(engine, ms, extra_rows, prior)
                evidence[engine] = evidence_block(ms + extra_rows, preds)
                print(f"[{time.time() - t0:5.1f}s] {engine}: held out by configuration "
                      f"{evidence[engine]['all']['median_ape_pct']}%", file=sys.stderr)
        for engine, res in results.items():
            ms = [m for m in read.measurements if m.engine == engine]
            prov = [predict(m, provisional(engine)) for m in ms]
            res = dataclasses.replace(res, before=summarize(ms, prov), before_by_source=summarize(ms, prov, "source"))
            extra = {"error_before_is": "the provisional profile (EngineProfile defaults)"}
            if engine == "vllm":
                extra["start"] = f"the trtllm fit's physics; fitted only {', '.join(VLLM_PARAMETERS)}"
            if engine in evidence:
                extra["held_out_by_config"] = evidence[engine]
            doc = profile_document(res.profile.replace(**carried(engine)), fit_summary(res, [csv_name], [], extra))
            for fam, fd in (doc.get("families") or {}).items():
                if engine in evidence and fam in evidence[engine]["by_family"]:
                    fd["held_out_by_config"] = evidence[engine]["by_family"][fam]
            header = (f"Default efficiency profile for {DESCRIPTION[engine]}.\n"
                      f"Fitted by benchmarks/fit_profiles.py on {csv_name}; rerun the script rather than editing.\n"
                      "`recommend calibrate` writes profiles in this format for --profile.")
            write_profile(ROOT / f"catalogs/profiles/{engine}.yaml", doc, header)
        vl = results["vllm"].profile
        for engine, name in (("sglang", "SGLang"), ("atom", "ATOM (AMD ROCm)")):
            sg = vl.replace(engine=engine, borrow_model_terms=None, source=f"the engine-level parameters are vLLM's fitted values (published.csv has "
                                                  f"no {name} rows); families: benchmarks/fit_inferencex.py")
            write_profile(ROOT / f"catalogs/profiles/{engine}.yaml", profile_document(sg),
                          f"Default efficiency profile for {name}. The engine-level parameters are a copy of vllm.yaml's\n"
                          "(the kernels' physics is shared; published.csv has none of this engine's rows). The families'\n"
                          "MoE-serving and front-end parameters are fitted on InferenceX by benchmarks/fit_inferencex.py,\n"
                          "which merges them in: run it after this script. Calibrate with `recommend calibrate --engine "
                          f"{engine}`.")
    print(f"done in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
