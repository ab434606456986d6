"""Invariants of the perf model (recommender/perf/) over every catalog model and GPU, any dtype and any
physically bounded efficiency profile (hypothesis).

- more TP never raises per-GPU weight bytes;
- a longer context never lowers a step time (nor a larger batch);
- a smaller dtype never raises bytes (weights by bits per parameter, KV cache fp8 <= bf16);
- throughput never exceeds the rooflines: each step streams at least the weights it reads at the
  datasheet HBM bandwidth, and every output token costs at least its matmul FLOPs at datasheet peak;
- the realistic step is never faster than the ideal floor.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from recommender.catalog import KV_DTYPES, WEIGHT_DTYPES, default_catalog
from recommender.errors import ConfigError
from recommender.perf import memory as mem
from recommender.perf.steady import Load, estimate
from recommender.perf.step import Deployment, EngineLimits, StepCostModel, check_parallelism
from recommender.profiles import BOUNDS, engine_profile

CAT = default_catalog()
MODELS = sorted(CAT.models)
GPUS = sorted(CAT.gpus)
TPS = (1, 2, 4, 8, 16)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: bits per stored parameter: a "smaller" dtype has fewer (mxfp4 is gpt-oss's expert-only format: see below)
BITS = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4}


@st.composite
def profiles(draw):
    """The shipped profile with every fitted parameter redrawn inside its physical bounds."""
    kw = {}
    for name in ("hbm_bandwidth_efficiency", "compute_efficiency", "allreduce_latency_s", "allreduce_latency_pcie_s",
                 "allreduce_bandwidth_efficiency", "step_overhead_s", "layer_launch_overhead_s"):
        lo, hi = BOUNDS[name]
        kw[name] = draw(st.floats(min_value=lo, max_value=hi, allow_nan=False))
    return engine_profile("vllm").replace(**kw)


@st.composite
def deployments(draw, fixed_profile: bool = False):
    model = CAT.model(draw(st.sampled_from(MODELS)))
    gpu = CAT.gpu(draw(st.sampled_from(GPUS)))
    tp = draw(st.sampled_from(TPS))
    try:
        check_parallelism(model, gpu, tp)
    except ConfigError:
        assume(False)
    prof = engine_profile("vllm") if fixed_profile else draw(profiles())
    limits = EngineLimits(max_num_seqs=draw(st.sampled_from((64, 256, 1024))),
                          max_num_batched_tokens=draw(st.sampled_from((2048, 8192, 16384))),
                          chunked_prefill=draw(st.booleans()))
    return Deployment(model=model, gpu=gpu, tp=tp, weight_dtype=draw(st.sampled_from(WEIGHT_DTYPES)),
                      kv_dtype=draw(st.sampled_from(KV_DTYPES)), profile=prof, limits=limits,
                      gpu_memory_utilization=draw(st.sampled_from((0.5, 0.8, 0.92, 0.95))),
                      cuda_graphs=draw(st.booleans()), max_model_len=draw(st.sampled_from((1024, 8192, 32768))))


contexts = st.integers(min_value=1, max_value=131_072)
batches = st.integers(min_value=1, max_value=1024)


# =========================================================================== weights
@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(WEIGHT_DTYPES), st.sampled_from(TPS), st.sampled_from(TPS))
def test_more_tp_never_raises_per_gpu_weight_bytes(model_id: str, dtype: str, tp_a: int, tp_b: int) -> None:
    m = CAT.model(model_id)
    lo, hi = sorted((tp_a, tp_b))
    assert mem.weights_bytes_per_gpu(m, dtype, hi) <= mem.weights_bytes_per_gpu(m, dtype, lo)
    # sharding never loses bytes: TP x per-GPU >= the whole (K/V projections may be replicated)
    assert mem.weights_bytes_per_gpu(m, dtype, hi) * hi >= mem.weight_bytes(m, dtype) * (1 - 1e-12)


@pytest.mark.parametrize("model_id", MODELS)
def test_tp1_holds_exactly_the_whole_model(model_id: str) -> None:
    m = CAT.model(model_id)
    for dtype in WEIGHT_DTYPES:
        assert mem.weights_bytes_per_gpu(m, dtype, 1) == pytest.approx(mem.weight_bytes(m, dtype), rel=1e-12)


@pytest.mark.slow
@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(sorted(BITS)), st.sampled_from(sorted(BITS)), st.sampled_from(TPS))
def test_a_smaller_dtype_never_raises_weight_bytes(model_id: str, a: str, b: str, tp: int) -> None:
    m = CAT.model(model_id)
    assume(BITS[a] < BITS[b])
    assert mem.weight_bytes(m, a) <= mem.weight_bytes(m, b)
    assert mem.weights_bytes_per_gpu(m, a, tp) <= mem.weights_bytes_per_gpu(m, b, tp)


@pytest.mark.parametrize("model_id", MODELS)
def test_mxfp4_is_never_larger_than_16_bit(model_id: str) -> None:
    # MXFP4 (gpt-oss) quantizes the experts only; it is still never larger than bf16
    m = CAT.model(model_id)
    assert mem.weight_bytes(m, "mxfp4") <= mem.weight_bytes(m, "bf16")
    if m.moe is not None:
        assert mem.weight_bytes(m, "mxfp4") < mem.weight_bytes(m, "bf16")


@SETTINGS
@given(st.sampled_from(MODELS), contexts, st.sampled_from(TPS))
def test_fp8_kv_never_raises_kv_bytes(model_id: str, context: int, tp: int) -> None:
    m = CAT.model(model_id)
    assert mem.kv_cache_bytes_per_token(m, "fp8", tp) * 2 == mem.kv_cache_bytes_per_token(m, "bf16", tp)
    assert mem.kv_bytes_per_sequence(m, "fp8", context, tp, 16) * 2 == mem.kv_bytes_per_sequence(m, "bf16", context, tp, 16)


@SETTINGS
@given(st.sampled_from(MODELS), contexts, contexts, st.sampled_from(KV_DTYPES))
def test_a_longer_sequence_never_holds_less_kv(model_id: str, c1: int, c2: int, kv: str) -> None:
    m = CAT.model(model_id)
    lo, hi = sorted((c1, c2))
    assert mem.kv_bytes_per_sequence(m, kv, lo, 1, 16) <= mem.kv_bytes_per_sequence(m, kv, hi, 1, 16)


# =========================================================================== step times
@SETTINGS
@given(deployments(), batches, contexts, contexts)
def test_a_longer_context_never_lowers_the_step_time(dep: Deployment, batch: int, c1: int, c2: int) -> None:
    cost = StepCostModel.build(dep)
    lo, hi = sorted((c1, c2))
    assert cost.decode_step_s(batch, lo) <= cost.decode_step_s(batch, hi)


@SETTINGS
@given(deployments(), batches, batches, contexts)
def test_a_larger_batch_never_lowers_the_step_time(dep: Deployment, b1: int, b2: int, context: int) -> None:
    cost = StepCostModel.build(dep)
    lo, hi = sorted((b1, b2))
    assert cost.decode_step_s(lo, context) <= cost.decode_step_s(hi, context)


@SETTINGS
@given(deployments(), st.integers(min_value=1, max_value=32_768), st.integers(min_value=1, max_value=32_768))
def test_a_longer_prompt_never_prefills_faster(dep: Deployment, p1: int, p2: int) -> None:
    cost = StepCostModel.build(dep)
    lo, hi = sorted((p1, p2))
    chunk = dep.limits.max_num_batched_tokens if dep.limits.chunked_prefill else None
    assert cost.prefill_s(lo, 1, chunk) <= cost.prefill_s(hi, 1, chunk) * (1 + 1e-12)


@SETTINGS
@given(deployments(), batches, contexts)
def test_the_realistic_step_is_never_faster_than_the_floor(dep: Deployment, batch: int, context: int) -> None:
    cost = StepCostModel.build(dep)
    kv, fl = cost.decode_seq_cost(context)
    floor = cost.parts(batch, batch * kv, batch * fl, floor=True)
    step = cost.step_s(batch, batch * kv, batch * fl)
    assert step >= max(floor["memory_s"], floor["compute_s"])
    # the floor itself: bytes at the datasheet bandwidth, FLOPs at the datasheet peak
    assert floor["memory_s"] == pytest.approx(floor["bytes_per_gpu"] / dep.gpu.hbm_bandwidth_bytes_per_s, rel=1e-12)


@SETTINGS
@given(deployments(), st.lists(contexts, min_size=1, max_size=20))
def test_vectorised_decode_costs_are_the_scalar_ones(dep: Deployment, context_list: list[int]) -> None:
    # the search's bounds read decode costs for whole arrays of prompt lengths: the same numbers, exactly
    import numpy as np

    cost = StepCostModel.build(dep)
    kv, fl = cost.decode_seq_costs(np.asarray(context_list, dtype=float))
    assert [(float(a), float(b)) for a, b in zip(kv, fl)] == [cost.decode_seq_cost(c) for c in context_list]


@SETTINGS
@given(deployments(), batches, contexts, st.integers(min_value=2, max_value=4096))
def test_a_run_of_decode_steps_is_non_decreasing_and_convex(dep: Deployment, batch: int, context: int, run: int) -> None:
    # the StepCost contract the simulator's decode fast-forward rests on (recommender.load.scheduler): with the
    # tokens fixed, the step time along a run of decode steps (every context one token longer per step) is
    # non-decreasing and convex, so a run's time is summed exactly from a few step times
    cost = StepCostModel.build(dep)
    kv0, fl0 = cost.decode_seq_cost(context)
    kv1, fl1 = cost.decode_seq_cost(context + 1)
    dkv, dfl = batch * (kv1 - kv0), batch * (fl1 - fl0)

    def f(i: int) -> float:
        return cost.step_s(batch, batch * kv0 + dkv * i, batch * fl0 + dfl * i)

    a, m, b = f(0), f(run // 2), f(run)
    assert a <= m * (1 + 1e-12) and m <= b * (1 + 1e-12)
    chord = a + (b - a) * (run // 2) / run
    assert m <= chord * (1 + 1e-12)


# =========================================================================== rooflines
loads = st.one_of(
    st.builds(lambda b, c: Load("context", b, c), batches, contexts),
    st.builds(lambda b, p, o: Load("static", b, 0, p, o), st.integers(1, 256), st.integers(1, 8192), st.integers(1, 2048)),
    st.builds(lambda n, p, o: Load("closed", n, 0, p, o), st.integers(1, 512), st.integers(1, 8192), st.integers(1, 2048)),
)


@SETTINGS
@given(deployments(), loads, st.integers(min_value=1, max_value=4))
def test_throughput_never_exceeds_the_bandwidth_roofline(dep: Deployment, load: Load, replicas: int) -> None:
    e = estimate(dep, load, replicas, usd_per_gpu_hour=1.0)
    cost = StepCostModel.build(dep)
    # every step streams at least the weights one token reads (MoE: the fewest experts), at <= peak bandwidth
    min_step_s = cost.weight_bytes_read_per_gpu(1) / dep.gpu.hbm_bandwidth_bytes_per_s
    roofline = replicas * e.batch / min_step_s
    assert e.output_tokens_per_s <= roofline * (1 + 1e-9)


@SETTINGS
@given(deployments(), loads, st.integers(min_value=1, max_value=4))
def test_throughput_never_exceeds_the_compute_roofline(dep: Deployment, load: Load, replicas: int) -> None:
    e = estimate(dep, load, replicas, usd_per_gpu_hour=1.0)
    cost = StepCostModel.build(dep)
    # each output token needs at least one token's matmul FLOPs at the group's datasheet peak
    roofline = replicas * cost.peak_group_flops_per_s / cost.linear_flops_per_token
    assert e.output_tokens_per_s <= roofline * (1 + 1e-9)


@SETTINGS
@given(deployments(fixed_profile=True), loads, st.integers(min_value=1, max_value=4),
       st.floats(min_value=0.1, max_value=20.0, allow_nan=False))
def test_cost_is_price_over_throughput(dep: Deployment, load: Load, replicas: int, price: float) -> None:
    e = estimate(dep, load, replicas, usd_per_gpu_hour=price)
    assert e.usd_per_hour == pytest.approx(price * dep.tp * replicas, rel=1e-12)
    assert e.usd_per_million_output_tokens == pytest.approx(e.usd_per_hour / (e.output_tokens_per_s * 3600) * 1e6, rel=1e-9)
    assert e.usd_per_million_tokens <= e.usd_per_million_output_tokens * (1 + 1e-12)


# =========================================================================== capacity
@SETTINGS
@given(deployments(fixed_profile=True), contexts, contexts)
def test_a_longer_context_never_fits_more_sequences(dep: Deployment, c1: int, c2: int) -> None:
    m = dep.memory()
    lo, hi = sorted((c1, c2))
    n_lo = mem.max_concurrent_sequences(m, dep.model, dep.kv_dtype, dep.tp, lo)
    n_hi = mem.max_concurrent_sequences(m, dep.model, dep.kv_dtype, dep.tp, hi)
    assert n_hi <= n_lo
    # and what fits really fits
    assert n_lo * mem.kv_bytes_per_sequence(dep.model, dep.kv_dtype, lo, dep.tp, 16) <= m.kv_cache_capacity_bytes


@SETTINGS
@given(deployments(fixed_profile=True))
def test_fp8_kv_holds_twice_the_tokens(dep: Deployment) -> None:
    bf16 = dataclasses.replace(dep, kv_dtype="bf16").memory()
    fp8 = dataclasses.replace(dep, kv_dtype="fp8").memory()
    assert fp8.kv_cache_capacity_bytes == bf16.kv_cache_capacity_bytes
    assert fp8.kv_capacity_tokens in (2 * bf16.kv_capacity_tokens, 2 * bf16.kv_capacity_tokens + 1)


@SETTINGS
@given(deployments(fixed_profile=True), st.sampled_from((0.5, 0.8, 0.9)), st.sampled_from((0.92, 0.95, 1.0)))
def test_more_memory_utilisation_never_lowers_capacity(dep: Deployment, lo: float, hi: float) -> None:
    a = dataclasses.replace(dep, gpu_memory_utilization=lo).memory()
    b = dataclasses.replace(dep, gpu_memory_utilization=hi).memory()
    assert a.kv_cache_capacity_bytes <= b.kv_cache_capacity_bytes
    assert b.kv_cache_bytes_per_gpu - a.kv_cache_bytes_per_gpu == pytest.approx(dep.gpu.memory_bytes * (hi - lo), rel=1e-9)
    assert not (a.fits and not b.fits)
    assert math.isfinite(a.shortfall_bytes_per_gpu) and a.shortfall_bytes_per_gpu >= b.shortfall_bytes_per_gpu


@SETTINGS
@given(deployments(fixed_profile=True))
def test_more_tp_never_turns_a_fit_into_a_no_fit(dep: Deployment) -> None:
    wider = dep.tp * 2
    try:
        check_parallelism(dep.model, dep.gpu, wider)
    except ConfigError:
        assume(False)
    a = dep.memory()
    b = dataclasses.replace(dep, tp=wider).memory()
    assert b.kv_cache_bytes_per_gpu >= a.kv_cache_bytes_per_gpu
    assert not (a.fits and not b.fits)
