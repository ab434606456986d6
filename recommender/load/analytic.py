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

import numpy as np
from scipy.special import ndtri

from recommender.errors import ConfigError
from recommender.load.percentiles import QUANTILES, Percentiles
from recommender.load.pool import PoolInputs, PoolSolution, pool_inputs, solve_pool
from recommender.load.protocols import LengthDistribution, Limits, StepCost
from recommender.load.summaries import qmc_points


@dataclass(frozen=True)
class LoadResult:
    """Steady state of a deployment at an arrival rate (all replicas / pools together).

    ``utilisation`` is the busiest resource's load (prefill lane or running slots, 1 = saturated);
    ``mean_running_batch`` the mean number of running requests per (decode) replica;
    ``queue_wait_mean_s`` the mean time from arrival to the first scheduled chunk.
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


def _summary(values: np.ndarray, mean: float) -> Percentiles:
    """Mean as given; p50..p99 as order statistics of the quasi-random points."""
    if values.size == 0:
        return Percentiles.zero()
    s = np.sort(values)
    k = s.size - 1
    return Percentiles(float(mean), *(float(s[min(k, int(round(q * k)))]) for q in QUANTILES))


def _unstable(util: float, capacity_per_s: float, arrival_rate_per_s: float, mean_output: float, neck: str, rho_l: float, rho_s: float) -> LoadResult:
    inf = Percentiles.unbounded()
    rate = min(capacity_per_s, arrival_rate_per_s)
    return LoadResult(
        stable=False, utilisation=util, mean_running_batch=math.inf, queue_wait_mean_s=math.inf,
        ttft_s=inf, tpot_s=inf, e2e_s=inf, output_tokens_per_s=rate * mean_output, requests_per_s=rate,
        decode_step_s=math.inf, prefill_utilisation=rho_l, slot_utilisation=rho_s, bottleneck=neck,
    )


def _check(arrival_rate_per_s: float, *replicas: int) -> None:
    if not (arrival_rate_per_s > 0.0) or not math.isfinite(arrival_rate_per_s):
        raise ConfigError(f"arrival rate must be a positive number of requests per second, got {arrival_rate_per_s!r}")
    for r in replicas:
        if int(r) < 1:
            raise ConfigError(f"replicas must be at least 1, got {r!r}")


def _latencies(
    ttft: np.ndarray, ttft_mean: float, lane_sojourn: np.ndarray, dec: PoolSolution, inp: PoolInputs
) -> tuple[Percentiles, Percentiles, Percentiles]:
    """TTFT / TPOT / E2E summaries from per-point TTFT and the decode pool's TPOT model."""
    if dec.base_sigma is None:
        return _summary(ttft, ttft_mean), Percentiles.zero(), _summary(ttft, ttft_mean)
    u = qmc_points()
    tpot, tpot_cond_mean = dec.tpot(inp, lane_sojourn, _normal(u[:, 4]), u[:, 6])
    om1 = inp.O - 1.0
    e2e = ttft + om1 * tpot
    multi = inp.multi
    tpot_mean = float(tpot_cond_mean[multi].mean()) if multi.any() else 0.0
    e2e_mean = ttft_mean + float((om1 * tpot_cond_mean).mean())
    return _summary(ttft, ttft_mean), _summary(tpot[multi], tpot_mean), _summary(e2e, e2e_mean)


def analyze(
    cost: StepCost,
    limits: Limits,
    arrival_rate_per_s: float,
    prompt: LengthDistribution,
    output: LengthDistribution,
    replicas: int = 1,
    shared_prefix_fraction: float = 0.0,
) -> LoadResult:
    """Aggregated serving: Poisson arrivals at ``arrival_rate_per_s`` split round-robin over ``replicas``
    identical replicas that each prefill and decode (formulas: ``recommender.load.pool``)."""
    _check(arrival_rate_per_s, replicas)
    lam = arrival_rate_per_s / replicas
    inp = pool_inputs(prompt, output, shared_prefix_fraction, int(cost.kv_block_tokens), bool(limits.enable_prefix_caching), "both")
    pool = solve_pool(cost, limits, lam, inp, 1.0 / replicas, "both")
    if not pool.stable:
        return _unstable(pool.utilisation, pool.capacity_per_s * replicas, arrival_rate_per_s, inp.E_O, pool.bottleneck, pool.rho_lane, pool.rho_slots)
    assert pool.own is not None
    u = qmc_points()
    queue, resid = pool.ttft_wait(u[:, 2], u[:, 3])
    extra, uncovered = pool.co_scheduled(queue * pool.lane_share + resid)
    ttft = queue + resid + pool.own + extra
    ttft_mean = pool.wait_total_mean_s + float(pool.own.mean()) + float(extra.mean())
    ttft_p, tpot_p, e2e_p = _latencies(ttft, ttft_mean, uncovered + pool.own + extra, pool, inp)
    return LoadResult(
        stable=True,
        utilisation=pool.utilisation,
        mean_running_batch=pool.running,
        queue_wait_mean_s=pool.wait_total_mean_s,
        ttft_s=ttft_p,
        tpot_s=tpot_p,
        e2e_s=e2e_p,
        output_tokens_per_s=arrival_rate_per_s * inp.E_O,
        requests_per_s=arrival_rate_per_s,
        decode_step_s=pool.t_bar,
        prefill_utilisation=pool.rho_lane,
        slot_utilisation=pool.rho_slots,
        bottleneck=pool.bottleneck,
    )


_normal_cache: list[np.ndarray] = []


def _normal(u: np.ndarray) -> np.ndarray:
    if not _normal_cache:
        _normal_cache.append(ndtri(u))
    return _normal_cache[0]


def analyze_disaggregated(
    prefill_cost: StepCost,
    prefill_limits: Limits,
    prefill_replicas: int,
    decode_cost: StepCost,
    decode_limits: Limits,
    decode_replicas: int,
    kv_transfer_s_per_token: float,
    arrival_rate_per_s: float,
    prompt: LengthDistribution,
    output: LengthDistribution,
    shared_prefix_fraction: float = 0.0,
) -> LoadResult:
    """Disaggregated prefill/decode (vLLM P/D behind a proxy).

    Prefill pool: each request is prefilled with ``max_tokens=1`` (the pool is solved with ``O = 1``).
    Its KV moves to a decode replica in ``kv_transfer_s_per_token * P`` seconds. Decode pool: the
    request waits for a slot, then its first step computes one token (the prompt's KV is remote)
    and produces the first token the client sees, then ``O - 1`` decode steps without prefill
    interference. ``TTFT = W_p + own_p(P) + transfer(P) + W_d + R_d + first step``.
    """
    _check(arrival_rate_per_s, prefill_replicas, decode_replicas)
    if kv_transfer_s_per_token < 0.0:
        raise ConfigError(f"kv_transfer_s_per_token must be >= 0, got {kv_transfer_s_per_token!r}")
    pin = pool_inputs(prompt, output, shared_prefix_fraction, int(prefill_cost.kv_block_tokens), bool(prefill_limits.enable_prefix_caching), "prefill")
    din = pool_inputs(prompt, output, 0.0, int(decode_cost.kv_block_tokens), False, "decode")
    pre = solve_pool(prefill_cost, prefill_limits, arrival_rate_per_s / prefill_replicas, pin, 1.0 / prefill_replicas, "prefill")
    dec = solve_pool(decode_cost, decode_limits, arrival_rate_per_s / decode_replicas, din, 1.0 / decode_replicas, "decode")
    if not (pre.stable and dec.stable):
        cap = min(pre.capacity_per_s * prefill_replicas, dec.capacity_per_s * decode_replicas)
        worst, label = (pre, "prefill pool: ") if pre.utilisation >= dec.utilisation else (dec, "decode pool: ")
        return _unstable(max(pre.utilisation, dec.utilisation), cap, arrival_rate_per_s, din.E_O, label + worst.bottleneck, pre.rho_lane, dec.rho_slots)
    assert pre.own is not None and dec.own is not None
    u = qmc_points()
    transfer = kv_transfer_s_per_token * din.P
    pre_queue, _ = pre.ttft_wait(u[:, 2], u[:, 3])
    pre_extra, _ = pre.co_scheduled(pre_queue * pre.lane_share)
    dec_queue, dec_resid = dec.ttft_wait(u[:, 5], u[:, 3])
    dec_wait = dec_queue + dec_resid
    ttft = pre_queue + pre.own + pre_extra + transfer + dec_wait + dec.own
    ttft_mean = (
        pre.wait_total_mean_s + float(pre.own.mean()) + float(pre_extra.mean()) + kv_transfer_s_per_token * din.E_P
        + dec.wait_total_mean_s + float(dec.own.mean())
    )
    ttft_p, tpot_p, e2e_p = _latencies(ttft, ttft_mean, dec_resid + dec.own, dec, din)
    label = "prefill pool: " + pre.bottleneck if pre.utilisation >= dec.utilisation else "decode pool: " + dec.bottleneck
    return LoadResult(
        stable=True,
        utilisation=max(pre.utilisation, dec.utilisation),
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
    )
