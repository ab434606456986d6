"""Exhaustive evaluation of a (reduced) space: the ground truth the Optuna search is measured against.

``search_quality`` reports the hypervolume of the Optuna front as a fraction of the exhaustive front's,
both over the feasible plans' objective vectors, with a common reference point (1.1 x the worst
feasible value of each objective over both sets).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

from recommender.search.evaluate import Evaluation, SearchContext, evaluate
from recommender.search.pareto import hypervolume, non_dominated
from recommender.search.space import Candidate
from recommender.search.space import SpaceChoices


def enumerate_space(ch: SpaceChoices, disaggregated: bool | None = None) -> Iterable[Candidate]:
    """Every candidate of the space (aggregated; plus P/D pairs when ``ch.disaggregation``)."""
    base = itertools.product(ch.gpus, ch.tps, ch.weight_dtypes, ch.kv_dtypes, ch.max_num_seqs, ch.budgets)
    for g, tp, wd, kd, s, b in base:
        if disaggregated is not True:
            for k in (0, *ch.mtp):  # MTP draft tokens (models with MTP heads)
                yield Candidate(g, tp, wd, kd, s, b, mtp=k)
                for dp, ep in ch.layouts:  # MoE layouts (invalid ones evaluate as infeasible)
                    yield Candidate(g, tp, wd, kd, s, b, dp=dp, ep=ep, mtp=k)
        if ch.disaggregation and disaggregated is not False:
            for dg, dtp in itertools.product(ch.gpus if ch.pd_heterogeneous else (g,), ch.tps):
                yield Candidate(g, tp, wd, kd, s, b, True, dg, dtp)


def exhaustive(ctx: SearchContext, ch: SpaceChoices) -> list[Evaluation]:
    return [evaluate(ctx, c) for c in enumerate_space(ch)]


def front(evaluations: Sequence[Evaluation]) -> list[tuple[float, ...]]:
    feas = [e.objectives for e in evaluations if e.feasible]
    return [feas[i] for i in non_dominated(feas)]


@dataclass(frozen=True)
class Quality:
    hypervolume_ratio: float
    optuna_front_size: int
    exhaustive_front_size: int
    space_size: int


def search_quality(found: Sequence[Evaluation], truth: Sequence[Evaluation]) -> Quality:
    fa, fb = front(found), front(truth)
    if not fb:
        return Quality(1.0 if not fa else 0.0, len(fa), 0, len(truth))
    allp = fa + fb
    ref = tuple(max(p[i] for p in allp) * 1.1 for i in range(len(allp[0])))
    hb = hypervolume(fb, ref)
    ha = hypervolume(fa, ref) if fa else 0.0
    return Quality(ha / hb if hb else 1.0, len(fa), len(fb), len(truth))
