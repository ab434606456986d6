"""Certification: a day of traffic replayed in the simulator with the autoscaler in the loop.

The controller is the Kubernetes HPA as KEDA drives it, on the arrival-rate metric of the rule
(``recommender.autoscale.rule``): every ``polling_s`` it reads the arrivals of the last ``metric_window_s``
as a rate, wants ``rule.desired(rate)`` replicas, scales up at once and scales down only to the largest
recommendation of the last ``scale_down_stabilisation_s`` (the HPA's stabilisation window). A new replica is
paid from the moment it is asked for and serves ``startup_s`` later; a removed one takes no new requests,
finishes the ones it holds (drains) and is paid until then. Requests go round-robin over the replicas that
are serving when they arrive. The metric is the arrivals' rate, which does not depend on the engines'
state, so each replica is simulated on its own (``recommender.load.scheduler.ReplicaScheduler``) over the
requests routed to it, as ``recommender.load.simulator`` does for a fixed pool.

Reported: per ``slo_window_s`` window of arrivals, whether each SLO percentile held over its requests;
flaps (a scale-down followed by a scale-up within the stabilisation window); GPU-hours of the replay, of the
static plan (``static_replicas`` all day) and of the ideal autoscaler (``ceil(lambda(t) / c1)`` replicas each
minute, no start-up, ``lambda`` the profile's rate).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from recommender.autoscale.profile import DayTraffic, DiurnalProfile
from recommender.autoscale.rule import MAX_STARTUP_S, ScalingRule, wrapped
from recommender.load.scheduler import ReplicaScheduler, Requests
from recommender.load.simulator import tokens_in_kv
from recommender.load.topology import PoolKind, PoolSpec
from recommender.workload import Slo


@dataclass(frozen=True)
class Certification:
    """What the day-long replay found (times in s, GPU-hours over the profile's period)."""

    requests: int
    windows: int
    windows_met: int
    flaps: int
    scale_events: int
    min_replicas_seen: int
    max_replicas_seen: int
    gpu_hours: float
    static_gpu_hours: float
    ideal_gpu_hours: float
    worst_window: dict[str, float]
    replay_s: float = field(default=0.0, compare=False)  # wall time of the replay (controller, routing, engines, windows), not in to_dict
    replay_cpu_s: float = field(default=0.0, compare=False)  # its CPU time (the machine's load does not move it)
    failed_windows_s: tuple[float, ...] = field(default=(), compare=False)  # start of each window that missed an SLO

    @property
    def attainment(self) -> float:
        return self.windows_met / self.windows if self.windows else 1.0

    def to_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "windows": self.windows, "windows_met": self.windows_met,
                "attainment": round(self.attainment, 4), "flaps": self.flaps, "scale_events": self.scale_events,
                "replicas_seen": [self.min_replicas_seen, self.max_replicas_seen],
                "gpu_hours": round(self.gpu_hours, 2), "static_gpu_hours": round(self.static_gpu_hours, 2),
                "ideal_gpu_hours": round(self.ideal_gpu_hours, 2),
                "vs_static": round(self.gpu_hours / self.static_gpu_hours, 4) if self.static_gpu_hours else None,
                "worst_window": {k: round(v, 5) for k, v in self.worst_window.items()}}


@dataclass
class _Replica:
    asked_s: float
    ready_s: float
    removed_s: float = math.inf


def controller(rule: ScalingRule, arrival_s: np.ndarray, period_s: float) -> tuple[list[_Replica], int, int]:
    """The replicas over the day (ask, ready, removal times), the flaps and the scale events.

    The day repeats: the controller starts ``cooldown + the longest start-up (an hour)`` before midnight on
    the end of the day (:func:`recommender.autoscale.rule.wrapped`), so midnight finds the pool yesterday left;
    events and flaps are counted from 0. Its decisions do not depend on the start-up time (a replica asked for
    counts until it is removed), only when each replica serves does, so two start-ups with the same cooldown
    differ only by later ``ready_s``."""
    warm = rule.cooldown_s + MAX_STARTUP_S + rule.metric_window_s
    a = wrapped(arrival_s, period_s, warm + rule.metric_window_s)
    t0 = -math.ceil(warm / rule.polling_s) * rule.polling_s
    first = float(np.count_nonzero((a > t0 - rule.metric_window_s) & (a <= t0))) / rule.metric_window_s
    reps = [_Replica(t0, t0) for _ in range(rule.desired(first))]
    readings: deque[tuple[float, float]] = deque()  # (t, rate): max_over_time's hold
    history: deque[tuple[float, int]] = deque()     # (t, recommendation): the HPA's stabilisation window
    last_down = -math.inf
    flaps = events = 0
    t = t0
    while t < period_s:
        came = np.searchsorted(a, t, "right") - np.searchsorted(a, t - rule.metric_window_s, "right")
        readings.append((t, float(came) / rule.metric_window_s))
        while readings[0][0] < t - rule.metric_hold_s:
            readings.popleft()
        rate = max(r for _, r in readings)
        live = [r for r in reps if r.removed_s == math.inf]
        want = rule.desired(rate)
        if live and abs(rate / (len(live) * rule.target_per_replica_per_s) - 1.0) <= rule.tolerance:
            want = len(live)  # the HPA's tolerance: within 10% of the target, no change
        history.append((t, want))
        while history[0][0] < t - rule.scale_down_stabilisation_s:
            history.popleft()
        target = max(h for _, h in history) if want < len(live) else want
        if target > len(live):
            if t >= 0:
                flaps += t - last_down < rule.cooldown_s
                events += 1
            reps += [_Replica(t, t + rule.startup_s) for _ in range(target - len(live))]
        elif target < len(live):
            for r in sorted(live, key=lambda r: r.ready_s)[target:]:  # the newest go first
                r.removed_s = t
            last_down = t
            events += t >= 0
        t += rule.polling_s
    return [r for r in reps if r.removed_s > 0], flaps, events


def _route(reps: list[_Replica], arrival_s: np.ndarray) -> list[list[int]]:
    """Round-robin over the replicas serving at each arrival (ready and not removed)."""
    changes = sorted({0.0} | {max(0.0, r.ready_s) for r in reps} | {r.removed_s for r in reps if math.isfinite(r.removed_s)})
    ids: list[list[int]] = [[] for _ in reps]
    rr = 0
    start = 0
    for k, t0 in enumerate(changes):
        t1 = changes[k + 1] if k + 1 < len(changes) else math.inf
        end = int(np.searchsorted(arrival_s, t1, "left"))
        serving = [i for i, r in enumerate(reps) if r.ready_s <= t0 and r.removed_s > t0]
        if not serving:  # cannot happen with min replicas >= 1 warm at 0; keep requests on the oldest replica
            serving = [0]
        for j in range(start, end):
            ids[serving[rr % len(serving)]].append(j)
            rr += 1
        start = end
    return ids


def replay(pool: PoolSpec, rule: ScalingRule, day: DayTraffic, profile: DiurnalProfile, slos: tuple[Slo, ...], *,
           static_replicas: int, shared_prefix_fraction: float = 0.0, slo_window_s: float = 300.0,
           ranks_per_replica: int = 1) -> Certification:
    """Run the day (``pool`` gives one scheduler's step cost and limits; its replica count is ignored). A replica
    of a data-parallel-attention engine is ``ranks_per_replica`` schedulers, each with its own batch and KV cache
    (``pool``'s cost is one rank's, ``recommender.sizing``): its requests are dealt round-robin over them, as the
    replicas' are, so one replica of ``k`` ranks serves as ``k`` replicas of one rank would."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    arr = np.asarray(day.arrival_s, dtype=float)
    period = profile.period_s
    reps, flaps, events = controller(rule, arr, period)
    prompts = [int(x) for x in day.prompt_tokens]
    outputs = [int(x) for x in day.output_tokens]
    hits = tokens_in_kv(pool, PoolKind.AGGREGATED, prompts, shared_prefix_fraction)
    req = Requests.new(arr.tolist(), prompts, outputs, hits, hits)
    routed = _route(reps, arr)
    for ids in routed:
        for rank in range(ranks_per_replica):
            if dealt := ids[rank::ranks_per_replica]:
                ReplicaScheduler(pool.cost, pool.limits, req, dealt, sample_interval_s=period, max_samples=2).run()
    overhead = float(pool.cost.request_overhead_s)
    first = np.asarray(req.first_token) + overhead
    finish = np.asarray(req.finish) + overhead
    out = np.asarray(outputs, dtype=float)
    ttft = first - arr
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1.0, 1.0), np.nan)
    e2e = finish - arr
    values = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    q = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
    windows = met = 0
    worst: dict[str, float] = {}
    edges = np.arange(0.0, period + slo_window_s, slo_window_s)
    starts = np.searchsorted(arr, edges)
    failed: list[float] = []
    for a, b, e in zip(starts[:-1], starts[1:], edges):
        if b - a < 10:
            continue
        windows += 1
        ok = True
        for s in slos:
            v = values[s.metric][a:b]
            v = v[np.isfinite(v)]
            if v.size == 0:
                continue
            x = float(np.mean(v)) if s.percentile == "mean" else float(np.percentile(v, q[s.percentile]))
            key = f"{s.metric}_{s.percentile}_s"
            worst[key] = max(worst.get(key, 0.0), x)
            ok = ok and x <= s.limit_s
        met += ok
        if not ok:
            failed.append(float(e))
    tp = rule.gpus_per_replica
    paid_s = 0.0
    for r, ids in zip(reps, routed):
        drained = max((float(finish[i]) for i in ids), default=r.removed_s)
        end = min(period, r.removed_s if not ids else max(r.removed_s if math.isfinite(r.removed_s) else period, drained))
        paid_s += max(0.0, end - max(0.0, r.asked_s))
    minutes = np.arange(0.0, period, 60.0) + 30.0
    ideal = np.ceil(profile.rate_per_s(minutes) / rule.replica_capacity_per_s - 1e-9)
    live_counts = [sum(1 for r in reps if r.asked_s <= t < r.removed_s) for t in minutes]
    return Certification(
        requests=int(arr.size), windows=windows, windows_met=met, flaps=flaps, scale_events=events,
        min_replicas_seen=min(live_counts), max_replicas_seen=max(live_counts),
        gpu_hours=paid_s * tp / 3600.0, static_gpu_hours=static_replicas * tp * period / 3600.0,
        ideal_gpu_hours=float(np.sum(np.maximum(ideal, 1.0))) * tp / 60.0, worst_window=worst,
        replay_s=time.perf_counter() - wall0, replay_cpu_s=time.process_time() - cpu0,
        failed_windows_s=tuple(failed))
