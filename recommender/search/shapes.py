"""Shape search: branch and bound over engine shapes, the default search of ``recommend``.

An engine *shape* is the discrete part of a candidate that decides its step costs: (GPU, TP, weight
dtype, KV dtype), or for P/D a (prefill GPU, TP; decode GPU, TP; dtypes) pair. Inside a shape the
*combos* are the engine limits (``max_num_seqs`` x chunk budget); replicas are sized by
``recommender.sizing`` for each combo evaluated.

Every shape and every combo has lower bounds on cost and on each latency objective
(``recommender.search.bounds``). Entries are taken from priority queues in turn: aggregated by cost
bound, P/D by cost bound, and one queue per direction of the Pareto front (weights over the objectives,
Chebyshev distance from the ideal point in log space), so the cheapest plans of both kinds and every
part of the front are found early; once rank 1 is proven the directions get most turns. A
shape is expanded into its combos, a combo is evaluated, unless a plan already found is at least as
cheap as its cost bound and at least as fast as each of its latency bounds (then no plan in it can
enter the front). Rank 1 is proven once no entry left has a cost bound below it; for a P/D entry, below it or below
``(1 - pd_min_saving)`` x the best aggregated cost (a P/D plan is listed only that much cheaper than the best
aggregated one). When both queues are empty the front and rank 1 are exact (for the space, given
the bounds); a budget of evaluations or seconds may stop it earlier, and :class:`ShapeSearchResult`
says so.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from recommender.perf import memory as mem
from recommender.search.bounds import Bound, Bounds
from recommender.search.evaluate import SearchContext, evaluate
from recommender.search.space import SpaceChoices, parallelism_valid, pd_pair_valid, weight_dtype_valid
from recommender.sizing import Candidate, Evaluation


@dataclass(frozen=True)
class ShapeSearchResult:
    evaluations: tuple[Evaluation, ...]  # fresh evaluations, in the order made
    complete: bool                       # both queues emptied: front and rank 1 exact for the space
    rank1_proven: bool                   # no unexplored entry can be cheaper than rank 1
    rank1_proven_after: int              # evaluations made when that became true (0: never)
    stopped_by: str                      # "" | "trials" | "timeout"
    shapes: int                          # shapes that can fit (aggregated + P/D pairs)
    pruned: int                          # shapes and combos skipped by their bounds
    seconds: float


@dataclass(frozen=True)
class _Entry:
    candidate: Candidate
    bound: Bound
    is_shape: bool
    refined: bool = True  # False: ``Bounds.of(refine=False)``, refined when it reaches the front of a queue


def _directions(n_objectives: int, divisions: int = 3) -> list[tuple[float, ...]]:
    """Weight vectors of the simplex lattice with ``divisions`` steps over ``n_objectives`` objectives, except
    pure cost (the cost queues go there): 9 for cost and two latencies, 19 for three."""
    out: list[tuple[float, ...]] = []
    for combo in itertools.product(range(divisions + 1), repeat=n_objectives):
        if sum(combo) == divisions and combo[0] != divisions:
            out.append(tuple(c / divisions for c in combo))
    return out


#: relative tolerance of the rank-1 proof: no entry left can be cheaper than rank 1 by more than float rounding
#: (DeepSeek-V3 on B300: ~1,000 MTP / layout combos whose bound is one TP4 rental, the rank-1 cost to 1e-16, kept
#: the proof waiting for 3,280 evaluations instead of 937)
PROOF_RTOL = 1e-9

#: extra log-distance per combo of the same shape already ahead in a direction (see ``_Queues.push_combos``)
DIVERSITY = 0.1


class _Queues:
    """Heaps over the entries: aggregated by cost bound, P/D by cost bound, and one per direction of the
    front; an entry is taken once. ``pop`` cycles aggregated-cost, P/D-cost, aggregated-cost, direction
    (the next direction each time), so the cheapest plans of both kinds and every part of the front, from
    cheap to fast, are found early. A direction ``w`` ranks entries by the augmented Chebyshev distance of
    their bounds from the ideal point in log space, ``max_i w_i d_i + 0.01 sum_i d_i``, ``d_i = ln(b_i /
    ideal_i)`` (the ideal: the smallest bound of each objective over the shapes)."""

    _CYCLE = ("agg", "pd", "agg", "dir")
    #: once rank 1 is proven the cost heaps only refine the cheap end of the front: the directions get more turns
    _CYCLE_PROVEN = ("agg", "dir", "pd", "dir", "dir", "dir")

    def __init__(self, usd_to_objective: float, ideal: Sequence[float]) -> None:
        self.k = usd_to_objective
        self._ideal = [math.log(max(v, 1e-300)) for v in ideal]
        self._dirs = _directions(len(ideal)) if len(ideal) > 1 else []
        self._heaps: dict[str, list[tuple[Any, ...]]] = {"agg": [], "pd": []}
        for j in range(len(self._dirs)):
            self._heaps[f"dir{j}"] = []
        self._taken: set[int] = set()
        self._n = itertools.count()
        self._turn = 0
        self._dir_turn = 0
        self.proven = False

    def push(self, e: _Entry) -> None:
        self.push_combos([e])

    def push_combos(self, entries: Sequence[_Entry]) -> None:
        """Push entries (a shape, or the combos of one shape). In each direction the ``r``-th best of them
        waits ``DIVERSITY x r`` longer: the combos of one shape mostly share its bounds, and a direction
        that took them all in a row would explore one shape per few dozen evaluations."""
        keyed = []
        for e in entries:
            i = next(self._n)
            obj = self.objectives(e.bound)
            heapq.heappush(self._heaps["pd" if e.candidate.disaggregated else "agg"], (obj, i, e))
            d = [math.log(max(v, 1e-300)) - z for v, z in zip(obj, self._ideal)]
            keyed.append((i, e, d, 0.01 * sum(d)))
        for j, w in enumerate(self._dirs):
            ranked = sorted((max(wi * di for wi, di in zip(w, d)) + tail, i, e) for i, e, d, tail in keyed)
            for r, (key, i, e) in enumerate(ranked):
                heapq.heappush(self._heaps[f"dir{j}"], (key + DIVERSITY * r, i, e))

    def objectives(self, b: Bound) -> tuple[float, ...]:
        return (b.usd_per_hour * self.k, *b.latencies_s)

    def cheapest_bound(self, kind: str | None = None) -> float:
        """Smallest cost bound (first objective) of the entries not yet taken (of ``kind``, "agg" or "pd");
        inf when none."""
        out = math.inf
        for name in ("agg", "pd") if kind is None else (kind,):
            heap = self._heaps[name]
            while heap and heap[0][1] in self._taken:
                heapq.heappop(heap)
            if heap:
                out = min(out, heap[0][0][0])
        return out

    def beats_none(self, best: float, best_agg: float, pd_min_saving: float) -> bool:
        """No entry left can be rank 1: aggregated bounds at least ``best``; P/D bounds at least ``best`` or
        at least ``(1 - pd_min_saving) x best_agg`` (a P/D plan is listed only that much cheaper than the
        best aggregated one, ``recommender.search.recommend_rows``). Within ``PROOF_RTOL``: a bound that equals a
        plan's cost computes a few ulps apart from it (USD/h x factor against the plan's own $/M)."""
        floor = best * (1.0 - PROOF_RTOL)
        return (self.cheapest_bound("agg") >= floor
                and self.cheapest_bound("pd") >= min(floor, (1.0 - pd_min_saving) * best_agg))

    def pop_cheaper_than(self, cost: float) -> _Entry | None:
        """The entry of least cost bound (aggregated or P/D) if that bound is below ``cost``, else None."""
        best: list[tuple[Any, ...]] | None = None
        for name in ("agg", "pd"):
            heap = self._heaps[name]
            while heap and heap[0][1] in self._taken:
                heapq.heappop(heap)
            if heap and heap[0][0][0] < cost and (best is None or heap[0][0][0] < best[0][0][0]):
                best = heap
        return None if best is None else self._take(best)

    def _next_heap(self) -> list[tuple[Any, ...]]:
        cycle = self._CYCLE_PROVEN if self.proven else self._CYCLE
        name = cycle[self._turn % len(cycle)]
        self._turn += 1
        if name == "dir":
            if not self._dirs:
                return []
            name = f"dir{self._dir_turn % len(self._dirs)}"
            self._dir_turn += 1
        return self._heaps[name]

    def _take(self, heap: list[tuple[Any, ...]]) -> _Entry | None:
        """The best entry of ``heap`` not yet taken (None when it holds none)."""
        while heap:
            item = heapq.heappop(heap)
            i, e = int(item[-2]), item[-1]
            assert isinstance(e, _Entry)
            if i not in self._taken:
                self._taken.add(i)
                return e
        return None

    def pop(self) -> _Entry | None:
        for _ in range(len(self._CYCLE_PROVEN) + len(self._dirs)):
            e = self._take(self._next_heap())
            if e is not None:
                return e
        for heap in self._heaps.values():  # every heap of a whole cycle came up empty: drain what is left
            e = self._take(heap)
            if e is not None:
                return e
        return None


def price_settle_cost(ctx: SearchContext) -> tuple[float, str]:
    """The $/M rank 1 (the cheapest feasible evaluation) reaches at its price thresholds, each capped at
    ``sensitivity.PRICE_SETTLE_FACTOR`` x today's price: ``max over its GPUs g of a_g + b_g min(f*_g, F)``, with ``a_g, b_g``
    the parts of its $/M that do not / do scale with g's price and ``f*_g`` the factor at which an evaluated
    plan overtakes it (``recommender.search.sensitivity``). A plan costing at least this today cannot overtake
    rank 1 before any reported threshold: its cost never falls as a price rises. Also the GPU rank 1 runs on
    alone ("" when it runs on two): a plan on that GPU alone never overtakes it, both costs scale by ``f``."""
    from recommender.search.sensitivity import PRICE_SETTLE_FACTOR, gpu_share, price_thresholds

    feas = [e for e in ctx.evaluator if e.feasible]
    if not feas:
        return -math.inf, ""
    first = min(feas, key=lambda e: e.objectives[0])
    out = first.objectives[0]
    gpus = {p.gpu for p in first.pools}
    for t in price_thresholds(ctx, first):
        a, b = gpu_share(first, t.gpu)
        f = PRICE_SETTLE_FACTOR
        if t.overtaken_at_usd_per_gpu_hour is not None and t.usd_per_gpu_hour > 0:
            f = min(f, t.overtaken_at_usd_per_gpu_hour / t.usd_per_gpu_hour)  # at_least: the factor itself
        out = max(out, a + b * f)
    return out, next(iter(gpus)) if len(gpus) == 1 else ""


def _open(e: _Entry, q: _Queues, ch: SpaceChoices, bounds: Bounds) -> bool | None:
    """One step on a popped entry: a cheap bound is refined and queued again (a bound only rises), a shape is
    expanded into its combos (queued): False; a refined combo is ready to evaluate: True; None when refining
    finds no plan in it."""
    if not e.refined:
        b = bounds.of(e.candidate)
        if b is None:
            return None
        q.push(_Entry(e.candidate, b, e.is_shape, True))
        return False
    if e.is_shape:
        q.push_combos([_Entry(c, b, False, False) for c in _combos(ch, e.candidate)
                       if (b := bounds.of(c, refine=False)) is not None])
        return False
    return True


def _settle_prices(ctx: SearchContext, q: _Queues, ch: SpaceChoices, bounds: Bounds, limits: Sequence[float],
                   run: Callable[[Candidate, tuple[int, ...]], None], *, left: int | None,
                   deadline_s: float | None) -> None:
    """After rank 1 is proven: evaluate, cheapest cost bound first, the entries whose cost bound is below
    ``price_settle_cost`` (re-read every 10 evaluations; it only falls), so that the price at which another
    plan overtakes rank 1 (``sensitivity.price_thresholds``, over evaluated plans) is not overstated by a
    cheaper-at-that-price plan the proof left unevaluated. Entries that cannot meet an SLO, or run on rank 1's
    one GPU alone, are skipped; the
    budget's evaluations and seconds still bound it."""
    (cost, alone), n = price_settle_cost(ctx), 0
    while (left is None or n < left) and (deadline_s is None or time.perf_counter() < deadline_s):
        e = q.pop_cheaper_than(cost)
        if e is None:
            return
        c = e.candidate
        if alone and c.gpu == alone and (not c.disaggregated or c.decode_gpu == alone):
            continue  # on rank 1's one GPU alone: its cost scales with rank 1's
        if any(lb > lim for lb, lim in zip(e.bound.latencies_s, limits)):
            continue
        if _open(e, q, ch, bounds):
            run(e.candidate, e.bound.replicas)
            n += 1
            if n % 10 == 0:
                cost, alone = price_settle_cost(ctx)


def _dominated(front: list[tuple[float, ...]], lb: tuple[float, ...]) -> bool:
    return any(all(f[i] <= lb[i] for i in range(len(lb))) for f in front)


def _update_front(front: list[tuple[float, ...]], p: tuple[float, ...]) -> list[tuple[float, ...]]:
    if _dominated(front, p):
        return front
    return [f for f in front if not all(p[i] <= f[i] for i in range(len(p)))] + [p]


def usd_per_hour_to_objective(ctx: SearchContext) -> float:
    """Factor from usd_per_hour to the first objective, usd_per_million_tokens (see ``recommender.sizing``)."""
    w = ctx.workload
    tokens_per_h = w.effective_rate_per_s * (w.prompt_tokens.mean + w.output_tokens.mean) * 3600
    return 1e6 / tokens_per_h if tokens_per_h > 0 else math.inf


def _unrentable_to_explain(unrentable: Sequence[Candidate], n: int = 8) -> list[Candidate]:
    """At most ``n`` shapes no offer can rent, evaluated so the error can say why: one of each group size, its
    narrowest weights (largest size first; the error names the smallest group that holds the model), then the
    largest of the rest."""
    from recommender.perf.memory import bytes_per_weight

    ranked = sorted(unrentable, key=lambda c: (-c.replica_gpus, bytes_per_weight(c.weight_dtype), c.disaggregated))
    firsts = list({c.replica_gpus: c for c in reversed(ranked)}.values())[::-1]
    return (firsts + [c for c in ranked if c not in firsts])[:n]


def _run_closest(ctx: SearchContext, ch: SpaceChoices, e: _Entry, run: Callable[[Candidate], None]) -> None:
    """Evaluate one SLO-pruned entry so the error can name its latencies: a shape's middle limits, and where those
    run no load (more sequences than its KV cache holds at a long context), its fewest sequences as well."""
    if not e.is_shape:
        run(e.candidate)
        return
    combos = _combos(ch, e.candidate)
    mid = combos[len(combos) // 2]
    run(mid)
    if not evaluate(ctx, mid).latencies:
        run(dataclasses.replace(mid, max_num_seqs=min(ch.max_num_seqs)))


def _combos(ch: SpaceChoices, shape: Candidate) -> list[Candidate]:
    return [Candidate(shape.gpu, shape.tp, shape.weight_dtype, shape.kv_dtype, s, b, shape.disaggregated,
                      shape.decode_gpu, shape.decode_tp, pp=shape.pp, dp=shape.dp, ep=shape.ep, mtp=shape.mtp)
            for s in ch.max_num_seqs for b in ch.budgets]


#: Pipeline-parallel stage counts tried for a model no single instance holds (``pipeline_shapes``).
PIPELINE_STAGES = (2, 4)


def pipeline_shapes(ctx: SearchContext, ch: SpaceChoices) -> list[Candidate]:
    """Aggregated shapes whose replica spans instances (``pp`` stages of the largest TP group an offer with a
    NIC holds), for each GPU and dtype pair where the weights alone exceed that TP group's memory: models
    that do not fit one instance. The sizer prices the stage hops (``recommender.sizing.pipeline_cost_model``, physics in ``recommender.perf.pipeline``)."""
    out: list[Candidate] = []
    frac = ctx.rules.gpu_memory_utilization
    for g in ch.gpus:
        gpu = ctx.gpus[g]
        tps = [tp for tp in ch.tps if not parallelism_valid(ctx.model, gpu, tp) and ctx.multinode_offers(g, tp)]
        if not tps:
            continue
        tp = max(tps)
        for wd, kd in itertools.product(ch.weight_dtypes, ch.kv_dtypes):
            if weight_dtype_valid(ctx.model, gpu, wd, kd) or ctx.layout_why(g, tp, 1, False, wd):
                continue
            if mem.weights_bytes_per_gpu(ctx.model, wd, tp) <= gpu.memory_bytes * frac:
                continue  # one instance holds it: no pipeline needed
            out += [Candidate(g, tp, wd, kd, 0, 0, pp=pp) for pp in PIPELINE_STAGES if pp <= ctx.model.num_layers]
    return out


def shapes(ctx: SearchContext, ch: SpaceChoices) -> list[Candidate]:
    """Valid shapes (validity only; fit is decided by the bounds): aggregated, then the P/D pairs
    NixlConnector can join (``recommender.search.space.pd_pair_valid``)."""
    agg: list[Candidate] = []
    pools: dict[tuple[str, str], list[tuple[str, int]]] = {}
    par = {(g, tp): not parallelism_valid(ctx.model, ctx.gpus[g], tp) for g in ch.gpus for tp in ch.tps}
    layout_ok: dict[tuple[str, int, int, bool, str], bool] = {}
    dty = {(g, wd, kd): not weight_dtype_valid(ctx.model, ctx.gpus[g], wd, kd)
           for g in ch.gpus for wd in ch.weight_dtypes for kd in ch.kv_dtypes}

    def ok(g: str, tp: int, dp: int, ep: bool, wd: str) -> bool:  # a block-quantized checkpoint's shards: per dtype
        return layout_ok.setdefault((g, tp, dp, ep, wd), not ctx.layout_why(g, tp, dp, ep, wd))

    for g, tp, wd, kd in itertools.product(ch.gpus, ch.tps, ch.weight_dtypes, ch.kv_dtypes):
        if not (par[g, tp] and dty[g, wd, kd]):
            continue
        if ok(g, tp, 1, False, wd):
            agg.append(Candidate(g, tp, wd, kd, 0, 0))
            pools.setdefault((wd, kd), []).append((g, tp))
        for dp, ep in ch.layouts:  # MoE: data-parallel attention / expert parallel engines (aggregated)
            if ok(g, tp, dp, ep, wd):
                agg.append(Candidate(g, tp, wd, kd, 0, 0, dp=dp, ep=ep))
    if ch.mtp:  # models with MTP heads: every aggregated shape also with k draft tokens
        agg += [replace(c, mtp=k) for c in agg for k in ch.mtp]
    pd: list[Candidate] = []
    pair_ok: dict[tuple[str, int, str, int], bool] = {}
    if ch.disaggregation:
        for (wd, kd), members in pools.items():
            for (g, tp), (dg, dtp) in itertools.product(members, members):
                key = (g, tp, dg, dtp)
                if key not in pair_ok:
                    pair_ok[key] = not pd_pair_valid(ctx.gpus[g], ctx.gpus[dg], tp, dtp, ch.pd_heterogeneous)
                if pair_ok[key]:
                    pd.append(Candidate(g, tp, wd, kd, 0, 0, True, dg, dtp))
    return agg + pipeline_shapes(ctx, ch) + pd


def shape_search(ctx: SearchContext, ch: SpaceChoices, *, max_evaluations: int | None = None,
                 timeout_s: float | None = None, on_evaluation: Callable[[Evaluation], None] | None = None,
                 first: Sequence[Candidate] = (), shard: tuple[int, int] = (0, 1),
                 min_evaluations: int | None = None, reuse_cached: bool = False) -> ShapeSearchResult:
    """Branch and bound over the space (see the module docstring). ``first`` are evaluated before the
    queues (e.g. the previous plan's rank 1); ``on_evaluation`` sees each fresh evaluation; ``shard``
    ``(i, n)`` keeps every n-th shape from the i-th (``--workers``). With ``min_evaluations``, the search
    stops as soon as rank 1 is proven and at least that many evaluations were made (the rest of the
    budget would only refine the expensive or slow end of the front). ``reuse_cached``: candidates an earlier
    search evaluated count towards the incumbent (a second search over part of the space, e.g. aggregated
    only, starts from what the first found)."""
    t0 = time.perf_counter()
    bounds = Bounds(ctx, ch.max_num_seqs, ch.budgets)
    k = usd_per_hour_to_objective(ctx)
    limits = [s.limit_s for s in ctx.workload.slos]
    first_entries: list[_Entry] = []
    unrentable: list[Candidate] = []
    for j, s in enumerate(shapes(ctx, ch)):
        if j % shard[1] != shard[0]:
            continue
        b = bounds.of(s, refine=False)  # seqs = budget = 0: a bound for every combo of the shape
        if b is not None:
            first_entries.append(_Entry(s, b, True, False))
        elif not bounds.rentable_shape(s):
            unrentable.append(s)
    n_shapes = len(first_entries)
    points = [(e.bound.usd_per_hour * k, *e.bound.latencies_s) for e in first_entries]
    q = _Queues(k, [min(col) for col in zip(*points)] if points else [1.0])
    for entry in first_entries:
        q.push(entry)
    front: list[tuple[float, ...]] = []
    best = math.inf
    done: list[Evaluation] = []
    slo_pruned: list[_Entry] = []
    pruned, stopped, proven_after, exhausted, is_proven = 0, "", 0, False, False

    best_agg = math.inf
    saving = ctx.policy.pd_min_saving

    def run(c: Candidate, lower: tuple[int, ...] = ()) -> None:
        nonlocal front, best, best_agg
        if ctx.evaluator.cached(c):
            if reuse_cached:  # an earlier search's evaluation still bounds this one
                ev = evaluate(ctx, c, lower)
                if ev.feasible:
                    front = _update_front(front, tuple(ev.objectives))
                    best = min(best, ev.objectives[0])
            return
        ev = evaluate(ctx, c, lower)
        done.append(ev)
        if on_evaluation is not None:
            on_evaluation(ev)
        if ev.feasible:
            front = _update_front(front, tuple(ev.objectives))
            best = min(best, ev.objectives[0])
            if not c.disaggregated:
                best_agg = min(best_agg, ev.objectives[0])

    for c in first:
        run(c)
    while True:
        if max_evaluations is not None and len(done) >= max_evaluations:
            stopped = "trials"
            break
        if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
            stopped = "timeout"
            break
        if not is_proven and math.isfinite(best) and q.beats_none(best, best_agg, saving):
            is_proven, proven_after = True, len(done)
            q.proven = True
        if is_proven and min_evaluations is not None and len(done) >= min_evaluations:
            break
        e = q.pop()
        if e is None:
            exhausted = True
            break
        if _dominated(front, q.objectives(e.bound)):
            pruned += 1
            continue
        if any(lb > lim for lb, lim in zip(e.bound.latencies_s, limits)):
            pruned += 1  # no plan in it can meet that SLO
            slo_pruned.append(e)
            continue
        ready = _open(e, q, ch, bounds)
        if ready is None:
            pruned += 1
        elif ready:
            run(e.candidate, e.bound.replicas)
    if is_proven and not stopped:
        left = None if max_evaluations is None else max_evaluations - len(done)
        _settle_prices(ctx, q, ch, bounds, limits, run, left=left,
                       deadline_s=None if timeout_s is None else t0 + timeout_s)
    if not done and unrentable:  # nothing else to evaluate: the TP groups say why (no offer holds them)
        for s in _unrentable_to_explain(unrentable):
            run(_combos(ch, s)[0])
    if not front:
        # nothing meets the SLOs: evaluate the entries closest to them, so the error can name the closest plan
        slo_pruned.sort(key=lambda e: max((lb / lim for lb, lim in zip(e.bound.latencies_s, limits)), default=0.0))
        for e in slo_pruned[:8]:
            _run_closest(ctx, ch, e, run)
    proven = math.isfinite(best) and (not stopped or q.beats_none(best, best_agg, saving))
    return ShapeSearchResult(evaluations=tuple(done), complete=exhausted,
                             rank1_proven=proven, rank1_proven_after=proven_after or (len(done) if proven else 0),
                             stopped_by=stopped, shapes=n_shapes, pruned=pruned, seconds=time.perf_counter() - t0)
