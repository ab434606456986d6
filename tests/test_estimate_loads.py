"""The estimate library's loads: closed loop above capacity, short-prompt TTFT, finite runs, --bench.

Numbers are computed by hand from the datasheet figures and a round-number profile (below), or from
queueing laws (Little's law, the drain of a burst), never read back from the model under test.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.estimator import bench_run, build_deployment, finite_run
from recommender.perf.steady import Load, LoadMode, estimate
from recommender.perf.step import EngineLimits
from recommender.profiles import EngineProfile, engine_profile

# hardware-and-models.md section 1: H100 SXM5 3.35 TB/s HBM3, 989 TFLOP/s dense BF16
H100_HBM_BYTES_PER_S = 3.35e12
H100_BF16_FLOPS = 989e12
# hardware-and-models.md table 2b: Llama-3.1-8B 8,030,261,248 parameters, bf16
LLAMA31_8B_PARAMS = 8_030_261_248
LLAMA31_8B_EMBED = 128_256 * 4096          # input embedding: a lookup, no FLOPs

# a round-number profile: full datasheet bandwidth, half the FLOP/s, 1 ms per step, 4 ms per prefill step
PROFILE = EngineProfile(engine="vllm", hbm_bandwidth_efficiency=1.0, compute_efficiency=0.5, step_overhead_s=1e-3,
                        prefill_step_overhead_s=4e-3, request_overhead_s=0.0)


def dep8b(profile: EngineProfile = PROFILE, limits: EngineLimits | None = None):
    cat = default_catalog()
    return build_deployment(model=cat.model("llama-3.1-8b"), gpu=cat.gpu("h100-sxm"), tp=1, weight_dtype="bf16",
                            kv_dtype="bf16", profile=profile, limits=limits or EngineLimits(256, 8192), max_model_len=4096)


def test_load_mode_is_a_str_enum_and_constructors_are_keyword_only() -> None:
    ld = Load.closed(concurrency=8, prompt_tokens=100, output_tokens=10)
    assert ld.mode is LoadMode.CLOSED and ld.mode == "closed" and Load("closed", 8, 0, 100, 10) == ld
    with pytest.raises(TypeError):
        Load.closed(8, 100, 10)  # type: ignore[misc]
    with pytest.raises(ValueError):
        Load("sideways")


def test_short_prompt_ttft_pays_the_prefill_step_fixed_cost() -> None:
    """16-token prompt, batch 1: memory-bound, TTFT = weights / bandwidth + step overhead + prefill-step cost."""
    weights_s = LLAMA31_8B_PARAMS * 2 / H100_HBM_BYTES_PER_S                     # 4.794 ms
    compute_s = 16 * 2 * (LLAMA31_8B_PARAMS - LLAMA31_8B_EMBED) / (H100_BF16_FLOPS * 0.5)
    assert compute_s < weights_s                                                   # so the GEMMs are memory-bound
    expected = weights_s + 1e-3 + 4e-3                                             # 9.79 ms
    e = estimate(dep8b(), Load.static(batch=1, prompt_tokens=16, output_tokens=2))
    assert e.ttft_s == pytest.approx(expected, rel=0.01)
    # the fixed cost is charged on prefill steps only: the decode step does not pay it
    assert e.tpot_s == pytest.approx(weights_s + 1e-3, rel=0.01)
    without = estimate(dep8b(PROFILE.replace(prefill_step_overhead_s=0.0)),
                       Load.static(batch=1, prompt_tokens=16, output_tokens=2))
    assert e.ttft_s - without.ttft_s == pytest.approx(4e-3, rel=1e-6)


def test_gemm_efficiency_grows_with_the_tokens_in_the_step() -> None:
    """eff(M) = eff_max M / (M + M_half): a compute-bound 4096-token prefill at M_half = 4096 takes twice the GEMM time."""
    flat = dep8b(PROFILE.replace(prefill_step_overhead_s=0.0, step_overhead_s=0.0))
    curved = dep8b(PROFILE.replace(prefill_step_overhead_s=0.0, step_overhead_s=0.0, gemm_m_half_tokens=4096.0))
    from recommender.perf.step import StepCostModel

    a, b = StepCostModel.build(flat), StepCostModel.build(curved)
    gemm = 4096 * 2 * (LLAMA31_8B_PARAMS - LLAMA31_8B_EMBED) / (H100_BF16_FLOPS * 0.5)   # 0.124 s at eff_max
    assert a.step_s(4096, 0.0, 0.0) == pytest.approx(gemm, rel=1e-3)
    assert b.step_s(4096, 0.0, 0.0) == pytest.approx(2 * gemm, rel=1e-3)


def test_closed_loop_above_capacity_queues_at_the_engine() -> None:
    """max_num_seqs 8, concurrency 32: 8 run, 24 wait. Little's law: N = throughput x E2E for the 32 in
    flight; TPOT and throughput are those of 8 running; each request waits 3 of the 8's cycle times."""
    dep = dep8b(limits=EngineLimits(8, 8192))
    r8 = estimate(dep, Load.closed(concurrency=8, prompt_tokens=512, output_tokens=128))
    r32 = estimate(dep, Load.closed(concurrency=32, prompt_tokens=512, output_tokens=128))
    assert r32.tpot_s == pytest.approx(r8.tpot_s)
    assert r32.output_tokens_per_s == pytest.approx(r8.output_tokens_per_s)
    requests_per_s = r32.output_tokens_per_s / 128
    assert requests_per_s * r32.e2e_s == pytest.approx(32)                     # Little's law over all 32
    assert r32.ttft_s == pytest.approx(r8.ttft_s + 3 * r8.e2e_s)               # (32 / 8 - 1) cycles of the 8
    assert any("wait in its queue" in n for n in r32.notes)


def test_closed_loop_above_the_token_budget_queues_for_prefill() -> None:
    """64 in flight, 1000-token prompts, 8 output tokens, budget 2048: the lane can start at most
    2048 / (1000 + 7) requests per step, so a request lives 64 x 1007 / 2048 = 31.5 steps, not k + 7."""
    dep = dep8b(PROFILE.replace(prefill_step_overhead_s=0.0), limits=EngineLimits(256, 2048))
    e = estimate(dep, Load.closed(concurrency=64, prompt_tokens=1000, output_tokens=8))
    steps_per_request = 64 * 1007 / 2048
    # every step is full (2048 tokens), so E2E = life x step and throughput = 64 x 8 / E2E
    from recommender.perf.step import StepCostModel

    cost = StepCostModel.build(dep)
    assert e.tpot_s == pytest.approx(cost.step_s(2048, 0, 0), rel=0.15)      # a full step (attention aside)
    assert e.e2e_s == pytest.approx(steps_per_request * e.tpot_s, rel=0.05)
    assert e.output_tokens_per_s == pytest.approx(64 * 8 / e.e2e_s)


def test_finite_run_below_capacity_lasts_the_arrivals_plus_one_latency() -> None:
    """100 requests at 10 req/s, below capacity: duration = 9.9 s of arrivals + one E2E."""
    dep = dep8b()
    run = finite_run(dep, Load.finite(requests=100, prompt_tokens=256, output_tokens=64, rate_per_s=10.0))
    assert run.in_flight > 1 and run.in_flight == pytest.approx(10.0 * run.e2e_s, rel=1e-4)   # Little's law
    assert run.duration_s == pytest.approx(9.9 + run.e2e_s)
    assert run.output_tokens_per_s == pytest.approx(100 * 64 / (9.9 + run.e2e_s))


def test_a_burst_drains_in_waves_and_the_simulator_agrees() -> None:
    """64 equal requests at once with max_num_seqs 16: 4 synchronised waves of 16, each a static batch.
    Duration = 4 waves; the mean request waits 1.5 waves (0, 1, 2, 3 / 4). The discrete-event
    simulator of the same run agrees."""
    dep = dep8b(limits=EngineLimits(16, 8192))
    burst = Load.finite(requests=64, prompt_tokens=512, output_tokens=128)
    run = finite_run(dep, burst)
    wave = estimate(dep, Load.static(batch=16, prompt_tokens=512, output_tokens=128))
    assert run.duration_s == pytest.approx(4 * wave.e2e_s)
    assert run.output_tokens_per_s == pytest.approx(64 * 128 / (4 * wave.e2e_s))
    assert run.ttft_s == pytest.approx(wave.ttft_s + 1.5 * wave.e2e_s)
    sim = bench_run(dep, burst)
    assert sim["method"] == "simulated" and sim["completed"] == 64
    assert float(sim["output_throughput"]) == pytest.approx(run.output_tokens_per_s, rel=0.1)
    assert float(sim["mean_ttft_ms"]) / 1e3 == pytest.approx(run.ttft_s, rel=0.15)
    assert float(sim["mean_tpot_ms"]) / 1e3 == pytest.approx(run.tpot_s, rel=0.1)


def test_bench_prints_vllm_bench_serve_keys() -> None:
    """`estimate --bench` speaks `vllm bench serve`: its flags in, its result keys out (reference bench-serve-result.json)."""
    keys = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
            "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
            "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms"}
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--bench", "--num-prompts", "50",
                                 "--request-rate", "5", "--random-input-len", "512", "--random-output-len", "64",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert keys <= set(doc) and doc["completed"] == 50 and doc["total_output_tokens"] == 50 * 64
    # 50 requests at 5 req/s: the run lasts at least the 49 gaps' worth of arrivals (~9.8 s)
    assert doc["duration"] > 5.0 and doc["request_throughput"] == pytest.approx(50 / doc["duration"])
    capped = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--bench",
                                      "--num-prompts", "200", "--max-concurrency", "8", "--format", "json"])
    assert capped.exit_code == 0, capped.output
    cd = json.loads(capped.output)
    assert cd["method"] == "analytic" and cd["max_concurrency"] == 8
    # Little's law for the capped closed loop: 8 in flight = request throughput x mean E2E
    assert cd["request_throughput"] * cd["mean_e2el_ms"] / 1e3 == pytest.approx(8, rel=0.05)


def test_bench_refuses_estimate_load_flags() -> None:
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--bench", "--batch", "4"])
    assert r.exit_code != 0 and "--bench takes vllm bench serve's flags" in r.output


def test_engine_conditions_are_printed() -> None:
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--batch", "1",
                                 "--context", "100"])
    assert r.exit_code == 0, r.output
    # vLLM 0.33 defaults: an A100 gets 2048 tokens / 256 sequences (EngineArgs.get_batch_defaults)
    assert "Engine conditions" in r.output and "max_num_seqs 256, max_num_batched_tokens 2048" in r.output


def test_a_gpu_without_a_family_fit_uses_the_engine_profile() -> None:
    prof = engine_profile("vllm")
    assert prof.for_gpu("no-such-gpu") is prof and prof.evidence("no-such-gpu") == ("", 0)
    assert not math.isnan(prof.compute_efficiency)


def test_parallel_attention_blocks_do_one_all_reduce_per_layer() -> None:
    """GPT-J and Falcon-7B (config.json: model_type gptj; parallel_attn true) sum attention and MLP outputs of the
    same input: one TP all-reduce per layer, not two. At T = 0 tokens only the latency term is left:
    GPT-J's 28 layers x 12 us = 336 us on TP 2, where a sequential block would pay 672 us."""
    import dataclasses
    from pathlib import Path

    from recommender.hf_config import load_config_file
    from recommender.perf.step import StepCostModel

    cfgs = Path(__file__).resolve().parent / "data" / "hf_configs"
    gptj, falcon = load_config_file(cfgs / "gpt-j-6b"), load_config_file(cfgs / "falcon-7b")
    assert gptj.parallel_attention and falcon.parallel_attention
    assert not default_catalog().model("llama-3.1-8b").parallel_attention
    gpu = default_catalog().gpu("h100-sxm")
    prof = PROFILE.replace(allreduce_latency_s=12e-6)

    def cost(arch):
        return StepCostModel.build(build_deployment(model=arch, gpu=gpu, tp=2, weight_dtype="bf16", kv_dtype="bf16",
                                                    profile=prof, max_model_len=2048))

    par, seq = cost(gptj), cost(dataclasses.replace(gptj, parallel_attention=False))
    assert par.allreduce_s(0) == pytest.approx(28 * 12e-6)
    assert seq.allreduce_s(0) == pytest.approx(2 * 28 * 12e-6)
    assert par.allreduce_s(512) == pytest.approx(seq.allreduce_s(512) / 2)


def test_a_static_batch_shares_vllms_budget_and_another_engines_benchmark_runs_in_one_pass() -> None:
    """vLLM splits a static batch's prefill into steps of max_num_batched_tokens: 8 prompts of 2,048 tokens in steps
    of 2,048 tokens are floor(2048 / 8) = 256 tokens of each, ceil(2048 / 256) = 8 steps; gptSessionBenchmark's static
    batching (TRT061: TensorRT-LLM 0.6.1 docs/source/performance.md) runs the batch's context in one pass, which
    the published rows are read with (perf.conditions.static_batch_limits), so their predictions did not move."""
    from pathlib import Path

    from recommender.calibrate.readers import read_published_csv
    from recommender.perf.conditions import static_batch_limits
    from recommender.perf.step import StepCostModel

    dep = dep8b(limits=EngineLimits(max_num_seqs=256, max_num_batched_tokens=2048))
    load = Load.static(batch=8, prompt_tokens=2048, output_tokens=64)
    cost = StepCostModel.build(dep)
    split = estimate(dep, load)
    assert split.wave_sequences == 8
    assert split.wave_prefill_s == pytest.approx(cost.prefill_s(2048, 8, 2048), rel=1e-12)
    one = dep8b(limits=static_batch_limits(dep.limits))
    whole = estimate(one, load)
    assert whole.wave_prefill_s == pytest.approx(cost.prefill_s(2048, 8, None), rel=1e-12)
    # 8 steps pay the profile's 1 ms step + 4 ms prefill-step overhead 8 times, where one pass pays it once
    assert split.wave_prefill_s - whole.wave_prefill_s >= 7 * (1e-3 + 4e-3) * 0.99
    csv = Path(__file__).resolve().parent / "data" / "measurements" / "published.csv"
    rows = read_published_csv(csv).measurements
    static = {m.engine: m.limits.static_prefill_one_pass for m in rows if m.load.mode == LoadMode.STATIC}
    assert static == {"lmdeploy": True, "gpt-fast": True, "trtllm": True}
    assert not any(m.limits.static_prefill_one_pass for m in rows if m.load.mode != LoadMode.STATIC)
