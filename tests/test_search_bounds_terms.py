"""The search's cost bounds term by term (issue #31, item 4), each on a case where the bound meets the evaluation.

Problem: ``benchmarks/workloads/tight-tpot-70b.yaml`` (Llama-3.1-70B, 6 req/s with the 20% headroom, 1,500 / 150
tokens constant, TTFT 250 ms / TPOT 10 ms p90). The reference numbers are the step-cost model's own steps
(``StepCostModel.step_s``) and the sizer's evaluation, never the bound's code: a bound term that equals them on a
case where it should be exact, and the replicas or rental it derives equal what sizing finds.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.load import PoolSpec, Traffic, analyze
from recommender.perf import memory as mem
from recommender.profiles import engine_profile
from recommender.search.bounds import Bounds, _curve_per_token, _curve_tokens
from recommender.search.evaluate import evaluate
from recommender.search.planner import build_context, space_choices
from recommender.search.policy import load_search_policy
from recommender.sizing import Candidate, limits_of, pd_limits
from recommender.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tight():
    w = load_workload(ROOT / "benchmarks" / "workloads" / "tight-tpot-70b.yaml")
    ctx = build_context(w, load_search_policy(), engine_profile("vllm"), default_catalog())
    ch = space_choices(ctx)
    return w, ctx, Bounds(ctx, ch.max_num_seqs, ch.budgets)


@pytest.fixture(scope="module")
def tight_no_handoff():
    # the queue terms below are about the prefill lane: without the P/D handoff (a constant, tested on its own)
    w = load_workload(ROOT / "benchmarks" / "workloads" / "tight-tpot-70b.yaml")
    policy = dataclasses.replace(load_search_policy(), kv_handoff_s=0.0)
    ctx = build_context(w, policy, engine_profile("vllm"), default_catalog())
    ch = space_choices(ctx)
    return w, ctx, Bounds(ctx, ch.max_num_seqs, ch.budgets)


def _cost(ctx, w, c: Candidate, pd: bool = False):
    lim = pd_limits(c, w.max_model_len, False)[0] if pd else limits_of(c, w.max_model_len, False)
    cost, why = ctx.cost_model(c.gpu, c.tp, c.weight_dtype, c.kv_dtype, lim)
    assert cost is not None, why
    return cost, lim


def test_the_curve_tokens_are_the_half_point_ramped_in_past_the_memory_knee(tight) -> None:
    # g(T) = M_half (1 - h M_mem / (T + M_mem)), M_mem = weight time x compute / FLOPs per token (perf.step)
    w, ctx, bounds = tight
    cost, _ = _cost(ctx, w, Candidate("h100-sxm", 8, "fp8", "fp8", 16, 8192))
    m_mem = cost.weight_read_s(1, cost.hbm_bytes_per_s) * cost.group_flops_per_s / cost.linear_flops_per_token
    for t in (1.0, 476.0, 1500.0, 8192.0):
        want = cost.gemm_m_half_tokens * (1.0 - cost.gemm_curve_hidden * m_mem / (t + m_mem))
        assert _curve_tokens(cost, t) == pytest.approx(want, rel=1e-12)
        # the step model's effective GEMM FLOPs of a dense model are (T + g(T)) x FLOPs per token
        assert cost.gemm_effective_flops(int(t)) == pytest.approx((t + want) * cost.linear_flops_per_token, rel=1e-12)
    # per token over steps of at most cap tokens: g(cap) / cap, below g(T) / T for every shorter step (concave g)
    assert _curve_per_token(cost, 8192) < _curve_tokens(cost, 1500.0) / 1500.0


def test_a_one_chunk_prefill_bound_is_its_exact_step(tight) -> None:
    # a 1,500-token prompt in one compute-bound step: GEMMs (Pc + g(Pc)) lf / flops, attention FLOPs, Pc tokens of
    # all-reduce and the step overheads are the step itself; the GEMM curve taken at the budget (8,192 tokens)
    # instead of the chunk undercounted it by 18% (49.9 ms against 60.5 ms on h100 TP8 fp8)
    w, ctx, bounds = tight
    cost, _ = _cost(ctx, w, Candidate("h100-sxm", 8, "fp8", "fp8", 16, 8192))
    kv, fl = cost.prefill_chunk_cost(1500, 0)
    exact = cost.step_s(1500, kv, fl, prefill=True)
    assert bounds._own_lb(cost, 8192).mean() == pytest.approx(exact, rel=1e-9)
    at_budget = 1500 * (1.0 + _curve_per_token(cost, 8192)) * cost.linear_flops_per_token / cost.group_flops_per_s
    assert at_budget < 0.8 * cost.parts(1500, kv, fl)["gemm_s"]


def test_a_two_chunk_prefill_bound_is_the_sum_of_its_steps(tight) -> None:
    # budget 1,024: a full chunk and a 476-token rest after it (its prefix KV read and attention pairs); both steps
    # compute-bound, so the bound (fewest, largest chunks: the least GEMM-curve sum) is their exact sum
    w, ctx, bounds = tight
    cost, _ = _cost(ctx, w, Candidate("b200", 1, "int4", "fp8", 16, 1024))
    kv0, fl0 = cost.prefill_chunk_cost(1024, 0)
    kv1, fl1 = cost.prefill_chunk_cost(476, 1024)
    parts = cost.parts(476, kv1, fl1)
    assert parts["gemm_s"] > cost.weight_read_s(476, cost.hbm_bytes_per_s)  # compute-bound
    exact = cost.step_s(1024, kv0, fl0, prefill=True) + cost.step_s(476, kv1, fl1, prefill=True)
    assert bounds._own_lb(cost, 1024).mean() == pytest.approx(exact, rel=1e-9)


def test_prefill_interference_bound_needs_the_replicas_sizing_finds(tight) -> None:
    # h100 TP8 fp8, 16 sequences, 8k chunks: one replica at 6 req/s decodes at t ~ 6.8 ms, and each prompt adds
    # D = own - t ~ 53.7 ms to the steps it shares; by hand the mean TPOT is at least
    # t + D lam (t + own / (O - 1)) / (1 - lam D) > 10 ms, so the bound asks 2 replicas, as sizing does
    w, ctx, bounds = tight
    c = Candidate("h100-sxm", 8, "fp8", "fp8", 16, 8192)
    cost, lim = _cost(ctx, w, c)
    lam = 6.0
    kv, fl = cost.prefill_chunk_cost(1500, 0)
    own = cost.step_s(1500, kv, fl, prefill=True)
    b = int(lam * 149 * cost.decode_step_s(1, 1417))  # Little: decoders per step at the one-sequence step
    t = cost.decode_step_s(b, 1417)  # 90% of the mean context, 1,575 tokens
    d = own - t
    by_hand = t + d * lam * (t + 0.95 * own / 149) / (1.0 - lam * d)
    assert by_hand > 0.0101
    gen = bounds.generous_cost("h100-sxm", 8, "fp8", "fp8")
    slots = bounds._slots_min(("h100-sxm", 8, "fp8", "fp8", 1, False, 0), 16, 8192)
    assert slots == 16
    assert bounds._tpot_interference_replicas(gen, (8192,), 1, slots) == 2
    assert bounds.of(c).replicas == (2,)
    traffic = Traffic(rate_per_s=lam, prompt=w.prompt_tokens, output=w.output_tokens)
    assert not ctx.ok(analyze(PoolSpec(cost=cost, limits=lim, replicas=1), traffic))
    assert ctx.ok(analyze(PoolSpec(cost=cost, limits=lim, replicas=2), traffic))
    ev = evaluate(ctx, c)
    assert ev.feasible and ev.pools[0].replicas == 2


def test_pd_rental_bound_is_the_cheapest_kv_path_and_equals_the_evaluation(tight) -> None:
    # b200 TP1 -> TP1 int4: two prefill replicas and one decoder fit one runpod-secure instance only as 4 GPUs
    # (instances of 1, 2, 4, 8 GPUs at $6.79/GPU-h, catalogs/gpus/b200.yaml [P6]); across instances the KV of a
    # 1,500-token prompt (163,840 B/token at fp8: 2 x 80 layers x 8 KV heads x 128 x 1 B) over a NIC of about
    # 1.25 GB/s takes ~0.2 s, so 6 req/s need 2 prefill and 2 decode replicas to keep the link under 80%:
    # 4 GPUs either way, where two separate rentals (3 GPUs, $20.37/h) were the bound before
    w, ctx, bounds = tight
    assert mem.kv_cache_bytes_per_token(ctx.model, "fp8", 1) == 2 * 80 * 8 * 128
    c = Candidate("b200", 1, "int4", "fp8", 16, 8192, True, "b200", 1)
    ev = evaluate(ctx, c)
    b = bounds.of(c)
    assert ev.feasible and b is not None
    assert b.usd_per_hour == pytest.approx(4 * 6.79, rel=1e-9)
    assert b.usd_per_hour == pytest.approx(ev.usd_per_hour, rel=1e-9)


def test_prefill_ttft_queue_counts_the_prompts_that_join_its_last_step(tight_no_handoff) -> None:
    # h100 TP2 int4 prefill pool: a 1,500-token prompt prefills in ~166 ms; at 3 req/s per replica (2 replicas) it
    # waits ~85 ms at p90 in the lane, and the ~380 prompt tokens arriving meanwhile join its step (~0.1 ms each):
    # TTFT p90 > 250 ms, so 3 prefill replicas, as the evaluation's own pools on that path need
    w, ctx, bounds = tight_no_handoff
    c = Candidate("h100-sxm", 2, "int4", "fp8", 16, 8192, True, "h100-sxm", 4)
    gen = bounds.generous_cost("h100-sxm", 2, "int4", "fp8")
    xfer = 1500 * mem.kv_cache_bytes_per_token(ctx.model, "fp8", 1) / (2 * 64e9)  # PCIe Gen5 host staging, 2 GPUs
    assert bounds._ttft_queue_replicas(gen, 8192, 1, xfer) == 3
    p_cost, p_lim = _cost(ctx, w, c, pd=True)
    d_lim = pd_limits(c, w.max_model_len, False)[1]
    d_cost, _ = ctx.cost_model("h100-sxm", 4, "int4", "fp8", d_lim)
    path = ctx.kv_paths(c)[0]
    assert path.same_instance and path.bytes_per_s_per_gpu == 64e9
    link = ctx.kv_link(c, path)
    ttft = [ctx.analyze_pd(c, PoolSpec(cost=p_cost, limits=p_lim, replicas=rp),
                           PoolSpec(cost=d_cost, limits=d_lim, replicas=1), 6.0, link).ttft_s.at("p90") for rp in (2, 3)]
    assert ttft[0] > 0.25 >= ttft[1]
    b = bounds.of(c)
    assert b is not None and b.usd_per_hour * 1e6 / (5.0 * 1650 * 3600) > 0.95 * 0.9145  # above P/D's 5% bar


def test_a_pd_bound_counts_the_handoff_and_stays_below_the_evaluation(tight, tight_no_handoff) -> None:
    # the handoff (recommender.load.link, 60 ms shipped) is a delay in every P/D request's TTFT: the prefill pool's
    # TTFT bound moves by exactly it, and the evaluated TTFT by about it (the same pools, a constant added)
    w, ctx, bounds = tight
    _, ctx0, bounds0 = tight_no_handoff
    handoff = ctx.kv_link(Candidate("h100-sxm", 2, "int4", "fp8", 16, 8192, True, "h100-sxm", 4)).handoff_s
    assert handoff == pytest.approx(0.06) and ctx.rules.kv_handoff_s == handoff
    key = ("h100-sxm", 2, "int4", "fp8", 1, False, 0)
    with_h, without = bounds._prefill(key, 8192), bounds0._prefill(key, 8192)
    assert with_h is not None and without is not None
    for q in ("mean", "p50", "p90", "p99"):
        assert with_h[1][q] - without[1][q] == pytest.approx(handoff, abs=1e-12)
    c = Candidate("h100-sxm", 2, "int4", "fp8", 16, 8192, True, "h100-sxm", 4)
    p_cost, p_lim = _cost(ctx, w, c, pd=True)
    d_lim = pd_limits(c, w.max_model_len, False)[1]
    d_cost, _ = ctx.cost_model("h100-sxm", 4, "int4", "fp8", d_lim)
    path = ctx.kv_paths(c)[0]
    pools = (PoolSpec(cost=p_cost, limits=p_lim, replicas=4), PoolSpec(cost=d_cost, limits=d_lim, replicas=1))
    got = [cx.analyze_pd(c, *pools, 2.0, cx.kv_link(c, path)).ttft_s.at("p50") for cx in (ctx, ctx0)]
    assert got[0] - got[1] == pytest.approx(handoff, rel=0.05)
    assert with_h[1]["p50"] <= got[0]


def test_the_tight_tpot_bounds_stay_below_these_evaluations(tight) -> None:
    # the cases above and their neighbours: bound <= evaluation, cost and latencies
    w, ctx, bounds = tight
    k = 1e6 / (w.effective_rate_per_s * 1650 * 3600)
    for c in (Candidate("h100-sxm", 8, "fp8", "fp8", 16, 8192), Candidate("h100-sxm", 8, "int4", "fp8", 64, 2048),
              Candidate("b200", 4, "fp8", "fp8", 16, 16384), Candidate("b200", 1, "int4", "fp8", 32, 1024),
              Candidate("b200", 2, "int4", "fp8", 16, 0, True, "b200", 1),
              Candidate("h100-sxm", 2, "int4", "fp8", 16, 8192, True, "h100-sxm", 4)):
        ev = evaluate(ctx, c)
        b = bounds.of(c)
        assert b is not None
        if ev.feasible:
            assert b.usd_per_hour * k <= ev.objectives[0] * (1 + 1e-9), c.key
            assert all(lb <= lat * (1 + 1e-9) for lb, lat in zip(b.latencies_s, ev.objectives[1:])), c.key
        assert math.isfinite(b.usd_per_hour)


def test_the_mean_positive_part_of_lines_by_sorted_roots_is_the_direct_mean() -> None:
    # E[max(0, a - n T)] over points, by cumulative sums over the points sorted on a / n, against the array itself
    import numpy as np

    from recommender.search.bounds import _mean_positive

    rng = np.random.default_rng(0)
    a, n = rng.uniform(-1.0, 5.0, 1000), rng.integers(1, 4, 1000).astype(float)

    def f(t):
        return (a[None] - n[None] * np.asarray(t)[..., None, None]).min(axis=-2)

    t = np.linspace(0.0, 3.0, 17)
    direct = np.maximum(0.0, a[None] - n[None] * t[:, None]).mean(axis=-1)
    f.lines = (a, n, np.zeros((3, 0)), np.zeros((3, 0)))
    assert np.allclose(_mean_positive(f, t), direct, rtol=0.0, atol=1e-12)
    # half the points as lines, the other half as the least of three lines each (two of them never the least)
    half = a.size // 2
    rest_a = np.stack([a[half:], a[half:] + 9.0, a[half:] + 9.0])
    rest_n = np.stack([n[half:], n[half:], n[half:]])
    f.lines = (a[:half], n[:half], rest_a, rest_n)
    assert np.allclose(_mean_positive(f, t), direct, rtol=0.0, atol=1e-12)
    assert direct[0] > direct[-1] > 0.0  # the case exercises both clipped and unclipped points
