"""Regenerate the SYNTHETIC `vllm bench serve --save-result` examples in this folder.

    python tests/data/bench/make_examples.py

The numbers are NOT measurements: they are the serving model's own predictions for a made-up cluster
(:data:`TRUE_PROFILE`, slower than the shipped vLLM profile) with 2 % multiplicative noise, laid out
with the exact key set of a real `--save-result` file (``reference/vllm/bench-serve-result.json``,
vLLM 0.33). They exist to show a user with three benchmark files getting a profile and the error
dropping (``tests/test_calibrate_cli.py``).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from recommender.calibrate.measurements import Measurement, closed_at, deployment, in_flight
from recommender.perf.steady import Load
from recommender.perf.step import default_limits
from recommender.catalog import default_catalog
from recommender.profiles import EngineProfile

HERE = Path(__file__).resolve().parent
#: The made-up cluster the examples describe (parameters a calibration should approach).
TRUE_PROFILE = EngineProfile(engine="vllm", hbm_bandwidth_efficiency=0.62, compute_efficiency=0.40,
                             step_overhead_s=2.5e-3, source="synthetic examples")
MODEL, GPU = "llama-3.1-8b", "h100-sxm"
RUNS = (
    # file name, prompts, max_concurrency, request_rate, input len, output len, where tp/gpu are stated
    ("vllm-8b-c1-in1024-out128.json", 32, 1, "inf", 1024, 128, "metadata"),
    ("vllm-8b-c16-in2048-out256.json", 160, 16, "inf", 2048, 256, "sidecar"),
    ("vllm-8b-rate4-in512-out512.json", 200, None, 4.0, 512, 512, "metadata"),
)


def _pcts(xs: list[float], name: str) -> dict[str, float]:
    ms = [x * 1e3 for x in xs]
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": statistics.median(ms),
            f"std_{name}_ms": statistics.pstdev(ms), f"p50_{name}_ms": statistics.median(ms),
            f"p90_{name}_ms": q[89], f"p99_{name}_ms": q[98]}


def make(name: str, n: int, conc: int | None, rate: float | str, isl: int, osl: int, where: str, seed: int) -> dict:
    rng = random.Random(seed)
    cat = default_catalog()
    lim = default_limits(cat.gpu(GPU))
    m = Measurement(id="x", source="x", file="x", engine="vllm", model=MODEL, gpu=GPU, tp=1, weight_dtype="bf16",
                    kv_dtype="bf16", load=Load("closed", conc or n, 0, isl, osl), quantity="ttft_s", value=1.0,
                    raw_metric="x", limits=lim, rate_per_s=None if rate == "inf" else float(rate), requests=n)
    dep = deployment(m, TRUE_PROFILE, cat)
    nf = in_flight(dep, m)
    ttft, tpot, e2e = closed_at(dep, nf, isl, osl)
    noise = lambda: 1.0 + 0.02 * rng.gauss(0, 1)  # noqa: E731
    ttft, tpot = ttft * noise(), tpot * noise()
    e2e = ttft + (osl - 1) * tpot
    arrivals = (n - 1) / float(rate) if rate != "inf" else 0.0
    duration = (max(arrivals, max(n - nf, 0.0) * e2e / nf) + e2e) * noise()
    ttfts = [ttft * (1 + 0.05 * rng.gauss(0, 1)) for _ in range(n)]
    tpots = [tpot * (1 + 0.03 * rng.gauss(0, 1)) for _ in range(n)]
    lats = [a + (osl - 1) * b for a, b in zip(ttfts, tpots)]
    doc: dict = {"date": "20261130-120000", "endpoint_type": "openai", "backend": "vllm", "label": None,
                 "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
                 "num_prompts": n}
    if where == "metadata":
        doc.update({"tp": "1", "gpu": "H100"})
    doc.update({"request_rate": rate if rate == "inf" else float(rate), "burstiness": 1.0, "max_concurrency": conc,
                "duration": duration, "completed": n, "failed": 0, "total_input_tokens": n * isl,
                "total_output_tokens": n * osl, "request_throughput": n / duration, "request_goodput": None,
                "output_throughput": n * osl / duration, "total_token_throughput": n * (isl + osl) / duration,
                "latencies": lats, "queue_times": [abs(rng.gauss(0, 1e-4)) for _ in range(n)],
                "max_output_tokens_per_s": round(nf * 1.3 / tpot), "max_concurrent_requests": int(round(nf)) + 1,
                "rtfx": 0.0})
    doc.update(_pcts(ttfts, "ttft"))
    doc.update(_pcts(tpots, "tpot"))
    doc.update(_pcts(tpots, "itl"))
    doc.update(_pcts(lats, "e2el"))
    return doc


def main() -> None:
    for i, (name, n, conc, rate, isl, osl, where) in enumerate(RUNS):
        doc = make(name, n, conc, rate, isl, osl, where, seed=i)
        (HERE / name).write_text(json.dumps(doc, indent=1) + "\n")
        if where == "sidecar":
            (HERE / (name + ".yaml")).write_text(
                "# Sidecar for the JSON file of the same name: what `vllm bench serve --metadata` did not record.\n"
                "gpu: H100\ntp: 1\nkv_dtype: auto\n")
        print(f"wrote {name}")


if __name__ == "__main__":
    main()
