"""Analytic load model: closed forms, bounds and invariants (toy cost models from recommender.load.toy)."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recommender.errors import ConfigError
from recommender.load import Disaggregated, PoolSpec, Traffic, analyze, analyze_disaggregated
from recommender.load.queueing import erlang_c, least_root
from recommender.load.toy import FixedLength, LinearStepCost, LogNormalLength, RooflineStepCost, ToyLimits, UniformLength

# No attention FLOPs, 1 MB of KV per context token read at 2 TB/s: every step time is hand-computable.
PLAIN = LinearStepCost(attention_flops_per_token_pair=0.0, kv_bytes_per_token=1e6)
RAG = (UniformLength(4000, 8000), UniformLength(100, 300))
CHAT = (LogNormalLength(1000, 0.8, 16, 8000), LogNormalLength(200, 0.7, 4, 1500))

# One request alone on PLAIN with a 100-token prompt and 11 output tokens:
# prefill step 5 ms + 100 * 20 us = 7 ms; decode step k (context 100 + k, k = 1..10) takes
# 5 ms + 20 us + (100 + k) * 1e6 B / 2e12 B/s, so the ten together take 10 * 5.02 ms + 1055 * 0.5 us.
PREFILL_100_S = 5e-3 + 100 * 20e-6
SERVICE_100_11_S = PREFILL_100_S + 10 * 5.02e-3 + 1055 * 0.5e-6


@pytest.mark.parametrize("rate", [5.0, 10.0, 15.0])
def test_single_slot_is_md1_pollaczek_khinchine(rate: float) -> None:
    # max_num_seqs=1 and constant lengths: a single server with deterministic service S, so the mean
    # wait is M/D/1's rho S / (2 (1 - rho)).
    rho = rate * SERVICE_100_11_S
    wait = rho * SERVICE_100_11_S / (2 * (1 - rho))
    r = analyze(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_seqs=1)), Traffic(rate_per_s=rate, prompt=FixedLength(100), output=FixedLength(11)))
    assert r.stable
    assert r.utilisation == pytest.approx(rho, rel=1e-9)
    assert r.queue_wait_mean_s == pytest.approx(wait, rel=1e-6)
    assert r.ttft_s.mean == pytest.approx(wait + PREFILL_100_S, rel=1e-6)
    assert r.e2e_s.mean == pytest.approx(wait + SERVICE_100_11_S, rel=1e-6)
    assert r.tpot_s.mean == pytest.approx((SERVICE_100_11_S - PREFILL_100_S) / 10, rel=1e-9)


def test_single_slot_beyond_capacity_is_unstable() -> None:
    rate = 1.05 / SERVICE_100_11_S
    r = analyze(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_seqs=1)), Traffic(rate_per_s=rate, prompt=FixedLength(100), output=FixedLength(11)))
    assert not r.stable
    assert all(math.isinf(getattr(r, m).at(p)) for m in ("ttft_s", "tpot_s", "e2e_s") for p in ("mean", "p50", "p99"))
    assert r.utilisation >= 1.0
    assert r.requests_per_s < rate  # what it can serve, never more than offered
    assert r.requests_per_s == pytest.approx(1 / SERVICE_100_11_S, rel=0.02)


def test_low_load_latencies_are_one_request_alone() -> None:
    # At 0.01 req/s a request almost never meets another: TTFT = its prefill step, TPOT = a decode step.
    r = analyze(PoolSpec(cost=PLAIN, limits=ToyLimits()), Traffic(rate_per_s=0.01, prompt=FixedLength(100), output=FixedLength(11)))
    assert r.ttft_s.p50 == pytest.approx(PREFILL_100_S, rel=1e-3)
    assert r.tpot_s.p50 == pytest.approx((SERVICE_100_11_S - PREFILL_100_S) / 10, rel=1e-3)
    assert r.e2e_s.p50 == pytest.approx(SERVICE_100_11_S, rel=2e-3)


def test_prefix_cache_hit_skips_whole_blocks() -> None:
    # 1000-token prompt, 30% shared prefix: floor(300 / 16) * 16 = 288 tokens are cached, so the
    # prefill computes 712 tokens after a 288-token prefix: 5 ms + 712 * 20 us + 288 MB / 2 TB/s.
    r = analyze(PoolSpec(cost=PLAIN, limits=ToyLimits(enable_prefix_caching=True)), Traffic(rate_per_s=0.01, prompt=FixedLength(1000), output=FixedLength(2), shared_prefix_fraction=0.3))
    assert r.ttft_s.p50 == pytest.approx(5e-3 + 712 * 20e-6 + 288 * 1e6 / 2e12, rel=1e-3)
    # without prefix caching enabled the fraction is ignored
    off = analyze(PoolSpec(cost=PLAIN, limits=ToyLimits()), Traffic(rate_per_s=0.01, prompt=FixedLength(1000), output=FixedLength(2), shared_prefix_fraction=0.3))
    assert off.ttft_s.p50 == pytest.approx(5e-3 + 1000 * 20e-6, rel=1e-3)


def test_chunked_prefill_runs_ceil_prompt_over_budget_steps() -> None:
    # 5000-token prompt, 2048-token budget: chunks 2048, 2048, 904 after 0, 2048, 4096 cached tokens.
    chunks = [(2048, 0), (2048, 2048), (904, 4096)]
    hand = sum(5e-3 + n * 20e-6 + p * 1e6 / 2e12 for n, p in chunks)
    r = analyze(PoolSpec(cost=PLAIN, limits=ToyLimits(max_num_batched_tokens=2048)), Traffic(rate_per_s=0.001, prompt=FixedLength(5000), output=FixedLength(2)))
    assert r.ttft_s.p50 == pytest.approx(hand, rel=1e-3)


def test_disaggregated_low_load_adds_transfer_and_first_decode_step() -> None:
    # Prefill pool: 7 ms for the 100-token prompt. Transfer: 100 tokens * 1 ms. Decode pool: the first
    # step computes one token after 99 remote ones (5 ms + 20 us + 99 MB / 2 TB/s) and emits token 1.
    r = analyze_disaggregated(Disaggregated(prefill=PoolSpec(cost=PLAIN, limits=ToyLimits()), decode=PoolSpec(cost=PLAIN, limits=ToyLimits()), kv_transfer_s_per_token=1e-3), Traffic(rate_per_s=0.01, prompt=FixedLength(100), output=FixedLength(11)))
    first = 5e-3 + 20e-6 + 99 * 1e6 / 2e12
    assert r.ttft_s.p50 == pytest.approx(PREFILL_100_S + 0.1 + first, rel=2e-3)
    # no prefill interference in the decode pool: TPOT is the plain decode step
    assert r.tpot_s.p99 == pytest.approx((SERVICE_100_11_S - PREFILL_100_S) / 10, rel=5e-3)
    # the mean TTFT moves by exactly the extra transfer time of the mean prompt
    r2 = analyze_disaggregated(Disaggregated(prefill=PoolSpec(cost=PLAIN, limits=ToyLimits()), decode=PoolSpec(cost=PLAIN, limits=ToyLimits()), kv_transfer_s_per_token=3e-3), Traffic(rate_per_s=0.01, prompt=FixedLength(100), output=FixedLength(11)))
    assert r2.ttft_s.mean - r.ttft_s.mean == pytest.approx(100 * 2e-3, rel=1e-9)


@pytest.mark.parametrize("cost,work", [(LinearStepCost(s_per_token=5e-6), RAG), (RooflineStepCost(), CHAT)])
def test_latency_grows_with_rate_explodes_near_saturation_and_is_unstable_beyond(cost, work) -> None:
    prompt, output = work
    rates = []
    r = 0.01
    while analyze(PoolSpec(cost=cost, limits=ToyLimits()), Traffic(rate_per_s=r, prompt=prompt, output=output)).stable:
        rates.append(r)
        r *= 1.15
    assert len(rates) > 10
    res = [analyze(PoolSpec(cost=cost, limits=ToyLimits()), Traffic(rate_per_s=x, prompt=prompt, output=output)) for x in rates]
    for metric in ("ttft_s", "e2e_s"):
        series = [getattr(x, metric).p90 for x in res]
        assert all(b >= a * 0.999 for a, b in zip(series, series[1:])), (metric, series)
    assert [x.utilisation for x in res] == sorted(x.utilisation for x in res)
    assert res[-1].e2e_s.p99 > 2.0 * res[0].e2e_s.p99  # near saturation the tail has blown up
    beyond = analyze(PoolSpec(cost=cost, limits=ToyLimits()), Traffic(rate_per_s=rates[-1] * 1.5, prompt=prompt, output=output))
    assert not beyond.stable and math.isinf(beyond.ttft_s.p99) and beyond.requests_per_s < rates[-1] * 1.5


def test_round_robin_over_replicas_smooths_arrivals() -> None:
    # Two replicas at 2x the rate carry the same load per replica, but round-robin gives each replica
    # Erlang-2 gaps (squared CV 1/2), so queueing can only get better.
    prompt, output = RAG
    cost = LinearStepCost(s_per_token=5e-6)
    one = analyze(PoolSpec(cost=cost, limits=ToyLimits()), Traffic(rate_per_s=2.5, prompt=prompt, output=output))
    two = analyze(PoolSpec(cost=cost, limits=ToyLimits(), replicas=2), Traffic(rate_per_s=5.0, prompt=prompt, output=output))
    assert two.prefill_utilisation == pytest.approx(one.prefill_utilisation, rel=1e-9)
    assert two.mean_running_batch <= one.mean_running_batch  # smaller batch swings: faster steps
    assert two.utilisation <= one.utilisation  # less bunching: less KV headroom needed
    assert two.queue_wait_mean_s < one.queue_wait_mean_s
    assert two.requests_per_s == 5.0 and one.requests_per_s == 2.5


class _It:
    def __init__(self, x: float, x_new: float) -> None:
        self.x, self.x_new = x, x_new


def test_least_root_finds_the_stable_root_and_stops_at_the_cap_without_one() -> None:
    """``f(x) = 0.5 + x^2 / 4`` meets ``x`` where ``x^2 / 4 - x + 0.5 = 0``, ``x = 2 -+ sqrt 2``: the least root
    is ``2 - sqrt 2``. With ``f(x) = x + 1``
    (always above the line) no root lies in ``[0, 16]``: the search says so after reaching the cap once, where it
    used to evaluate the cap 60 times (a replica sized past its slot cap; 151 of the chat example's 802
    searches, 9,000 of its 13,000 step-model evaluations)."""
    seen: list[float] = []

    def f(x: float) -> _It:
        seen.append(x)
        return _It(x, 0.5 + x * x / 4.0)

    s, ok = least_root(f, lambda it: False, cap=100.0)
    assert ok and s.x == pytest.approx(2.0 - math.sqrt(2.0), rel=1e-6)
    seen.clear()

    def g(x: float) -> _It:
        seen.append(x)
        return _It(x, x + 1.0)

    s, ok = least_root(g, lambda it: False, cap=16.0)
    assert not ok and s.x == 16.0
    assert seen == [0.0, 1.0, 3.0, 7.0, 15.0, 16.0]  # doubling up to the cap, once


def test_erlang_c_closed_forms() -> None:
    assert erlang_c(1, 0.3) == pytest.approx(0.3)  # M/M/1: P(wait) = rho
    # M/M/2 at a = 1: C = a^2 / (2 - a) / (1 + a + a^2 / (2 - a)) = 1 / 3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(10, 12.0) == 1.0 and erlang_c(4, 0.0) == 0.0


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(0.05, 40.0),
    replicas=st.integers(1, 4),
    seqs=st.sampled_from([1, 4, 32, 256]),
    budget=st.sampled_from([512, 2048, 8192]),
    chunked=st.booleans(),
    caching=st.booleans(),
    prompt_median=st.integers(50, 6000),
    output_median=st.integers(1, 400),
    roofline=st.booleans(),
)
def test_invariants(rate, replicas, seqs, budget, chunked, caching, prompt_median, output_median, roofline) -> None:
    cost = RooflineStepCost() if roofline else LinearStepCost(s_per_token=5e-6)
    limits = ToyLimits(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked,
                       enable_prefix_caching=caching)
    prompt = LogNormalLength(prompt_median, 0.6, 1, 12000)
    output = LogNormalLength(output_median, 0.6, 1, 2000)
    r = analyze(PoolSpec(cost=cost, limits=limits, replicas=replicas), Traffic(rate_per_s=rate, prompt=prompt, output=output, shared_prefix_fraction=0.3))
    assert r.requests_per_s <= rate * (1 + 1e-12)
    if not r.stable:
        assert math.isinf(r.ttft_s.p50) and math.isinf(r.e2e_s.mean) and r.utilisation >= 1.0
        return
    assert 0.0 < r.utilisation < 1.0
    assert r.output_tokens_per_s == pytest.approx(rate * output.mean, rel=0.02)
    for m in ("ttft_s", "tpot_s", "e2e_s"):
        p = getattr(r, m)
        assert 0.0 <= p.p50 <= p.p90 <= p.p95 <= p.p99 < math.inf, (m, p)
    assert r.e2e_s.p50 >= r.ttft_s.p50 * 0.999
    # nothing is faster than the cheapest step the engine can run
    assert r.ttft_s.p50 >= cost.step_s(1, 0.0, 0.0) * 0.999


def test_deterministic_and_picklable() -> None:
    prompt, output = CHAT
    a = analyze(PoolSpec(cost=RooflineStepCost(), limits=ToyLimits()), Traffic(rate_per_s=2.0, prompt=prompt, output=output))
    b = analyze(PoolSpec(cost=RooflineStepCost(), limits=ToyLimits()), Traffic(rate_per_s=2.0, prompt=prompt, output=output))
    assert a == b
    c = pickle.loads(pickle.dumps(a))
    assert c == a and c.tpot_s.to_dict() == a.tpot_s.to_dict()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_rate_is_a_config_error(bad: float) -> None:
    with pytest.raises(ConfigError):
        analyze(PoolSpec(cost=PLAIN, limits=ToyLimits()), Traffic(rate_per_s=bad, prompt=FixedLength(10), output=FixedLength(10)))


def test_bad_replicas_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        analyze(PoolSpec(cost=PLAIN, limits=ToyLimits(), replicas=0), Traffic(rate_per_s=1.0, prompt=FixedLength(10), output=FixedLength(10)))


def test_shipped_sobol_points_equal_scipys():
    # recommender/data/qmc-sobol-1024x7.npy caches scipy's scrambled Sobol points (saves a 0.5 s import)
    import numpy as np

    from recommender.load.summaries import _sobol_points, sobol_points_fresh

    assert np.array_equal(_sobol_points(), sobol_points_fresh())
