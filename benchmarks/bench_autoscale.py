"""Autoscaling over a day: the example day's plan, certified, beside the static peak plan and the ideal bound.

Run: ``python benchmarks/bench_autoscale.py [WORKLOAD.yaml] [--sweep]`` (default examples/chat-day.yaml; about a
minute on 2 cores: one search, the capacity bisection and the day-long replays: autoscaled, the static peak plan,
and the search's own replica count for the smooth peak when that differs). Writes benchmarks/results/autoscale.md
with the figures docs/autoscaling.md quotes and the time each phase took.

``--sweep`` also writes benchmarks/results/autoscale-sweep.md: what other rules would cost on the same day, from
the controller alone (no engine simulation, so seconds): for metric windows, cooldowns and targets around the
derived one, the day's GPU-hours, flaps and how many SLO windows bring more than ``k x c1`` per serving replica
(``k`` = 1 and the simulator's measured share ``k_sim``: the lowest per-replica load, as a share of ``c1``, of a
window the static peak plan's replay failed; 1 when it failed none). Beside it the two bounds that need no controller:
``ceil(r_w / (k c1))`` replicas in every SLO window (perfect foresight, no start-up) and the same held for each
clock hour. With ``--sweep-static N`` the day is also replayed on ``N`` static replicas.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

from recommender.autoscale import AutoscalePlan, _day_traffic, day_spec, plan_autoscaling, summary_lines  # noqa: E402
from recommender.autoscale.coverage import coverage, window_capacities_per_s  # noqa: E402
from recommender.autoscale.profile import DayTraffic  # noqa: E402
from recommender.autoscale.replay import Certification, controller, replay  # noqa: E402
from recommender.autoscale.rule import ScalingRule, load_autoscale_policy, replica_capacity_per_s  # noqa: E402
from recommender.catalog import default_catalog  # noqa: E402
from recommender.load.topology import PoolSpec  # noqa: E402
from recommender.profiles import engine_profile  # noqa: E402
from recommender.replan.predict import pool_step_costs  # noqa: E402
from recommender.search.policy import load_search_policy  # noqa: E402
from recommender.workload import Workload, load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _serving_per_window(rule: ScalingRule, day: DayTraffic, period_s: float,
                        window_s: float) -> tuple[np.ndarray, np.ndarray, float, int, int]:
    """The controller alone on the day: each SLO window's arrival rate, the replicas serving all through it
    (ready at its start, not removed before its end), the GPU-hours asked for, flaps and scale events."""
    reps, flaps, events = controller(rule, np.asarray(day.arrival_s, dtype=float), period_s)
    edges = np.arange(0.0, period_s, window_s)
    rate = np.diff(np.searchsorted(day.arrival_s, np.append(edges, period_s))) / window_s
    n = np.array([sum(1 for r in reps if r.ready_s <= e and r.removed_s >= e + window_s) for e in edges])
    paid = sum(max(0.0, min(period_s, r.removed_s) - max(0.0, r.asked_s)) for r in reps)
    return rate, n, paid * rule.gpus_per_replica / 3600.0, flaps, events


def _sweep(ap: AutoscalePlan, day: DayTraffic, static: Certification, k_sim: float, caps: np.ndarray) -> str:
    """The markdown of ``--sweep`` (see the module docstring)."""
    rule, prof = ap.rule, ap.profile
    c1, tp, window = rule.replica_capacity_per_s, rule.gpus_per_replica, load_autoscale_policy().slo_window_s
    rate, _, _, _, _ = _serving_per_window(rule, day, prof.period_s, window)
    lines = ["# Autoscaling sweep: other rules on the same day (controller only)\n",
             f"c1 {c1:.3f} req/s per replica; static peak plan {static.static_gpu_hours:.1f} GPU-h "
             f"(0.8x = {0.8 * static.static_gpu_hours:.1f}); k_sim = {k_sim:.3f}: the lowest per-replica load, as a "
             f"share of c1, of a window the static plan's replay failed ({len(static.failed_windows_s)} failed).\n",
             "Bounds without a controller (GPU-hours):\n"]
    for k, cap in ((1.0, c1), (k_sim, k_sim * c1), ("c_w", caps)):
        need = np.ceil(rate / np.where(np.isfinite(cap), cap, c1) - 1e-9)
        hour = (np.arange(need.size) * window // 3600).astype(int)
        hours = [float(np.max(need[hour == h], initial=0.0)) for h in np.unique(hour)]
        lines.append(f"- at {k if isinstance(k, str) else f'{k:.3f} x c1'}: every window its own replicas {need.sum() * tp * window / 3600:.1f}, "
                     f"each clock hour its busiest window's {sum(hours) * tp:.1f}")
    rows = []
    for mw in sorted({rule.metric_window_s, window}):
        for cool in sorted({rule.cooldown_s, 3600.0}, reverse=True):
            stab = min(cool, rule.scale_down_stabilisation_s if cool == rule.cooldown_s else cool)
            for target in sorted({rule.target_per_replica_per_s, *(c1 * np.arange(0.85, 1.051, 0.025))}):
                r = dataclasses.replace(rule, metric_window_s=mw, scale_down_stabilisation_s=stab,
                                        metric_hold_s=cool - stab, target_per_replica_per_s=float(target),
                                        min_replicas=max(1, math.ceil(prof.trough_rate_per_s / target - 1e-9)),
                                        max_replicas=rule.max_replicas + 2)
                rate, n, gpu_h, flaps, events = _serving_per_window(r, day, prof.period_s, window)
                load = rate / (np.maximum(n, 1) * c1)
                cov = coverage(r, day, caps, period_s=prof.period_s, window_s=window).covered
                rows.append([f"{mw:g}", f"{cool:g}", f"{target:.3f} ({target / c1:.3f} c1)", f"{int(n.min())}..{int(n.max())}",
                             f"{gpu_h:.1f} ({gpu_h / static.static_gpu_hours:.2f}x)", flaps, events,
                             int(np.sum(load >= k_sim - 1e-9)), int(np.sum(load > 1.0)), f"{cov:.1%}"])
    lines.append("\n" + tabulate(rows, headers=["metric window s", "cooldown s", "target req/s", "replicas",
                                                "GPU-hours", "flaps", "events", f"windows >= {k_sim:.3f} c1",
                                                "windows > c1", "covered at c_w"], tablefmt="github"))
    return "\n".join(lines) + "\n"


def _static_margin(ap: AutoscalePlan, day: DayTraffic, static: Certification) -> float:
    """``k_sim``: the lowest ``r_w / (N c1)`` over the windows the static plan's replay failed (1 when none)."""
    window = load_autoscale_policy().slo_window_s
    a = np.asarray(day.arrival_s, dtype=float)
    came = [int(np.searchsorted(a, e + window) - np.searchsorted(a, e)) for e in static.failed_windows_s]
    loads = [n / window / (ap.static_replicas * ap.rule.replica_capacity_per_s) for n in came]
    return min(loads) if loads else 1.0


def _configurations(ap: AutoscalePlan, peak_w: Workload) -> str:
    """``c1`` per GPU of every ranked row of the search's plan: which configuration serves the day cheapest."""
    rows = []
    for row in sorted(ap.static_plan.rows, key=lambda r: r.rank):
        if row.disaggregated:
            continue
        one = dataclasses.replace(ap.static_plan, rows=(dataclasses.replace(row, rank=1),))
        c = replica_capacity_per_s(one, peak_w, profile=engine_profile("vllm"), search=load_search_policy())
        gpus = row.pools[0].gpus_per_replica
        rows.append([row.rank, row.id, gpus, f"{c:.3f}", f"{c / gpus:.3f}",
                     math.ceil(ap.peak_window_rate_per_s / c - 1e-9) * gpus])
    return ("\nThe search's ranked configurations (c1 per replica and per GPU; GPUs to serve the busiest window "
            "statically):\n\n" + tabulate(rows, headers=["rank", "configuration", "GPUs/replica", "c1 req/s",
                                                        "c1 per GPU", "GPUs at the busiest window"],
                                          tablefmt="github") + "\n")


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
    ap_ = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap_.add_argument("workload", nargs="?", default=str(ROOT / "examples" / "chat-day.yaml"))
    ap_.add_argument("--sweep", action="store_true", help="also write benchmarks/results/autoscale-sweep.md")
    ap_.add_argument("--sweep-static", type=int, default=0, metavar="N",
                     help="with --sweep: also replay the day on N static replicas")
    args = ap_.parse_args(argv)
    path = args.workload
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
    if args.sweep:
        day = _day_traffic(day_spec(w), w, 0)
        k_sim = _static_margin(ap, day, s)
        peak_w = dataclasses.replace(w, arrival_rate_per_s=ap.profile.peak_rate_per_s)
        caps = window_capacities_per_s(ap.static_plan, peak_w, day, profile=engine_profile("vllm"),
                                       search=load_search_policy(), window_s=load_autoscale_policy().slo_window_s,
                                       period_s=ap.profile.period_s)
        sweep = _sweep(ap, day, s, k_sim, caps) + _configurations(ap, peak_w)
        if args.sweep_static:
            more = _replay_static(w, ap, args.sweep_static)
            sweep += (f"\nThe day on {args.sweep_static} static replicas: {more.windows_met}/{more.windows} windows "
                      f"({more.attainment:.1%}), {more.gpu_hours:.1f} GPU-h.\n")
        (ROOT / "benchmarks" / "results" / "autoscale-sweep.md").write_text(sweep, encoding="utf-8")
        print(sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
