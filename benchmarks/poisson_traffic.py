"""Write a request log of Poisson traffic drawn from a workload file (the traffic a plan was made for).

    python3 benchmarks/poisson_traffic.py examples/rag.yaml same.jsonl --rate-scale 1 --seconds 900 --seed 0

Arrivals: a Poisson process at the workload's ``arrival_rate`` x ``--rate-scale`` (exponential gaps,
``random.Random(seed).expovariate``) over ``--seconds`` ending at ``--end`` (unix s; default 1.7e9, a fixed
past time, so ``recommend replan`` reads the file as a replay of its last window). Each request's prompt and
output lengths are drawn from the workload's distributions (``LengthDist.sample``). One JSON object a line:
``{"timestamp", "prompt_tokens", "output_tokens"}`` (a request-log format ``recommend replan --traffic``
reads). ``bursts``: extra Poisson streams ``(start_s, length_s, rate_per_s)`` on top (a real burst).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Sequence

from recommender.workload import Workload, load_workload

END_S = 1.7e9


def write_poisson_log(path: Path, workload: Workload, *, rate_per_s: float, seconds: float, seed: int,
                      end_s: float = END_S, bursts: Sequence[tuple[float, float, float]] = ()) -> int:
    """Write the log; returns the number of requests."""
    rng = random.Random(seed)
    times: list[float] = []
    for start, length, rate in ((0.0, seconds, rate_per_s), *bursts):
        t, stop = end_s - seconds + start, end_s - seconds + start + length
        while True:
            t += rng.expovariate(rate)
            if t >= stop:
                break
            times.append(t)
    times.sort()
    prompts = workload.prompt_tokens.sample(rng, len(times))
    outputs = workload.output_tokens.sample(rng, len(times))
    with path.open("w") as f:
        for t, p, o in zip(times, prompts, outputs):
            f.write(json.dumps({"timestamp": round(t, 4), "prompt_tokens": p, "output_tokens": o}) + "\n")
    return len(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("out")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="multiply the workload's arrival rate")
    ap.add_argument("--seconds", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--end", type=float, default=END_S)
    a = ap.parse_args()
    w = load_workload(a.workload)
    if w.arrival_rate_per_s is None:
        raise SystemExit(f"error: {a.workload} is an offline job (no arrival_rate); use a live workload")
    n = write_poisson_log(Path(a.out), w, rate_per_s=w.arrival_rate_per_s * a.rate_scale, seconds=a.seconds,
                          seed=a.seed, end_s=a.end)
    print(f"wrote {n} requests over {a.seconds:g} s to {a.out}")


if __name__ == "__main__":
    main()
