"""Reproduce every accuracy figure of the README's "How accurate" section and check that the README states it.

    python3 benchmarks/readme_figures.py [--out benchmarks/results/readme-figures.md] [--quick] [--no-check]

One run recomputes each figure with the benchmark that owns it (the same functions, imported), renders it as the
README writes it, and looks for that text in ``README.md``:

- InferenceX (``bench_inferencex.py``): the table by GPU, in sample and held out by 3 folds of whole configurations
  (``fit_inferencex.held_out_predictions``), beside aiconfigurator's point-weighted errors on its DeepSeek-R1 cells
  (``tests/data/measurements/inferencex-peer-mape.csv``); by framework; leaving one configuration out at a time
  (``--folds 0``; skipped by ``--quick``);
- the profile table (``profile_evidence.py``): per engine and GPU family, the dense rows' error held out by
  configuration (``fit_profiles.held_out_by_config``, the pipeline that writes the profiles) and the InferenceX
  rows' held out (``fit_inferencex.held_out_by_profile`` of the 3-fold predictions above). The README prints what
  the profiles record; here both are recomputed from the rows;
- dense published rows held out by configuration (``bench_accuracy.py``): throughput, TPOT, TTFT median error;
- InferenceX's disaggregated rows, predicted with the one constant fitted on them (the P/D handoff) held out by
  configuration (``bench_inferencex_disagg.py``): coverage, TPOT and output throughput median error, TTFT median
  signed error;
- band coverage on held-out rows (``bench_bands.py``; skipped by ``--quick``);
- analytic model against the simulator (``bench_agreement.py``: every example's top five rows and the extra
  problems; skipped by ``--quick``);
- ``recommend calibrate`` held out on TensorRT-LLM's rows (``bench_accuracy.py``'s user's case; skipped by ``--quick``);
- ``recommend calibrate`` on one MoE model's rows held out by configuration (``calibrate_moe.py``, B200; skipped by
  ``--quick``).

The report lists each figure, the script that owns it, the text computed and whether the README carries it; the
exit status is 1 when one is missing (``--no-check``: 0). About 20-25 minutes on 2 cores (20 min on 2026-12-06 with the calibrate figure, other runs beside it; the MoE calibration adds about 2), 3 with ``--quick`` (3.4 min).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import bench_inferencex as bx  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "readme-figures.md"
README = ROOT / "README.md"
#: README's InferenceX table: one line per GPU, the AMD GPUs on one line
GPU_LINES = (("B200", ("b200",)), ("B300", ("b300",)), ("H200", ("h200",)),
             ("MI300X / MI325X / MI355X", ("mi300x", "mi325x", "mi355x")))
FRAMEWORKS = (("SGLang", "sglang"), ("TensorRT-LLM", "trt"), ("ATOM", "atom"))


@dataclass(frozen=True)
class Figure:
    """One figure as the README writes it, and the benchmark that computes it."""

    name: str
    script: str
    text: str


def _join(parts: Sequence[str]) -> str:
    return " / ".join(parts)


def _peer(gpus: Sequence[str]) -> str:
    """aiconfigurator's point-weighted TTFT / TPOT MAPE on its DeepSeek-R1 cells of ``gpus`` ("-": none)."""
    rows = [r for r in bx.peer_rows() if r["gpu"] in gpus]
    n = sum(int(r["aic_points"]) for r in rows)
    if not n:
        return "-"
    ttft = sum(int(r["aic_points"]) * float(r["aic_ttft_mape_pct"]) for r in rows) / n
    tpot = sum(int(r["aic_points"]) * float(r["aic_tpot_mape_pct"]) for r in rows) / n
    return f"{ttft:.1f} / {tpot:.1f}"


def gpu_line(label: str, gpus: Sequence[str], ins: dict[str, bx.Tally], held: dict[str, bx.Tally]) -> str:
    """A README table line: rows, in-sample TTFT / TPOT / tok/s, held out, aiconfigurator (several GPUs: each cell
    lists them in order, the held-out cell metric by metric)."""
    t = [ins[g] for g in gpus]
    h = [held[g] for g in gpus]
    cells = [_join([str(x.n) for x in t])] + [_join([f"{x.mape(k):.1f}" for x in t]) for k in bx.METRICS]
    hcell = ", ".join(_join([f"{x.mape(k):.1f}" for x in h]) for k in bx.METRICS) if len(h) > 1 else \
        _join([f"{h[0].mape(k):.1f}" for k in bx.METRICS])
    return f"| {label} | " + " | ".join(cells) + f" | {hcell} | {_peer(gpus)} |"


def inferencex_figures(loco: bool) -> tuple[list[Figure], list[tuple[Any, Any]]]:
    """The InferenceX table, the framework sentence and (``loco``) leave one configuration out; also the 3-fold
    held-out predictions (the profile table and the bands reuse them)."""
    import fit_inferencex as fx

    cases = bx.single_node_cases(bx.DEFAULT_CSV)
    ins = bx.grouped(bx.run(cases, False))
    sc = fx.scored(cases)
    shipped_a, shipped_b = fx.shipped_groups(sc)
    held3 = fx.held_out_predictions(sc, 3, None, None, shipped_b, shipped_a)
    h = bx.grouped(held3)
    script = "bench_inferencex.py --held-out"
    out = [Figure("InferenceX rows", script, f"On {ins['all']['all'].n} real DeepSeek-R1 points")]
    for label, gpus in GPU_LINES:
        out.append(Figure(f"InferenceX {label}", script, gpu_line(label, gpus, ins["gpu"], h["gpu"])))
    a, ha = ins["all"]["all"], h["all"]["all"]
    out.append(Figure("InferenceX all", script, f"| all | {a.n} | " + " | ".join(f"{a.mape(k):.1f}" for k in bx.METRICS)
                      + " | " + _join([f"{ha.mape(k):.1f}" for k in bx.METRICS]) + f" | {_peer([r['gpu'] for r in bx.peer_rows()])} |"))
    fw_in = ", ".join(f"{name} {ins['framework'][k].mape('ttft'):.1f} / {ins['framework'][k].mape('tpot'):.1f}%"
                      for name, k in FRAMEWORKS)
    fw_held = ", ".join(f"{h['framework'][k].mape('ttft'):.1f} / {h['framework'][k].mape('tpot'):.1f}" for _, k in FRAMEWORKS)
    out.append(Figure("InferenceX by framework", script, f"By framework ({fw_in}; held out {fw_held}%)"))
    if loco:
        lo = bx.grouped(fx.held_out_predictions(sc, 0, None, None, shipped_b, shipped_a))["all"]["all"]
        out.append(Figure("InferenceX, leave one configuration out", "bench_inferencex.py --held-out --folds 0",
                          "it is " + _join([f"{lo.mape(k):.1f}" for k in bx.METRICS]) + "%."))
    return out, held3


def dense_held_out() -> tuple[list[Figure], dict[str, dict[str, dict[str, Any]]]]:
    """Dense published rows held out by configuration (bench_accuracy's classes) and, per engine, the
    ``fit.held_out_by_config.by_family`` block the profile table quotes (``fit_profiles.evidence_block``)."""
    import bench_accuracy as ba
    import fit_profiles as fp

    pub, amd = ba.read_rows()
    preds = ba.held_out_predictions(pub, amd, fp.CONFIG_FOLDS)
    cls = ba.grouped(ba.dense(pub + amd), preds, lambda m: ba.CLASSES[m.quantity])
    text = (f"throughput {cls['throughput'].median_ape:.1f}%, TPOT {cls['tpot'].median_ape:.1f}%, "
            f"TTFT {cls['ttft'].median_ape:.1f}% median error")
    by_engine = {e: fp.evidence_block([m for m in pub + amd if m.engine == e], preds)["by_family"] for e in fp.ENGINES}
    return [Figure("dense rows held out by configuration", "bench_accuracy.py", text)], by_engine


def profile_table(dense: dict[str, dict[str, dict[str, Any]]], held3: list[tuple[Any, Any]]) -> list[Figure]:
    """The README's profile table with both kinds of evidence recomputed."""
    import fit_inferencex as fx
    import profile_evidence as pe

    moe: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (engine, fam), d in fx.held_out_by_profile(held3).items():
        moe[engine][fam] = d
    return [Figure(f"profile {line.split('|')[1].strip()} / {line.split('|')[2].strip()}", "profile_evidence.py", line)
            for line in pe.table(dense=dense, moe=moe)[2:]]


def band_figure(held3: list[tuple[Any, Any]]) -> Figure:
    """Share of held-out rows inside their p10-p90 band (``bench_bands.py``, 12 folds for the published rows)."""
    import bench_bands as bb

    rows = bb.published_rows(12) + bb.inferencex_rows(3, held3)
    _, _, totals = bb.calibrate(rows)
    c = totals["all"]
    return Figure("band coverage", "bench_bands.py",
                  f"on {c.n:,} held-out rows the measured value falls inside it {100.0 * c.inside / c.n:.0f}% of the time")


def agreement_figure() -> Figure:
    """Analytic against simulated TTFT and TPOT p90 on every example's top five rows (``bench_agreement.py``)."""
    import bench_agreement as bg

    rows = [r for name, path, pol, over in bg.problems() for r in bg.rows_of(name, path, pol, over, 5)]
    worst = max(float(r[12].rstrip("%")) for r in rows)
    within = sum(float(r[12].rstrip("%")) <= 10.0 for r in rows)
    head = f"on all {len(rows)} top-five rows" if within == len(rows) else f"on {within} of {len(rows)} top-five rows"
    return Figure("analytic vs simulator", "bench_agreement.py", f"{head} of the examples\nand issue workloads "
                  f"(`python3 benchmarks/bench_agreement.py`, worst {worst:.1f}%)")


def calibrate_figure() -> Figure:
    """``recommend calibrate`` held out on TensorRT-LLM's rows (``bench_accuracy.calibrate_user_case``: four folds of
    configurations; the start is the profile pipeline fitted on two, the fit sees a third, both are scored on the
    fourth)."""
    import bench_accuracy as ba

    pub, amd = ba.read_rows()
    row = ba.calibrate_user_case(pub, amd, engines=("trtllm",))[0]
    start, cal = (float(str(c).split(" / ")[0]) for c in row[4:6])
    return Figure("calibrate held out (TensorRT-LLM)", "bench_accuracy.py",
                  f"{start:.1f} -> {cal:.1f}% median held out ({row[6]} splits lower)")


def calibrate_moe_figure() -> Figure:
    """``recommend calibrate`` on one MoE model's rows (``calibrate_moe.py``): B200 DeepSeek-R1, the vllm profile
    without borrowed terms as the start, two folds of configurations; TPOT median error start -> calibrated."""
    import calibrate_moe as cm
    from recommender.profiles import engine_profile

    got, _, _ = cm.splits("b200", None, {"start": cm.no_borrowing(engine_profile("vllm"))})
    before = [r.before["tpot_s"] for r in got]
    after = [r.after["tpot_s"] for r in got]
    return Figure("calibrate a MoE model (B200 DeepSeek-R1)", "calibrate_moe.py",
                  f"TPOT {min(before):.0f}-{max(before):.0f} -> {min(after):.0f}-{max(after):.0f}% median")


def disagg_figure() -> Figure:
    """InferenceX's disaggregated rows predicted by the P/D load model, its one constant fitted on them (the handoff)
    held out by configuration (``bench_inferencex_disagg.py``): coverage, TPOT and output throughput median error,
    TTFT median signed error."""
    import bench_inferencex_disagg as bd

    h = bd.headline(bd.held_out_pairs(bd.disagg_cases(bx.DEFAULT_CSV)))
    ttft = (f"under-predicted by a median {-h['ttft_signed']:.0f}%" if h["ttft_signed"] < 0
            else f"over-predicted by a median {h['ttft_signed']:.0f}%")
    return Figure("InferenceX disaggregated (P/D)", "bench_inferencex_disagg.py",
                  f"{h['coverage']:.0f}% covered): TPOT {h['tpot']:.1f}% and output throughput {h['tput']:.1f}% median "
                  f"error, TTFT {ttft}")


def check(figures: Sequence[Figure], readme: str) -> list[tuple[Figure, bool]]:
    """Each figure and whether the README carries its text (line breaks and runs of spaces count as one space)."""
    flat = " ".join(readme.split())
    return [(f, " ".join(f.text.split()) in flat) for f in figures]


def report(checked: Sequence[tuple[Figure, bool]], seconds: float, argv: Sequence[str]) -> str:
    lines = ["# The README's accuracy figures, reproduced", "",
             f"Generated by `python3 benchmarks/readme_figures.py{' ' + ' '.join(argv) if argv else ''}` in "
             f"{seconds:.0f} s. Each figure is recomputed by the benchmark named beside it and rendered as the README "
             "writes it; *in README* says whether `README.md` carries that text.", "",
             f"{sum(ok for _, ok in checked)} of {len(checked)} figures as the README states them.", "",
             "| figure | script | reproduced | in README |", "|---|---|---|---|"]
    for f, ok in checked:
        text = " ".join(f.text.split()).replace("|", "\\|")
        lines.append(f"| {f.name} | `{f.script}` | {text} | {'yes' if ok else '**no**'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="skip leave-one-out, bands, agreement and calibrate (about 3 min)")
    ap.add_argument("--no-check", action="store_true", help="exit 0 even when the README lacks a figure")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    figures, held3 = inferencex_figures(loco=not a.quick)
    dense_figs, dense_by = dense_held_out()
    figures += profile_table(dense_by, held3) + dense_figs + [disagg_figure()]
    if not a.quick:
        figures += [band_figure(held3), agreement_figure(), calibrate_figure(), calibrate_moe_figure()]
    checked = check(figures, README.read_text())
    text = report(checked, time.perf_counter() - t0, list(argv if argv is not None else sys.argv[1:]))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)
    missing = [f.name for f, ok in checked if not ok]
    if missing:
        print(f"{len(missing)} figure(s) not in README.md as reproduced: {', '.join(missing)}", file=sys.stderr)
    return 1 if missing and not a.no_check else 0


if __name__ == "__main__":
    raise SystemExit(main())
