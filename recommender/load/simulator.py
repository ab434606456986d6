"""Discrete-event simulator of a vLLM-v1-like scheduler, one engine step at a time.

Per replica, each step (``vllm/v1/core/sched/scheduler.py`` order):

1. running requests first: every decoding sequence gets one token; a sequence whose next token
   starts a new KV block (``computed % block == 0``) needs a free block, and while there are too few,
   the most recently admitted running request is preempted (recompute: its blocks are freed, it goes
   back to the front of the waiting queue, and later prefills prompt + generated tokens again);
2. the (at most one) partially prefilled request continues with ``min(remaining, budget left)``
   tokens (preempting from the tail if its blocks do not fit);
3. if nothing was preempted in this step, waiting requests are admitted FCFS while the token budget
   (``max_num_batched_tokens``), ``max_num_seqs`` and free KV blocks allow. With chunked prefill the
   last admitted prompt may be cut to the remaining budget; without it a prompt must fit whole in the
   remaining budget (decodes and whole prefills share steps, as in vLLM v1), or run alone in an
   otherwise empty step. A prefix-cache hit skips whole blocks of the shared prefix (at most
   ``prompt - 1`` tokens); every sequence still holds its own KV blocks. An engine with nothing to do
   starts a step as soon as a request arrives.
4. the step takes ``cost.step_s(tokens, kv_read_bytes, attention_flops)``; a request whose prefill
   completes emits a token at the end of the step (its first token, or the next one after a
   recompute); decoders finishing their output leave at the end of the step.

Speed: decoders are kept as aggregates, not walked every step. Where ``decode_seq_cost`` is affine in
the context (checked once; from the window on for sliding-window attention), the step's decode KV
bytes / FLOPs follow from the number of decoders and the sum of their contexts, which grows by the
number of decoders per step; decoders below that context are costed one by one until they reach
it. Block needs come from a histogram of ``(context - step) mod block`` (a decoder needs a new block
exactly when ``(key + step) % block == 0``); finish steps sit in a heap; per-sequence state is only
touched on admission, completion and preemption. About 1-2 us of Python per step.

Requests are routed round-robin over replicas (each replica is simulated on its own, since routing
does not depend on state). Arrivals: Poisson (gamma gaps with shape ``burstiness``, the
``vllm bench serve --burstiness`` convention: 1 = Poisson, < 1 burstier), or replayed from a trace.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from recommender import progress
from recommender.errors import ConfigError
from recommender.load.link import KvLink
from recommender.load.percentiles import Percentiles
from recommender.load.protocols import Limits, StepCost
from recommender.load.summaries import cost_summary
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
    at least ``STABLE_SERVED_FRACTION`` (98%) over the half and ``STABLE_LATE_FRACTION`` (95%) over its
    last half (shorter, so the number in system moves it more: chat at 80 req/s, stable, reads 0.978).
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


@dataclass
class _Requests:
    """Per-request arrays shared by all replicas (indexed by request id)."""

    arrival: list[float]
    prompt: list[int]
    output: list[int]
    hit_first: list[int]  # tokens already in KV at first admission (prefix-cache hit, or remote KV)
    hit_again: list[int]  # the same after a preemption
    first_token: list[float]
    finish: list[float]
    admitted: list[float]


@dataclass
class _ReplicaStats:
    preempted: int = 0
    steps: int = 0
    busy_s: float = 0.0
    in_system_integral: float = 0.0
    running_integral: float = 0.0
    samples: list[tuple[int, int, float]] | None = None
    interval_s: float = 0.0


def _run_replica(
    cost: StepCost,
    limits: Limits,
    req: _Requests,
    ids: Sequence[int],
    sample_interval_s: float,
    max_samples: int,
    tick: Callable[[int], object] | None = None,
) -> _ReplicaStats:
    """Simulate one replica serving requests ``ids`` (in arrival order); fills ``req`` times in place.
    ``tick(1)`` is called per finished request (progress)."""
    cs = cost_summary(cost)
    step_s = cost.step_s
    chunk_cost = cost.prefill_chunk_cost
    seq_cost = cost.decode_seq_cost
    affine_from = cs.decode_affine_from_tokens
    kv0, kv1, fl0, fl1 = cs.kv0, cs.kv1, cs.fl0, cs.fl1
    bs = int(cost.kv_block_tokens)
    total_blocks = int(cost.kv_capacity_tokens) // bs
    budget_max = int(limits.max_num_batched_tokens)
    max_seqs = max(1, int(limits.max_num_seqs))
    chunked = bool(limits.chunked_prefill)
    arrival, prompt, output = req.arrival, req.prompt, req.output
    first_token, finish, admitted = req.first_token, req.finish, req.admitted

    st = _ReplicaStats(samples=[])
    samples = st.samples
    assert samples is not None
    free = total_blocks
    waiting: deque[int] = deque()
    running: dict[int, None] = {}
    # Per-request scheduler state (dicts: only this replica's requests).
    gen: dict[int, int] = {}  # tokens generated so far
    computed: dict[int, int] = {}  # tokens in KV (prefilling requests)
    blocks: dict[int, int] = {}  # blocks held (prefilling requests)
    key: dict[int, int] = {}  # decoders: context - step at registration
    epoch: dict[int, int] = {}
    dec_n = 0  # all decoders (block accounting)
    dec_key_sum = 0
    old_n = 0  # decoders whose context is in the affine range of decode_seq_cost (cost by aggregate)
    old_key_sum = 0
    young: dict[int, int] = {}  # the others: rid -> key, costed one by one until promoted
    promote: list[tuple[int, int, int]] = []  # (step at which the context reaches affine_from, rid, epoch)
    phase = [0] * bs
    heap: list[tuple[int, int, int]] = []
    pref = -1  # the partially prefilled request, if any
    t = 0
    now = arrival[ids[0]] if ids else 0.0
    next_sample = 0.0
    i_next, m = 0, len(ids)
    empty_steps = 0

    def sample_until(time_s: float) -> None:
        nonlocal next_sample, sample_interval_s
        while next_sample <= time_s:
            samples.append((len(waiting), len(running), (total_blocks - free) / total_blocks))
            next_sample += sample_interval_s

    def remove_decoder(r: int) -> int:
        """Drop decoder ``r`` from the aggregates; returns its KV blocks."""
        nonlocal dec_n, dec_key_sum, old_n, old_key_sum
        k = key.pop(r)
        dec_n -= 1
        dec_key_sum -= k
        if young.pop(r, None) is None:
            old_n -= 1
            old_key_sum -= k
        phase[k % bs] -= 1
        return -(-(k + t) // bs)

    def preempt_tail() -> None:
        nonlocal free, pref
        v = next(reversed(running))
        del running[v]
        if v == pref:
            free += blocks.pop(v)
            pref = -1
            computed.pop(v, None)
        else:
            ctx = key[v] + t
            free += remove_decoder(v)
            gen[v] = ctx - prompt[v] + 1
        epoch[v] = epoch.get(v, 0) + 1
        waiting.appendleft(v)
        st.preempted += 1

    while True:
        while i_next < m and arrival[ids[i_next]] <= now:
            r = ids[i_next]
            waiting.append(r)
            st.in_system_integral += now - arrival[r]
            i_next += 1
        if not running and not waiting:
            if i_next >= m:
                break
            sample_until(arrival[ids[i_next]])
            now = arrival[ids[i_next]]
            continue
        sample_until(now)
        budget = budget_max
        preempted = False
        tokens = 0
        kv = fl = 0.0
        # 1. decodes (and the KV blocks their next token needs)
        if dec_n:
            need = phase[(-t) % bs]
            while free < need:
                preempt_tail()
                preempted = True
                need = phase[(-t) % bs]
            free -= need
        if dec_n:
            tokens = dec_n
            budget -= dec_n
            while promote and promote[0][0] <= t:
                _, r, ep = heapq.heappop(promote)
                if epoch.get(r, 0) == ep and r in young:
                    k = young.pop(r)
                    old_n += 1
                    old_key_sum += k
            if old_n:
                ctx_sum = old_key_sum + old_n * (t + 1)  # contexts of this step's tokens
                kv = old_n * kv0 + kv1 * ctx_sum
                fl = old_n * fl0 + fl1 * ctx_sum
            for k in young.values():
                a, b = seq_cost(k + t + 1)
                kv += a
                fl += b
        done: list[int] = []
        # 2. the partial prefill continues
        if pref >= 0 and budget > 0:
            r = pref
            target = prompt[r] + gen[r]
            chunk = min(target - computed[r], budget)
            need = -(-(computed[r] + chunk) // bs) - blocks[r]
            while free < need and pref == r:
                preempt_tail()
                preempted = True
            if pref == r:
                free -= need
                blocks[r] += need
                a, b = chunk_cost(chunk, computed[r])
                kv += a
                fl += b
                computed[r] += chunk
                budget -= chunk
                tokens += chunk
                if computed[r] == target:
                    done.append(r)
                    pref = -1
        # 3. admit waiting requests (FCFS)
        if not preempted:
            while waiting and budget > 0 and len(running) < max_seqs:
                r = waiting[0]
                g = gen.get(r, 0)
                base = req.hit_first[r] if r not in epoch else req.hit_again[r]
                target = prompt[r] + g
                todo = target - base
                if chunked:
                    chunk = min(todo, budget)
                elif todo <= budget:
                    chunk = todo
                elif tokens == 0:
                    chunk = todo  # alone in the step
                else:
                    break
                need = -(-(base + chunk) // bs)
                if need > free:
                    break
                waiting.popleft()
                running[r] = None
                if admitted[r] < 0.0:
                    admitted[r] = now
                gen[r] = g
                free -= need
                blocks[r] = need
                a, b = chunk_cost(chunk, base)
                kv += a
                fl += b
                computed[r] = base + chunk
                budget -= chunk
                tokens += chunk
                if chunk == todo:
                    done.append(r)
                else:
                    pref = r
        if tokens == 0:  # everything was preempted: reschedule at once
            empty_steps += 1
            if empty_steps > 3:
                raise RuntimeError("simulator made no progress (a request larger than the KV cache?)")
            continue
        empty_steps = 0
        dt = step_s(tokens, kv, fl)
        st.in_system_integral += (len(waiting) + len(running)) * dt
        st.running_integral += len(running) * dt
        st.busy_s += dt
        now += dt
        t += 1
        st.steps += 1
        # 4. finishes, then prefills that completed emit a token
        while heap and heap[0][0] <= t:
            _, r, ep = heapq.heappop(heap)
            if epoch.get(r, 0) != ep or r not in key:
                continue
            free += remove_decoder(r)
            del running[r]
            finish[r] = now
            if tick is not None:
                tick(1)
        for r in done:
            g = gen[r] + 1
            gen[r] = g
            if first_token[r] < 0.0:
                first_token[r] = now
            c = computed.pop(r)
            nb = blocks.pop(r)
            if g >= output[r]:
                free += nb
                del running[r]
                finish[r] = now
                continue
            k = c - t
            key[r] = k
            dec_n += 1
            dec_key_sum += k
            if c + 1 >= affine_from:
                old_n += 1
                old_key_sum += k
            else:
                young[r] = k
                heapq.heappush(promote, (affine_from - 1 - k, r, epoch.get(r, 0)))
            phase[k % bs] += 1
            heapq.heappush(heap, (t + output[r] - g, r, epoch.get(r, 0)))
        if len(samples) > max_samples:
            del samples[1::2]
            sample_interval_s *= 2.0
            next_sample = len(samples) * sample_interval_s
    sample_until(now)
    st.samples = samples
    st.interval_s = sample_interval_s
    return st


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


def _tokens_in_kv(pool: PoolSpec, kind: PoolKind, prompts: list[int], shared_prefix_fraction: float) -> list[int]:
    """``prompt_tokens_in_kv`` per request, as ints."""
    hits = pool.tokens_in_kv(np.asarray(prompts, dtype=float), kind=kind, shared_prefix_fraction=shared_prefix_fraction)
    out: list[int] = hits.astype(np.int64).tolist()
    return out


def _check_fits(cost: StepCost, prompts: list[int], outputs: list[int], what: str) -> None:
    cap = int(cost.kv_capacity_tokens) // int(cost.kv_block_tokens) * int(cost.kv_block_tokens)
    worst = max(p + o for p, o in zip(prompts, outputs))
    if worst > cap:
        raise ConfigError(
            f"a request of {worst} tokens (prompt + output) does not fit the {what} KV cache of {cap} tokens per replica; "
            "use a larger GPU / tensor parallelism or cap the lengths"
        )


def _run_pool(
    cost: StepCost, limits: Limits, req: _Requests, order: list[int], replicas: int, interval_s: float,
    what: str = "simulate",
) -> tuple[list[_ReplicaStats], TimeSeries]:
    with progress.bar(what, total=len(order), unit="req") as bar:
        stats = [
            _run_replica(cost, limits, req, order[k::replicas], interval_s, 4000, bar.update) for k in range(replicas)
        ]
    coarse = max(s.interval_s for s in stats)
    series = []
    for s in stats:
        stride = int(round(coarse / s.interval_s)) if s.interval_s > 0 else 1
        series.append((s.samples or [])[::stride])
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
    arr: list[float],
    first: list[float],
    finish: list[float],
    outputs: list[int],
    waits: list[float],
    stats: list[_ReplicaStats],
    replicas: int,
    warmup_requests: int,
    extra_in_system_s: float,
    ts: TimeSeries,
    prefill_ts: TimeSeries | None,
    request_overhead_s: float = 0.0,
) -> SimResult:
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
    served, served_late = served_fractions(arr, finish)
    return SimResult(
        ttft_s=Percentiles.from_samples(f1[keep] - a[keep]),
        tpot_s=Percentiles.from_samples(tpot),
        e2e_s=Percentiles.from_samples(fin[keep] - a[keep]),
        queue_wait_mean_s=float(np.mean(np.asarray(waits)[keep])),
        completed=n,
        preempted=sum(s.preempted for s in stats),
        duration_s=duration,
        output_tokens_per_s=float(out.sum()) / duration,
        requests_per_s=n / duration,
        mean_running_batch=sum(s.running_integral for s in stats) / duration / replicas,
        mean_in_system=in_system / duration,
        busy_fraction=sum(s.busy_s for s in stats) / duration / replicas,
        stable=served >= STABLE_SERVED_FRACTION and served_late >= STABLE_LATE_FRACTION,
        steps=sum(s.steps for s in stats),
        timeseries=ts,
        prefill_timeseries=prefill_ts,
        served_fraction=served,
        served_fraction_late=served_late,
        warmup_requests=int(min(warmup_requests, n - 1)),
    )


STABLE_SERVED_FRACTION = 0.98
STABLE_LATE_FRACTION = 0.95  # a quarter of the run: the number in system alone moves it by a few percent


def served_fractions(arrivals: Sequence[float], finishes: Sequence[float]) -> tuple[float, float]:
    """(completions / arrivals over [median arrival, last arrival], the same over its last half)."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    f = np.asarray(finishes, dtype=float)
    n = a.size
    if n < 40:
        return 1.0, 1.0

    def frac(t0: float, t1: float) -> float:
        came = np.count_nonzero((a > t0) & (a <= t1))
        done = np.count_nonzero((f > t0) & (f <= t1))
        return done / came if came else 1.0

    t_mid, t_late, t_end = float(a[n // 2]), float(a[(3 * n) // 4]), float(a[-1])
    return float(frac(t_mid, t_end)), float(frac(t_late, t_end))


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
) -> SimResult:
    """Simulate ``n_requests`` requests of ``load`` (a ``Traffic``: seeded arrivals with gamma gaps of shape
    ``burstiness``, 1 = Poisson; or a ``Replay``: its rows, the first ``n_requests`` if > 0) on the
    ``pool.replicas`` aggregated replicas of ``pool``; deterministic for a seed. ``warmup_requests`` first
    requests are left out of the latency percentiles (not out of throughput). Time series are sampled
    every ``sample_interval_s`` (default: 1/500 of the arrival span, coarsened to keep <= 4000 points)."""
    cost, limits, replicas = pool.cost, pool.limits, pool.replicas
    shared_prefix_fraction = load.shared_prefix_fraction
    arr, prompts, outputs = _workload(load, n_requests, seed, burstiness)
    _check_fits(cost, prompts, outputs, "replica")
    n = len(arr)
    hits = _tokens_in_kv(pool, PoolKind.AGGREGATED, prompts, shared_prefix_fraction)
    req = _Requests(arr, prompts, outputs, hits, hits, [-1.0] * n, [-1.0] * n, [-1.0] * n)
    stats, ts = _run_pool(cost, limits, req, list(range(n)), replicas, _interval(arr, sample_interval_s))
    waits = [req.admitted[i] - arr[i] for i in range(n)]
    return _result(arr, req.first_token, req.finish, outputs, waits, stats, replicas, warmup_requests, 0.0, ts, None,
                   float(cost.request_overhead_s))


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
    ``kv_link.transfer_s(prompt)`` (instead of the fixed delay). Requests and keywords as ``simulate``.
    ``timeseries`` is the decode pool, ``prefill_timeseries`` the prefill pool."""
    prefill_cost, prefill_limits, prefill_replicas = topology.prefill.cost, topology.prefill.limits, topology.prefill.replicas
    decode_cost, decode_limits, decode_replicas = topology.decode.cost, topology.decode.limits, topology.decode.replicas
    kv_transfer_s_per_token, kv_link = topology.kv_transfer_s_per_token, topology.kv_link
    shared_prefix_fraction = load.shared_prefix_fraction
    arr, prompts, outputs = _workload(load, n_requests, seed, burstiness)
    n = len(arr)
    _check_fits(prefill_cost, prompts, [1] * n, "prefill")
    _check_fits(decode_cost, prompts, outputs, "decode")
    interval = _interval(arr, sample_interval_s)
    hits = _tokens_in_kv(topology.prefill, PoolKind.PREFILL, prompts, shared_prefix_fraction)
    pre = _Requests(arr, prompts, [1] * n, hits, hits, [-1.0] * n, [-1.0] * n, [-1.0] * n)
    pre_stats, pre_ts = _run_pool(prefill_cost, prefill_limits, pre, list(range(n)), prefill_replicas, interval,
                                  "simulate prefill pool")
    if kv_link is None:
        transfer = [kv_transfer_s_per_token * p for p in prompts]
        arr_d = [pre.finish[i] + transfer[i] for i in range(n)]
    else:
        arr_d = _link_fifo(kv_link, pre.finish, prompts, prefill_replicas)
        transfer = [arr_d[i] - pre.finish[i] for i in range(n)]
    remote = _tokens_in_kv(topology.decode, PoolKind.DECODE, prompts, shared_prefix_fraction)
    recompute = _tokens_in_kv(topology.decode, PoolKind.AGGREGATED, prompts, shared_prefix_fraction)  # after a preemption
    dec = _Requests(arr_d, prompts, outputs, remote, recompute, [-1.0] * n, [-1.0] * n, [-1.0] * n)
    order = sorted(range(n), key=lambda i: arr_d[i])
    dec_stats, dec_ts = _run_pool(decode_cost, decode_limits, dec, order, decode_replicas, interval)
    waits = [(pre.admitted[i] - arr[i]) + (dec.admitted[i] - arr_d[i]) for i in range(n)]
    res = _result(
        arr, dec.first_token, dec.finish, outputs, waits, dec_stats, decode_replicas, warmup_requests,
        sum(s.in_system_integral for s in pre_stats) + sum(transfer), dec_ts, pre_ts,
        float(decode_cost.request_overhead_s),
    )
    return SimResult(**{**res.__dict__, "preempted": res.preempted + sum(s.preempted for s in pre_stats),
                        "steps": res.steps + sum(s.steps for s in pre_stats)})
