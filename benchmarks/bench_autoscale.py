"""Autoscaling over a day: the example day's plan, certified, beside the static peak plan and the ideal bound.

Run: ``python benchmarks/bench_autoscale.py [WORKLOAD.yaml]`` (default examples/chat-day.yaml; a few minutes on
2 cores: one search, the capacity bisection and the day-long replays: autoscaled, the static peak plan, and
the search's own replica count for the smooth peak when that differs). Writes
benchmarks/results/autoscale.md with the figures docs/autoscaling.md quotes and the time each phase took.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate  # noqa: E402

from recommender.autoscale import AutoscalePlan, _day_traffic, day_spec, plan_autoscaling, summary_lines  # noqa: E402
from recommender.autoscale.replay import Certification, replay  # noqa: E402
from recommender.autoscale.rule import load_autoscale_policy  # noqa: E402
from recommender.catalog import default_catalog  # noqa: E402
from recommender.load.topology import PoolSpec  # noqa: E402
from recommender.profiles import engine_profile  # noqa: E402
from recommender.replan.predict import pool_step_costs  # noqa: E402
from recommender.workload import Workload, load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _replay_static(w: Workload, ap: AutoscalePlan, replicas: int) -> Certification:
    """The day replayed on ``replicas`` static replicas of the plan's configuration (the search's own count)."""
    spec = day_spec(w)
    peak_w = dataclasses.replace(w, arrival_rate_per_s=spec.profile.peak_rate_per_s)
    (cost, limits, _), = pool_step_costs(ap.static_plan, peak_w, profile=engine_profile("vllm"),
                                         catalog=default_catalog())
    rule = dataclasses.replace(ap.rule, min_replicas=replicas, max_replicas=replicas)
    return replay(PoolSpec(cost=cost, limits=limits), rule, _day_traffic(spec, w, 0), spec.profile, w.slos,
                  static_replicas=replicas, shared_prefix_fraction=w.shared_prefix_fraction,
                  slo_window_s=load_autoscale_policy().slo_window_s)


def main(argv: list[str]) -> int:
    path = argv[0] if argv else str(ROOT / "examples" / "chat-day.yaml")
    t0 = time.perf_counter()
    w = load_workload(path)
    ap = plan_autoscaling(w, compare_static=True)
    total_s = time.perf_counter() - t0
    c, s = ap.certification, ap.static_certification
    assert s is not None
    n_search = ap.static_plan.top.pools[0].replicas
    smooth = _replay_static(w, ap, n_search) if n_search != ap.static_replicas else None
    rows = [["autoscaled", f"{ap.rule.min_replicas}..{ap.rule.max_replicas}", f"{c.windows_met}/{c.windows} "
             f"({c.attainment:.1%})", c.flaps, f"{c.gpu_hours:.1f} ({c.gpu_hours / c.static_gpu_hours:.2f}x)"],
            ["static peak plan", ap.static_replicas, f"{s.windows_met}/{s.windows} "
             f"({s.attainment:.1%})", s.flaps, f"{s.gpu_hours:.1f}"],
            ["ideal autoscaler", "-", "-", "-", f"{c.ideal_gpu_hours:.1f}"]]
    if smooth is not None:
        rows.insert(2, ["search's plan for the smooth peak", n_search, f"{smooth.windows_met}/{smooth.windows} "
                        f"({smooth.attainment:.1%})", smooth.flaps, f"{smooth.gpu_hours:.1f}"])
    table = tabulate(rows, headers=["", "replicas", "SLO windows met", "flaps", "GPU-hours"], tablefmt="github")
    text = (f"# Autoscaling benchmark: {Path(path).name}\n\n```\n" + "\n".join(summary_lines(ap)) + "\n```\n\n"
            + table + f"\n\nWorst window: {s.worst_window} (static), {c.worst_window} (autoscaled).\n"
            f"Whole run {total_s:.1f} s (search, bisection, two replays of {c.requests:,} requests); the day's replay "
            f"alone {c.replay_s:.1f} s autoscaled ({c.replay_cpu_s:.1f} s CPU), {s.replay_s:.1f} s static "
            f"({s.replay_cpu_s:.1f} s CPU); issue #25 asks <= 30 s. Load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores at the end.\n")
    out = ROOT / "benchmarks" / "results" / "autoscale.md"
    out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
