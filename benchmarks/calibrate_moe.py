"""The user's case for calibrating a MoE deployment: DeepSeek-R1 runs of one GPU, fitted by `recommend calibrate`.

A vLLM user who serves DeepSeek-V3 / R1 has no vLLM rows behind the shipped profile: its routed-expert terms are
SGLang's, borrowed (``borrow_model_terms`` in ``catalogs/profiles/vllm.yaml``). This script plays that user with
InferenceX's SGLang rows of one GPU (no MTP; TP, EP and DP attention as they ran): the rows become the
``vllm bench serve``-like measurements ``recommend calibrate`` reads (``Measurement``: the layout, the launch
script's limits and memory fraction, a closed loop of ``10 x concurrency`` prompts at the row's concurrency, as
``benchmarks/bench_inferencex.py`` predicts them; TTFT only where the row publishes its mean). Its configurations
are dealt into two folds; each fold in turn is the user's, the other the test: ``fit_user_rows`` (what
``recommend calibrate`` runs, with its k-fold gate and its default parameters: with rows of one MoE model, the
routed experts' terms and the request overhead, the engine's dense physics left as it was) fits the start profile on
the user's fold, and both are scored on the test fold.

Starts: ``vllm`` as shipped (SGLang's terms borrowed: the rows' own engine fitted them, so there is little to
gain), and ``vllm`` without the borrowing rule (its state before 2026-12-07: no MoE terms, the case calibration is
for). Each with calibrate's default for these rows (since 2026-12-07: the experts' decode terms and the request
overhead) and with the dense parameters (``FIT_PARAMETERS``) it fitted before. Median absolute % error per metric on
the test folds. About 25 minutes on one core.

    python3 benchmarks/calibrate_moe.py [--gpus h200,b200,mi355x] [--out benchmarks/results/calibrate-moe.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import bench_inferencex as bx  # noqa: E402
from recommender.calibrate.api import fit_user_rows, parameters_for  # noqa: E402
from recommender.calibrate.measurements import Measurement, predict  # noqa: E402
from recommender.catalog import default_catalog  # noqa: E402
from recommender.estimator import build_deployment  # noqa: E402
from recommender.profiles import FIT_PARAMETERS, EngineProfile, engine_profile  # noqa: E402
from recommender.perf.steady import Load  # noqa: E402
from recommender.perf.step import EngineLimits  # noqa: E402

CSV = ROOT / "tests" / "data" / "measurements" / "inferencex-dsr1.csv"
QUANTITIES = ("ttft_s", "tpot_s", "output_tokens_per_s")


def measurements(c: bx.Case, start: EngineProfile) -> list[Measurement]:
    """One InferenceX row as the measurements of a `vllm bench serve` run of its layout (engine label ``vllm``)."""
    cat = default_catalog()
    seqs, tokens = bx._limits(c)
    lim = EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens, scheduler_poll_steps=bx.scheduler_poll_steps(c))
    dep = build_deployment(model=cat.model(bx.MODEL), gpu=cat.gpu(c.gpu), tp=c.tp, dp=c.dp, ep=c.ep,
                           weight_dtype=c.weight_dtype, kv_dtype=c.kv_dtype, profile=start, limits=lim,
                           gpu_memory_utilization=0.9, max_model_len=c.prompt_tokens + c.output_tokens)
    cfg = "-".join(str(x) for x in c.config)
    base = dict(source=cfg, file=CSV.name, engine="vllm", model=bx.MODEL, gpu=c.gpu, tp=c.tp, dp=c.dp, ep=c.ep,
                weight_dtype=c.weight_dtype, kv_dtype=c.kv_dtype,
                load=Load.closed(concurrency=c.conc, prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens),
                limits=lim, gpu_memory_utilization=bx.memory_fraction(c, dep.memory()), requests=10 * c.conc)
    rid = "|".join(c.row[k] for k in ("date", "tp", "ep", "dp_attention", "isl", "osl", "concurrency"))
    out = []
    if "tput" in c.measured:
        out.append(Measurement(id=f"{rid}#tput", quantity="output_tokens_per_s", value=c.measured["tput"],
                               raw_metric="output_throughput", **base))  # type: ignore[arg-type]
    if "tpot" in c.measured:
        out.append(Measurement(id=f"{rid}#tpot", quantity="tpot_s", value=c.measured["tpot"], raw_metric="mean_tpot_ms",
                               **base))  # type: ignore[arg-type]
    if "ttft" in c.measured and c.ttft_statistic == "mean":
        out.append(Measurement(id=f"{rid}#ttft", quantity="ttft_s", value=c.measured["ttft"], raw_metric="mean_ttft_ms",
                               **base))  # type: ignore[arg-type]
    return out


def median_errors(ms: list[Measurement], prof: EngineProfile) -> dict[str, float]:
    errs: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for m in ms:
        errs[m.quantity].append(abs(predict(m, prof) / m.value - 1.0) * 100.0)
    return {q: statistics.median(v) if v else float("nan") for q, v in errs.items()}


@dataclasses.dataclass(frozen=True)
class Split:
    """One start x split: the user's fold, whether the fit was kept, what it fitted, the test fold's errors."""

    start: str
    split: int
    configurations: int
    rows: int
    kept: bool
    fitted: str
    before: dict[str, float]
    after: dict[str, float]


def splits(gpu: str, params: tuple[str, ...] | None, starts: dict[str, EngineProfile]) -> tuple[list[Split], int, int]:
    """Every start x split on one GPU (``params`` None: calibrate's default for these rows), the rows and
    configurations."""
    cases = [c for c in bx.single_node_cases(CSV) if c.gpu == gpu and c.framework == "sglang" and not c.mtp
             and "closed_loop_check_ratio" not in c.row["quality_flags"]]
    configs = sorted({c.config for c in cases}, key=str)
    folds = [[k for i, k in enumerate(configs) if i % 2 == f] for f in (0, 1)]
    out = []
    for label, start in starts.items():
        for f in (0, 1):
            train = [m for c in cases if c.config in folds[f] for m in measurements(c, start)]
            test = [m for c in cases if c.config in folds[1 - f] for m in measurements(c, start)]
            uf = fit_user_rows(train, start, params or parameters_for(train, None, default_catalog()))
            fitted = ", ".join(f"{n} {getattr(uf.result.values, n):.4g}" for n in uf.result.fitted) or "-"
            out.append(Split(label, f + 1, len({m.source for m in train}), len(train), uf.kept, fitted,
                             median_errors(test, start), median_errors(test, uf.result.profile)))
            print(out[-1], flush=True)
    return out, len(cases), len(configs)


def no_borrowing(shipped: EngineProfile) -> EngineProfile:
    """The vllm profile without its borrowing rule: no experts' terms (a vLLM user's start before 2026-12-07)."""
    return dataclasses.replace(shipped, borrow_model_terms=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="h200,b200,mi355x")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "calibrate-moe.md"))
    args = ap.parse_args()
    t0 = time.time()
    shipped = engine_profile("vllm")
    starts = {"shipped (SGLang's terms borrowed)": shipped, "no borrowing (no experts' terms)": no_borrowing(shipped)}
    rows: list[str] = []
    sizes = []
    for gpu in args.gpus.split(","):
        for params in (None, FIT_PARAMETERS):
            got, n, k = splits(gpu, params, starts)
            rows += [f"| {gpu} | {'dense (before)' if params else 'default'} | {r.start} | {r.split} | "
                     f"{r.configurations} / {r.rows} | {'yes' if r.kept else 'no'} | {r.fitted} | "
                     + " / ".join(f"{r.before[q]:.1f}" for q in QUANTITIES) + " | "
                     + " / ".join(f"{r.after[q]:.1f}" for q in QUANTITIES) + " |" for r in got]
        sizes.append(f"{gpu} {n} rows of {k} configurations")
    lines = ["# Calibrating a MoE deployment: InferenceX SGLang DeepSeek-R1 rows as a vLLM user's runs", "",
             f"Generated by `python3 benchmarks/calibrate_moe.py --gpus {args.gpus}` in {time.time() - t0:.0f} s (module "
             f"docstring): {'; '.join(sizes)} (no MTP), two folds of configurations, each the user's in turn. "
             "`default`: what `recommend calibrate` fits for rows of one MoE model (the experts' decode terms and the "
             "request overhead, written as the model's); `dense (before)`: FIT_PARAMETERS, what it fitted before "
             "2026-12-07 (written as the GPU family's). Median absolute % error on the test fold (configurations the "
             "fit did not see).", "",
             "| GPU | parameters | start | split | user's configurations / rows | kept | fitted | start TTFT / TPOT / tput % "
             "| calibrated TTFT / TPOT / tput % |",
             "|---|---|---|---|---:|---|---|---|---|", *rows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
