"""Cheap lower bounds on what a candidate can cost and how fast it can be (microseconds per candidate).

The shape search (``recommender.search.shapes``) evaluates candidates in order of their cost bound and
skips any whose bounds are already dominated by a plan it has found. Bounds use only the step-cost
model's roofline floors, the workload's length arrays (``recommender.load.pool_inputs.pool_inputs``) and the
sizer's rentals (``Sizer.rent_pd``, ``cheapest_rental``). ``Bounds.of(refine=False)`` leaves out the prefill
interference and rents P/D pools apart (cheaper to compute, never higher); the search refines an entry when it
reaches the front of a queue:

Throughput of one replica (requests/s), ``u = max_utilisation``:

* decode: ``b`` decoders are at most the slots ``c = min(max_num_seqs, budget, u x kv_capacity_tokens / held)``
  and the load model prices their step at the batch a decoder sees, which near the cap lies between ``c - 1``
  (an aggregated pool's step model holds at most ``c - 1`` decoders, a slot prefilling;
  ``recommender.load.pool_steps``) and ``c``, so ``lam x (E[O] - 1) <= c / decode_step_s(max(1, c - 1), mean_ctx)``
  (with ``c`` in the step, Qwen3-30B-A3B on L4 TP2 EP at 16 sequences sustained 0.4% more than the bound);
* busy time: a step takes ``gemm + attention + allreduce + overhead`` (``StepCostModel.step_s``), each term
  at least its share of the request's work, and ``sum max(a, b) >= max(sum a, sum b)`` over the steps. A
  request computes ``T = Pc + O - 1`` tokens in at least ``S = max((O - 1) / max_num_seqs, T / budget)``
  steps; its GEMMs take ``>= max(S W / hbm, T (1 + g(cap) / cap) lf / flops)`` (the GEMM curve's half
  points, ``_curve_per_token``: steps of at most ``cap`` tokens), its attention ``>= max(KV read / (tp hbm), attention FLOPs / (flops x
  attention_ratio))`` (each decode token reads at least the prompt's KV and attends to
  it), its all-reduces ``T`` tokens' worth plus ``S`` latencies, and ``S`` step overheads. So ``lam x
  busy <= 1`` (``_busy_s_per_request``). The analytic load model lies within ~6% of this on the sampled
  configurations, and the bound keeps ``BUSY_SLACK`` for that.

* TPOT SLO ``L`` (decoding pools): the mean decode step ``t`` is at least ``f(b) = decode_step_s(b, mean_ctx)``
  at the mean batch ``b``, Little's law gives ``b >= lam x (E[O] - 1) x t``, and TPOT at p >= 90 (or the
  mean) is at least ``t`` (at p50 at least ``t / 2``), so ``f(b) <= t <= L`` bounds ``b <= b_max`` (the largest
  batch whose step fits in ``L``) and, ``b / f(b)`` growing with ``b``, ``lam x (E[O] - 1) <= b_max / f(b_max)``.

* TPOT with prefill interference (aggregated pools; TPOT SLO ``L`` at p90 and above, or the mean): a prompt's
  prefill adds ``D = own(P) - n(P) T`` to the decode steps it shares (``T``: the decode-only step; ``own``: its
  own chunk steps, ``_own_parts``; ``n`` between ``ceil(Pc / budget)`` and ``ceil(Pc / (budget - b_cap q))``, ``b_cap``
  the largest batch whose step fits in ``L``; ``_prefill_excess``). At ``lam = rate (1 + headroom) / R`` per
  replica, a step holds at least ``b = lam (E[O] - 1) t0`` decoders, so the decode step ``t`` is at least
  ``t_lo = decode_step_s(b)``, and ``T <= t``. The load model's mean TPOT is at least ``t + E[D] (phi lam (t +
  own / (O - 1)) - (1 - 1/R) / (2 (O - 1))) / (1 - phi lam E[D])`` (its renewal count over the request's window of
  ``O - 1`` steps and its own lane sojourn, ``recommender.load.pool``; ``phi``, the share of arrivals admitted
  while it decodes, is 1 once the replica's slots exceed the decoders a TPOT-meeting step holds). ``E[D]`` falls
  and the rest grows with ``t``: over pieces of ``[t_lo, L]`` the bound takes each piece's low end and ``E[D]``
  at its high end, and ``R`` is the fewest replicas for which some piece meets ``L`` (``TPOT_SLACK`` on the
  interference);
* TTFT with the prefill lane's queue (P/D prefill pools; TTFT SLOs at p90 and above): ``TTFT_q >= min(own) +
  transfer + handoff + W_q + J(W_q)`` with the M/G/1 lane wait ``W_q >= E[S] ca2 g / (2 (1 - rho)) ln(rho / (1 - q))``
  (``cs2 = 0`` in the model's Kraemer-Langenbach-Belz factor ``g``, ``ca2 = 1 / R``; ``E[S] >= E[own - (n - Pc / C)
  T]``, the lane's share of the decode-only step) and ``J(W) = min(lam E[Pc] W, spare budget) E[D] / E[Pc]``, the
  prompts that arrive while it waits joining its last step (vLLM fills the budget at each step boundary); this
  bounds the prefill replicas from below.
* P/D rental: per KV path the sizer may take (``Sizer.kv_paths``: one instance's fabric, a provider's NICs), a
  transfer holds the link for ``S(P) = latency + P bytes / (min(tp) bw)`` and the decode side's NICs take
  ``lam / R_d E[P] bytes / (tp_d bw)``; both stay under the utilisation cap, so ``R_p >= rate E[S] / u`` and
  ``R_d >= rate E[P] bytes / (tp_d bw u)``, with the TTFT queue bound counting the path's shortest transfer.
  The bound is the cheapest ``Sizer.rent_pd`` over the paths at those replicas (renting more over one path never
  costs less); no path: the pair cannot be rented (an infinite cost, evaluated last: its reason names the limit).

Replicas ``R >= ceil(rate x (1 + headroom) / lam_max)`` (or the interference and queue bounds above); cost ``>=`` the cheapest whole-instance rental of
``R`` TP groups (``recommender.offers.cheapest_rental``; renting more groups never costs less; P/D: above). An offline
job pays ``usd_per_gpu_hour x tp x R x running`` with ``running = rate / (R x capacity)`` and capacity
``<= lam_max`` at a full KV cache (``u = 1``), so its cost is ``>= usd_per_gpu_hour x tp x rate / lam_max``
(per pool for P/D: each pool's capacity bounds the job's rate).

MTP speculative decoding (``mtp`` draft tokens, ``q = k + 1`` query tokens per decoder, ``tau`` tokens per verify
step): ``decode_step_s`` is already per output token (``(verify + drafts) / tau``), so the decode and TPOT
bounds read it unchanged; the busy time counts ``(O - 1) / tau`` verify steps per request, each computing ``q``
tokens per sequence, reading the context's KV once and attending ``q`` times (the draft passes left out: a
bound); the decode floor's weight read is per step, so per token it is ``W / (hbm tau)``; and a prefill's
interference subtracts decode-only steps of ``tau t`` (``t`` per output token).

Latency at percentile ``p`` (TTFT = queue + residual + own prefill + co-scheduled + fixed, all >= 0):
``TTFT_p >= q_p(own)`` with ``own`` the prompt's own ``n = ceil(Pc / C)`` chunk steps, each no faster than
with its chunk alone: ``max(n W / hbm, (Pc + (n - 1) g(C) + g(Pc - (n - 1) C)) lf / flops)`` GEMMs (each chunk step
reads the weights ``W`` once; ``g`` concave, so the fewest and largest chunks add the least curve, ``_own_parts``),
its attention FLOPs, all-reduces and ``n`` step overheads, plus fixed (``_ttft``); TPOT ``>=`` the shortest decode step, ``max(W / hbm,
decode_step_s(1, 0.9 x mean_ctx))`` (every decode step reads the weights; the load model's step is at a mean
batch of at least one; halved at p50, where the batch-noise factor may be below 1); E2E ``>=`` TTFT's bound (plus
``E[O - 1] x W / hbm`` for the mean). P/D: prefill's TTFT bound plus the KV transfer and the handoff, decode's TPOT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from recommender.load.pool_inputs import pool_inputs
from recommender.load.topology import PoolKind
from recommender.offers import cheapest_rental, rent_colocated
from recommender.perf.step import EngineLimits, StepCostModel
from recommender.sizing import Candidate, Sizer

# The load model prices a prompt's prefill from a least-squares fit over a grid of prompt lengths and
# time-averaged batches (recommender.load.pool), a few percent from the exact step sums: over random
# configurations of the examples and of offline decode- and prefill-heavy jobs, its capacity is at most
# 1.06x the busy-time bound (code-completion, h100-sxm TP1 fp8, 64 sequences, 8k budget). The throughput
# bound is loosened by this factor so that it stays a bound.
BUSY_SLACK = 0.9
# The load model times a prompt's chunks by an affine expansion around a full chunk (a tangent of the convex
# step time), which can sit a little under the exact sum of its steps.
TTFT_SLACK = 0.95
# The TPOT bound's interference term against the load model: over every feasible aggregated evaluation of the
# examples and benchmarks/workloads/tight-tpot-70b.yaml (600 trials each, 2026-12-01) the model's TPOT was at
# least 1.005x the bound without slack; the slack keeps it a bound on the configurations not sampled.
TPOT_SLACK = 0.97
# pieces of [decode floor, TPOT limit] over which the interference bound takes its least value
INTERFERENCE_GRID = 16
ShapeKey = tuple[str, int, str, str, int, bool, int]  # (gpu, tp, weight dtype, kv dtype, dp, ep, MTP draft tokens)
_QUANTILE = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True)
class Bound:
    """Lower bounds: ``usd_per_hour`` and one latency per objective after the cost (seconds)."""

    usd_per_hour: float
    latencies_s: tuple[float, ...]
    replicas: tuple[int, ...] = ()  # per pool (prefill, decode for P/D)


class Bounds:
    """Lower bounds for candidates of one search (caches per replica configuration)."""

    def __init__(self, sizer: Sizer, seqs: Sequence[int], budgets: Sequence[int]) -> None:
        self.sizer = sizer
        w = sizer.workload
        self.target_req_s = w.effective_rate_per_s * (1 + sizer.headroom)
        caching = w.prefix_caching
        frac = w.shared_prefix_fraction
        self._both = pool_inputs(w.prompt_tokens, w.output_tokens, kind=PoolKind.AGGREGATED, shared_prefix_fraction=frac,
                                 block_tokens=16, prefix_caching=caching)
        self._pre = pool_inputs(w.prompt_tokens, w.output_tokens, kind=PoolKind.PREFILL, shared_prefix_fraction=frac,
                                block_tokens=16, prefix_caching=caching)
        self._slos = w.slos
        # the loosest TPOT bound on the mean decode step: the limit, doubled at p50 (see the module docstring)
        tpots = [s.limit_s * (2.0 if s.percentile == "p50" else 1.0) for s in w.slos if s.metric == "tpot"]
        self._tpot_limit_s: float | None = min(tpots) if tpots else None
        self._min_seqs = min(seqs)
        self._min_budget = min([b for b in budgets if b > 0] or [max(w.max_model_len, 2048)])
        self._max_seqs = max(seqs)
        self._max_budget = max(self._eff_budget(b) for b in budgets)
        self._budgets = tuple(sorted({self._eff_budget(b) for b in budgets}))
        self._agg_cache: dict[tuple[Any, ...], Bound | None] = {}
        self._pre_cache: dict[tuple[Any, ...], tuple[float, dict[str, float], int] | None] = {}
        self._dec_cache: dict[tuple[Any, ...], tuple[float, float, int] | None] = {}
        self._generous: dict[tuple[Any, ...], StepCostModel | None] = {}
        self._ttft_cache: dict[tuple[Any, ...], dict[str, float]] = {}
        # keyed by id(cost model); the value holds the model too, so the id is not reused while cached
        self._tpot_lam: dict[int, tuple[StepCostModel, float]] = {}
        self._per_request_cache: dict[tuple[int, bool, bool], tuple[StepCostModel, tuple[float, float, float]]] = {}
        self._rentals: dict[tuple[str, int, int], float | None] = {}  # (gpu, tp, replicas) -> USD/h of the rental
        self._rentable: dict[tuple[str, int], bool] = {}
        self._slots_cache: dict[tuple[Any, ...], int] = {}
        self._paths: dict[tuple[str, int, str, int, str], tuple[Any, ...]] = {}
        self._pd_rent_cache: dict[tuple[Any, ...], float | None] = {}
        self._interference_cache: dict[tuple[Any, ...], int] = {}
        self._interference_parts: dict[tuple[Any, ...], tuple[np.ndarray, tuple[Any, ...], float, float]] = {}
        self._excess_cache: dict[tuple[int, int], tuple[Any, float, float, dict[int, float]]] = {}
        self._own_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, float, np.ndarray]] = {}
        self._own_lb_cache: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self._pd_paths_cache: dict[tuple[Any, ...], tuple[tuple[Any, int, int], ...]] = {}
        self._link_cache: dict[tuple[Any, ...], tuple[float, float, float]] = {}
        self._batch_cap_cache: dict[tuple[Any, ...], int] = {}
        self._pd_cache: dict[tuple[Any, ...], tuple[float, tuple[int, int]] | None] = {}
        self._queue_cache: dict[tuple[Any, ...], int] = {}  # keyed by id(cost model): generous ones, kept

    # -- pieces -------------------------------------------------------------------------------------

    def _replicas(self, cost: StepCostModel, seqs: int, budget: int, decodes: bool, prefills: bool,
                  budgets: Sequence[int] = (), slots_min: int = 1, interference: bool = True) -> int:
        lam = self._lam(cost, seqs, budget, decodes, prefills, self.sizer.max_utilisation)
        r = 1 if not math.isfinite(lam) or lam <= 0 else max(1, math.ceil(self.target_req_s / lam - 1e-9))
        if decodes and prefills and interference:
            r = self._tpot_interference_replicas(cost, tuple(budgets) or (budget,), r, slots_min)
        return r

    def _slots_min(self, key: ShapeKey, seqs: int, budget: int) -> int:
        """Fewest running slots ``c = min(max_num_seqs, budget / q, kv_capacity / held)`` any limits of ``key`` with
        at least ``seqs`` sequences and ``budget`` tokens give (``recommender.load.pool``, slots): the KV cache at
        the space's largest limits, the smallest it gets (more activation and CUDA-graph memory); 1 if unknown."""
        k = (key, seqs, budget)
        if k not in self._slots_cache:
            lim = EngineLimits(max_num_seqs=self._max_seqs, max_num_batched_tokens=self._max_budget, chunked_prefill=True,
                               enable_prefix_caching=self.sizer.workload.prefix_caching)
            tight = self.sizer.cost_model(*key[:4], lim, key[4], key[5], mtp=key[6])[0]
            gen = self.generous_cost(*key)
            if tight is None or gen is None:
                self._slots_cache[k] = 1
            else:
                held = self._both.mean_ctx + tight.kv_block_tokens / 2.0
                kv = min(tight.kv_capacity_tokens, gen.kv_capacity_tokens)
                self._slots_cache[k] = max(1, int(min(seqs, budget // max(tight.query_tokens, 1), kv / held)))
        return self._slots_cache[k]

    def _ttft_queue_replicas(self, cost: StepCostModel, budget: int, r0: int, extra_s: float = 0.0) -> int:
        """Fewest prefill replicas (at least ``r0``) whose TTFT bound with the lane's queue meets each TTFT SLO
        at p90 and above: ``TTFT_q >= min(own) + extra_s + W_q`` (``extra_s``: the shortest KV transfer of P/D and its handoff), the
        lane an M/G/1 queue at ``rho = lam E[S]`` (``E[S] >= TTFT_SLACK x E[own]``) whose wait is 0 with probability
        ``1 - rho``, else exponential with mean ``E[S] ca2 g / (2 (1 - rho))`` at least (``ca2 = 1 / R`` round-robin;
        ``cs2 = 0`` minimises it, with the Kraemer-Langenbach-Belz factor ``g = exp(-2 (1 - rho) (1 - ca2)^2 / (3 rho
        ca2))``), so ``W_q >= that x ln(rho / (1 - q))`` (the load model's lane wait, ``recommender.load.pool``).
        The wait falls with ``R``, so the fewest replicas is ``max(r0, r_q)``; ``r_q`` cached per pool and transfer."""
        k = (id(cost), budget, extra_s)
        if k not in self._queue_cache:
            self._queue_cache[k] = self._ttft_queue_fewest(cost, budget, extra_s)
        return max(r0, self._queue_cache[k])

    def _ttft_queue_fewest(self, cost: StepCostModel, budget: int, extra_s: float) -> int:
        """``r_q`` of :meth:`_ttft_queue_replicas` (1 when no TTFT SLO applies or none would meet it: the latency
        bound prunes those)."""
        slos = [(s.limit_s, _QUANTILE[s.percentile]) for s in self._slos if s.metric == "ttft" and s.percentile in _QUANTILE
                and _QUANTILE[s.percentile] >= 0.9]
        if not slos:
            return 1
        own_lb = self._own_lb(cost, budget)
        pc = self._pre.Pc
        n = np.ceil(pc / max(budget, 1))
        step0 = cost.step_s(0, 0.0, 0.0)  # the lane's decode-only step: no decoders in a prefill pool
        # lane service S = own - n T + max(Pc / C, 1 / k) T >= own - (n - Pc / C) T (recommender.load.pool, lane)
        e_s = TTFT_SLACK * max(0.0, float((own_lb - np.maximum(0.0, n - pc / max(budget, 1)) * step0).mean()))
        own_min = TTFT_SLACK * float(own_lb.min()) + cost.request_overhead_s + extra_s
        # prompts arriving while it waits join its last prefill step (vLLM fills the budget at each step): lam E[Pc] W
        # tokens up to the budget left, each costing at least E[D] / E[Pc], D = own - n T
        e_pc = float(pc.mean())
        per_token = TTFT_SLACK * max(0.0, float((own_lb - n * step0).mean())) / max(e_pc, 1e-12)
        spare = float(np.maximum(0.0, n * max(budget, 1) - pc).min())

        def meets(r: int) -> bool:
            lam = self.target_req_s / r
            rho = lam * e_s
            if rho >= 1.0:
                return False
            for limit, level in slos:
                tail = 1.0 - level
                ca2 = 1.0 / r
                # the load model's Kraemer-Langenbach-Belz factor at cs2 = 0, where ca2 x factor is smallest
                klb = math.exp(-2.0 * (1.0 - rho) * (1.0 - ca2) ** 2 / (3.0 * rho * ca2)) if ca2 < 1.0 else 1.0
                wait = e_s * ca2 * klb / (2.0 * (1.0 - rho)) * math.log(rho / tail) if rho > tail else 0.0
                if own_min + wait + min(lam * e_pc * wait, spare) * per_token > limit:
                    return False
            return True

        if meets(1):
            return 1
        lo, hi = 1, 2
        while not meets(hi):
            lo, hi = hi, 2 * hi
            if hi > (1 << 20):
                return 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(mid) else (mid, hi)
        return hi

    def _tpot_interference_replicas(self, cost: StepCostModel, budgets: tuple[int, ...], r0: int, slots_min: int = 1) -> int:
        """Fewest replicas (at least ``r0``) whose TPOT bound with prefill interference meets the TPOT SLO
        (aggregated pools; percentiles p90 and above, or the mean): see the module docstring, "TPOT with
        prefill interference". ``budgets``: the chunk budgets the bound must hold for (the smallest ``D``);
        ``slots_min``: running slots the replica has at least (:meth:`_slots_min`)."""
        key = (id(cost), budgets, r0, slots_min)
        if key not in self._interference_cache:
            self._interference_cache[key] = self._tpot_interference_uncached(cost, budgets, r0, slots_min)
        return self._interference_cache[key]

    def _tpot_interference_uncached(self, cost: StepCostModel, budgets: tuple[int, ...], r0: int, slots_min: int) -> int:
        limits = [s.limit_s for s in self._slos if s.metric == "tpot" and s.percentile != "p50"]
        inp = self._both
        if not limits or inp.E_O <= 1.0:
            return r0
        limit = min(limits)
        t0 = self._decode_floor_s(cost)
        if t0 >= limit:
            return r0  # the latency bound prunes it
        ctx = max(1, int(0.9 * inp.mean_ctx))
        inv_out = float((1.0 / np.maximum(inp.O - 1.0, 1.0)).mean())
        u = self.sizer.max_utilisation
        if self._interference_cannot_bind(cost, budgets, r0, limit, t0, inv_out):
            return r0
        pk = (id(cost), budgets)
        if pk not in self._interference_parts:
            # a step of more decoders than b_cap exceeds the limit on its own: the chunk left beside the decoders
            # is at least budget - b_cap q tokens, so a prompt takes at most ceil(Pc / that) chunk steps
            ck = (id(cost), ctx, limit)
            if ck not in self._batch_cap_cache:
                self._batch_cap_cache[ck] = self._largest_batch_within(cost, ctx, limit)
            b_cap = self._batch_cap_cache[ck]
            # the mean decode step per token lies in [t0, limit]: on each of GRID pieces [g_j, g_j+1] the TPOT bound
            # is at least its value at the piece's lower end with E[D] at its upper end (E[D] falls with the step)
            g_ = t0 + (limit - t0) * np.arange(INTERFERENCE_GRID + 1) / INTERFERENCE_GRID
            per_budget = []
            for b in budgets:
                bk = (id(cost), b)
                if bk not in self._excess_cache:
                    f, own, n_hi = self._prefill_excess(cost, b, max(1, b - b_cap * cost.query_tokens))
                    # the request's own lane sojourn (its prefill, for a prompt that takes one step) opens its window
                    self._excess_cache[bk] = (f, float(np.min(np.where(n_hi <= 1.0, TTFT_SLACK * own, 0.0))),
                                              float(own.mean()), {})
                per_budget.append(self._excess_cache[bk])
            soj_ = min(x for _, x, _, _ in per_budget)
            a_own_ = TTFT_SLACK * min(x for _, _, x, _ in per_budget)  # E[own] at least (the model fits it)
            self._interference_parts[pk] = (g_, tuple(per_budget), soj_, a_own_)
        g, per_budget_, soj, a_own = self._interference_parts[pk]
        tau_ = cost.tokens_per_step

        def d_hi(j: int) -> float:
            """E[D] at least at the high end of piece ``j`` (the least over the budgets), computed once."""
            out = math.inf
            for f, _, _, done in per_budget_:
                if j not in done:
                    done[j] = float(_mean_positive(f, np.array([tau_ * g[j + 1]]))[0])
                out = min(out, done[j])
            return out

        grid = INTERFERENCE_GRID

        def meets(r: int) -> bool:
            lam = self.target_req_s / r
            kappa = 0.5 * (1.0 - 1.0 / r)  # (1 - ca2) / 2, round-robin arrivals (ca2 = 1 / R)
            # Little: at least lam (E[O] - 1) t0 sequences decode in a step (at most the smallest max_num_seqs - 1)
            b = int(min(lam * (inp.E_O - 1.0) * t0, self._min_seqs - 1.0))
            t_lo = max(t0, cost.decode_step_s(b, ctx)) if b > 1 else t0
            if t_lo > limit:
                return False
            # admitted while it decodes: phi = min(1, (c - 1) / B) with B = lam (E[O] - 1) t_d decoders; a plan
            # within the utilisation cap has c >= a / u slots, a >= B + lam E[own] running; within the TPOT limit
            # B <= lam (E[O] - 1) x limit, so phi = 1 when slots_min - 1 is at least that
            b_lo = lam * (inp.E_O - 1.0) * t_lo
            phi = 1.0 if lam * a_own >= u else min(1.0, max(0.0, 1.0 / u - (u - lam * a_own) / (u * max(b_lo, 1e-12))))
            phi = max(phi, min(1.0, (slots_min - 1.0) / max(lam * (inp.E_O - 1.0) * limit, 1e-12)))
            rate = phi * lam
            for j in range(grid):
                if g[j + 1] < t_lo:
                    continue
                d = d_hi(j)
                rho = rate * d
                if rho >= 1.0:
                    continue  # unstable there
                a = max(float(g[j]), t_lo)
                arrivals = max(0.0, rate * a + (rate * soj - kappa) * inv_out)  # E[max(0, x)] >= max(0, E[x])
                if a + TPOT_SLACK * d * arrivals / (1.0 - rho) <= limit:
                    return True
            return False

        if meets(r0):
            return r0
        lo, hi = r0, max(r0 + 1, 2 * r0)
        while not meets(hi):
            lo, hi = hi, 2 * hi
            if hi > (1 << 20):
                return r0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(mid) else (mid, hi)
        return hi

    def _interference_cannot_bind(self, cost: StepCostModel, budgets: tuple[int, ...], r0: int, limit: float, t0: float,
                                  inv_out: float) -> bool:
        """True when the interference bound meets ``limit`` at ``r0`` even with its largest terms: ``E[D] <= E[own]``
        (``T = 0``), the decode step at the floor's Little batch, all arrivals admitted (``phi = 1``); then the
        piecewise bound (which is smaller) meets it too, and ``r0`` stands without building it."""
        inp = self._both
        d_up = self._own_mean(cost, max(budgets))  # E[D] <= min over the budgets <= any one's E[own]
        lam = self.target_req_s / r0
        if lam * d_up >= 1.0:
            return False
        ctx = max(1, int(0.9 * inp.mean_ctx))
        b = int(min(lam * (inp.E_O - 1.0) * t0, self._min_seqs - 1.0))
        t_lo = max(t0, cost.decode_step_s(b, ctx)) if b > 1 else t0
        arrivals = max(0.0, lam * t_lo + lam * d_up * inv_out)  # the sojourn term at most TTFT_SLACK E[own] <= d_up
        return t_lo + TPOT_SLACK * d_up * arrivals / (1.0 - lam * d_up) <= limit

    def _prefill_excess(self, cost: StepCostModel, budget: int, chunk_min: int) -> tuple[Any, np.ndarray, np.ndarray]:
        """A prompt's prefill work on top of the decode steps it shares, ``D = own - n T`` (``T``: the decode-only
        step), at least, for chunks of ``chunk_min`` to ``budget`` tokens: (``T -> D`` per point, own prefill
        steps at least, most chunk steps). ``own >= max(n W, G) + R + n f`` (:meth:`_own_parts`, ``G``
        the GEMMs of the fewest and largest chunks, which any chunking exceeds), so ``D >= max(n W, G) + R +
        n (f - T)``, piecewise linear in ``n``: its least over ``n`` in ``[n_lo, n_hi]`` is at an end or at the
        kink ``n = G / W``."""
        pc = self._pre.Pc
        gemm_min, rest, fixed, n_lo = self._own_parts(cost, budget)
        n_hi = np.ceil(pc / max(chunk_min, 1))
        w = self._weights_s(cost)
        kink = np.clip(gemm_min / max(w, 1e-300), n_lo, n_hi)
        own = np.maximum(n_lo * w, gemm_min) + rest + n_lo * fixed

        ns = np.stack([n_lo, n_hi, kink])  # (3, points)
        base = np.maximum(ns * w, gemm_min) + rest + ns * fixed
        one = n_lo == n_hi  # one chunk count: D = base - n T, a line per point

        def excess(t_step: Any) -> np.ndarray:
            """Per point (and per step time, for an array of them: shape (steps, points)) ``D`` at least."""
            t = np.asarray(t_step, dtype=float)[..., None, None]
            out: np.ndarray = (base - ns * t).min(axis=-2)
            return out

        # for _mean_positive: the points on one line, and the others' (bases, counts)
        excess.lines = (base[0][one], ns[0][one], base[:, ~one], ns[:, ~one])  # type: ignore[attr-defined]

        return excess, own, n_hi

    def _lam(self, cost: StepCostModel, seqs: int, budget: int, decodes: bool, prefills: bool, u: float) -> float:
        """Upper bound on one replica's throughput (requests/s) with at most ``u`` of its KV cache in use."""
        inp = self._both
        lam = math.inf
        if decodes and inp.E_O > 1.0:
            held = inp.mean_ctx + cost.kv_block_tokens / 2.0
            c = max(1.0, min(float(seqs), float(budget), u * cost.kv_capacity_tokens / held))
            b = max(1, int(c))
            # the load model prices a step at the batch a decoder sees, which near the slot cap ``c`` lies between
            # ``c - 1`` (an aggregated pool's step holds at most ``c - 1`` decoders) and ``c``: b decoders, a step of b - 1
            lam = min(lam, b / cost.decode_step_s(max(1, b - 1), int(inp.mean_ctx)) / (inp.E_O - 1.0))
        busy_s = self._busy_s_per_request(cost, seqs, budget, prefills, decodes)
        if busy_s > 0:  # the load model's prefill lane fits a prompt's cost on a grid: up to ~7% below it
            lam = min(lam, 1.0 / (BUSY_SLACK * busy_s))
        if decodes and inp.E_O > 1.0 and self._tpot_limit_s is not None:
            lam = min(lam, self._tpot_capped_lam(cost))
        return lam

    def _tpot_capped_lam(self, cost: StepCostModel) -> float:
        """``b_max / decode_step_s(b_max) / (E[O] - 1)`` for the TPOT limit (inf when no batch meets it:
        the latency bound prunes those); cached per cost model (the limits do not change it)."""
        key = id(cost)
        if key not in self._tpot_lam:
            inp = self._both
            assert self._tpot_limit_s is not None
            b_max = self._largest_batch_within(cost, int(inp.mean_ctx), self._tpot_limit_s)
            self._tpot_lam[key] = (cost, b_max / cost.decode_step_s(b_max, int(inp.mean_ctx)) / (inp.E_O - 1.0)
                                   if b_max >= 1 else math.inf)
        return self._tpot_lam[key][1]

    @staticmethod
    def _largest_batch_within(cost: StepCostModel, ctx: int, limit_s: float, cap: int = 1 << 16) -> int:
        """Largest batch ``b`` in [1, cap] with ``decode_step_s(b, ctx) <= limit_s`` (0 if none; bisection)."""
        if cost.decode_step_s(1, ctx) > limit_s:
            return 0
        lo, hi = 1, cap
        if cost.decode_step_s(hi, ctx) <= limit_s:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cost.decode_step_s(mid, ctx) <= limit_s else (lo, mid)
        return lo

    def _busy_s_per_request(self, cost: StepCostModel, seqs: int, budget: int, prefills: bool, decodes: bool) -> float:
        """Engine time one request costs at least (s), summed over the steps that serve it.

        A step takes ``gemm + attention + allreduce + overhead`` (``StepCostModel.step_s``) with ``gemm >=
        max(W / hbm, (n + g(n)) x lf / flops)`` (the GEMM curve, :func:`_curve_per_token`) and ``attention >=
        max(kv / (tp x hbm), fl / (flops x attention_ratio))``;
        summed over steps, ``sum max(a, b) >= max(sum a, sum b)``. Per request: ``T = Pc + O - 1`` computed
        tokens, at least ``S = max((O - 1) / max_num_seqs, T / budget)`` steps (a step holds at most
        ``max_num_seqs`` decoders and ``budget`` tokens), attention FLOPs ``fpp x (Pc h + Pc (Pc + 1) / 2)``
        for the prompt (any chunking) and ``fpp x P`` per decode token, and at least the prompt's KV read
        per decode token. So ``busy >= max(S W / hbm, T (1 + g(cap) / cap) lf / flops) + max(KV / (tp hbm), FL /
        (flops x attention_ratio)) + T x allreduce per token + S x (fixed all-reduce latency + step overhead)``, plus the
        prefill-step overhead on ``Pc / budget`` steps."""
        prompt_tokens, decode_tokens, attention_s = self._per_request(cost, prefills, decodes)
        lf, flops_s = cost.linear_flops_per_token, cost.group_flops_per_s
        # MTP: the O - 1 decode tokens take (O - 1) / tau verify steps of q = k + 1 computed tokens each
        q, tau = cost.query_tokens, cost.tokens_per_step
        tokens = prompt_tokens + decode_tokens * q / tau
        steps = max(decode_tokens / tau / max(seqs, 1), tokens / max(budget, 1))
        cap = max(budget, seqs * q, 1)  # no step computes more tokens
        gemm_s = max(steps * self._weights_s(cost), tokens * (1.0 + _curve_per_token(cost, cap)) * lf / flops_s)
        ar0 = cost.allreduce_s(0)
        fixed_s = steps * (ar0 + cost.overhead_s) + prompt_tokens / max(budget, 1) * cost.prefill_step_overhead_s
        return gemm_s + attention_s + tokens * (cost.allreduce_s(1) - ar0) + fixed_s

    def _per_request(self, cost: StepCostModel, prefills: bool, decodes: bool) -> tuple[float, float, float]:
        """(prompt tokens, decode tokens, attention seconds) one request computes on average (see
        :meth:`_busy_s_per_request`); cached per cost model."""
        key = (id(cost), prefills, decodes)
        if key not in self._per_request_cache:
            inp = self._both
            P, Pc, O = inp.P, inp.Pc, inp.O
            flops_s = cost.group_flops_per_s
            attn_fl = np.zeros_like(P)
            kv = np.zeros_like(P)
            prompt_tokens = decode_tokens = 0.0
            if prefills:
                attn_fl = attn_fl + self._prompt_attention_flops(cost, Pc, P - Pc)
                prompt_tokens = float(np.mean(Pc))
            if decodes:
                # per verify step (MTP: (O - 1) / tau of them) the prompt's KV read once, its attention FLOPs q times
                kv_p, fl_p = cost.decode_seq_costs(P)
                attn_fl = attn_fl + (O - 1.0) * fl_p * cost.query_tokens / cost.tokens_per_step
                kv = kv + (O - 1.0) * kv_p / cost.tokens_per_step
                decode_tokens = max(inp.E_O - 1.0, 0.0)
            attention_s = max(float(kv.mean()) / (cost.tp * cost.hbm_bytes_per_s), float(attn_fl.mean()) / (flops_s * cost.attention_ratio))
            self._per_request_cache[key] = (cost, (prompt_tokens, decode_tokens, attention_s))
        return self._per_request_cache[key][1]

    @staticmethod
    def _prompt_attention_flops(cost: StepCostModel, pc: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """Full-attention FLOPs of prefilling ``pc`` tokens after ``prefix`` cached ones, in any chunking:
        ``fpp x (pc x prefix + pc (pc + 1) / 2)`` token pairs (sliding-window layers left out: a bound)."""
        pairs: np.ndarray = pc * prefix + pc * (pc + 1) / 2.0
        return cost.attn_flops_per_pair_full * pairs

    def _weights_s(self, cost: StepCostModel) -> float:
        return cost.weight_bytes_read_per_gpu(1) / cost.hbm_bytes_per_s

    def _decode_floor_s(self, cost: StepCostModel) -> float:
        """Shortest mean decode step per output token: the weights read once, or a one-sequence step at 90% of
        the mean context (the load model's step at its mean batch, which is at least one, and at the mean
        context); with MTP both per verify step over the ``tau`` tokens it emits (``decode_step_s`` already is)."""
        one = cost.decode_step_s(1, max(1, int(0.9 * self._both.mean_ctx)))
        return max(self._weights_s(cost) / cost.tokens_per_step, one)

    def _own_parts(self, cost: StepCostModel, chunk: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """Per point, a prompt's own prefill in chunk steps of at most ``chunk`` tokens, each no faster than
        with its chunk alone (``step_s`` grows with every argument): (GEMM FLOP time ``G``, attention and
        all-reduce tokens ``R``, fixed time per step ``f``, fewest steps ``n = ceil(Pc / chunk)``); the steps take
        at least ``max(n W / hbm, G) + R + n f``.

        ``G = (Pc + sum_k g(c_k)) lf / flops`` over chunks of ``c_k`` tokens (the GEMM curve, :func:`_curve_tokens`):
        ``g`` is concave with ``g(0) >= 0``, so over chunkings of ``Pc`` into pieces of at most ``chunk`` the sum is
        least for ``n - 1`` full chunks and the rest, ``(n - 1) g(chunk) + g(Pc - (n - 1) chunk)``. ``R`` = the
        attention FLOPs ``fpp (Pc h + Pc (Pc + 1) / 2) / (flops x attention_ratio)`` plus ``Pc`` tokens of
        all-reduce; ``f`` = the all-reduce latency, step and prefill-step overheads. Cached per cost model."""
        key = (id(cost), chunk)
        if key not in self._own_cache:
            self._own_cache[key] = self._own_parts_uncached(cost, chunk)
        return self._own_cache[key]

    def _own_parts_uncached(self, cost: StepCostModel, chunk: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        pre = self._pre
        pc, h = pre.Pc, pre.P - pre.Pc
        flops_s = cost.group_flops_per_s
        c = max(chunk, 1)
        n = np.ceil(pc / c)
        last = pc - (n - 1.0) * c
        curve = (n - 1.0) * _curve_tokens(cost, float(c)) + _curve_tokens(cost, last)
        gemm = (pc + curve) * cost.linear_flops_per_token / flops_s
        attention = self._prompt_attention_flops(cost, pc, h) / (flops_s * cost.attention_ratio)
        ar0 = cost.allreduce_s(0)
        rest: np.ndarray = attention + pc * (cost.allreduce_s(1) - ar0)
        return gemm, rest, ar0 + cost.overhead_s + cost.prefill_step_overhead_s, n

    def _own_lb(self, cost: StepCostModel, chunk: int) -> np.ndarray:
        """Per point, a prompt's own prefill steps at least (s): see :meth:`_own_parts`, without the slack, the
        request overhead and the KV transfer of :meth:`_ttft`. Cached per cost model (read-only)."""
        key = (id(cost), chunk)
        if key not in self._own_lb_cache:
            gemm, rest, fixed, n = self._own_parts(cost, chunk)
            out: np.ndarray = np.maximum(n * self._weights_s(cost), gemm) + rest + n * fixed
            out.flags.writeable = False
            self._own_lb_cache[key] = (out, float(out.mean()))
        return self._own_lb_cache[key][0]

    def _own_mean(self, cost: StepCostModel, chunk: int) -> float:
        """``E[own]`` of :meth:`_own_lb`."""
        self._own_lb(cost, chunk)
        return self._own_lb_cache[(id(cost), chunk)][1]

    def _ttft(self, cost: StepCostModel, chunk: int, extra_s_per_prompt_token: float) -> dict[str, float]:
        """TTFT bounds per percentile: a prompt's own prefill steps (:meth:`_own_parts`: ``max(n W, G) + R``
        with ``TTFT_SLACK``, plus ``n f``), the request overhead and ``extra_s_per_prompt_token x P`` (the KV
        transfer of P/D)."""
        pre = self._pre
        gemm, rest, fixed, n = self._own_parts(cost, chunk)
        steps = np.maximum(n * self._weights_s(cost), gemm) + rest
        own = TTFT_SLACK * steps + n * fixed + pre.P * extra_s_per_prompt_token + cost.request_overhead_s
        s = np.sort(own)
        k = s.size - 1
        out = {"mean": float(own.mean())}
        for name, q in _QUANTILE.items():
            out[name] = float(s[min(k, int(round(q * k)))])
        return out

    def _latencies(self, ttft: dict[str, float], tpot_s: float) -> tuple[float, ...]:
        out = []
        for s in self._slos or ():
            if s.metric == "ttft":
                out.append(ttft[s.percentile])
            elif s.metric == "tpot":
                out.append(tpot_s * (0.5 if s.percentile == "p50" else 1.0))
            else:
                extra = (self._both.E_O - 1.0) * tpot_s if s.percentile == "mean" else 0.0
                out.append(ttft[s.percentile] + extra)
        if not self._slos:
            out.append(0.5 * tpot_s)
        return tuple(out)

    # -- candidates -----------------------------------------------------------------------------------

    def generous_cost(self, gpu: str, tp: int, wd: str, kd: str, dp: int = 1, ep: bool = False,
                      mtp: int = 0) -> StepCostModel | None:
        """The step-cost model of (gpu, tp, dtypes) at the smallest limits of the space: the largest KV
        capacity any limits give (the limits change nothing else in the model); None if even that does not fit.
        With ``dp > 1`` or ``ep``: one attention rank of a MoE engine; ``mtp``: with MTP (``Sizer.cost_model``)."""
        key = (gpu, tp, wd, kd, dp, ep, mtp)
        if key not in self._generous:
            w = self.sizer.workload
            lim = EngineLimits(max_num_seqs=self._min_seqs, max_num_batched_tokens=self._min_budget, chunked_prefill=True,
                               enable_prefix_caching=w.prefix_caching)
            self._generous[key] = self.sizer.cost_model(gpu, tp, wd, kd, lim, dp, ep, mtp=mtp)[0]
        return self._generous[key]

    def rentable(self, gpu: str, tp: int) -> bool:
        """Some offer of ``gpu`` holds a TP group of ``tp`` (or the sizer prices per GPU, without offers)."""
        key = (gpu, tp)
        if key not in self._rentable:
            offers = self.sizer.offers.get(gpu)
            self._rentable[key] = not offers or cheapest_rental(offers, tp, 1) is not None
        return self._rentable[key]

    def rentable_shape(self, c: Candidate) -> bool:
        """Every pool of ``c`` can be rented (:meth:`rentable`)."""
        return self.rentable(c.gpu, c.gpus_per_replica) and (not c.disaggregated or self.rentable(c.decode_gpu, c.decode_tp))

    def _seqs_refused(self, key: ShapeKey, seqs: int) -> bool:
        """``seqs`` above the grid's floor and above the sequences even the largest KV cache of ``key`` holds
        at the mean context, so that every limits with it are refused by the sizer."""
        cost = self.generous_cost(*key)
        if cost is None or seqs <= self.sizer.rules.max_num_seqs_floor:
            return False
        return seqs > self.sizer.kv_sequences(cost.kv_capacity_tokens)

    def _ttft_cached(self, cost: StepCostModel, key: ShapeKey, chunk: int, xfer: float) -> dict[str, float]:
        k = (key, chunk, xfer)
        if k not in self._ttft_cache:
            self._ttft_cache[k] = self._ttft(cost, chunk, xfer)
        return self._ttft_cache[k]

    def _usd(self, gpu: str, tp: int, r: int, lam_full: float, dp: int = 1) -> float:
        """Cost bound (USD/h) of ``r`` replicas; an offline job pays only while running, which is at least
        ``rate / (r x lam_full)`` of the time (``lam_full``: the throughput bound at a full KV cache).
        ``dp > 1``: ``r`` counts attention ranks of ``tp`` GPUs; the sizer rents engines of ``tp x dp`` GPUs and
        needs at least ``ceil(r / dp)`` of them (the offline bound is per GPU, the same either way)."""
        if dp > 1 and not self.sizer.workload.is_offline:
            return self._usd(gpu, tp * dp, -(-r // dp), lam_full)
        if self.sizer.workload.is_offline:
            if not math.isfinite(lam_full) or lam_full <= 0:
                return 0.0
            return self.sizer.prices[gpu] * tp * self.target_req_s / lam_full
        # whole instances: the cheapest rental of r TP groups (the sizer rents R >= r the same way, and renting
        # more groups never costs less); per GPU when the sizer has no offers for the GPU
        key = (gpu, tp, r)
        if key not in self._rentals:
            offers = self.sizer.offers.get(gpu)
            rental = cheapest_rental(offers, tp, r) if offers else None
            self._rentals[key] = rental.usd_per_hour if rental is not None else None
        usd = self._rentals[key]
        return usd if usd is not None else self.sizer.prices[gpu] * tp * r

    def _eff_budget(self, b: int) -> int:
        return b if b > 0 else max(self.sizer.workload.max_model_len, 2048)

    def _agg(self, key: ShapeKey, seqs: int, budget: int, any_budget: bool = False, refine: bool = True) -> Bound | None:
        k = (key, seqs, budget, any_budget, refine)
        if k not in self._agg_cache:
            cost = self.generous_cost(*key)
            if cost is None:
                self._agg_cache[k] = None
            else:
                slots = self._slots_min(key, self._min_seqs if any_budget else seqs, self._min_budget if any_budget else budget) \
                    if refine else 1
                r = self._replicas(cost, seqs, budget, True, True, self._budgets if any_budget else (), slots, refine)
                ttft = self._ttft_cached(cost, key, budget, 0.0)
                usd = self._usd(key[0], key[1], r, self._lam(cost, seqs, budget, True, True, 1.0), key[4])
                # replicas are engines: r attention ranks need at least ceil(r / dp) engines of dp ranks
                self._agg_cache[k] = Bound(usd, self._latencies(ttft, self._decode_floor_s(cost)), (-(-r // key[4]),))
        return self._agg_cache[k]

    def _prefill(self, key: ShapeKey, budget: int) -> tuple[float, dict[str, float], int] | None:
        """(usd_per_hour bound, TTFT bounds incl. KV transfer) of a prefill pool."""
        k = (key, budget)
        if k not in self._pre_cache:
            cost = self.generous_cost(*key)
            if cost is None:
                self._pre_cache[k] = None
            else:
                r = self._ttft_queue_replicas(cost, budget, self._replicas(cost, 1, budget, False, True))
                # KV transfer runs on min(tp_p, tp_d) NICs: at least the time over the prefill pool's tp NICs
                xfer = self.sizer.kv_transfer_s_per_token(Candidate(key[0], key[1], key[2], key[3], 1, 0, True, key[0], key[1]))
                usd = self._usd(key[0], key[1], r, self._lam(cost, 1, budget, False, True, 1.0))
                # ... and every request's P/D handoff, a delay that holds no link (recommender.load.link)
                ttft = {q: v + self.sizer.rules.kv_handoff_s for q, v in self._ttft_cached(cost, key, budget, xfer).items()}
                self._pre_cache[k] = (usd, ttft, r)
        return self._pre_cache[k]

    def _decode(self, key: ShapeKey, seqs: int) -> tuple[float, float, int] | None:
        """(usd_per_hour bound, per-step seconds bound) of a decode pool."""
        k = (key, seqs)
        if k not in self._dec_cache:
            cost = self.generous_cost(*key)
            if cost is None:
                self._dec_cache[k] = None
            else:
                r = self._replicas(cost, seqs, max(2048, seqs), True, False)
                usd = self._usd(key[0], key[1], r, self._lam(cost, seqs, max(2048, seqs), True, False, 1.0))
                self._dec_cache[k] = (usd, self._decode_floor_s(cost), r)
        return self._dec_cache[k]

    def of(self, c: Candidate, refine: bool = True) -> Bound | None:
        """Lower bounds for ``c``, or None when it cannot fit. ``max_num_seqs`` / ``max_num_batched_tokens``
        of 0 stand for "any": the bound then holds for every choice of ``seqs`` / ``budgets``. ``refine=False``:
        a cheaper bound, never above the refined one (no prefill interference; P/D pools rented apart or on one
        instance, not per KV path): the search refines an entry only when it reaches the front of its queue."""
        pkey: ShapeKey = (c.gpu, c.tp, c.weight_dtype, c.kv_dtype, c.dp, c.ep, c.mtp)
        dkey: ShapeKey = (c.decode_gpu, c.decode_tp, c.weight_dtype, c.kv_dtype, 1, False, 0) if c.disaggregated else pkey
        if not self.rentable_shape(c):
            return None  # the sizer cannot rent a TP group of it: every combo is infeasible
        if c.pp > 1:
            return self._pipeline(c)
        if c.max_num_seqs and self._seqs_refused(dkey, c.max_num_seqs):
            return None  # the sizer refuses it (recommender.sizing.Sizer.seqs_above_kv): not worth a trial
        seqs = c.max_num_seqs or self._max_seqs
        budget = self._eff_budget(c.max_num_batched_tokens) if c.max_num_seqs else self._max_budget
        if not c.disaggregated:
            return self._agg(pkey, seqs, budget, any_budget=not c.max_num_seqs, refine=refine)
        pre = self._prefill(pkey, budget)
        dec = self._decode(dkey, seqs)
        if pre is None or dec is None:
            return None
        if self.sizer.workload.is_offline:
            return Bound(pre[0] + dec[0], self._latencies(pre[1], dec[1]), (pre[2], dec[2]))
        if not refine:  # the pools' cheapest rentals apart, or both on one instance (one 8-GPU instance, not two)
            usd = pre[0] + dec[0]
            if c.gpu == c.decode_gpu:
                usd = min(usd, self._colocated_usd(c.gpu, ((c.tp, pre[2]), (c.decode_tp, dec[2]))))
            return Bound(usd, self._latencies(pre[1], dec[1]), (pre[2], dec[2]))
        got = self._pd_rental(c, pkey, budget, pre[2], dec[2])
        if got is None:  # no KV path can carry it at any replicas: infeasible, but its evaluation says why (max_gpus)
            return Bound(math.inf, self._latencies(pre[1], dec[1]), (pre[2], dec[2]))
        return Bound(got[0], self._latencies(pre[1], dec[1]), got[1])

    def _pd_rental(self, c: Candidate, pkey: ShapeKey, budget: int, rp0: int, rd0: int) -> tuple[float, tuple[int, int]] | None:
        """Cheapest rental (USD/h) of a P/D pair over the KV paths the sizer may take (``Sizer.kv_paths``), and the
        replicas of the cheapest, or None when no path can carry it. On a path of ``bw`` per GPU a transfer of
        ``P`` tokens holds the link for ``S(P) = latency + P x bytes_per_token / (min(tp_p, tp_d) bw)`` and the
        decode side takes ``lam / R_d x E[P] x bytes_per_token / (tp_d bw)`` of its NICs (``recommender.load.link``),
        both held under the utilisation cap ``u``: ``R_p >= rate E[S] / u``, ``R_d >= rate E[P] bytes / (tp_d bw
        u)``; the prefill pool's TTFT queue bound counts the shortest transfer. Renting more replicas over one
        path never costs less (``Sizer.rent_pd``), and the sizer keeps the cheapest path it sizes."""
        pair = (c.gpu, c.tp, c.decode_gpu, c.decode_tp, c.kv_dtype)
        ck = (pair, pkey, budget, rp0, rd0)
        if ck not in self._pd_cache:
            self._pd_cache[ck] = self._pd_rental_uncached(c, pair, pkey, budget, rp0, rd0)
        return self._pd_cache[ck]

    def _pd_rental_uncached(self, c: Candidate, pair: tuple[str, int, str, int, str], pkey: ShapeKey, budget: int,
                            rp0: int, rd0: int) -> tuple[float, tuple[int, int]] | None:
        best: tuple[float, tuple[int, int]] | None = None
        for path, rp, rd_link in self._pd_path_replicas(c, pair, pkey, budget, rp0):
            rd = max(rd0, rd_link)
            usd = self._rent_pd_usd(c, pair, path, rp, rd)
            if usd is not None and (best is None or usd < best[0]):
                best = (usd, (rp, rd))
        return best

    def _pd_path_replicas(self, c: Candidate, pair: tuple[str, int, str, int, str], pkey: ShapeKey, budget: int,
                          rp0: int) -> tuple[tuple[Any, int, int], ...]:
        """Per KV path of ``pair``: (path, prefill replicas at least, decode replicas the link needs at least);
        see :meth:`_pd_rental`. Cached per (pair, prefill pool, budget, ``rp0``)."""
        key = (pair, pkey, budget, rp0)
        if key not in self._pd_paths_cache:
            if pair not in self._paths:
                self._paths[pair] = tuple(self.sizer.kv_paths(c))
            u = self.sizer.max_utilisation
            P = self._pre.P
            cost = self.generous_cost(*pkey)
            assert cost is not None
            out = []
            for path in self._paths[pair]:
                lk = (pair, path)
                if lk not in self._link_cache:
                    link = self.sizer.kv_link(c, path)
                    s = np.asarray(link.transfer_s(P), dtype=float)
                    ingress = float(P.mean()) * link.bytes_per_token / (link.decode_tp * link.nic_bytes_per_s)
                    self._link_cache[lk] = (float(s.mean()), float(s.min()) + link.handoff_s, ingress)
                s_mean, s_min, ingress = self._link_cache[lk]
                rp = max(rp0, math.ceil(self.target_req_s * s_mean / u - 1e-9))
                rp = self._ttft_queue_replicas(cost, budget, rp, s_min)  # s_min: the shortest transfer and the handoff
                out.append((path, rp, math.ceil(self.target_req_s * ingress / u - 1e-9)))
            self._pd_paths_cache[key] = tuple(out)
        return self._pd_paths_cache[key]

    def _rent_pd_usd(self, c: Candidate, pair: tuple[str, int, str, int, str], path: Any, rp: int, rd: int) -> float | None:
        """USD/h of ``Sizer.rent_pd`` over ``path`` (None when it cannot rent them), cached."""
        key = (pair, path, rp, rd)
        if key not in self._pd_rent_cache:
            rented = self.sizer.rent_pd(c, path, rp, rd)
            self._pd_rent_cache[key] = None if isinstance(rented, str) else rented[0].usd_per_hour + rented[1].usd_per_hour
        return self._pd_rent_cache[key]

    def _pipeline(self, c: Candidate) -> Bound | None:
        """A loose but valid bound for a pipeline-parallel shape: one whole pipeline (``pp`` stage groups on
        offers naming their NIC) at no latency; None when no such offer holds a stage."""
        rental = cheapest_rental(self.sizer.multinode_offers(c.gpu, c.tp), c.tp, c.pp)
        if rental is None:
            return None
        usd = rental.usd_per_hour * (0.0 if self.sizer.workload.is_offline else 1.0)
        return Bound(usd, tuple(0.0 for _ in self.sizer.workload.slos) or (0.0,), (1,))


    def _colocated_usd(self, gpu: str, groups: tuple[tuple[int, int], ...]) -> float:
        """USD/h of the cheapest single instance holding every group; inf when none does."""
        best = math.inf
        for o in self.sizer.offers.get(gpu) or ():
            got = rent_colocated(o, groups)
            if got is not None:
                best = min(best, got[0] * o.usd_per_instance_hour)
        return best


def _mean_positive(excess: Any, t_steps: np.ndarray) -> np.ndarray:
    """``E[max(0, D(T))]`` over the points at each step time ``T`` of ``t_steps``. Where ``D = a - n T`` is one line
    per point (``excess.lines``: those points' ``a`` and ``n``, then the other points' lines, the least of which is
    ``D``), by sorting the points on their roots ``a / n`` and summing the lines still above zero (cumulative sums);
    the other points on their (steps, lines, points) array."""
    lines = getattr(excess, "lines", None)
    if lines is None:
        out: np.ndarray = np.maximum(0.0, excess(t_steps)).mean(axis=-1)
        return out
    a, n, a_rest, n_rest = lines
    total = a.size + a_rest.shape[-1]
    roots = a / np.maximum(n, 1e-300)
    order = np.argsort(roots)
    r, ca, cn = roots[order], np.cumsum(a[order][::-1])[::-1], np.cumsum(n[order][::-1])[::-1]
    k = np.searchsorted(r, t_steps, side="right")  # points k.. have roots above T: D > 0 there
    ca, cn = np.append(ca, 0.0), np.append(cn, 0.0)
    out = ca[k] - cn[k] * t_steps
    if a_rest.shape[-1]:
        t = t_steps[:, None, None]
        out = out + np.maximum(0.0, (a_rest[None] - n_rest[None] * t).min(axis=-2)).sum(axis=-1)
    mean: np.ndarray = out / max(total, 1)
    return mean


def _curve_tokens(cost: StepCostModel, tokens: Any) -> Any:
    """``g(T) = c M_half (1 - h M_mem / (T + M_mem))``: the GEMM-curve tokens a step of ``T`` tokens adds at least
    (``StepCostModel.gemm_effective_flops``: routed experts pay ``E_t(T dp) / (dp k) >= 1 / dp`` half points, since a
    step of at least one token per rank touches at least ``k`` experts; dense GEMMs one), so ``c = (dense + routed /
    dp) / linear`` of the FLOPs per token (1 without attention DP). ``g`` falls with ``M_mem``: taken at the largest
    weight read (every expert touched, at the dtype's stream efficiency), it bounds every step from below.
    Increasing and concave in ``T`` with ``g(0) = c M_half (1 - h) >= 0``."""
    if not cost.gemm_m_half_tokens or not cost.linear_flops_per_token:
        return tokens * 0.0
    lf = cost.linear_flops_per_token
    dp = cost.moe.dp if cost.moe is not None else 1
    share = (lf - cost.routed_flops_per_token * (1.0 - 1.0 / dp)) / lf
    m_mem = cost.weight_read_s(1 << 30, cost.hbm_bytes_per_s) * cost.group_flops_per_s / lf
    return share * cost.gemm_m_half_tokens * (1.0 - cost.gemm_curve_hidden * m_mem / (tokens + m_mem))


def _curve_per_token(cost: StepCostModel, cap_tokens: int) -> float:
    """GEMM-curve tokens each computed token adds at least, over steps of at most ``cap_tokens`` tokens.

    A step of ``T`` tokens costs ``(T + g(T)) x lf`` GEMM FLOPs or more (:func:`_curve_tokens`). ``g`` is
    increasing and concave with ``g(0) >= 0``, so ``g(T) / T`` falls with ``T`` and ``sum g(T_i) >= sum T_i x
    g(cap) / cap`` for steps of ``T_i <= cap`` tokens."""
    return float(_curve_tokens(cost, float(cap_tokens))) / cap_tokens
