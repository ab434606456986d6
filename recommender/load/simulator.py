"""Discrete-event simulator of vLLM-like replicas: requests, pools, P/D, and what the runs add up to.

Each replica is a ``recommender.load.scheduler.ReplicaScheduler``: a vLLM-v1-like scheduler stepping
one engine iteration at a time (decodes, the partial prefill, FCFS admission with chunking, preemption
by recompute, finishes; the phases are documented there).

Requests are routed round-robin over replicas (each replica is simulated on its own, since routing
does not depend on state). Arrivals: Poisson (gamma gaps with shape ``burstiness``, the
``vllm bench serve --burstiness`` convention: 1 = Poisson, < 1 burstier), or replayed from a trace.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from recommender import progress
from recommender.errors import ConfigError
from recommender.load.link import KvLink
from recommender.load.percentiles import Percentiles
from recommender.load.scheduler import ReplicaScheduler, ReplicaStats, Requests
from recommender.load.topology import Disaggregated, PoolKind, PoolSpec, Replay, Traffic


@dataclass(frozen=True)
class TimeSeries:
    """State sampled every ``interval_s`` of simulated time (all replicas of a pool together):
    waiting requests, running requests, and used KV blocks as a fraction of all blocks (mean over
    replicas)."""

    interval_s: float
    t_s: tuple[float, ...]
    queue_len: tuple[int, ...]
    running: tuple[int, ...]
    kv_usage: tuple[float, ...]


@dataclass(frozen=True)
class SimResult:
    """Simulated percentiles (over completed requests, after ``warmup_requests``) and counts.

    ``output_tokens_per_s`` / ``requests_per_s`` are over ``duration_s`` = first arrival to last
    completion (what ``vllm bench serve`` reports); ``mean_in_system`` is the time average of waiting +
    running requests over that span (Little's law: ``mean_in_system = requests_per_s * e2e mean``).
    Steady state over the second half of the arrivals (from the median arrival to the last one):
    ``served_fraction`` = requests completed in that window / requests that arrived in it, for the
    whole window and for its last half (``served_fraction_late``). Completions minus arrivals is the
    change of the number in system, so a growing queue shows as a fraction below 1. ``stable``:
    at least ``STABLE_SERVED_FRACTION`` (98%) over the half, and over its last half (shorter, so the number
    in system moves it more: chat at 80 req/s, stable, reads 0.978) ``STABLE_LATE_FRACTION`` (95%) or a
    deficit (arrivals - completions) within the mean number in system (chat on one H100 at 0.79 of its
    capacity, 3,556 requests, seed 3, read 0.930: 62 requests behind with ~100 in the system).
    """

    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    queue_wait_mean_s: float
    completed: int
    preempted: int
    duration_s: float
    output_tokens_per_s: float
    requests_per_s: float
    mean_running_batch: float
    mean_in_system: float
    busy_fraction: float
    stable: bool
    steps: int
    timeseries: TimeSeries
    prefill_timeseries: TimeSeries | None = None
    served_fraction: float = 1.0
    served_fraction_late: float = 1.0
    warmup_requests: int = 0
    # over the stability window (median arrival to last arrival): arrivals - completions (the growth of the
    # number in system) and the growth of the waiting queues (every pool's) within it
    in_system_growth: int = 0
    waiting_growth: int = 0

    @property
    def filling(self) -> bool:
        """Not :attr:`stable`, but the requests that piled up over the stability window sit mostly in the running
        batches, not in the waiting queues (``waiting_growth < in_system_growth / 2``): the run ended while its
        batches were still filling towards steady state (a run shorter than a few request latencies), so it
        cannot tell an overload from a fill. An overloaded engine runs its batch at a limit (``max_num_seqs``,
        KV, token budget) and what arrives beyond its capacity waits: its waiting queue grows by about the
        whole deficit."""
        return not self.stable and 2 * self.waiting_growth < self.in_system_growth


def _arrivals(rng: random.Random, rate_per_s: float, n: int, burstiness: float) -> list[float]:
    """Gamma-distributed gaps with shape ``burstiness`` and mean ``1 / rate`` (exponential at 1)."""
    t, out = 0.0, []
    for _ in range(n):
        if burstiness == 1.0:
            t += rng.expovariate(rate_per_s)
        else:
            t += rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))
        out.append(t)
    return out


def _workload(
    load: Traffic | Replay, n_requests: int, seed: int, burstiness: float
) -> tuple[list[float], list[int], list[int]]:
    """(arrival times s, prompt tokens, output tokens) per request: the ``Replay`` rows sorted by arrival
    (the first ``n_requests`` if > 0), or ``n_requests`` seeded requests of the ``Traffic``."""
    if isinstance(load, Replay):
        rows = sorted((float(a), int(p), int(o)) for a, p, o in load.rows)
        if n_requests > 0:
            rows = rows[:n_requests]
        if not rows:
            raise ConfigError("the trace has no requests")
        return [r[0] for r in rows], [max(1, r[1]) for r in rows], [max(1, r[2]) for r in rows]
    if n_requests < 1:
        raise ConfigError(f"the number of requests must be at least 1, got {n_requests}")
    if not (burstiness > 0.0):
        raise ConfigError(f"burstiness (gamma shape) must be > 0, got {burstiness!r}; 1.0 is Poisson")
    rng = random.Random(seed)
    arr = _arrivals(rng, load.rate_per_s, n_requests, burstiness)
    prompts = [max(1, int(x)) for x in load.prompt.sample(rng, n_requests)]
    return arr, prompts, [max(1, int(x)) for x in load.output.sample(rng, n_requests)]


def tokens_in_kv(pool: PoolSpec, kind: PoolKind, prompts: list[int], shared_prefix_fraction: float) -> list[int]:
    """``prompt_tokens_in_kv`` per request, as ints."""
    hits = pool.tokens_in_kv(np.asarray(prompts, dtype=float), kind=kind, shared_prefix_fraction=shared_prefix_fraction)
    out: list[int] = hits.astype(np.int64).tolist()
    return out


def check_fits(pool: PoolSpec, prompts: list[int], outputs: list[int], what: str) -> None:
    """Refuse a request whose prompt + output tokens exceed one replica's KV cache (whole blocks)."""
    block = int(pool.cost.kv_block_tokens)
    cap = int(pool.cost.kv_capacity_tokens) // block * block
    worst = max(p + o for p, o in zip(prompts, outputs))
    if worst > cap:
        raise ConfigError(
            f"a request of {worst} tokens (prompt + output) does not fit the {what} KV cache of {cap} tokens per replica; "
            "use a larger GPU / tensor parallelism or cap the lengths"
        )


def _run_pool(
    pool: PoolSpec, req: Requests, order: list[int], interval_s: float, what: str = "simulate",
) -> tuple[list[ReplicaStats], TimeSeries]:
    """Run ``order``'s requests round-robin over the pool's replicas (request ``order[i]`` on replica
    ``i mod R``); the time series of all replicas together (on the coarsest replica's sample grid)."""
    replicas = pool.replicas
    with progress.bar(what, total=len(order), unit="req") as bar:
        stats = [
            ReplicaScheduler(pool.cost, pool.limits, req, order[k::replicas], sample_interval_s=interval_s,
                             max_samples=MAX_SAMPLES, tick=bar.update).run()
            for k in range(replicas)
        ]
    coarse = max(s.interval_s for s in stats)
    series = []
    for s in stats:
        stride = int(round(coarse / s.interval_s)) if s.interval_s > 0 else 1
        series.append(s.samples[::stride])
    n = max(len(x) for x in series)
    q = [0] * n
    run = [0] * n
    kv = [0.0] * n
    for x in series:
        for i, (a, b, c) in enumerate(x):
            q[i] += a
            run[i] += b
            kv[i] += c / replicas
    ts = TimeSeries(coarse, tuple(i * coarse for i in range(n)), tuple(q), tuple(run), tuple(kv))
    return stats, ts


def _result(
    *, arrival_s: list[float], req: Requests, waits: list[float], stats: list[ReplicaStats], replicas: int, warmup_requests: int,
    ts: TimeSeries, request_overhead_s: float, upstream: Sequence[ReplicaStats] = (), extra_in_system_s: float = 0.0,
    prefill_ts: TimeSeries | None = None,
) -> SimResult:
    """Percentiles and counts of requests that arrived at ``arrival_s`` and were served as ``req`` by the
    last pool (``stats``, ``replicas``); ``upstream`` (a prefill pool) adds its preemptions and steps,
    ``extra_in_system_s`` its request-seconds (and the KV transfers')."""
    arr, first, finish, outputs = arrival_s, req.first_token, req.finish, req.output
    n = len(arr)
    start = min(arr)
    end = max(finish)
    duration = max(end - start, 1e-12)
    a = np.asarray(arr)
    f1 = np.asarray(first) + request_overhead_s  # API server / tokenisation / first chunk, per request
    fin = np.asarray(finish) + request_overhead_s
    out = np.asarray(outputs, dtype=float)
    keep = np.arange(n) >= min(warmup_requests, n - 1)
    multi = keep & (out > 1)
    tpot = (fin[multi] - f1[multi]) / (out[multi] - 1.0)
    in_system = sum(s.in_system_integral for s in stats) + extra_in_system_s
    served, served_late, came_late = served_fractions(arr, finish)
    grown, waiting_grown = _window_growth(arr, finish, [ts] if prefill_ts is None else [ts, prefill_ts])
    mean_in_system = in_system / duration
    # the late quarter's deficit (arrivals - completions) is the change of the number in system over it: a
    # stable queue moves by about its mean, so a deficit within the mean number in system is not a trend
    late_ok = served_late >= STABLE_LATE_FRACTION or (1.0 - served_late) * came_late <= mean_in_system
    return SimResult(
        ttft_s=Percentiles.from_samples(f1[keep] - a[keep]),
        tpot_s=Percentiles.from_samples(tpot),
        e2e_s=Percentiles.from_samples(fin[keep] - a[keep]),
        queue_wait_mean_s=float(np.mean(np.asarray(waits)[keep])),
        completed=n,
        preempted=sum(s.preempted for s in stats) + sum(s.preempted for s in upstream),
        duration_s=duration,
        output_tokens_per_s=float(out.sum()) / duration,
        requests_per_s=n / duration,
        mean_running_batch=sum(s.running_integral for s in stats) / duration / replicas,
        mean_in_system=mean_in_system,
        busy_fraction=sum(s.busy_s for s in stats) / duration / replicas,
        stable=served >= STABLE_SERVED_FRACTION and late_ok,
        steps=sum(s.steps for s in stats) + sum(s.steps for s in upstream),
        timeseries=ts,
        prefill_timeseries=prefill_ts,
        served_fraction=served,
        served_fraction_late=served_late,
        warmup_requests=int(min(warmup_requests, n - 1)),
        in_system_growth=grown,
        waiting_growth=waiting_grown,
    )


def _window_growth(arrivals: Sequence[float], finishes: Sequence[float], series: Sequence[TimeSeries]) -> tuple[int, int]:
    """(arrivals - completions, growth of the waiting requests of all ``series``) over the window
    :func:`served_fractions` judges stability on, from the median arrival to the last; (0, 0) under 40 requests."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    f = np.asarray(finishes, dtype=float)
    if a.size < 40:
        return 0, 0
    t0, t1 = float(a[a.size // 2]), float(a[-1])
    came = int(np.count_nonzero((a > t0) & (a <= t1)))
    done = int(np.count_nonzero((f > t0) & (f <= t1)))

    def waiting(t: float) -> int:
        return sum(s.queue_len[min(max(int(t / s.interval_s), 0), len(s.queue_len) - 1)]
                   for s in series if s.queue_len and s.interval_s > 0)

    return came - done, waiting(t1) - waiting(t0)


STABLE_SERVED_FRACTION = 0.98
MAX_SAMPLES = 4000  # time-series points per replica: past this the interval doubles
STABLE_LATE_FRACTION = 0.95  # a quarter of the run: the number in system alone moves it by a few percent


def served_fractions(arrivals: Sequence[float], finishes: Sequence[float]) -> tuple[float, float, int]:
    """(completions / arrivals over [median arrival, last arrival], the same over its last half, arrivals in
    that last half)."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    f = np.asarray(finishes, dtype=float)
    n = a.size
    if n < 40:
        return 1.0, 1.0, 0

    def frac(t0: float, t1: float) -> float:
        came = np.count_nonzero((a > t0) & (a <= t1))
        done = np.count_nonzero((f > t0) & (f <= t1))
        return done / came if came else 1.0

    t_mid, t_late, t_end = float(a[n // 2]), float(a[(3 * n) // 4]), float(a[-1])
    return float(frac(t_mid, t_end)), float(frac(t_late, t_end)), int(np.count_nonzero((a > t_late) & (a <= t_end)))


def _interval(arr: list[float], sample_interval_s: float | None) -> float:
    if sample_interval_s is not None:
        if not sample_interval_s > 0.0:
            raise ConfigError(f"sample interval must be > 0 s, got {sample_interval_s!r}")
        return float(sample_interval_s)
    return max(max(arr) - min(0.0, min(arr)), 1e-3) / 500.0


def simulate(
    pool: PoolSpec,
    load: Traffic | Replay,
    *,
    n_requests: int = 0,
    seed: int = 0,
    burstiness: float = 1.0,
    warmup_requests: int = 0,
    sample_interval_s: float | None = None,
    cold_start_s: float = 0.0,
) -> SimResult:
    """Simulate ``n_requests`` requests of ``load`` (a ``Traffic``: seeded arrivals with gamma gaps of shape
    ``burstiness``, 1 = Poisson; or a ``Replay``: its rows, the first ``n_requests`` if > 0) on the
    ``pool.replicas`` aggregated replicas of ``pool``; deterministic for a seed. ``warmup_requests`` first
    requests are left out of the latency percentiles (not out of throughput). Time series are sampled
    every ``sample_interval_s`` (default: 1/500 of the arrival span, coarsened to keep <= 4000 points).
    ``cold_start_s``: the servers take no request before that time (s; a benchmark's cold start, the profile's
    ``first_wave_overhead_s``): an earlier arrival is scheduled at it, its latencies counted from its arrival."""
    arr, prompts, outputs = _workload(load, n_requests, seed, burstiness)
    check_fits(pool, prompts, outputs, "replica")
    hits = tokens_in_kv(pool, PoolKind.AGGREGATED, prompts, load.shared_prefix_fraction)
    req = Requests.new([max(a, cold_start_s) for a in arr], prompts, outputs, hits, hits)
    stats, ts = _run_pool(pool, req, list(range(len(arr))), _interval(arr, sample_interval_s))
    waits = [req.admitted[i] - arr[i] for i in range(len(arr))]
    return _result(arrival_s=arr, req=req, waits=waits, stats=stats, replicas=pool.replicas,
                   warmup_requests=warmup_requests, ts=ts, request_overhead_s=float(pool.cost.request_overhead_s))


def _link_fifo(link: KvLink, ready: list[float], prompts: list[int], replicas: int) -> list[float]:
    """Arrival at the decode pool of each request: its KV waits for its prefill replica's link
    (request ``i`` was prefilled on replica ``i % replicas``), FIFO in order of prefill completion."""
    done = [0.0] * len(ready)
    for k in range(replicas):
        free = -math.inf
        for i in sorted(range(k, len(ready), replicas), key=lambda j: ready[j]):
            free = max(free, ready[i]) + float(link.transfer_s(prompts[i]))
            done[i] = free
    return done


def simulate_disaggregated(
    topology: Disaggregated,
    load: Traffic | Replay,
    *,
    n_requests: int = 0,
    seed: int = 0,
    burstiness: float = 1.0,
    warmup_requests: int = 0,
    sample_interval_s: float | None = None,
) -> SimResult:
    """Prefill pool (each request prefilled with one output token), KV transfer of
    ``kv_transfer_s_per_token * prompt`` seconds, then a decode pool where the request's first step
    computes one token (the rest of its KV is remote) and emits the first token the client sees.
    With ``kv_link`` the transfers queue FIFO on their prefill replica's link, each holding it for
    ``kv_link.transfer_s(prompt)`` (instead of the fixed delay), and reach the decode pool ``kv_link.handoff_s``
    after their transfer ends. Requests and keywords as ``simulate``.
    ``timeseries`` is the decode pool, ``prefill_timeseries`` the prefill pool."""
    prefill, decode, fraction = topology.prefill, topology.decode, load.shared_prefix_fraction
    arr, prompts, outputs = _workload(load, n_requests, seed, burstiness)
    n = len(arr)
    check_fits(prefill, prompts, [1] * n, "prefill")
    check_fits(decode, prompts, outputs, "decode")
    interval = _interval(arr, sample_interval_s)
    hits = tokens_in_kv(prefill, PoolKind.PREFILL, prompts, fraction)
    pre = Requests.new(arr, prompts, [1] * n, hits, hits)
    pre_stats, pre_ts = _run_pool(prefill, pre, list(range(n)), interval, "simulate prefill pool")
    if topology.kv_link is None:
        transfer = [topology.kv_transfer_s_per_token * p for p in prompts]
        arr_d = [pre.finish[i] + transfer[i] for i in range(n)]
    else:
        # the handoff is a delay after the transfer that holds no link (recommender.load.link)
        arr_d = [t + topology.kv_link.handoff_s for t in _link_fifo(topology.kv_link, pre.finish, prompts,
                                                                      prefill.replicas)]
        transfer = [arr_d[i] - pre.finish[i] for i in range(n)]
    remote = tokens_in_kv(decode, PoolKind.DECODE, prompts, fraction)
    recompute = tokens_in_kv(decode, PoolKind.AGGREGATED, prompts, fraction)  # after a preemption
    dec = Requests.new(arr_d, prompts, outputs, remote, recompute)
    order = sorted(range(n), key=lambda i: arr_d[i])
    dec_stats, dec_ts = _run_pool(decode, dec, order, interval)
    waits = [(pre.admitted[i] - arr[i]) + (dec.admitted[i] - arr_d[i]) for i in range(n)]
    return _result(arrival_s=arr, req=dec, waits=waits, stats=dec_stats, replicas=decode.replicas,
                   warmup_requests=warmup_requests, ts=dec_ts, request_overhead_s=float(decode.cost.request_overhead_s),
                   upstream=pre_stats, extra_in_system_s=sum(s.in_system_integral for s in pre_stats) + sum(transfer),
                   prefill_ts=pre_ts)
