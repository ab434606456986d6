"""Predict every single-node DeepSeek-R1 row of SemiAnalysis InferenceX and report the error beside aiconfigurator's.

    python3 benchmarks/bench_inferencex.py [--csv tests/data/measurements/inferencex-dsr1.csv]
                                           [--out benchmarks/results/inferencex.md] [--legacy] [--json FILE]
                                           [--held-out [--folds 3]]

Each row (``is_multinode`` and ``disagg`` false) is predicted as the InferenceX harness ran it: ``vllm bench serve``'s
fork with ``--max-concurrency CONC --num-prompts 10 x CONC --request-rate inf --random-range-ratio 0.8`` (prompt and
output lengths uniform in [0.8 L, L]: mean 0.9 L), i.e. ``recommend estimate --bench`` with:

- its parallelism in vLLM's vocabulary: ``dp_attention`` true -> ``--tp 1 --data-parallel-size TP`` (SGLang's TP8
  EP8 DPA), else ``--tp TP``; ``ep > 1`` -> ``--enable-expert-parallel``;
- ``spec_method = mtp`` -> ``--speculative-config '{"method": "mtp", "num_speculative_tokens": k}'`` with the
  launch scripts' k (``SemiAnalysisAI/InferenceX benchmarks/single_node/fixed_seq_len/dsr1_*_mtp.sh`` @ 843c6254:
  SGLang on NVIDIA ``--speculative-num-steps 2``, SGLang on AMD 3, ATOM 3, TensorRT-LLM ``num_nextn_predict_layers``
  3, or 1 with attention DP); acceptance: the model catalog's default;
- precision ``fp8`` -> fp8 weights; ``fp4`` -> NVFP4 (``fp4``) on NVIDIA, MXFP4 (``mxfp4``) on AMD; KV cache fp8 where
  the launch script in force on the row's date set it (:func:`kv_cache_dtype`: TensorRT-LLM, ATOM, SGLang on
  B200 / B300, and on AMD from the dates in :data:`SGLANG_FP8_KV_FROM`), else bf16;
- engine profile: ``sglang`` for SGLang, ``atom`` for ATOM, ``trtllm`` for TensorRT-LLM (:data:`ENGINE`), as the row's
  engine release ran it (:func:`engine_release` from the image tag; ``EngineProfile.for_release``: a family's
  override for releases older than its ``before``, where the profile has one); the launch scripts' limits (SGLang
  ``--max-running-requests 512 --chunked-prefill-size 32768 --mem-fraction-static 0.82``; TensorRT-LLM
  ``max_num_tokens = CONC + ISL`` rounded up to 64, at least 8192, ``max_batch_size`` >= CONC, 0.8 of free memory),
  their memory fractions turned into vLLM's ``gpu_memory_utilization`` (:func:`memory_fraction`).

Rows flagged ``closed_loop_check_ratio`` (the README's one inconsistent ATOM row) are listed, not scored.

``--legacy`` predicts every row as TP only without MTP (what the model could express before EP / DPA / MTP) and runs
on older checkouts too (``PYTHONPATH=<old checkout> python3 benchmarks/bench_inferencex.py --legacy``).
Measured values: ``ttft_mean_ms`` / ``tpot_mean_ms`` (the median where the mean is missing), ``output_tput_tok_s``;
TTFT is predicted as the same statistic (``bench_run``'s ``median_ttft_ms``, the steady closed loop's TTFT without
the first wave's tail, where the row publishes only the median).

``--held-out`` also predicts every row with the fitted MoE and front-end parameters refitted WITHOUT its whole
configuration (``fit_inferencex.held_out_predictions``, ``--folds`` folds per engine x GPU family; about 20 s) and
reports that error beside the in-sample one, overall and by GPU, engine and parallelism class.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

DEFAULT_CSV = ROOT / "tests" / "data" / "measurements" / "inferencex-dsr1.csv"
PEER_CSV = ROOT / "tests" / "data" / "measurements" / "inferencex-peer-mape.csv"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "inferencex.md"
#: where ``--held-out --folds 0`` (leave one configuration out) writes unless ``--out`` says otherwise
LOCO_OUT = ROOT / "benchmarks" / "results" / "inferencex-loco.md"
MODEL = "deepseek-v3"  # DeepSeek-R1-0528 has DeepSeek-V3's architecture (catalog note)
AMD = ("mi300x", "mi325x", "mi355x")
METRICS = ("ttft", "tpot", "tput")
#: InferenceX framework -> engine profile (``catalogs/profiles/<engine>.yaml``)
ENGINE = {"trt": "trtllm", "sglang": "sglang", "atom": "atom"}
#: where each framework's image tag names its release: lmsysorg/sglang:v0.5.5-cu129 (and the ROCm dev image
#: ...sgl-dev-v0.5.2-rocm7.0...), nvcr.io/nvidia/tensorrt-llm/release:1.1.0rc2.post2, rocm/atom:...-atom0.1.1
RELEASE_TAG = {"sglang": r"v(\d+\.\d+\.\d+)", "trt": r"release:(\d+\.\d+\.\d+)", "atom": r"atom(\d+\.\d+\.\d+)"}


def engine_release(framework: str, image: str) -> str:
    """The engine release an InferenceX row ran (``"0.5.5"``), from its image tag; "" when the tag names none."""
    import re

    m = re.search(RELEASE_TAG.get(framework, r"$^"), image)
    return m.group(1) if m else ""


def mtp_tokens(framework: str, gpu: str, dp_attention: bool) -> int:
    """The InferenceX launch scripts' number of MTP draft tokens (module docstring)."""
    if framework == "trt":
        return 1 if dp_attention else 3
    if framework == "sglang" and gpu not in AMD:
        return 2
    return 3


#: SGLang's KV cache dtype by launch script: (GPU, weights) -> the first row date (UTC) whose script passes
#: ``--kv-cache-dtype fp8_e4m3`` (earlier: none, i.e. bf16); the MTP scripts follow their plain sibling. From the
#: history of ``SemiAnalysisAI/InferenceX benchmarks/**/dsr1_<precision>_<gpu>[_mtp].sh``: B200 / B300 fp8 since
#: 425f74d51 (2025-09-12; the fp4 and MTP scripts from their first commit), MI300X 32772c579 and MI325X e9b6e0fde
#: (2026-01-23, "SGLang v0.5.7 ... fp8 KV cache"), MI355X fp8 9d39c92ee (2026-03-05), MI355X MXFP4 332fec529
#: (2025-12-16). H200's scripts never set it.
SGLANG_FP8_KV_FROM: dict[tuple[str, str], str] = {
    ("b200", "fp8"): "2025-09-12", ("b300", "fp8"): "2025-09-12", ("b200", "fp4"): "", ("b300", "fp4"): "",
    ("mi300x", "fp8"): "2026-01-23", ("mi325x", "fp8"): "2026-01-23", ("mi355x", "fp8"): "2026-03-05",
    ("mi355x", "mxfp4"): "2025-12-16",
}


def kv_cache_dtype(framework: str, gpu: str, weight_dtype: str, date: str) -> str:
    """The KV cache dtype a row's launch script set: fp8 for TensorRT-LLM and ATOM (``kv_cache_dtype fp8`` in every
    script), SGLang's by :data:`SGLANG_FP8_KV_FROM` (ISO dates compare as strings), else bf16."""
    if framework in ("trt", "atom"):
        return "fp8"
    since = SGLANG_FP8_KV_FROM.get((gpu, weight_dtype))
    return "fp8" if since is not None and date >= since else "bf16"


@dataclass(frozen=True)
class Case:
    """One InferenceX row as a prediction request."""

    row: dict[str, str]
    gpu: str
    framework: str
    tp: int
    dp: int
    ep: bool
    mtp: int
    weight_dtype: str
    kv_dtype: str
    conc: int
    prompt_tokens: int
    output_tokens: int
    parallel: str  # TP / EP / EP+DPA / DPA
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def ttft_statistic(self) -> str:
        """"mean" where the row publishes ``ttft_mean_ms``, else "median" (the measured value is that one)."""
        return "mean" if _num(self.row.get("ttft_mean_ms", "")) is not None else "median"

    @property
    def release(self) -> str:
        """The engine release the row ran (:func:`engine_release`)."""
        return engine_release(self.framework, self.row.get("image") or self.row.get("image_from_config") or "")

    @property
    def config(self) -> tuple[Any, ...]:
        """A whole configuration (every concurrency and date of it), for held-out fits."""
        return (self.gpu, self.framework, self.tp, self.dp, self.ep, self.mtp, self.weight_dtype,
                self.row["isl"], self.row["osl"])


def _num(s: str) -> float | None:
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def single_node_cases(path: Path) -> list[Case]:
    out = []
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["is_multinode"] != "false" or r["disagg"] != "false":
                continue
            gpu, fw = r["gpu"], r["framework"]
            tp_src, ep_src = int(r["tp"]), int(r["ep"])
            dpa = r["dp_attention"] == "true"
            tp, dp = (1, tp_src) if dpa else (tp_src, 1)
            fp4 = r["precision"] == "fp4"
            wd = ("mxfp4" if gpu in AMD else "fp4") if fp4 else "fp8"
            kv = kv_cache_dtype(fw, gpu, wd, r["date"])
            mtp = mtp_tokens(fw, gpu, dpa) if r["spec_method"] == "mtp" else 0
            parallel = ("EP+DPA" if ep_src > 1 else "DPA") if dpa else ("EP" if ep_src > 1 else "TP")
            meas = {}
            for k, mean, med in (("ttft", "ttft_mean_ms", "ttft_median_ms"), ("tpot", "tpot_mean_ms", "tpot_median_ms")):
                v = _num(r[mean]) or _num(r[med])
                if v is not None:
                    meas[k] = v / 1e3
            t = _num(r["output_tput_tok_s"])
            if t is not None:
                meas["tput"] = t
            out.append(Case(row=r, gpu=gpu, framework=fw, tp=tp, dp=dp, ep=ep_src > 1, mtp=mtp, weight_dtype=wd,
                            kv_dtype=kv, conc=int(r["concurrency"]), prompt_tokens=round(0.9 * int(r["isl"])),
                            output_tokens=round(0.9 * int(r["osl"])), parallel=parallel, measured=meas))
    return out


def _limits(c: Case) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of the row's launch script."""
    if c.framework == "trt":
        tokens = max(8192, -(-(c.conc * (c.mtp + 1) + int(c.row["isl"]) + 64) // 64) * 64)
        return max(c.conc, 8), tokens
    return 512, 32768


def scheduler_poll_steps(c: Case) -> int:
    """How often the row's SGLang server takes in new requests, in steps (``--scheduler-recv-interval``; the launch
    scripts of ``SemiAnalysisAI/InferenceX``, unchanged from 2025-11-21 d22bf9ca9 to 2026-06 843c6254):

    * B200 / B300 fp8 without MTP (``dsr1_fp8_b200.sh``, ``dsr1_fp8_b300.sh``): TP 8 polls every 30 steps from
      concurrency 16 and every 10 below; TP 4 every 10;
    * B200 / B300 fp4 and the MTP scripts (``dsr1_fp4_b200.sh``, ``dsr1_fp4_b300.sh``, ``dsr1_fp8_b200_mtp.sh``,
      ``dsr1_fp8_b300_mtp.sh``): every 30 steps from concurrency 16, every 10 below, at any TP;
    * MI300X / MI325X / MI355X: ``--num-continuous-decode-steps 4`` (``dsr1_fp8_mi300x.sh``, ``dsr1_fp8_mi355x.sh``:
      four decode steps between two looks at the queue);
    * H200 and the other engines poll every step."""
    if c.framework != "sglang":
        return 1
    if c.gpu in ("b200", "b300"):
        relaxed = c.conc >= 16 and (c.tp * c.dp == 8 or c.weight_dtype != "fp8" or c.mtp > 0)
        return 30 if relaxed else 10
    if c.gpu in ("mi300x", "mi325x", "mi355x"):
        return 4
    return 1


def memory_fraction(c: Case, mem: Any) -> float:
    """vLLM's ``gpu_memory_utilization`` that leaves the KV cache the row's engine gives itself.

    SGLang ``--mem-fraction-static f`` (0.82 here; ATOM alike) holds weights + KV in ``f x memory``, activations and
    graphs outside it: ``gmu = f + (activations + reserve + graphs) / memory``. TensorRT-LLM's
    ``free_gpu_memory_fraction`` 0.8 takes that share of what weights and activations leave:
    ``gmu = (w + o + 0.8 (M - w - o)) / M`` with ``o`` the activations, reserve and graphs."""
    other = mem.activation_bytes_per_gpu + mem.runtime_reserve_bytes_per_gpu + mem.cuda_graph_bytes_per_gpu
    total = mem.memory_bytes_per_gpu
    if c.framework == "trt":
        w = mem.weights_bytes_per_gpu
        gmu = (w + other + 0.8 * (total - w - other)) / total
    else:
        gmu = 0.82 + other / total
    return min(1.0, max(0.05, gmu))


def predict(c: Case, legacy: bool = False, profile: Any = None, catalog: Any = None,
            acceptance_rate: float | None = None) -> dict[str, float] | str:
    """{ttft, tpot, tput} predicted, or the one-line reason the row is not predicted."""
    from recommender.errors import RecommenderError
    from recommender.estimator import EstimateRequest, bench_run, estimate_request
    from recommender.perf.steady import Load
    from recommender.profiles import engine_profile

    seqs, tokens = _limits(c)
    if profile is None and not legacy:
        profile = engine_profile(ENGINE[c.framework]).for_release(c.gpu, c.release, MODEL)
    kw: dict[str, Any] = dict(model=MODEL, gpu=c.gpu, tp=c.tp * c.dp if legacy else c.tp, weight_dtype=c.weight_dtype,
                              kv_dtype=c.kv_dtype, prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens,
                              engine=ENGINE[c.framework], gpu_memory_utilization=0.9,
                              max_num_seqs=seqs, max_num_batched_tokens=tokens, usd_per_gpu_hour=1.0)
    if not legacy:
        kw["scheduler_poll_steps"] = scheduler_poll_steps(c)
        kw.update(dp=c.dp, ep=c.ep)
        if c.mtp:
            kw["speculative_config"] = json.dumps({"method": "mtp", "num_speculative_tokens": c.mtp})
            kw["acceptance_rate"] = acceptance_rate
    try:
        dep, _, est = estimate_request(EstimateRequest(**kw), catalog, profile=profile)
        kw["gpu_memory_utilization"] = memory_fraction(c, dep.memory())
        dep, _, est = estimate_request(EstimateRequest(**kw), catalog, profile=profile)
        if not est.fits:
            return "does not fit"
        load = Load.finite(requests=10 * c.conc, prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens,
                           concurrency=c.conc)
        res = bench_run(dep, load, replicas=1)
    except RecommenderError as e:
        return str(e).splitlines()[0]
    # the row's own statistic: its mean TTFT, or the median where it publishes only that (562 of the 740 rows)
    ttft_key = "mean_ttft_ms" if c.ttft_statistic == "mean" else "median_ttft_ms"
    return {"ttft": float(res[ttft_key]) / 1e3, "tpot": float(res["mean_tpot_ms"]) / 1e3,  # type: ignore[arg-type]
            "tput": float(res["output_throughput"])}  # type: ignore[arg-type]


def ape(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


@dataclass
class Tally:
    n: int = 0
    refused: int = 0
    errs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    signed: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, c: Case, p: dict[str, float] | str) -> None:
        if "closed_loop_check_ratio" in c.row["quality_flags"]:
            return
        self.n += 1
        if isinstance(p, str):
            self.refused += 1
            return
        for k in METRICS:
            if k in c.measured:
                self.errs[k].append(ape(p[k], c.measured[k]))
                self.signed[k].append((p[k] - c.measured[k]) / c.measured[k] * 100.0)

    def mape(self, k: str) -> float:
        return statistics.fmean(self.errs[k]) if self.errs[k] else math.nan

    def cells(self) -> list[str]:
        cov = 100.0 * (self.n - self.refused) / self.n if self.n else math.nan
        med = statistics.median(self.signed["ttft"]) if self.signed["ttft"] else math.nan
        return [str(self.n), f"{cov:.0f}%", *(f"{self.mape(k):.1f}" for k in METRICS), f"{med:+.0f}"]


HEAD = "| {} | rows | coverage | TTFT MAPE % | TPOT MAPE % | output tput MAPE % | TTFT median signed % |"
RULE = "|---|---:|---:|---:|---:|---:|---:|"


def table(title: str, groups: dict[str, Tally]) -> list[str]:
    out = [HEAD.format(title), RULE]
    out += [f"| {g} | " + " | ".join(t.cells()) + " |" for g, t in sorted(groups.items())]
    return out


def summary(by: dict[str, dict[str, Tally]], held: dict[str, dict[str, Tally]] | None = None) -> list[str]:
    """One compact table (the README's): by GPU (with aiconfigurator's point-weighted figures on its DeepSeek-R1
    cells of that GPU), framework and parallelism class; with ``held``, the held-out-by-configuration error too."""
    aic: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in peer_rows():
        aic[r["gpu"]].append((int(r["aic_points"]), float(r["aic_ttft_mape_pct"]), float(r["aic_tpot_mape_pct"])))
    hcol = " held out TTFT / TPOT / tput % |" if held is not None else ""
    out = ["| group | rows | TTFT % | TPOT % | output tput % |" + hcol + " aiconfigurator TTFT % / TPOT % (points) |",
           "|---|---:|---:|---:|---:|" + ("---|" if held is not None else "") + "---|"]
    for key, label in (("all", "all"), ("gpu", "GPU"), ("framework", "framework"), ("parallel", "parallelism")):
        for g, t in sorted(by[key].items()):
            cells = aic.get(g) if key == "gpu" else None
            peer = "-"
            if cells:
                n = sum(c[0] for c in cells)
                peer = (f"{sum(c[0] * c[1] for c in cells) / n:.1f} / {sum(c[0] * c[2] for c in cells) / n:.1f} ({n})")
            if key == "all":
                n = sum(int(r["aic_points"]) for r in peer_rows())
                peer = (f"{sum(int(r['aic_points']) * float(r['aic_ttft_mape_pct']) for r in peer_rows()) / n:.1f} / "
                        f"{sum(int(r['aic_points']) * float(r['aic_tpot_mape_pct']) for r in peer_rows()) / n:.1f} ({n})")
            hc = ""
            if held is not None:
                h = held[key].get(g)
                hc = (f" {h.mape('ttft'):.1f} / {h.mape('tpot'):.1f} / {h.mape('tput'):.1f} |" if h is not None else " - |")
            name = "all" if key == "all" else f"{label} {g}"
            out.append(f"| {name} | {t.n} | {t.mape('ttft'):.1f} | {t.mape('tpot'):.1f} | {t.mape('tput'):.1f} |{hc} {peer} |")
    return out


def peer_rows() -> list[dict[str, str]]:
    with PEER_CSV.open() as f:
        return [r for r in csv.DictReader(f) if r["model"] == "DeepSeek-R1-0528"]


def run(cases: list[Case], legacy: bool, profile_for: Any = None) -> list[tuple[Case, dict[str, float] | str]]:
    return [(c, predict(c, legacy, profile_for(c) if profile_for else None)) for c in cases]


def grouped(results: list[tuple[Case, dict[str, float] | str]]) -> dict[str, dict[str, Tally]]:
    """Tallies by GPU, framework, parallelism class, speculation, weight dtype and overall."""
    by: dict[str, dict[str, Tally]] = {k: defaultdict(Tally) for k in ("gpu", "framework", "parallel", "mtp", "dtype", "all")}
    for c, p in results:
        for key, g in (("gpu", c.gpu), ("framework", c.framework), ("parallel", c.parallel),
                       ("mtp", f"MTP k={c.mtp}" if c.mtp else "no MTP"), ("dtype", c.weight_dtype), ("all", "all")):
            by[key][g].add(c, p)
    return by


def report(results: list[tuple[Case, dict[str, float] | str]], legacy: bool, seconds: float,
           before: dict[str, dict[str, Tally]] | None = None,
           held: list[tuple[Case, dict[str, float] | str]] | None = None, folds: int = 3) -> str:
    by = grouped(results)
    hby = grouped(held) if held is not None else None
    cells: dict[tuple[str, str, str], Tally] = defaultdict(Tally)
    refusals: dict[str, int] = defaultdict(int)
    for c, p in results:
        cells[(c.gpu, c.row["isl"], c.row["osl"])].add(c, p)
        if isinstance(p, str):
            refusals[p[:160]] += 1
    lines = [f"# InferenceX DeepSeek-R1 single-node rows: predicted vs measured ({'legacy: TP only, no MTP' if legacy else 'EP / DPA / MTP / fp4'})",
             "",
             "Generated by `python3 benchmarks/bench_inferencex.py" + (" --legacy" if legacy else "")
             + (" --held-out" if held is not None else "") + (f" --folds {folds}" if held is not None and folds != 3 else "")
             + f"` in {seconds:.1f} s "
             "from `tests/data/measurements/inferencex-dsr1.csv` (SemiAnalysis InferenceX, see that folder's README). "
             "MAPE = mean absolute % error; signed = (predicted - measured) / measured. "
             "The date-to-date floor of these rows is about 18% TTFT / 8% TPOT.", ""]
    lines += table("all", by["all"]) + [""]
    if hby is not None:
        how = f"{folds} folds of configurations per group" if folds > 0 else "leaving one configuration out at a time"
        lines += [f"Held out: each row predicted with its engine x GPU family's fitted MoE and front-end parameters "
                  f"(`benchmarks/fit_inferencex.py` stages A-B) refitted without its whole configuration ({how}); in sample: the shipped parameters. aiconfigurator: its point-weighted "
                  "per-cell errors on its DeepSeek-R1 cells of that GPU (`inferencex-peer-mape.csv`, 2026-07-20 dump).", ""]
    lines += summary(by, hby) + [""]
    flagged = sum(1 for c, _ in results if "closed_loop_check_ratio" in c.row["quality_flags"])
    if flagged:
        lines += [f"{flagged} row flagged `closed_loop_check_ratio` (the README's inconsistent ATOM row) is predicted, not scored.", ""]
    if before is not None:
        lines += ["Before (`--legacy` predictions of the model before EP / DPA / MTP, from `--before FILE`: every row as "
                  "TP only, no MTP, on the same rows):", ""]
        lines += table("before", before["all"]) + [""] + summary(before) + [""]
    for key, title in (("gpu", "GPU"), ("framework", "framework"), ("parallel", "parallelism"), ("mtp", "speculation"),
                       ("dtype", "weights")):
        lines += table(title, by[key]) + [""]
    lines += gain_tables(results)
    lines += ["## Beside aiconfigurator (its per-cell figures, `inferencex-peer-mape.csv`)", "",
              "aiconfigurator's cells are its DeepSeek-R1-0528 points of the 2026-07-20 dump (not the same dates as our "
              "rows); ours are every row of that GPU and ISL:OSL here.", "",
              "| GPU | ISL:OSL | aic points | aic TTFT % | aic TPOT % | our rows | our TTFT % | our TPOT % | our tput % |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in peer_rows():
        t = cells.get((r["gpu"], r["isl"], r["osl"]))
        ours = [str(t.n), f"{t.mape('ttft'):.1f}", f"{t.mape('tpot'):.1f}", f"{t.mape('tput'):.1f}"] if t else ["0", "-", "-", "-"]
        lines.append(f"| {r['gpu']} | {r['isl']}:{r['osl']} | {r['aic_points']} | {r['aic_ttft_mape_pct']} | "
                     f"{r['aic_tpot_mape_pct']} | " + " | ".join(ours) + " |")
    if refusals:
        lines += ["", "## Rows not predicted", ""]
        lines += [f"- {n} x {why}" for why, n in sorted(refusals.items(), key=lambda x: -x[1])]
    return "\n".join(lines) + "\n"


def _median_by(results: list[tuple[Case, dict[str, float] | str]], strip: str) -> dict[tuple[Any, ...], tuple[float, float]]:
    """Per point (configuration without ``strip``, concurrency): (median measured TPOT, predicted TPOT)."""
    acc: dict[tuple[Any, ...], tuple[list[float], float]] = {}
    for c, p in results:
        if isinstance(p, str) or "tpot" not in c.measured or "closed_loop_check_ratio" in c.row["quality_flags"]:
            continue
        base = (c.gpu, c.framework, c.tp, c.dp, c.ep, c.row["isl"], c.row["osl"], c.conc)
        key = (*base, c.weight_dtype if strip == "mtp" else c.mtp, (c.mtp > 0) if strip == "mtp" else c.weight_dtype)
        acc.setdefault(key, ([], p["tpot"]))[0].append(c.measured["tpot"])
    return {k: (statistics.median(v[0]), v[1]) for k, v in acc.items()}


def gain_tables(results: list[tuple[Case, dict[str, float] | str]]) -> list[str]:
    """Measured vs predicted TPOT gains of MTP (no-MTP / MTP) and of fp4 (fp8 / fp4) on paired points."""
    out: list[str] = []
    pts = _median_by(results, "mtp")
    bands = {"1-8": (1, 8), "16-64": (16, 64), "128-512": (128, 512)}
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for k, (m1, p1) in pts.items():
        if k[-1] is not True:
            continue
        off = pts.get((*k[:-1], False))
        if off is None:
            continue
        band = next(b for b, (lo, hi) in bands.items() if lo <= k[7] <= hi)
        rows[band].append((off[0] / m1, off[1] / p1))
    out += ["## MTP: TPOT without / with MTP on paired points (median over dates)", "",
            "| concurrency | pairs | measured gain (median) | predicted gain (median) |", "|---|---:|---:|---:|"]
    for band in bands:
        v = rows.get(band, [])
        if v:
            out.append(f"| {band} | {len(v)} | {statistics.median(x for x, _ in v):.2f}x | {statistics.median(y for _, y in v):.2f}x |")
    out += [""]
    pts = _median_by(results, "dtype")
    frows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for k, (m4, p4) in pts.items():
        if k[-1] not in ("fp4", "mxfp4"):
            continue
        off = pts.get((*k[:-1], "fp8"))
        if off is None:
            continue
        frows[k[0]].append((off[0] / m4, off[1] / p4))
    out += ["## fp4: TPOT at fp8 / at fp4 on paired points (median over dates)", "",
            "| GPU | pairs | measured gain (median) | predicted gain (median) | bytes per weight fp8 / fp4 |", "|---|---:|---:|---:|---:|"]
    from recommender.perf.memory import bytes_per_weight

    for gpu, v in sorted(frows.items()):
        d = "mxfp4" if gpu in AMD else "fp4"
        out.append(f"| {gpu} | {len(v)} | {statistics.median(x for x, _ in v):.2f}x | {statistics.median(y for _, y in v):.2f}x | "
                   f"{bytes_per_weight('fp8') / bytes_per_weight(d):.2f}x |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--out", type=Path, default=None,
                    help="report path (default: benchmarks/results/inferencex.md; inferencex-loco.md with --held-out --folds 0)")
    ap.add_argument("--legacy", action="store_true", help="TP only, no MTP (runs on older checkouts)")
    ap.add_argument("--before", type=Path, default=None, help="a --json file of a --legacy run to print beside")
    ap.add_argument("--json", type=Path, default=None, help="also write per-row predictions here")
    ap.add_argument("--limit", type=int, default=0, help="predict only the first N rows (smoke test)")
    ap.add_argument("--held-out", action="store_true", help="also the error held out by whole configuration (about 20 s)")
    ap.add_argument("--folds", type=int, default=3, help="folds of configurations for --held-out (0: leave one configuration "
                    "out, about 4 min)")
    a = ap.parse_args(argv)
    cases = single_node_cases(a.csv)
    if a.limit:
        cases = cases[: a.limit]
    t0 = time.perf_counter()
    results = run(cases, a.legacy)
    held = None
    if a.held_out and not a.legacy:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import fit_inferencex as fx

        # stage B is refitted only for the groups that ship it (the others keep 0, as shipped)
        sc = fx.scored(cases)
        shipped_a, shipped_b = fx.shipped_groups(sc)
        held = fx.held_out_predictions(sc, a.folds, None, None, shipped_b, shipped_a)
    secs = time.perf_counter() - t0
    before = None
    if a.before is not None:
        prev = json.loads(a.before.read_text())
        keyed = {(r["key"]): r["pred"] for r in prev}
        before = grouped([(c, keyed[_key(c)]) for c, _ in results if _key(c) in keyed])
    text = report(results, a.legacy, secs, before, held, a.folds)
    out = a.out or (LOCO_OUT if a.held_out and a.folds == 0 else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if a.json is not None:
        a.json.write_text(json.dumps([{"key": _key(c), "pred": p, "measured": c.measured} for c, p in results]))
    print(text)
    return 0


def _key(c: Case) -> str:
    r = c.row
    return "|".join((r["date"], r["gpu"], r["framework"], r["precision"], r["tp"], r["ep"], r["dp_attention"],
                     r["spec_method"], r["isl"], r["osl"], r["concurrency"], r["source_commit"], r["run_id"]))


if __name__ == "__main__":
    raise SystemExit(main())
