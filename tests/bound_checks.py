"""Random evaluations of a search space against their bounds (``recommender.search.bounds``), for tests.

``random_bound_checks(ctx, draws, seed)`` builds the bounds of ``ctx``'s default space, draws ``draws`` combos
uniformly (a shape the bounds admit, then one of its engine limits), evaluates each and asserts that no feasible
evaluation lies below its bounds: cost (``usd_per_hour`` x the factor to $/M tokens) and, with ``latencies``, every
SLO latency. Returns how many feasible evaluations were checked. ``context_of(tmp_path, job)``: the search context of
a workload YAML file, or text (written under ``tmp_path``), under the default policy, vLLM's profile and the shipped catalog.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from recommender.catalog import default_catalog
from recommender.profiles import engine_profile
from recommender.search.bounds import Bounds
from recommender.search.evaluate import evaluate
from recommender.search.planner import build_context, space_choices
from recommender.search.policy import load_search_policy
from recommender.search.shapes import _combos, shapes, usd_per_hour_to_objective
from recommender.workload import load_workload


def context_of(tmp_path: Path, job: str | Path) -> Any:
    if isinstance(job, Path):
        path = job
    else:
        path = tmp_path / "job.yaml"
        path.write_text(job)
    return build_context(load_workload(path), load_search_policy(), engine_profile("vllm"), default_catalog())


def random_bound_checks(ctx: Any, draws: int, seed: int, latencies: bool = True) -> int:
    ch = space_choices(ctx)
    bounds, k = Bounds(ctx, ch.max_num_seqs, ch.budgets), usd_per_hour_to_objective(ctx)
    candidates = [s for s in shapes(ctx, ch) if bounds.of(s) is not None]
    rng = random.Random(seed)
    checked = 0
    for _ in range(draws):
        c = rng.choice(_combos(ch, rng.choice(candidates)))
        b = bounds.of(c)
        ev = evaluate(ctx, c)
        if b is None or not ev.feasible:
            continue
        assert b.usd_per_hour * k <= ev.objectives[0] * (1 + 1e-9), c.key
        if latencies:
            assert all(lb <= lat * (1 + 1e-9) for lb, lat in zip(b.latencies_s, ev.objectives[1:])), c.key
        checked += 1
    return checked
