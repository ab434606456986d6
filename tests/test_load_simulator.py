"""Discrete-event simulator: hand-computed schedules, queueing closed forms, Little's law, invariants,
and agreement with the analytic model (toy cost models from recommender.load.toy)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recommender.errors import ConfigError
from recommender.load import Disaggregated, PoolSpec, Replay, Traffic, analyze, read_trace, simulate, simulate_disaggregated
from recommender.load.toy import FixedLength, LinearStepCost, LogNormalLength, RooflineStepCost, ToyLimits, UniformLength

DATA = Path(__file__).parent / "data" / "load"
# No attention FLOPs, 1 MB of KV per context token read at 2 TB/s: every step time is hand-computable.
PLAIN = LinearStepCost(attention_flops_per_token_pair=0.0, kv_bytes_per_token=1e6)


def plain_step(tokens: int, kv_tokens: int) -> float:
    """PLAIN's step: 5 ms + 20 us per computed token + 0.5 us per KV token read."""
    return 5e-3 + tokens * 20e-6 + kv_tokens * 0.5e-6


def one_request(p: int, o: int, arrival: float = 0.0) -> list[tuple[float, int, int]]:
    return [(arrival, p, o)]


def test_one_request_alone_step_by_step() -> None:
    # Default toy model (attention FLOPs included). Prompt 1000, output 5:
    # prefill: 5 ms + 1000 * 20 us + 1000 * 500.5 pairs * 2.6e6 FLOP / 4e14 FLOP/s;
    # decode k = 1..4 at context 1000 + k: 5 ms + 20 us + (1000 + k) * (163840 B / 2e12 + 2.6e6 / 4e14).
    prefill = 5e-3 + 1000 * 20e-6 + 1000 * 500.5 * 2.6e6 / 4e14
    decode = sum(5e-3 + 20e-6 + (1000 + k) * (163840 / 2e12 + 2.6e6 / 4e14) for k in range(1, 5))
    s = simulate(PoolSpec(cost=LinearStepCost(), limits=ToyLimits()), Replay(rows=one_request(1000, 5, 3.0)))
    assert s.completed == 1 and s.steps == 5 and s.preempted == 0
    assert s.ttft_s.p50 == pytest.approx(prefill, rel=1e-12)
    assert s.e2e_s.p50 == pytest.approx(prefill + decode, rel=1e-12)
    assert s.tpot_s.p50 == pytest.approx(decode / 4, rel=1e-12)
    assert s.queue_wait_mean_s == 0.0


def test_chunked_prefill_splits_the_prompt_over_the_budget() -> None:
    # 5000-token prompt, 2048-token budget: chunks of 2048, 2048, 904 tokens; each reads its prefix.
    hand = plain_step(2048, 0) + plain_step(2048, 2048) + plain_step(904, 4096)
    s = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_batched_tokens=2048)), Replay(rows=one_request(5000, 1)))
    assert s.steps == 3 and s.ttft_s.p50 == pytest.approx(hand, rel=1e-12)


def test_without_chunked_prefill_a_long_prompt_runs_alone_in_one_step() -> None:
    s = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_batched_tokens=2048, chunked_prefill=False)), Replay(rows=one_request(5000, 1)))
    assert s.steps == 1 and s.ttft_s.p50 == pytest.approx(plain_step(5000, 0), rel=1e-12)


def test_decodes_come_first_and_the_next_prompt_fills_the_budget() -> None:
    # A (100 tokens, 3 outputs) arrives at 0; B (100 tokens) at 1 ms, while A's prefill runs.
    # step 1: A's prefill (7 ms). step 2: A decodes (context 101) + B's prefill in the same step:
    # 5 ms + 101 tokens * 20 us + 101 KV tokens * 0.5 us. B's first token comes at the end of step 2.
    s1 = plain_step(100, 0)
    s2 = plain_step(101, 101)
    s = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits()), Replay(rows=[(0.0, 100, 3), (0.001, 100, 1)]))
    assert s.ttft_s.mean == pytest.approx((s1 + (s1 + s2 - 0.001)) / 2, rel=1e-12)


def test_max_num_seqs_one_queues_the_second_request_for_the_whole_first() -> None:
    # Two identical requests at t = 0 with one slot: the second starts when the first finishes.
    service = plain_step(100, 0) + sum(plain_step(1, 100 + k) for k in range(1, 11))
    s = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_seqs=1)), Replay(rows=[(0.0, 100, 11), (0.0, 100, 11)]))
    assert s.e2e_s.mean == pytest.approx(1.5 * service, rel=1e-9)  # (S + 2 S) / 2
    assert s.queue_wait_mean_s == pytest.approx(service / 2, rel=1e-9)


@pytest.mark.parametrize("rate", [5.0, 15.0])
def test_single_slot_mean_wait_is_md1(rate: float) -> None:
    # Deterministic service S with one slot and Poisson arrivals: M/D/1, mean wait rho S / (2 (1 - rho)).
    service = plain_step(100, 0) + sum(plain_step(1, 100 + k) for k in range(1, 11))
    rho = rate * service
    s = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_seqs=1)), Traffic(rate_per_s=rate, prompt=FixedLength(100), output=FixedLength(11)), n_requests=6000, seed=3)
    assert s.queue_wait_mean_s == pytest.approx(rho * service / (2 * (1 - rho)), rel=0.1)
    assert s.busy_fraction == pytest.approx(rho, rel=0.05)


def test_littles_law_on_the_simulators_own_counts() -> None:
    s = simulate(PoolSpec(cost=RooflineStepCost(), limits=ToyLimits()), Traffic(rate_per_s=2.5, prompt=LogNormalLength(1000, 0.8, 16, 8000), output=LogNormalLength(200, 0.7, 4, 1500)), n_requests=3000, seed=5)
    # time-average number in system = completion rate * mean time in system
    assert s.mean_in_system == pytest.approx(s.requests_per_s * s.e2e_s.mean, rel=1e-9)
    assert s.mean_running_batch < s.mean_in_system


def test_throughput_never_exceeds_arrivals_or_capacity() -> None:
    prompt, output = UniformLength(4000, 8000), UniformLength(100, 300)
    cost, limits = LinearStepCost(s_per_token=5e-6), ToyLimits(max_num_seqs=64)
    # Decode capacity bound: at most 64 tokens per step, and a step takes at least 5 ms + 64 * 5 us.
    bound_tokens_per_s = 64 / (5e-3 + 64 * 5e-6)
    for rate in (1.0, 3.0, 10.0):
        s = simulate(PoolSpec(cost=cost, limits=limits), Traffic(rate_per_s=rate, prompt=prompt, output=output), n_requests=1500, seed=2)
        assert s.requests_per_s <= rate * 1.15  # finite-sample slack on the arrival rate itself
        assert s.output_tokens_per_s <= bound_tokens_per_s
        assert s.completed == 1500
    overloaded = simulate(PoolSpec(cost=cost, limits=limits), Traffic(rate_per_s=10.0, prompt=prompt, output=output), n_requests=1500, seed=2)
    assert overloaded.requests_per_s < 5.0 and not overloaded.stable


def test_trace_replay_reproduces_the_given_arrivals() -> None:
    rows = read_trace(DATA / "azure-conv-200.csv")
    assert len(rows) == 200 and rows[0] == (0.0, 374, 44) and rows[1][1:] == (396, 109)
    # 2023-11-16 18:15:50.9951690 - 18:15:46.6805900 = 4.314579 s (fraction cut to microseconds)
    assert rows[1][0] == pytest.approx(4.314579, abs=1e-6)
    assert all(a <= b for (a, _, _), (b, _, _) in zip(rows, rows[1:]))
    s = simulate(PoolSpec(cost=RooflineStepCost(), limits=ToyLimits()), Replay(rows=rows))
    assert s.completed == 200
    # the first request meets an idle engine: its TTFT is its own prefill step, 374 tokens
    alone = simulate(PoolSpec(cost=RooflineStepCost(), limits=ToyLimits()), Replay(rows=[rows[0]]))
    roof = RooflineStepCost()
    assert alone.ttft_s.p50 == pytest.approx(roof.step_s(374, *roof.prefill_chunk_cost(374, 0)), rel=1e-12)
    # the replayed run spans the trace: duration >= last arrival - first arrival
    assert s.duration_s >= rows[-1][0]


def test_deterministic_for_a_seed() -> None:
    pool = PoolSpec(cost=RooflineStepCost(), limits=ToyLimits())
    traffic = Traffic(rate_per_s=2.0, prompt=LogNormalLength(1000, 0.8, 16, 8000), output=LogNormalLength(200, 0.7, 4, 1500))
    a, b, c = (simulate(pool, traffic, n_requests=800, seed=seed) for seed in (9, 9, 10))
    assert a == b
    assert a.ttft_s != c.ttft_s


def test_preemption_recomputes_and_everything_still_finishes() -> None:
    # 20 requests of 1000 + 400 tokens at once into 10,000 tokens of KV: admission packs ~9 prompts,
    # then growing decodes run out of blocks and the newest requests are preempted and recomputed.
    small = LinearStepCost(kv_capacity_tokens=10_000)
    s = simulate(PoolSpec(cost=small, limits=ToyLimits()), Replay(rows=[(0.0, 1000, 400)] * 20))
    assert s.completed == 20 and s.preempted > 0
    roomy = simulate(PoolSpec(cost=LinearStepCost(kv_capacity_tokens=1_000_000), limits=ToyLimits()), Replay(rows=[(0.0, 1000, 400)] * 20))
    assert roomy.preempted == 0 and roomy.e2e_s.mean < s.e2e_s.mean
    assert max(s.timeseries.kv_usage) <= 1.0 and max(roomy.timeseries.kv_usage) < 0.05


def test_a_request_larger_than_the_kv_cache_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        simulate(PoolSpec(cost=LinearStepCost(kv_capacity_tokens=1000), limits=ToyLimits()), Replay(rows=one_request(900, 200)))


def test_burstier_arrivals_wait_longer() -> None:
    pool = PoolSpec(cost=LinearStepCost(s_per_token=5e-6), limits=ToyLimits())
    traffic = Traffic(rate_per_s=2.0, prompt=UniformLength(4000, 8000), output=UniformLength(100, 300))
    poisson = simulate(pool, traffic, n_requests=3000, seed=4)
    bursty = simulate(pool, traffic, n_requests=3000, seed=4, burstiness=0.25)  # gamma gaps, squared CV 4
    assert bursty.ttft_s.p99 > 1.5 * poisson.ttft_s.p99


def test_replicas_split_round_robin() -> None:
    one = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits(), replicas=2), Replay(rows=[(0.0, 100, 11), (0.0, 100, 11)]))
    # two requests at t = 0 on two replicas: both run alone, no queueing
    alone = plain_step(100, 0) + sum(plain_step(1, 100 + k) for k in range(1, 11))
    assert one.e2e_s.p99 == pytest.approx(alone, rel=1e-12)
    assert len(one.timeseries.t_s) == len(one.timeseries.running)


@dataclass(frozen=True)
class SlidingWindow:
    """Decode cost not affine in context (sliding-window attention): forces the simulator's exact path."""

    window: int = 64
    kv_capacity_tokens: int = 100_000
    kv_block_tokens: int = 16
    request_overhead_s: float = 0.0

    def step_s(self, new_tokens: int, kv_read_bytes: float, attention_flops: float) -> float:
        return 5e-3 + new_tokens * 20e-6 + kv_read_bytes / 2e12

    def decode_seq_cost(self, context_tokens: int) -> tuple[float, float]:
        return (min(context_tokens, self.window) * 1e6, 0.0)

    def prefill_chunk_cost(self, chunk_tokens: int, prefix_tokens: int) -> tuple[float, float]:
        return (min(prefix_tokens, self.window) * 1e6, 0.0)


def test_non_affine_decode_cost_uses_exact_per_sequence_costs() -> None:
    # prompt 40, 41 outputs: decode contexts 41..80, KV read min(context, 64) MB each.
    hand_decode = sum(5e-3 + 20e-6 + min(40 + k, 64) * 0.5e-6 for k in range(1, 41))
    s = simulate(PoolSpec(cost=SlidingWindow(), limits=ToyLimits()), Replay(rows=one_request(40, 41)))
    assert s.e2e_s.p50 - s.ttft_s.p50 == pytest.approx(hand_decode, rel=1e-12)


def test_a_long_decode_run_is_summed_exactly() -> None:
    # One request, prompt 1000, 2001 outputs: 2000 decode steps, taken as runs (recommender.load.scheduler,
    # fast_forward) instead of one by one. PLAIN's decode step at context 1000 + k: 5 ms + 20 us + (1000 + k) x 0.5 us.
    hand_decode = sum(plain_step(1, 1000 + k) for k in range(1, 2001))
    s = simulate(PoolSpec(cost=PLAIN, limits=ToyLimits()), Replay(rows=one_request(1000, 2001)), sample_interval_s=100.0)
    assert s.steps == 2001
    assert s.e2e_s.p50 - s.ttft_s.p50 == pytest.approx(hand_decode, rel=1e-12)


@pytest.mark.parametrize("cost", [PLAIN, RooflineStepCost()], ids=["linear", "roofline"])
def test_decode_runs_match_stepping_one_by_one(cost: object, monkeypatch: pytest.MonkeyPatch) -> None:
    # the same seeded workload with runs taken at once and with every step taken alone: the same schedule
    # (steps, preemptions, samples) and times within float rounding
    from recommender.load import scheduler

    pool = PoolSpec(cost=cost, limits=ToyLimits(max_num_seqs=16, max_num_batched_tokens=2048), replicas=2)
    load = Traffic(rate_per_s=1.0, prompt=LogNormalLength(600, 0.5, 16, 4000), output=LogNormalLength(300, 0.8, 1, 3000))
    fast = simulate(pool, load, n_requests=400, seed=3)
    monkeypatch.setattr(scheduler, "MIN_RUN_STEPS", 1 << 60)
    slow = simulate(pool, load, n_requests=400, seed=3)
    assert fast.steps == slow.steps and fast.preempted == slow.preempted
    assert fast.timeseries.running == slow.timeseries.running and fast.timeseries.queue_len == slow.timeseries.queue_len
    for a, b in ((fast.ttft_s, slow.ttft_s), (fast.e2e_s, slow.e2e_s), (fast.tpot_s, slow.tpot_s)):
        assert a.p50 == pytest.approx(b.p50, rel=1e-9) and a.p99 == pytest.approx(b.p99, rel=1e-9)
    assert fast.timeseries.kv_usage == pytest.approx(slow.timeseries.kv_usage, rel=1e-12)


def test_disaggregated_one_request() -> None:
    # prefill pool: one 7 ms step; transfer 100 tokens * 1 ms; decode pool: first step computes the
    # last prompt token after 99 remote ones (5 ms + 20 us + 99 * 0.5 us), then decodes at 101..110.
    s = simulate_disaggregated(Disaggregated(prefill=PoolSpec(cost=PLAIN, limits=ToyLimits()), decode=PoolSpec(cost=PLAIN, limits=ToyLimits()), kv_transfer_s_per_token=1e-3), Replay(rows=one_request(100, 11)))
    first = plain_step(1, 99)
    assert s.ttft_s.p50 == pytest.approx(plain_step(100, 0) + 0.1 + first, rel=1e-12)
    assert s.tpot_s.p50 == pytest.approx(sum(plain_step(1, 100 + k) for k in range(1, 11)) / 10, rel=1e-12)
    assert s.prefill_timeseries is not None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(0.2, 30.0),
    seqs=st.sampled_from([1, 8, 256]),
    budget=st.sampled_from([256, 2048, 8192]),
    chunked=st.booleans(),
    caching=st.booleans(),
    replicas=st.integers(1, 3),
    kv_tokens=st.sampled_from([20_000, 400_000]),
    seed=st.integers(0, 1000),
)
def test_invariants(rate, seqs, budget, chunked, caching, replicas, kv_tokens, seed) -> None:
    cost = LinearStepCost(s_per_token=5e-6, kv_capacity_tokens=kv_tokens)
    limits = ToyLimits(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked, enable_prefix_caching=caching)
    s = simulate(PoolSpec(cost=cost, limits=limits, replicas=replicas), Traffic(rate_per_s=rate, prompt=LogNormalLength(500, 0.8, 1, 4000), output=LogNormalLength(50, 0.8, 1, 400), shared_prefix_fraction=0.4), n_requests=150, seed=seed)
    assert s.completed == 150
    for m in ("ttft_s", "tpot_s", "e2e_s"):
        p = getattr(s, m)
        assert 0.0 <= p.p50 <= p.p90 <= p.p95 <= p.p99 < math.inf
    assert s.e2e_s.p50 >= s.ttft_s.p50 and s.ttft_s.p50 >= 5e-3  # no step is faster than the 5 ms overhead
    assert s.tpot_s.p50 == 0.0 or s.tpot_s.p50 >= 5e-3
    assert s.mean_in_system == pytest.approx(s.requests_per_s * s.e2e_s.mean, rel=1e-9)
    ts = s.timeseries
    assert len(ts.t_s) == len(ts.queue_len) == len(ts.running) == len(ts.kv_usage)
    assert all(0.0 <= k <= 1.0 for k in ts.kv_usage) and all(r <= seqs * replicas for r in ts.running)


# Analytic vs simulated p90 / p99 at analytic load 0.5 and 0.7 (utilisation or KV peak, whichever is higher): toy linear and roofline cost
# models x rag-like and chat-like workloads x engine limits (chunked 8k, chunked 2k, whole prompts
# with a 16k budget, prefix caching with half the prompt shared); one replica, 5000 requests.
WORKLOADS = {
    "rag": (UniformLength(4000, 8000), UniformLength(100, 300)),
    "chat": (LogNormalLength(1000, 0.8, 16, 8000), LogNormalLength(200, 0.7, 4, 1500)),
}
COSTS = {"linear": LinearStepCost(s_per_token=5e-6), "roofline": RooflineStepCost()}
LIMITS = {
    "chunk8k": ToyLimits(),
    "chunk2k": ToyLimits(max_num_batched_tokens=2048),
    "whole16k": ToyLimits(max_num_batched_tokens=16384, chunked_prefill=False),
    "prefix": ToyLimits(enable_prefix_caching=True),
}
GRID = list(itertools.product(COSTS, WORKLOADS, LIMITS, (0.5, 0.7)))


def _rate_at(cost, limits, prompt, output, utilisation: float) -> float:
    lo, hi = 1e-3, 1e4
    for _ in range(50):
        mid = (lo * hi) ** 0.5
        r = analyze(PoolSpec(cost=cost, limits=limits), Traffic(rate_per_s=mid, prompt=prompt, output=output, shared_prefix_fraction=0.5))
        lo, hi = (mid, hi) if r.stable and _load(r) < utilisation else (lo, mid)
    return lo


def _load(r) -> float:
    """What the search caps: utilisation of capacity, and the KV cache at mean + 3 sd of the batch."""
    return max(r.utilisation, r.kv_peak_utilisation)


@pytest.mark.parametrize("cost_name,work_name,limits_name,utilisation", GRID)
def test_analytic_matches_simulated_tails(cost_name, work_name, limits_name, utilisation) -> None:
    cost, limits = COSTS[cost_name], LIMITS[limits_name]
    prompt, output = WORKLOADS[work_name]
    rate = _rate_at(cost, limits, prompt, output, utilisation)
    a = analyze(PoolSpec(cost=cost, limits=limits), Traffic(rate_per_s=rate, prompt=prompt, output=output, shared_prefix_fraction=0.5))
    assert a.stable and _load(a) == pytest.approx(utilisation, abs=0.01)
    s = simulate(PoolSpec(cost=cost, limits=limits), Traffic(rate_per_s=rate, prompt=prompt, output=output, shared_prefix_fraction=0.5), n_requests=5000, seed=1, warmup_requests=500)
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        for q in ("p90", "p99"):
            assert getattr(a, metric).at(q) == pytest.approx(getattr(s, metric).at(q), rel=0.2), (metric, q)


def test_served_fractions_count_the_second_half_and_its_last_quarter() -> None:
    # hand-made: 1,000 arrivals one per second; each finishes 5 s later except the last 40, never served
    from recommender.load.simulator import served_fractions

    arrivals = [float(i) for i in range(1000)]
    finishes = [a + 5.0 if i < 960 else float("inf") for i, a in enumerate(arrivals)]
    half, late, came_late = served_fractions(arrivals, finishes)
    # half window (500, 999]: arrivals 501..999 (499); completions in it are the finishes 501..964 of
    # arrivals 496..959 (464)
    assert came_late == 249  # late window (750, 999]: arrivals 751..999
    assert half == pytest.approx(464 / 499)
    # late window: completions are the finishes 751..964 of arrivals 746..959 (214)
    assert late == pytest.approx(214 / 249)
