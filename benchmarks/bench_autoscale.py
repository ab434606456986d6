"""Autoscaling over a day: the example day's plan, certified, beside the static peak plan and the ideal bound.

Run: ``python benchmarks/bench_autoscale.py [WORKLOAD.yaml]`` (default examples/chat-day.yaml; a few minutes on
2 cores: one search, the capacity bisection and two day-long replays, autoscaled and static). Writes
benchmarks/results/autoscale.md with the figures docs/autoscaling.md quotes and the time each phase took.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate  # noqa: E402

from recommender.autoscale import plan_autoscaling, summary_lines  # noqa: E402
from recommender.workload import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    path = argv[0] if argv else str(ROOT / "examples" / "chat-day.yaml")
    t0 = time.perf_counter()
    w = load_workload(path)
    ap = plan_autoscaling(w, compare_static=True)
    total_s = time.perf_counter() - t0
    c, s = ap.certification, ap.static_certification
    assert s is not None
    rows = [["autoscaled", f"{ap.rule.min_replicas}..{ap.rule.max_replicas}", f"{c.windows_met}/{c.windows} "
             f"({c.attainment:.1%})", c.flaps, f"{c.gpu_hours:.1f} ({c.gpu_hours / c.static_gpu_hours:.2f}x)"],
            ["static peak plan", ap.static_replicas, f"{s.windows_met}/{s.windows} "
             f"({s.attainment:.1%})", s.flaps, f"{s.gpu_hours:.1f}"],
            ["ideal autoscaler", "-", "-", "-", f"{c.ideal_gpu_hours:.1f}"]]
    table = tabulate(rows, headers=["", "replicas", "SLO windows met", "flaps", "GPU-hours"], tablefmt="github")
    text = (f"# Autoscaling benchmark: {Path(path).name}\n\n```\n" + "\n".join(summary_lines(ap)) + "\n```\n\n"
            + table + f"\n\nWorst window: {s.worst_window} (static), {c.worst_window} (autoscaled).\n"
            f"Whole run {total_s:.1f} s (search, bisection, two replays of {c.requests:,} requests).\n")
    out = ROOT / "benchmarks" / "results" / "autoscale.md"
    out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
