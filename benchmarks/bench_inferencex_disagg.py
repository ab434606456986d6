"""Predict InferenceX's disaggregated DeepSeek-R1 rows with the P/D load model; write ``benchmarks/results/inferencex-disagg.md``.

    python3 benchmarks/bench_inferencex_disagg.py [--out FILE.md] [--limit N]

The 284 rows of ``tests/data/measurements/inferencex-dsr1.csv`` with ``disagg`` true (Dynamo SGLang / TensorRT-LLM
and MoRI SGLang: ``prefill_workers`` engines of ``num_prefill_gpu / prefill_workers`` GPUs feed ``decode_workers``
engines, each side with its own TP, EP and DP attention) are predicted as a plan's P/D deployment is
(``recommender.load.analyze_disaggregated``), from the shipped profiles, with one constant fitted on them, the P/D
handoff (:func:`fit_handoff`; every reported error is held out by configuration, :func:`held_out_handoff`):

- each side is one engine per worker, built as ``recommend estimate`` builds it (``tp`` = the worker's GPUs, or
  ``tp`` 1 and ``dp`` = its GPUs under DP attention; EP where ``*_ep`` > 1; the decode side with MTP where the
  row ran it, at the engine's acceptance); the load model's replicas are the attention ranks (workers x dp);
- the KV moves over NVLink (900 GB/s per GPU) where both sides fit one NVLink domain (a GB200 / GB300 NVL72 rack), else over
  one 400 Gb/s NIC per GPU (50 GB/s), with the search policy's fixed cost per transfer and the P/D handoff, a delay
  per request that holds no link (``recommender.load.link``);
- the harness keeps ``CONC`` requests in flight (a closed loop): the arrival rate ``R`` the open-loop model needs
  is the one with ``R x E2E(R) = CONC`` (Little's law; bisection below the deployment's capacity);
- measured TTFT is the row's median (the model's p50): the steady-state model has no cold first wave, which moves a
  run's mean TTFT and not its median; TPOT the mean; output throughput ``R x output tokens``.

Not predicted (the reason is counted): a GPU without a catalog entry, an engine wider than one NVLink / xGMI
domain (EP or DP attention across nodes), EP ranks that do not split the 256 experts, an engine whose weights the
model does not fit at memory fraction 0.96 (it keeps every non-expert weight on each attention rank, as vLLM's DP
does), rows whose worker GPU count is not whole.
Error = ``|predicted / measured - 1|``: mean (MAPE) and median, by GPU, framework, layout and concurrency.
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
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_inferencex as bx  # noqa: E402

from recommender.atomic import atomic_write_text  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "inferencex-disagg.md"
#: InferenceX disaggregated framework -> (single-node framework name of bench_inferencex, engine profile)
FRAMEWORK = {"dynamo-sglang": ("sglang", "sglang"), "dynamo-trt": ("trt", "trtllm"), "mori-sglang": ("sglang", "sglang")}
#: InferenceX GPU name -> catalog id
GPU = {"h100": "h100-sxm", "h200": "h200", "b200": "b200", "b300": "b300", "gb200": "gb200", "gb300": "gb300", "mi355x": "mi355x"}
NIC_BYTES_PER_S = 50e9  # one 400 Gb/s NIC per GPU (ConnectX-7 / NDR, the rail-optimised HGX / MI355X layout)


@dataclass(frozen=True)
class Side:
    """One side of the P/D deployment: ``workers`` engines, each ``tp`` x ``dp`` GPUs, EP or not."""

    workers: int
    tp: int
    dp: int
    ep: bool

    @property
    def gpus(self) -> int:
        return self.workers * self.tp * self.dp

    def label(self) -> str:
        par = f"DP{self.dp}" if self.dp > 1 else f"TP{self.tp}"
        return f"{self.workers}x{par}{'+EP' if self.ep else ''}"


@dataclass(frozen=True)
class DisaggCase:
    row: dict[str, str]
    gpu: str            # InferenceX name
    framework: str      # InferenceX name
    weight_dtype: str
    conc: int
    prompt_tokens: int
    output_tokens: int
    mtp: bool
    prefill: Side | None
    decode: Side | None
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def ttft_statistic(self) -> str:
        """"median" where the row publishes it (the steady-state model does not see a run's cold first wave, which
        moves the mean and not the median: docs/accuracy.md), else "mean"."""
        return "median" if bx._num(self.row.get("ttft_median_ms", "")) is not None else "mean"

    @property
    def point(self) -> tuple[Any, ...]:
        """One configuration and concurrency (every date of it)."""
        return (self.gpu, self.framework, self.weight_dtype, self.mtp, self.prefill, self.decode, self.row["isl"],
                self.row["osl"], self.conc, self.ttft_statistic)

    @property
    def layout(self) -> str:
        return "-" if self.prefill is None or self.decode is None else f"P {self.prefill.label()} / D {self.decode.label()}"


def side_of(row: dict[str, str], which: str) -> Side | None:
    """A side's layout from the row's ``{which}_tp / _ep / _dp_attention / _workers`` and ``num_{which}_gpu``; None when
    its GPU count is not a whole number of workers."""
    workers, gpus = int(row[f"{which}_workers"] or 0), int(row[f"num_{which}_gpu"] or 0)
    if workers < 1 or gpus < workers or gpus % workers:
        return None
    per = gpus // workers
    dpa = row[f"{which}_dp_attention"] == "true"
    return Side(workers=workers, tp=1 if dpa else per, dp=per if dpa else 1, ep=int(row[f"{which}_ep"] or 1) > 1)


def disagg_cases(path: Path) -> list[DisaggCase]:
    out = []
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["disagg"] != "true":
                continue
            fp4 = r["precision"] == "fp4"
            wd = ("mxfp4" if r["gpu"] in bx.AMD else "fp4") if fp4 else "fp8"
            meas: dict[str, float] = {}
            for k, first, second in (("ttft", "ttft_median_ms", "ttft_mean_ms"), ("tpot", "tpot_mean_ms", "tpot_median_ms")):
                v = bx._num(r[first]) or bx._num(r[second])
                if v is not None:
                    meas[k] = v / 1e3
            t = bx._num(r["output_tput_tok_s"])
            if t is not None:
                meas["tput"] = t
            out.append(DisaggCase(row=r, gpu=r["gpu"], framework=r["framework"], weight_dtype=wd,
                                  conc=int(r["concurrency"]), prompt_tokens=round(0.9 * int(r["isl"])),
                                  output_tokens=round(0.9 * int(r["osl"])), mtp=r["spec_method"] == "mtp",
                                  prefill=side_of(r, "prefill"), decode=side_of(r, "decode"), measured=meas))
    return out


def _pool(c: DisaggCase, side: Side, fw: str, engine: str, gpu: str, with_mtp: bool) -> tuple[Any, Any]:
    """(StepCostModel, EngineLimits) of one engine of ``side``, built as ``recommend estimate`` builds it
    (``build_deployment``) at the memory fraction 0.9, or 0.96 where that does not hold the weights (the row ran, so
    its engine held them); ConfigError (one line, ``recommender.perf.moe.check_layout``, as ``recommend estimate``)
    for a layout the physics does not cover: ``tp x dp`` beyond one NVLink / xGMI domain (collectives across nodes
    are not modelled), EP ranks that do not split the experts; ValueError for weights that do not fit."""
    from recommender.catalog import default_catalog
    from recommender.estimator import build_deployment, parse_speculative_config
    from recommender.perf.moe import check_layout
    from recommender.perf.step import EngineLimits, StepCostModel
    from recommender.profiles import engine_profile

    cat = default_catalog()
    g, model = cat.gpu(gpu), cat.model(bx.MODEL)
    ranks = side.tp * side.dp
    check_layout(model, gpu, g.interconnect.gpus_per_domain, tp=side.tp, dp=side.dp, ep=side.ep)
    release = bx.engine_release(fw, c.row.get("image") or c.row.get("image_from_config") or "")
    profile = engine_profile(engine).for_release(gpu, release, bx.MODEL)
    kv = bx.kv_cache_dtype(fw, c.gpu, c.weight_dtype, c.row["date"])
    seqs, tokens = (512, 32768) if fw == "sglang" else (max(c.conc // max(side.workers * side.dp, 1), 8), 16384)
    spec = None
    if with_mtp:
        k = bx.mtp_tokens(fw, c.gpu, side.dp > 1)
        spec = parse_speculative_config(json.dumps({"method": "mtp", "num_speculative_tokens": k}), model, engine=engine)
    limits = EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens)
    for gmu in (0.9, 0.96):
        dep = build_deployment(model=model, gpu=g, tp=side.tp, weight_dtype=c.weight_dtype, kv_dtype=kv, profile=profile,
                               limits=limits, gpu_memory_utilization=gmu, dp=side.dp, ep=side.ep, spec=spec,
                               max_model_len=c.prompt_tokens + c.output_tokens)
        if dep.memory().fits:
            return StepCostModel.build(dep), dep.limits
    raise ValueError(f"a {'decode' if with_mtp or side is c.decode else 'prefill'} engine of {ranks} GPUs does not "
                     "hold the weights at memory fraction 0.96")


def predict(c: DisaggCase, handoff_s: float | None = None) -> dict[str, float] | str:
    """{ttft, tpot, tput} of the row's P/D deployment in a closed loop of ``conc`` requests, or why not; the KV link
    carries the search policy's handoff (``kv_handoff_s``) unless ``handoff_s`` is given."""
    from recommender.catalog import default_catalog
    from recommender.errors import RecommenderError
    from recommender.load import Disaggregated, PoolSpec, Traffic, analyze_disaggregated
    from recommender.load.link import KvLink
    from recommender.perf import memory as mem
    from recommender.search.policy import load_search_policy
    from recommender.workload import LengthDist

    gpu = GPU.get(c.gpu)
    if gpu is None:
        return f"no catalog entry for {c.gpu}"
    if c.prefill is None or c.decode is None:
        return "worker GPU count not whole"
    fw, engine = FRAMEWORK[c.framework]
    try:
        cost_p, lim_p = _pool(c, c.prefill, fw, engine, gpu, False)
        cost_d, lim_d = _pool(c, c.decode, fw, engine, gpu, c.mtp)
    except RecommenderError as e:
        return str(e).splitlines()[0]
    except ValueError as e:
        return str(e)
    cat = default_catalog()
    g, model = cat.gpu(gpu), cat.model(bx.MODEL)
    one_domain = c.prefill.gpus + c.decode.gpus <= g.interconnect.gpus_per_domain
    nic = g.interconnect.bandwidth_bytes_per_s if one_domain else NIC_BYTES_PER_S
    policy = load_search_policy()
    link = KvLink(bytes_per_token=mem.kv_cache_bytes_per_token(model, bx.kv_cache_dtype(fw, c.gpu, c.weight_dtype,
                                                                                      c.row["date"]), 1),
                  nic_bytes_per_s=nic, prefill_tp=c.prefill.tp, decode_tp=c.decode.tp,
                  latency_s=policy.kv_transfer_latency_s,
                  handoff_s=policy.kv_handoff_s if handoff_s is None else handoff_s)
    topo = Disaggregated(prefill=PoolSpec(cost=cost_p, limits=lim_p, replicas=c.prefill.workers * c.prefill.dp),
                         decode=PoolSpec(cost=cost_d, limits=lim_d, replicas=c.decode.workers * c.decode.dp), kv_link=link)

    def at(rate: float) -> Any:
        return analyze_disaggregated(topo, Traffic(rate_per_s=rate, prompt=LengthDist.constant(c.prompt_tokens),
                                                   output=LengthDist.constant(c.output_tokens)))

    res = closed_loop(at, c.conc)
    if isinstance(res, str):
        return res
    rate, r = res
    ttft = r.ttft_s.at("mean" if c.ttft_statistic == "mean" else "p50")
    return {"ttft": float(ttft), "tpot": float(r.tpot_s.at("mean")), "tput": rate * c.output_tokens,
            "utilisation": float(r.utilisation)}


def closed_loop(at: Any, conc: int, iters: int = 40) -> tuple[float, Any] | str:
    """The rate ``R`` with ``R x mean E2E(R) = conc`` (Little's law) and the model's result there: doubling from 1 req/s
    to a rate past it (or past the capacity), then bisection on ``ln R``; the model saturates before ``R x E2E``
    reaches ``conc`` only when the queue grows without bound, so the bracket always closes."""
    lo, hi = 1e-4, None
    probe = at(lo)
    if not probe.stable:
        return "unstable at any rate"
    hi = 1.0
    while hi < 1e6 and (r := at(hi)).stable and hi * float(r.e2e_s.at("mean")) < conc:   # double up to a bracket
        lo, hi = hi, 2.0 * hi
    best = (lo, at(lo))
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        res = at(mid)
        if res.stable and mid * float(res.e2e_s.at("mean")) < conc:
            lo, best = mid, (mid, res)
        else:
            hi = mid
    return best


def _tally(pairs: Sequence[tuple[DisaggCase, dict[str, float] | str]], key: Any) -> list[list[Any]]:
    """Per group of ``key``: rows, coverage, each metric's mean / median absolute % error, TTFT's median signed %."""
    groups: dict[str, list[tuple[DisaggCase, dict[str, float] | str]]] = defaultdict(list)
    for c, p in pairs:
        groups[key(c)].append((c, p))
    rows = []
    for k, g in sorted(groups.items()):
        ok = [(c, p) for c, p in g if isinstance(p, dict)]

        def ratios(m: str) -> list[float]:
            return [p[m] / c.measured[m] for c, p in ok if isinstance(p, dict) and m in c.measured and p[m] > 0]

        cells: list[Any] = [k, len(g), f"{100 * len(ok) / len(g):.0f}%"]
        for m in ("ttft", "tpot", "tput"):
            e = [abs(x - 1.0) * 100.0 for x in ratios(m)]
            cells.append("-" if not e else f"{statistics.fmean(e):.1f} / {statistics.median(e):.1f}")
        t = ratios("ttft")
        cells.append("-" if not t else f"{100 * (statistics.median(t) - 1):+.0f}")
        rows.append(cells)
    return rows


def _table(title: str, rows: list[list[Any]]) -> list[str]:
    head = [title, "rows", "coverage", "TTFT MAPE / median %", "TPOT MAPE / median %", "output tok/s MAPE / median %",
            "TTFT median signed %"]
    return (["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows] + [""])


def predict_all(cases: Sequence[DisaggCase], handoff_s: float | None = None,
                ) -> list[tuple[DisaggCase, dict[str, float] | str]]:
    """Every case with its prediction (or why not), each distinct point (configuration x concurrency) predicted once,
    at ``handoff_s`` (default: the search policy's)."""
    memo: dict[tuple[Any, ...], dict[str, float] | str] = {}
    out = []
    for c in cases:
        if c.point not in memo:
            memo[c.point] = predict(c, handoff_s)
        out.append((c, memo[c.point]))
    return out


#: Rows of a closed loop of at most this many requests fit the handoff: with so few in flight nothing queues, and what
#: the model misses is the path's fixed cost (at 16-64 in flight the gap grows with the prefill pool's load: a
#: constant fitted there would absorb that too; docs/accuracy.md).
HANDOFF_FIT_MAX_CONCURRENCY = 8
HANDOFF_FOLDS = 3


def config_of(c: DisaggCase) -> tuple[Any, ...]:
    """One configuration: everything but the concurrency and the date (held out whole)."""
    return (c.gpu, c.framework, c.weight_dtype, c.mtp, c.prefill, c.decode, c.row["isl"], c.row["osl"])


def fit_handoff(pairs0: Sequence[tuple[DisaggCase, dict[str, float] | str]]) -> float:
    """The P/D handoff (s): the median of measured minus predicted TTFT over ``pairs0`` (predicted without a handoff)
    at concurrency <= :data:`HANDOFF_FIT_MAX_CONCURRENCY`; NaN without such rows. Adding a constant to every TTFT
    moves the closed loop's rate a little, which the re-prediction at the fitted value accounts for."""
    r = [c.measured["ttft"] - p["ttft"] for c, p in pairs0
         if isinstance(p, dict) and "ttft" in c.measured and c.conc <= HANDOFF_FIT_MAX_CONCURRENCY]
    return statistics.median(r) if r else float("nan")


def held_out_pairs(cases: Sequence[DisaggCase]) -> list[tuple[DisaggCase, dict[str, float] | str]]:
    """Every case predicted at a handoff fitted without its whole configuration (:func:`held_out_handoff`): what the
    README's P/D figures and the P/D error band (``bench_bands.py``) are computed from."""
    return held_out_handoff(cases, predict_all(cases, 0.0))[0]


def held_out_handoff(cases: Sequence[DisaggCase], pairs0: Sequence[tuple[DisaggCase, dict[str, float] | str]],
                     group: Any = None) -> tuple[list[tuple[DisaggCase, dict[str, float] | str]], dict[Any, float]]:
    """Every case predicted at a handoff fitted without it (``group``: case -> key, default whole configurations dealt
    round-robin into :data:`HANDOFF_FOLDS` folds), and the handoff each fold was fitted to."""
    key = group or config_of
    names = sorted({key(c) for c in cases}, key=repr)
    fold_of = {n: (i % HANDOFF_FOLDS if group is None else n) for i, n in enumerate(names)}
    fitted: dict[Any, float] = {}
    out: dict[int, tuple[DisaggCase, dict[str, float] | str]] = {}
    for f in sorted(set(fold_of.values()), key=repr):
        train = [(c, p) for c, p in pairs0 if fold_of[key(c)] != f]
        fitted[f] = fit_handoff(train)
        test = [i for i, c in enumerate(cases) if fold_of[key(c)] == f]
        for i, pair in zip(test, predict_all([cases[i] for i in test], fitted[f])):
            out[i] = pair
    return [out[i] for i in range(len(cases))], fitted


def within_utilisation(pairs: Sequence[tuple[DisaggCase, dict[str, float] | str]],
                       max_utilisation: float) -> list[tuple[DisaggCase, dict[str, float]]]:
    """The covered rows whose deployment the model runs at or below ``max_utilisation`` (the regime a plan is sized
    for: the search policy's ``max_utilisation``; above it the closed loop's queue, not the P/D path, sets TTFT):
    the rows behind ``catalogs/evidence.yaml``'s ``disaggregated`` entry (``benchmarks/bench_bands.py --write``).
    Pass held-out pairs (:func:`held_out_pairs`) for held-out errors."""
    return [(c, p) for c, p in pairs if isinstance(p, dict) and p["utilisation"] <= max_utilisation]


def headline(pairs: Sequence[tuple[DisaggCase, dict[str, float] | str]]) -> dict[str, float]:
    """Coverage (%), the median absolute % error of TPOT and output throughput, the median signed % error of TTFT
    (``README.md`` states them; ``benchmarks/readme_figures.py`` checks)."""
    ok = [(c, p) for c, p in pairs if isinstance(p, dict)]

    def med(m: str, signed: bool = False) -> float:
        xs = [p[m] / c.measured[m] for c, p in ok if m in c.measured and p[m] > 0]
        return 100.0 * (statistics.median(xs) - 1.0) if signed else statistics.median(abs(x - 1.0) * 100.0 for x in xs)

    return {"coverage": 100.0 * len(ok) / len(pairs), "tpot": med("tpot"), "tput": med("tput"), "ttft_signed": med("ttft", True)}


def load_policy_handoff() -> float:
    from recommender.search.policy import load_search_policy

    return load_search_policy().kv_handoff_s


def _ttft_line(label: str, pairs: Sequence[tuple[DisaggCase, dict[str, float] | str]]) -> str:
    xs = [p["ttft"] / c.measured["ttft"] for c, p in pairs if isinstance(p, dict) and "ttft" in c.measured and p["ttft"] > 0]
    return (f"| {label} | {len(xs)} | {100 * (statistics.median(xs) - 1):+.0f} | "
            f"{statistics.median(abs(x - 1) for x in xs) * 100:.1f} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--limit", type=int, default=0, help="predict only the first N rows (a smoke run)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    cases = disagg_cases(bx.DEFAULT_CSV)
    if a.limit:
        cases = cases[:a.limit]
    pairs0 = predict_all(cases, 0.0)
    shipped = predict_all(cases)
    pairs, folds = held_out_handoff(cases, pairs0)
    by_fw, fw_fit = held_out_handoff(cases, pairs0, group=lambda c: c.framework)
    reasons: dict[str, int] = defaultdict(int)
    for _, p in pairs:
        if isinstance(p, str):
            reasons[p] += 1
    conc = lambda c: "conc <= 64" if c.conc <= 64 else "conc 128-1024" if c.conc <= 1024 else "conc > 1024"  # noqa: E731
    own = {fw: fit_handoff([(c, p) for c, p in pairs0 if c.framework == fw]) for fw in sorted(fw_fit)}
    md = ["# InferenceX disaggregated DeepSeek-R1 rows: the P/D load model against measured runs", "",
          f"Generated by `python3 benchmarks/bench_inferencex_disagg.py` in {time.perf_counter() - t0:.0f} s from "
          "`tests/data/measurements/inferencex-dsr1.csv` (rows with `disagg` true). The shipped profiles predict them "
          "(module docstring: the layout, the KV link, the closed loop); one constant is fitted on them, the P/D "
          "handoff (below), so every table is held out: each row predicted at a handoff fitted without its whole "
          f"configuration ({HANDOFF_FOLDS} folds of configurations). Error = |predicted / measured - 1|, mean / median %; "
          "signed = median of predicted / measured - 1.", "",
          "## The P/D handoff", "",
          "A request's delay between its prefill and its decode engine beyond the KV transfer, holding no link "
          "(`recommender.load.link`): the median of measured minus predicted TTFT, the model without a handoff, over "
          f"the rows of at most {HANDOFF_FIT_MAX_CONCURRENCY} requests in flight (nothing queues).", "",
          "| fitted on | handoff ms |", "|---|---:|",
          f"| all frameworks | {1e3 * fit_handoff(pairs0):.0f} |"]
    md += [f"| {fw} alone | {1e3 * v:.0f} |" for fw, v in own.items()]
    md += [f"| shipped (`policies/search.yaml` `kv_handoff_s`) | {1e3 * load_policy_handoff():.0f} |", "",
           "TTFT median signed / median absolute % error:", "",
           "| predicted with | rows | TTFT median signed % | TTFT median abs % |", "|---|---:|---:|---:|"]
    for label, ps in (("no handoff", pairs0), ("the shipped handoff (in sample)", shipped),
                      ("a handoff fitted without the row's configuration", pairs),
                      ("a handoff fitted on the other two frameworks", by_fw)):
        md.append(_ttft_line(label, ps))
    md += ["", "Held out by framework, each fitted on the other two: "
           + ", ".join(f"{fw} {1e3 * v:.0f} ms" for fw, v in fw_fit.items()) + ".", ""]
    md += _table("all", _tally(pairs, lambda c: "all"))
    md += _table("GPU", _tally(pairs, lambda c: c.gpu))
    md += _table("framework", _tally(pairs, lambda c: c.framework))
    md += _table("concurrency", _tally(pairs, conc))
    md += _table("MTP", _tally(pairs, lambda c: "MTP" if c.mtp else "no MTP"))
    md += ["Not predicted:", ""] + [f"- {n} rows: {r}" for r, n in sorted(reasons.items(), key=lambda x: -x[1])] + [""]
    text = "\n".join(md)
    print(text)
    atomic_write_text(a.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
