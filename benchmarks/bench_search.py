"""Time the main job on every example and measure search quality against exhaustive evaluation.

    python benchmarks/bench_search.py                    # all examples, default budget
    python benchmarks/bench_search.py --quick            # fewer examples
    python benchmarks/bench_search.py --out results.md   # where the Markdown table goes

For each example: wall time of ``recommend()`` with the default policy (verification included),
trials, configurations evaluated, evaluations per second; then, on a reduced space (<= 3 GPUs, the
policy's other choices), the hypervolume of the Optuna front as a fraction of the exhaustive front.
Writes the table to ``--out`` (default: ``$TMPDIR/recommender-benchmarks/search.md``, outside the tracked
tree; the published figures in ``benchmarks/results/search.md`` change only when you pass that path).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recommender.catalog import default_catalog  # noqa: E402
from recommender.errors import RecommenderError  # noqa: E402
from recommender.profiles import engine_profile  # noqa: E402
from recommender.search import SearchSettings, recommend  # noqa: E402
from recommender.search.exhaustive import exhaustive, search_quality  # noqa: E402
from recommender.search.policy import load_search_policy  # noqa: E402
from recommender.search.planner import build_context, seed_candidates, space_choices  # noqa: E402
from recommender.search.study import StudySettings, run_study  # noqa: E402
from recommender.workload import load_workload  # noqa: E402

REDUCED_GPUS = ("h100-sxm", "a100-80gb", "l40s")


def reduced_quality(path: str, seed: int) -> tuple[float, int, int, float]:
    w = load_workload(path)
    w = dataclasses.replace(w, gpus=REDUCED_GPUS)
    policy = load_search_policy()
    cat, prof = default_catalog(), engine_profile("vllm")
    ctx_truth = build_context(w, policy, prof, cat)
    ch = space_choices(ctx_truth)
    ch = dataclasses.replace(ch, disaggregation=False)
    t0 = time.perf_counter()
    truth = exhaustive(ctx_truth, ch)
    t_ex = time.perf_counter() - t0
    ctx = build_context(w, policy, prof, cat)
    _, found = run_study(ctx, ch, StudySettings(seed=seed), seed_candidates(ctx, ch))
    q = search_quality(list(ctx._cache.values()), truth)
    return q.hypervolume_ratio, len(ctx._cache), q.space_size, t_ex


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "recommender-benchmarks" / "search.md",
                    help="Markdown file to write (default outside the repository)")
    args = ap.parse_args()
    rows = []
    paths = sorted(glob.glob(str(ROOT / "examples" / "*.yaml")))
    if args.quick:
        paths = paths[:2]
    for path in paths:
        name = Path(path).stem
        w = load_workload(path)
        t0 = time.perf_counter()
        try:
            plan = recommend(w, settings=SearchSettings(seed=args.seed))
            status = f"${plan.rows[0].evaluation.usd_per_million_tokens:.3f}/M tok"
            meta = plan.meta
        except RecommenderError as e:
            status, meta = f"no plan: {str(e)[:40]}", {}
        wall = time.perf_counter() - t0
        hv, n_eval, space, t_ex = reduced_quality(path, args.seed)
        rows.append([name, f"{wall:.2f}", meta.get("trials", "-"), meta.get("evaluations", "-"),
                     meta.get("evaluations_per_s", "-"), status, f"{hv:.4f}", f"{n_eval}/{space}", f"{t_ex:.1f}"])
        print(rows[-1], flush=True)
    headers = ["example", "wall s", "trials", "configs evaluated", "evals/s", "rank 1",
               "HV vs exhaustive", "evaluated/space (reduced)", "exhaustive s"]
    table = tabulate(rows, headers=headers, tablefmt="github")
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Search benchmark\n\nMachine: the project's 2-core CI-class box. Command: `python benchmarks/bench_search.py`.\n"
        f"Reduced space for the hypervolume ratio: GPUs {', '.join(REDUCED_GPUS)}, aggregated only, all other "
        "choices from policies/search.yaml.\n\n" + table + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
