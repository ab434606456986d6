"""The seed-style walkthrough of one configuration: memory -> decode floor -> batched decode -> prefill
-> capacity -> throughput -> cost, every number with its unit and the formula it came from."""

from __future__ import annotations

import json
from typing import Any

from recommender.estimator import Pricing
from recommender.perf import memory as mem
from recommender.perf.steady import Estimate, Load
from recommender.perf.step import Deployment, StepCostModel
from recommender.units import fmt_bytes as B
from recommender.units import fmt_seconds as S


def _line(label: str, formula: str, value: str) -> str:
    return f"  {label:<18} {formula:<66} = {value}"


def render_walkthrough(dep: Deployment, load: Load, est: Estimate, replicas: int, pricing: Pricing,
                       conditions: list[str] | None = None) -> str:
    m, g, tp, p = dep.model, dep.gpu, dep.tp, dep.profile
    mb = est.memory
    cost = StepCostModel.build(dep)
    out: list[str] = []
    out.append(f"{m.id} on {replicas * tp} x {g.id} (TP {tp}, {replicas} replica{'s' if replicas > 1 else ''}), "
               f"weights {dep.weight_dtype}, KV cache {dep.kv_dtype}, engine profile {p.engine}"
               f"{f' ({p.family} family fit)' if p.family else ''}{'' if dep.cuda_graphs else ', CUDA graphs off'}")
    out.append("")
    if conditions:
        out.append("Engine conditions")
        out += [f"  {c}" for c in conditions]
        out.append("")
    out.append("Memory (per GPU)")
    wpp = mem.bytes_per_weight(dep.weight_dtype)
    out.append(_line("weights", f"{m.total_params / 1e9:.2f}e9 params ({m.params.linear / 1e9:.1f}e9 linear x {wpp:g} B, rest x 2 B) / TP {tp}",
                     B(est.weights_bytes_per_gpu)))
    out.append(_line("budget", f"{B(g.memory_bytes)} x gpu-memory-utilization {dep.gpu_memory_utilization}", B(mb.budget_bytes_per_gpu)))
    out.append(_line("activations", f"{dep.limits.max_num_batched_tokens} tokens profile run + {dep.limits.max_num_seqs} seqs x vocab fp32 logits",
                     B(mb.activation_bytes_per_gpu)))
    out.append(_line("runtime + graphs", "CUDA context, NCCL, workspaces + captured CUDA graphs",
                     B(mb.runtime_reserve_bytes_per_gpu + mb.cuda_graph_bytes_per_gpu)))
    out.append(_line("KV cache", "budget - weights - activations - runtime - graphs", B(mb.kv_cache_bytes_per_gpu)
                     + f" per GPU, {B(est.kv_cache_capacity_bytes)} per replica"))
    if m.mla is not None:
        f = f"{m.num_full_attention_layers} layers x ({m.mla.kv_lora_rank} + {m.mla.qk_rope_head_dim}) x {mem.KV_BYTES[dep.kv_dtype]:g} B x {tp} copies (MLA)"
    else:
        f = f"2 x {m.num_full_attention_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim} x {mem.KV_BYTES[dep.kv_dtype]:g} B"
    out.append(_line("KV per token", f, f"{est.kv_cache_bytes_per_token:,.0f} B ({est.kv_cache_bytes_per_token / 1024:.0f} KiB)"))
    if m.num_sliding_layers:
        out.append(_line("sliding window", f"{m.num_sliding_layers} layers hold at most {m.sliding_window} tokens each", "bounded"))
    seq = load.context_tokens if load.mode == "context" else load.prompt_tokens + load.output_tokens
    out.append(_line("max sequences", f"{B(est.kv_cache_capacity_bytes)} / ({seq:,} tokens x KV per token), 16-token blocks",
                     f"{est.max_concurrent_sequences:,} sequences"))
    out.append(_line("fits", "weights + reserves + one max-length sequence <= budget",
                     "yes" if est.fits else f"NO, short by {B(est.shortfall_bytes_per_gpu)} per GPU"))
    out.append("")
    b = est.batch
    ctx = load.context_tokens if load.mode == "context" else load.prompt_tokens + max(load.output_tokens, 1) // 2
    kv, fl = cost.decode_seq_cost(ctx)
    floor = cost.parts(b, b * kv, b * fl, floor=True)
    out.append(f"Decode step at batch {b}, context {ctx:,} tokens")
    out.append(_line("bytes per GPU", f"{B(cost.weight_bytes_read_per_gpu(b))} weights{' (experts touched)' if m.is_moe else ''} + {B(b * kv / tp)} KV",
                     B(floor["bytes_per_gpu"])))
    out.append(_line("memory floor", f"{B(floor['bytes_per_gpu'])} / {g.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s", S(floor["memory_s"])))
    out.append(_line("compute floor", f"{floor['flops']:.3g} FLOPs / ({tp} x {g.flops_per_s('bf16') / 1e12:.0f} TFLOP/s peak)", S(floor["compute_s"])))
    out.append(_line("floor", "max(memory, compute)", S(est.decode_step_floor_s) + f" ({est.bound}-bound)"))
    out.append(_line("memory (real)", f"bytes / ({p.hbm_bandwidth_efficiency:.0%} of HBM bandwidth)", S(est.decode_memory_s)))
    out.append(_line("compute (real)", f"FLOPs / ({p.compute_efficiency:.0%} of peak)", S(est.decode_compute_s)))
    if tp > 1:
        out.append(_line("all-reduce", f"2 x {m.num_layers} layers x (latency + ring transfer of {b} x {m.hidden_size} x 2 B)", S(est.decode_allreduce_s)))
    out.append(_line("overhead", "scheduler, sampling, launch" + ("" if dep.cuda_graphs else f" + {m.num_layers} layers x eager launches"),
                     S(est.decode_overhead_s)))
    real = cost.parts(b, b * kv, b * fl)
    out.append(_line("GEMMs", "max(weight bytes / bw, linear FLOPs / compute)", S(real["gemm_s"])))
    out.append(_line("attention", "max(KV bytes / bw, attention FLOPs / compute)", S(real["attention_s"])))
    out.append(_line("decode step", "GEMMs + attention + all-reduce + overhead", S(est.decode_step_s)))
    out.append("")
    out.append("Prefill")
    prompt = load.prompt_tokens if load.mode != "context" else load.context_tokens
    out.append(_line("FLOPs", f"2 x {cost.linear_flops_per_token / 2 / 1e9:.2f}e9 active params x {prompt:,} tokens + attention",
                     f"{est.prefill_flops:.3g} FLOPs"))
    out.append(_line("compute floor", f"FLOPs / ({tp} x peak); at 50% utilisation: {S(2 * est.prefill_compute_floor_s)}", S(est.prefill_compute_floor_s)))
    out.append(_line("prefill (real)", f"chunks of {dep.limits.max_num_batched_tokens} tokens at {p.compute_efficiency:.0%} + all-reduce + overhead", S(est.prefill_s)))
    out.append("")
    out.append(f"Load: {_describe(load, est)}")
    out.append(_line("TTFT", "time to first token", S(est.ttft_s)))
    out.append(_line("TPOT", "time per output token (one step)", S(est.tpot_s)))
    if est.e2e_s is not None:
        out.append(_line("end-to-end", "TTFT + (output - 1) x TPOT", S(est.e2e_s)))
    out.append(_line("output tokens/s", f"all {replicas} replica(s)", f"{est.output_tokens_per_s:,.0f} tok/s ({est.output_tokens_per_s / est.gpus_total:,.0f} per GPU)"))
    out.append(_line("total tokens/s", "prompt + output tokens", f"{est.total_tokens_per_s:,.0f} tok/s"))
    out.append("")
    out.append("Cost")
    out.append(_line("USD/hour", pricing.basis, f"${est.usd_per_hour:,.2f}/h"))
    out.append(f"  price from         {pricing.source}")
    out += [f"  price note         {n}" for n in pricing.notes]
    out.append(_line("$/M output tokens", "USD/hour / (output tokens/s x 3600) x 1e6", f"${est.usd_per_million_output_tokens:,.3f}"))
    out.append(_line("$/M tokens", "USD/hour / (total tokens/s x 3600) x 1e6", f"${est.usd_per_million_tokens:,.3f}"))
    for n in est.notes:
        out.append(f"note: {n}")
    return "\n".join(out)


def _describe(load: Load, est: Estimate) -> str:
    if load.mode == "context":
        return f"{est.batch} sequences each holding {load.context_tokens:,} tokens (one decode step)"
    if load.mode not in ("static", "closed", "max"):
        return load.describe()
    if load.mode == "static":
        return f"static batch of {est.batch}: {load.prompt_tokens:,}-token prompts, {load.output_tokens:,} output tokens"
    return (f"{'max ' if load.mode == 'max' else ''}concurrency {est.batch} (continuous batching): "
            f"{load.prompt_tokens:,}-token prompts, {load.output_tokens:,} output tokens")


def estimate_json(dep: Deployment, load: Load, est: Estimate, extra: dict[str, Any] | None = None,
                  conditions: list[str] | None = None, pricing: Pricing | None = None) -> str:
    d = est.to_dict()
    d.update({"model": dep.model.id, "gpu": dep.gpu.id, "tp": dep.tp, "weight_dtype": dep.weight_dtype,
              "kv_dtype": dep.kv_dtype, "engine": dep.profile.engine, "profile_family": dep.profile.family or None,
              "mode": str(load.mode)})
    if conditions:
        d["conditions"] = conditions
    if pricing is not None:
        d["pricing"] = pricing.to_dict()
    if extra:
        d.update(extra)
    return json.dumps(_finite(d), indent=2)


def _finite(d: Any) -> Any:
    if isinstance(d, float) and (d != d or d in (float("inf"), float("-inf"))):
        return None
    if isinstance(d, dict):
        return {k: _finite(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_finite(v) for v in d]
    return d
