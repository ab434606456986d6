"""Search benchmark: speed and convergence of the default main job on every example, against a reference.

    python benchmarks/bench_search.py                        # all examples, seeds 0-9
    python benchmarks/bench_search.py --seeds 0 1 --out /tmp/search.md
    python benchmarks/bench_search.py --workers              # also: 2 workers vs 1 on a larger budget

Per example and seed: the default ``recommend()`` (policy defaults, verification included): wall and
CPU seconds, trials run / asked, rank-1 cost. Reference, once per example: the same search with
``--reference-factor`` (default 50) times the trials the default run made and no timeout; its rank 1 is
proven cheapest when its branch and bound shows that no unexplored configuration can be cheaper.
Reported: how many seeds give a rank 1 within 1% of the reference's, the worst ratio, and the
hypervolume of the default front as a fraction of the reference front's (same reference point).
Also the CLI start-up (``python -X importtime``-free: wall of ``recommend --help``) and the import
time of the main job's modules. Writes a Markdown report to ``--out`` (default outside the tree).
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def import_seconds() -> float:
    """Wall seconds of a fresh interpreter importing what the main job needs."""
    code = ("import time; t=time.perf_counter(); import recommender.cli, recommender.search.planner, "
            "recommender.render.plan; print(time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return float(out.stdout.strip())


def cli_seconds(example: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sys; from recommender.cli import main; sys.argv[0] = 'recommend'; main()",
                    "--workload", example], capture_output=True, cwd=ROOT,
                   check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t


EXTRA = [  # (workload, policy or None): the aiconfigurator problem and a larger space
    ("benchmarks/workloads/aic-70b-h200.yaml", "benchmarks/policies/bf16-only.yaml"),
    ("benchmarks/workloads/large-405b.yaml", None),
    ("benchmarks/workloads/large-dsv3.yaml", None),
    ("benchmarks/workloads/tight-tpot-70b.yaml", None),  # issue #31: 2,000 of 2,000 trials, 49 s, not proven before
]


def extra_rows() -> list[list[str]]:
    """End-to-end CLI runs (verification off: the search alone) of the EXTRA problems."""
    import json

    out = []
    for wl, pol in EXTRA:
        cmd = [sys.executable, "-c", "import sys; from recommender.cli import main; sys.argv[0] = 'recommend'; main()",
               "--workload", wl, "--verify", "0", "--format", "json", "--quiet"]
        if pol:
            cmd += ["--policy", pol]
        t = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - t
        try:
            doc = json.loads(res.stdout)
            m, top = doc["search"], doc["plans"][0]
            out.append([Path(wl).stem, f"{wall:.2f}", f"{m['trials_run']}/{m['trials_asked']} {m['stopped_by'] or 'stopped'}",
                        "yes" if m["rank1_proven"] else "no", f"{top['id']} ${top['usd_per_million_tokens']:.4f}/M"])
        except (ValueError, KeyError, IndexError):
            out.append([Path(wl).stem, f"{wall:.2f}", "-", "-", (res.stderr.strip().splitlines() or ["?"])[-1][:80]])
        print(out[-1], flush=True)
    return out


def main() -> None:
    from tabulate import tabulate

    from recommender.errors import RecommenderError
    from recommender.search import SearchSettings, recommend
    from recommender.search.exhaustive import search_quality
    from recommender.search.policy import load_search_policy
    from recommender.workload import load_workload

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--examples", nargs="*", default=None, help="example names (default: all)")
    ap.add_argument("--reference-factor", type=int, default=50, help="reference trials = factor x the default run's")
    ap.add_argument("--reference-cap", type=int, default=20000, help="at most this many reference trials")
    ap.add_argument("--cli", action="store_true", help="also time the CLI end to end (subprocess) per example")
    ap.add_argument("--extra", action="store_true", help="also the aiconfigurator problem and the 405B / DeepSeek-V3 space")
    ap.add_argument("--skip-examples", action="store_true")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "recommender-benchmarks" / "search.md"),
                    help="Markdown report (default outside the tracked tree)")
    args = ap.parse_args()
    policy = load_search_policy()
    paths = sorted(glob.glob(str(ROOT / "examples" / "*.yaml")))
    if args.examples:
        paths = [p for p in paths if Path(p).stem in args.examples]
    if args.skip_examples:
        paths = []
    rows = []
    for path in paths:
        name = Path(path).stem
        w = load_workload(path)
        walls, cpus, costs, runs, trials, plans = [], [], [], [], [], []
        try:
            for seed in args.seeds:
                t, c = time.perf_counter(), _cpu()
                plan = recommend(w, settings=SearchSettings(seed=seed), policy=policy)
                walls.append(time.perf_counter() - t)
                cpus.append(_cpu() - c)
                costs.append(plan.top.usd_per_million_tokens)
                m = plan.search
                runs.append(m.trials_run or 0)
                trials.append(f"{m.trials_run}/{m.trials_asked}{' (timeout)' if m.stopped_by == 'timeout' else ''}")
                plans.append(plan)
                print(name, seed, f"{walls[-1]:.2f}s", trials[-1], f"{costs[-1]:.4f}", flush=True)
        except RecommenderError as e:
            rows.append([name, "-", "-", "-", "-", f"no plan: {str(e)[:50]}", "-", "-", "-"])
            continue
        ref_trials = min(args.reference_factor * max(runs), args.reference_cap)
        t = time.perf_counter()
        ref = recommend(w, settings=SearchSettings(seed=0, trials=ref_trials, timeout_s=1e9, verify=0), policy=policy)
        t_ref = time.perf_counter() - t
        ref_cost = ref.top.usd_per_million_tokens
        ratios = [c / ref_cost for c in costs]
        within, worst = sum(r <= 1.01 for r in ratios), max(ratios)
        hvs = [search_quality(list(p.evaluations), list(ref.evaluations)).hypervolume_ratio for p in plans]
        print(name, "reference", f"{ref_cost:.4f}", ref.search.trials_run, f"{t_ref:.0f}s", "hv", hvs, flush=True)
        cli = f"{cli_seconds(path):.2f}" if args.cli else "-"
        rows.append([name, f"{max(walls):.2f}", f"{max(cpus):.2f}", cli, max(set(trials), key=trials.count),
                     f"${ref_cost:.4f}/M ({'proven' if ref.search.rank1_proven else 'not proven'}, "
                     f"{ref.search.trials_run} trials, {t_ref:.0f} s)",
                     f"{within}/{len(args.seeds)}", f"{worst:.4f}", f"{min(hvs):.4f}"])
    headers = ["example", "wall s (max)", "CPU s (max)", "CLI s", "trials run/asked", "reference rank 1",
               "seeds within 1%", "worst cost ratio", "HV ratio (min)"]
    table = tabulate(rows, headers=headers, tablefmt="github")
    imp = import_seconds()
    text = ("# Search benchmark\n\n"
            f"Command: `python benchmarks/bench_search.py {' '.join(sys.argv[1:])}`; seeds {args.seeds}; machine: "
            f"{os.cpu_count()} CPUs (`nproc`), shared. Default run = policies/search.yaml (trials {policy.trials}, "
            f"front_trials {policy.front_trials}, timeout {policy.timeout_s} s, verification on). Reference = the same "
            f"search with {args.reference_factor}x the default run's trials (at most {args.reference_cap}) and no timeout. Import of the main job's modules: {imp:.2f} s.\n\n" + table + "\n")
    if args.extra:
        text += "\nEnd to end (CLI subprocess, `--verify 0`):\n\n" + tabulate(
            extra_rows(), headers=["problem", "wall s", "trials", "rank 1 proven", "rank 1"], tablefmt="github") + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
