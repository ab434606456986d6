"""Speed of the load model: simulated requests per second and analytic evaluations per second.

Run: ``python benchmarks/bench_simulator.py`` (one core; takes ~20 s). Workload: rag-like (prompts
lognormal 6000 +- 1000 tokens in [4000, 8000], outputs lognormal 180 +- 80 in [16, 512], 25% shared
prefix), as in ``examples/rag.yaml``. Cost models: Llama-3.1-70B fp8 on 4x H100 SXM from the perf
model (when the catalogs are present) and the toy linear model of ``recommender.load.toy``, at the
rate that gives the listed analytic utilisation. Timings are the best of a few repeats
(``time.perf_counter``), so a busy machine shows its best case.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate  # noqa: E402

from recommender.load import PoolSpec, Traffic, analyze, simulate  # noqa: E402
from recommender.load.toy import LinearStepCost, LogNormalLength, ToyLimits  # noqa: E402


def _best(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _rate_for(cost: Any, limits: Any, prompt: Any, output: Any, target: float, fraction: float) -> float:
    lo, hi = 1e-3, 1e4
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        r = analyze(PoolSpec(cost=cost, limits=limits), Traffic(rate_per_s=mid, prompt=prompt, output=output,
                                                                 shared_prefix_fraction=fraction))
        if r.stable and r.utilisation < target:
            lo = mid
        else:
            hi = mid
    return lo


def _setups() -> list[tuple[str, Any, Any, Any, Any, float]]:
    fraction = 0.25
    try:
        from recommender.workload import LengthDist

        prompt: Any = LengthDist.lognormal(6000, 1000, 4000, 8000)
        output: Any = LengthDist.lognormal(180, 80, 16, 512)
    except Exception:  # the workload module is optional for this benchmark
        prompt = LogNormalLength(5900, 0.17, 4000, 8000)
        output = LogNormalLength(165, 0.42, 16, 512)
    out = [("toy linear (5 us/token)", LinearStepCost(s_per_token=5e-6), ToyLimits(enable_prefix_caching=True), prompt, output, fraction)]
    try:
        from recommender.catalog import default_catalog
        from recommender.estimator import build_deployment
        from recommender.perf.step import EngineLimits, StepCostModel
        from recommender.profiles import resolve_profile

        cat = default_catalog()
        lim = EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192, chunked_prefill=True, enable_prefix_caching=True)
        dep = build_deployment(model=cat.model("llama-3.1-70b"), gpu=cat.gpu("h100-sxm"), tp=4, weight_dtype="fp8",
                               kv_dtype="fp8", profile=resolve_profile("vllm", None), limits=lim, max_model_len=8704)
        out.insert(0, ("llama-3.1-70b fp8, 4x h100-sxm", StepCostModel.build(dep), lim, prompt, output, fraction))
    except Exception as e:  # pragma: no cover - catalogs missing
        print(f"(perf model unavailable: {e}; toy model only)")
    return out


def main() -> None:
    n = 10_000
    sim_rows, ana_rows = [], []
    for name, cost, limits, prompt, output, fraction in _setups():
        for target in (0.5, 0.8):
            rate = _rate_for(cost, limits, prompt, output, target, fraction)
            pool = PoolSpec(cost=cost, limits=limits)
            traffic = Traffic(rate_per_s=rate, prompt=prompt, output=output, shared_prefix_fraction=fraction)
            secs, res = _best(lambda: simulate(pool, traffic, n_requests=n, seed=1), 2)
            sim_rows.append([name, f"{target:.1f}", f"{rate:.2f}", f"{res.mean_running_batch:.0f}", res.steps,
                             f"{secs:.2f}", f"{n / secs:,.0f}", f"{res.steps / secs:,.0f}"])
        rate = _rate_for(cost, limits, prompt, output, 0.5, fraction)

        def bare() -> Any:
            return analyze(PoolSpec(cost=cost, limits=limits),
                           Traffic(rate_per_s=rate, prompt=prompt, output=output, shared_prefix_fraction=fraction))

        def one_slo() -> float:
            return bare().ttft_s.p90

        def everything() -> float:
            r = bare()
            return r.ttft_s.p99 + r.tpot_s.p99 + r.e2e_s.p99

        row = [name]
        for fn in (bare, one_slo, everything):
            k = 2000
            secs, _ = _best(lambda: [fn() for _ in range(k)], 3)
            row.append(f"{k / secs:,.0f}")
        ana_rows.append(row)
    print(f"Simulator: {n:,} rag-like requests, one replica, seed 1")
    print(tabulate(sim_rows, headers=["cost model", "util", "req/s in", "mean running", "steps", "wall s",
                                      "sim requests/s", "steps/s"], tablefmt="github"))
    print()
    print("Analytic model: evaluations per second at utilisation 0.5 (one core)")
    print(tabulate(ana_rows, headers=["cost model", "analyze()", "+ one percentile", "+ all percentiles"], tablefmt="github"))


if __name__ == "__main__":
    main()
