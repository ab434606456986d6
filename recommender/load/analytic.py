"""Analytic load model: utilisation, running batch and tail TTFT / TPOT / E2E at an arrival rate.

Fast enough for the search (well under a millisecond per call). Requests are routed round-robin,
so with Poisson arrivals at ``lam`` each of ``R`` replicas sees renewal arrivals at ``lam / R`` with
squared coefficient of variation ``ca2 = 1 / R`` (Erlang-R gaps). One replica of a pool is solved by
``recommender.load.pool.solve_pool`` (every formula is in that module's docstring); this module
composes pools and turns the per-request model into percentiles.

Per request: ``TTFT = W + R + own(P)`` (queue wait, residual of the running step, own prefill steps);
``TPOT`` from the request's decode window (see ``pool``); ``E2E = TTFT + (O - 1) * TPOT``. The model
is evaluated at fixed quasi-random points of (prompt, output, wait, residual, noise)
(``recommender.load.summaries``), so the percentiles are deterministic and smooth in the inputs;
means are exact expectations of the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import ndtri

from recommender.load.link import solve_link
from recommender.load.percentiles import QUANTILES, IdentityCache, LazyPercentiles, Percentiles
from recommender.load.pool import PoolSolution, solve_pool
from recommender.load.pool_inputs import PoolInputs, pool_inputs_of
from recommender.load.summaries import _mean, qmc_exponentials, qmc_points
from recommender.load.topology import Disaggregated, PoolKind, PoolSpec, Traffic


@dataclass(frozen=True)
class LoadResult:
    """Steady state of a deployment at an arrival rate (all replicas / pools together).

    ``utilisation`` is the busiest resource's load (prefill lane or running slots, 1 = saturated);
    ``mean_running_batch`` the mean number of running requests per (decode) replica;
    ``queue_wait_mean_s`` the mean time from arrival to the first scheduled chunk;
    ``kv_peak_utilisation`` the running batch's KV at its mean + 3 sd over the KV cache (> 1: expect
    preemptions); ``link_utilisation`` the KV-transfer link's (P/D with a ``KvLink``).
    Unstable: ``stable=False``, every latency ``inf``, throughputs = the estimated capacity.
    """

    stable: bool
    utilisation: float
    mean_running_batch: float
    queue_wait_mean_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    output_tokens_per_s: float
    requests_per_s: float
    decode_step_s: float = 0.0
    prefill_utilisation: float = 0.0
    slot_utilisation: float = 0.0
    bottleneck: str = ""
    kv_peak_utilisation: float = 0.0
    link_utilisation: float = 0.0


def _summary(values: np.ndarray, mean: float) -> Percentiles:
    """Mean as given; p50..p99 as order statistics of the quasi-random points."""
    if values.size == 0:
        return Percentiles.zero()
    s = np.sort(values)
    k = s.size - 1
    return Percentiles(float(mean), *(float(s[min(k, int(round(q * k)))]) for q in QUANTILES))


#: solved replicas and results, keyed on the cost model (identity), limits, replicas and traffic: the sizer asks
#: the same question again (a P/D prefill pool for every decode replica count it tries; the final pricing run
#: where the replica search already ran it), and a result is immutable (its percentiles computed once). 64: the
#: repeats come within one candidate's sizing (512 saved 9 more of chat's 817 solves), and an entry holds
#: arrays of the 1,024 quasi-random points (~100 KB)
_solved = IdentityCache(64)
_analyzed = IdentityCache(64)


def _key(pool: PoolSpec, traffic: Traffic) -> tuple[object, ...]:
    return (pool.cost, pool.limits, int(pool.replicas), float(traffic.rate_per_s), traffic.prompt, traffic.output,
            float(traffic.shared_prefix_fraction))


def _solve(pool: PoolSpec, traffic: Traffic, kind: PoolKind) -> tuple[PoolInputs, PoolSolution]:
    """One replica of ``pool`` serving its round-robin share of ``traffic``: rate ``lam / R`` with
    Erlang-R gaps (``ca2 = 1 / R``)."""

    def make() -> tuple[PoolInputs, PoolSolution]:
        inp = pool_inputs_of(pool, traffic, kind)
        replicas = pool.replicas
        sol = solve_pool(pool.cost, pool.limits, rate_per_s=traffic.rate_per_s / replicas, inputs=inp,
                         ca2=1.0 / replicas, kind=kind)
        return inp, sol

    return _solved.get((*_key(pool, traffic), kind.value), make)


def _unstable(
    *, utilisation: float, capacity_per_s: float, arrival_rate_per_s: float, mean_output: float, bottleneck: str,
    rho_lane: float, rho_slots: float,
) -> LoadResult:
    """An overloaded deployment: every latency ``inf``, throughputs at the estimated capacity (req/s)."""
    inf = Percentiles.unbounded()
    rate = min(capacity_per_s, arrival_rate_per_s)
    return LoadResult(
        stable=False, utilisation=utilisation, mean_running_batch=math.inf, queue_wait_mean_s=math.inf,
        ttft_s=inf, tpot_s=inf, e2e_s=inf, output_tokens_per_s=rate * mean_output, requests_per_s=rate,
        decode_step_s=math.inf, prefill_utilisation=rho_lane, slot_utilisation=rho_slots, bottleneck=bottleneck,
        kv_peak_utilisation=math.inf,
    )


class _Deferred:
    """Per-point TTFT / TPOT / E2E of a solved deployment, computed once on first use."""

    def __init__(
        self, ttft_parts: Callable[[], tuple[np.ndarray, float, np.ndarray, np.ndarray]], dec: PoolSolution,
        inp: PoolInputs,
    ) -> None:
        # -> (ttft per point, mean ttft, lane sojourn per point, the sojourn over which an arrival reaches the decode)
        self._ttft_parts = ttft_parts
        self._dec, self._inp = dec, inp
        self._ttft: tuple[np.ndarray, float, np.ndarray, np.ndarray] | None = None
        self._tpot: tuple[np.ndarray, np.ndarray] | None = None

    def ttft(self) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        if self._ttft is None:
            self._ttft = self._ttft_parts()
        return self._ttft

    def tpot(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self._dec.window is None:
            return None
        if self._tpot is None:
            u = qmc_points()
            parts = self.ttft()
            self._tpot = self._dec.tpot(self._inp, parts[2], _normal(u[:, 4]), u[:, 6], parts[3])
        return self._tpot

    def ttft_p(self) -> Percentiles:
        t, mean, _, _ = self.ttft()
        return _summary(t, mean)

    def tpot_p(self) -> Percentiles:
        tp = self.tpot()
        if tp is None:
            return Percentiles.zero()
        multi = self._inp.multi
        return _summary(tp[0][multi], _mean(tp[1][multi]) if multi.any() else 0.0)

    def e2e_p(self) -> Percentiles:
        t, mean, _, _ = self.ttft()
        tp = self.tpot()
        if tp is None:
            return _summary(t, mean)
        om1 = self._inp.O - 1.0
        return _summary(t + om1 * tp[0], mean + _mean(om1 * tp[1]))

    def percentiles(self) -> tuple[Percentiles, Percentiles, Percentiles]:
        return LazyPercentiles(self.ttft_p), LazyPercentiles(self.tpot_p), LazyPercentiles(self.e2e_p)


def analyze(pool: PoolSpec, traffic: Traffic, /) -> LoadResult:
    """Aggregated serving: ``traffic`` (Poisson arrivals) split round-robin over the ``pool.replicas``
    identical replicas of ``pool``, each of which prefills and decodes (formulas: ``recommender.load.pool``)."""
    if not isinstance(pool, PoolSpec) or not isinstance(traffic, Traffic):
        raise TypeError("analyze(pool: PoolSpec, traffic: Traffic) takes a PoolSpec and a Traffic")
    return _analyzed.get(_key(pool, traffic), lambda: _analyze(pool, traffic))


def _analyze(pool: PoolSpec, traffic: Traffic) -> LoadResult:
    arrival_rate_per_s = traffic.rate_per_s
    inp, sol = _solve(pool, traffic, PoolKind.AGGREGATED)
    if not sol.stable:
        return _unstable(utilisation=sol.utilisation, capacity_per_s=sol.capacity_per_s * pool.replicas,
                         arrival_rate_per_s=arrival_rate_per_s, mean_output=inp.E_O, bottleneck=sol.bottleneck,
                         rho_lane=sol.rho_lane, rho_slots=sol.rho_slots)
    own = sol.own
    assert own is not None

    def ttft_parts() -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        u, e = qmc_points(), qmc_exponentials()
        queue, resid = sol.ttft_wait(e[:, 2], u[:, 3])
        extra, uncovered, covered = sol.co_scheduled(queue * sol.lane_share, resid, u[:, 4])
        fixed = float(pool.cost.request_overhead_s)
        mean = sol.wait_total_mean_s + _mean(own) + _mean(extra) + fixed
        lane = uncovered + own - sol.before_last_s + extra
        return queue + resid + own + extra + fixed, mean, lane, lane + sol.hit_window(inp, covered)

    ttft_p, tpot_p, e2e_p = _Deferred(ttft_parts, sol, inp).percentiles()
    return LoadResult(
        stable=True,
        utilisation=sol.utilisation,
        mean_running_batch=sol.running,
        queue_wait_mean_s=sol.wait_total_mean_s,
        ttft_s=ttft_p,
        tpot_s=tpot_p,
        e2e_s=e2e_p,
        output_tokens_per_s=arrival_rate_per_s * inp.E_O,
        requests_per_s=arrival_rate_per_s,
        decode_step_s=sol.t_bar,
        prefill_utilisation=sol.rho_lane,
        slot_utilisation=sol.rho_slots,
        bottleneck=sol.bottleneck,
        kv_peak_utilisation=sol.kv_peak,
    )


_normal_cache: list[np.ndarray] = []


def _normal(u: np.ndarray) -> np.ndarray:
    if not _normal_cache:
        _normal_cache.append(ndtri(u))
    return _normal_cache[0]


def analyze_disaggregated(topology: Disaggregated, traffic: Traffic, /) -> LoadResult:
    """Disaggregated prefill/decode (vLLM P/D behind a proxy) under ``traffic``.

    Prefill pool: each request is prefilled with ``max_tokens=1`` (the pool is solved with ``O = 1``).
    Its KV moves to a decode replica in ``kv_transfer_s_per_token * P`` seconds. Decode pool: the
    request waits for a slot, then its first step computes one token (the prompt's KV is remote)
    and produces the first token the client sees, then ``O - 1`` decode steps without prefill
    interference. ``TTFT = W_p + own_p(P) + transfer(P) + W_d + R_d + first step`` (+ the link's
    ``handoff_s``, a delay that holds no link).

    With ``kv_link`` the transfer is a queue with a capacity (``recommender.load.link``): its wait and
    ``S(P)`` replace ``kv_transfer_s_per_token * P``, its utilisation counts like any pool's, and an
    over-subscribed link makes the deployment unstable (bottleneck ``kv_link``).
    """
    if not isinstance(topology, Disaggregated) or not isinstance(traffic, Traffic):
        raise TypeError("analyze_disaggregated(topology: Disaggregated, traffic: Traffic) takes exactly two arguments")
    prefill_replicas, decode_replicas = topology.prefill.replicas, topology.decode.replicas
    kv_transfer_s_per_token, kv_link = topology.kv_transfer_s_per_token, topology.kv_link
    arrival_rate_per_s = traffic.rate_per_s
    _, pre = _solve(topology.prefill, traffic, PoolKind.PREFILL)
    din, dec = _solve(topology.decode, traffic, PoolKind.DECODE)
    link = None
    if kv_link is not None:
        link = solve_link(kv_link, arrival_rate_per_s=arrival_rate_per_s, prefill_replicas=prefill_replicas,
                          decode_replicas=decode_replicas, prompt_tokens=din.P)
    link_util = link.utilisation if link is not None else 0.0
    if not (pre.stable and dec.stable) or link_util >= 1.0:
        cap = min(pre.capacity_per_s * prefill_replicas, dec.capacity_per_s * decode_replicas)
        if link is not None and link_util > 0.0:
            cap = min(cap, arrival_rate_per_s / link_util)
        worst, label = (pre, "prefill pool: ") if pre.utilisation >= dec.utilisation else (dec, "decode pool: ")
        util, neck = max(pre.utilisation, dec.utilisation), label + worst.bottleneck
        if link_util >= util:
            util, neck = link_util, "kv_link"
        return _unstable(utilisation=util, capacity_per_s=cap, arrival_rate_per_s=arrival_rate_per_s, mean_output=din.E_O,
                         bottleneck=neck, rho_lane=pre.rho_lane, rho_slots=dec.rho_slots)
    assert pre.own is not None and dec.own is not None
    pre_own, dec_own = pre.own, dec.own
    if link is not None:
        transfer_pts, transfer_mean = link.transfer_s, float(link.transfer_s.mean()) + link.wait_mean_s
    else:
        transfer_pts, transfer_mean = kv_transfer_s_per_token * din.P, kv_transfer_s_per_token * din.E_P

    def ttft_parts() -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        u, e = qmc_points(), qmc_exponentials()
        pre_queue, _ = pre.ttft_wait(e[:, 2], u[:, 3])
        pre_extra, _, _ = pre.co_scheduled(pre_queue * pre.lane_share, np.zeros_like(pre_queue), u[:, 4])
        dec_queue, dec_resid = dec.ttft_wait(e[:, 5], u[:, 3])
        # the request's own fixed costs: the engine's per-request overhead and the P/D handoff (recommender.load.link)
        fixed = float(topology.decode.cost.request_overhead_s) + (kv_link.handoff_s if kv_link is not None else 0.0)
        # the link queue shares the prefill wait's quasi-random column: both are high together (conservative)
        link_wait = link.wait(e[:, 2]) if link is not None else 0.0
        ttft = pre_queue + pre_own + pre_extra + transfer_pts + link_wait + dec_queue + dec_resid + dec_own + fixed
        mean = (
            pre.wait_total_mean_s + _mean(pre_own) + _mean(pre_extra) + transfer_mean
            + dec.wait_total_mean_s + _mean(dec_own) + fixed
        )
        lane = dec_resid + dec_own
        return ttft, mean, lane, lane

    ttft_p, tpot_p, e2e_p = _Deferred(ttft_parts, dec, din).percentiles()
    label = "prefill pool: " + pre.bottleneck if pre.utilisation >= dec.utilisation else "decode pool: " + dec.bottleneck
    if link_util > max(pre.utilisation, dec.utilisation):
        label = "kv_link"
    return LoadResult(
        stable=True,
        utilisation=max(pre.utilisation, dec.utilisation, link_util),
        mean_running_batch=dec.running,
        queue_wait_mean_s=pre.wait_total_mean_s + dec.wait_total_mean_s,
        ttft_s=ttft_p,
        tpot_s=tpot_p,
        e2e_s=e2e_p,
        output_tokens_per_s=arrival_rate_per_s * din.E_O,
        requests_per_s=arrival_rate_per_s,
        decode_step_s=dec.t_bar,
        prefill_utilisation=pre.utilisation,
        slot_utilisation=dec.rho_slots,
        bottleneck=label,
        kv_peak_utilisation=max(pre.kv_peak, dec.kv_peak),
        link_utilisation=link_util,
    )
