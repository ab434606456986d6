"""The seed-style walkthrough of one configuration: memory -> decode floor -> batched decode -> prefill
-> capacity -> throughput -> cost, every number with its unit and the formula it came from."""

from __future__ import annotations

import json
import math
from typing import Any

from recommender.dtypes import WeightsChoice
from recommender.estimator import Pricing
from recommender.perf import memory as mem
from recommender.perf.pipeline import PP_HOP_LATENCY_S
from recommender.perf.steady import Estimate, Load, admitted
from recommender.perf.step import Deployment, StepCostModel, bound_of, compute_dtype
from recommender.profiles import gpu_family
from recommender.render.plan import model_label
from recommender.search.estimate_bands import EstimateBands
from recommender.units import fmt_bytes as B
from recommender.units import fmt_seconds as S


def _line(label: str, formula: str, value: str) -> str:
    return f"  {label:<18} {formula:<66} = {value}"


def _n(x: float) -> str:
    """A number with 4 significant digits ('1.979e+15' style only when large or small)."""
    return f"{x:.4g}"


def _tbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e12:.4g} TB/s"


def _tflops(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.4g} TFLOP/s"


def render_walkthrough(dep: Deployment, load: Load, est: Estimate, replicas: int, pricing: Pricing,
                       conditions: list[str] | None = None, *, serve: WeightsChoice | None = None) -> str:
    """Every line ``label  formula = value``: the formula, up to a ``;`` (what follows is a note), is arithmetic
    on the numbers it shows (``x`` multiplies; words name the factors) and evaluates to the value within their
    rounding (``tests/test_cli_estimate.py`` recomputes every line)."""
    cost = StepCostModel.build(dep)
    b = _rank_batch(dep, load, est, cost)
    ctx = _decode_context(load)
    prompt = load.prompt_tokens if load.mode != "context" else load.context_tokens
    out = _header_lines(dep, replicas, conditions, serve)
    out += _memory_lines(dep, load, est, cost)
    out += ["", *_decode_lines(dep, est, cost, b, ctx)]
    if dep.model.moe is not None:
        out += ["", *_moe_lines(dep, cost, b * cost.query_tokens)]  # the step's tokens (verify step with MTP)
    if cost.draft is not None:
        out += ["", *_mtp_lines(dep, cost, b, ctx)]
    out += ["", *_prefill_lines(dep, est, cost, prompt)]
    out += ["", *_load_lines(load, est, cost, replicas, prompt, dep.limits.max_num_batched_tokens)]
    out += ["", *_cost_lines(est, pricing)]
    return "\n".join(out)


def _rank_batch(dep: Deployment, load: Load, est: Estimate, cost: StepCostModel) -> int:
    """The decode step's batch on one attention rank: the sequences a closed loop admits, over ``dp`` ranks."""
    b = admitted(dep, cost, est.batch, load.prompt_tokens, load.output_tokens) if load.mode == "closed" else est.batch
    return -(-b // dep.dp) if dep.dp > 1 else b  # DP attention: one attention rank's share of the batch


def _decode_context(load: Load) -> int:
    """The context the decode step is explained at: the load's, or the mean of a request's (prompt + output / 2)."""
    return load.context_tokens if load.mode == "context" else load.prompt_tokens + max(load.output_tokens, 1) // 2


def _header_lines(dep: Deployment, replicas: int, conditions: list[str] | None,
                  serve: WeightsChoice | None = None) -> list[str]:
    """The configuration in one line, then the engine conditions (and the parallelism flags) when given; the
    ``vllm serve`` line loads ``serve``'s repo with its ``--quantization`` / ``--dtype`` (deploy's policy), else names
    the pre-quantized checkpoint vLLM needs and no one named (``CHECKPOINT``: --checkpoint REPO gives it)."""
    m, g, tp, p = dep.model, dep.gpu, dep.tp, dep.profile
    par = ((f" x PP {dep.pp}: {dep.pp} pipeline stages a replica" if dep.pp > 1 else "")
           + (f", DP attention {dep.dp}" if dep.dp > 1 else "") + (", expert parallel" if dep.ep else ""))
    out = [f"{model_label(m.id, m.hf_repo)} on {replicas * dep.gpus} x {g.id} (TP {tp}{par}, {replicas} replica{'s' if replicas > 1 else ''}), "
           f"weights {dep.weight_dtype}, KV cache {dep.kv_dtype}, engine profile {p.engine}"
           f"{_fit_label(dep)}{'' if dep.cuda_graphs else ', CUDA graphs off'}", ""]
    if conditions:
        out.append("Engine conditions")
        out += [f"  {c}" for c in conditions]
        if dep.dp > 1 or dep.ep or dep.spec is not None or dep.pp > 1:
            load_flags = ([] if serve is None else (["--quantization", serve.quantization] if serve.quantization else [])
                          + (["--dtype", serve.dtype] if serve.dtype else []))
            repo = serve.model if serve is not None else "CHECKPOINT"
            weights = ("the weights as deploy loads them" if serve is not None else
                       f"CHECKPOINT: a pre-quantized {dep.weight_dtype} checkpoint of {m.id}, which vLLM needs and the "
                       f"catalog does not name; give it with --checkpoint REPO")
            out.append(f"  vllm serve {repo} {' '.join(_quote(a) for a in [*load_flags, *parallel_flags(dep)])} "
                       f"({weights}; parallelism and speculation flags checked against vLLM 0.33's parser)")
        out.append("")
    return out


def _memory_lines(dep: Deployment, load: Load, est: Estimate, cost: StepCostModel) -> list[str]:
    """Memory per GPU: weights, budget, reserves, KV cache and what it holds, and whether it fits (of the fullest
    pipeline stage with ``--pipeline-parallel-size``)."""
    m, g, tp = dep.stage_model, dep.gpu, dep.tp
    mb = est.memory
    out = ["Memory (per GPU)" if dep.pp == 1 else
           f"Memory (per GPU of the fullest of {dep.pp} stages: {m.num_layers} of {dep.model.num_layers} layers"
           + (f", {m.moe.num_moe_layers} of them MoE" if m.moe is not None else "") + ")"]
    wpp = mem.bytes_per_weight(dep.weight_dtype)
    q_bytes, o_bytes = mem._linear_split(m, dep.weight_dtype)
    stored = f"{q_bytes / wpp / 1e9:.4f}e9 quantized x {wpp:g} B + {o_bytes / 2 / 1e9:.4f}e9 other x 2 B"
    terms, notes = _weight_terms(dep, est.weights_bytes_per_gpu)
    wf = f"({stored}) / TP {tp}" + "".join(f" {t}" for t in terms) + (f"; {', '.join(notes)}" if notes else "")
    out.append(_line("weights", wf, B(est.weights_bytes_per_gpu)))
    out.append(_line("budget", f"{B(g.memory_bytes)} x gpu-memory-utilization {dep.gpu_memory_utilization}",
                     B(mb.budget_bytes_per_gpu)))
    inter = m.intermediate_size if m.moe is None else m.moe.expert_intermediate_size * m.moe.top_k
    out.append(_line("activations", f"{dep.limits.max_num_batched_tokens} tokens x (4 x {m.hidden_size} + 2 x {inter} / TP {tp}) "
                     f"x 2 B + {dep.limits.max_num_seqs} seqs x {m.vocab_size} vocab x 4 B; profile run, fp32 logits",
                     B(mb.activation_bytes_per_gpu)))
    out.append(_line("runtime + graphs", f"{B(mb.runtime_reserve_bytes_per_gpu)} + {B(mb.cuda_graph_bytes_per_gpu)}; "
                     "CUDA context, NCCL, workspaces + captured CUDA graphs",
                     B(mb.runtime_reserve_bytes_per_gpu + mb.cuda_graph_bytes_per_gpu)))
    kv_f = (f"{B(mb.budget_bytes_per_gpu)} - {B(est.weights_bytes_per_gpu)} - {B(mb.activation_bytes_per_gpu)} - "
            f"{B(mb.runtime_reserve_bytes_per_gpu + mb.cuda_graph_bytes_per_gpu)}; budget - weights - activations - runtime")
    # the main layers' share of the cache: MTP's draft layer keeps its own KV (Deployment.memory)
    main, mtp_layers = dep.model.num_full_attention_layers, dep.model.mtp_layers if dep.spec is not None else 0
    if dep.dp == 1 and not mtp_layers:
        out.append(_line("KV cache", kv_f, B(mb.kv_cache_bytes_per_gpu) + f" per GPU, {B(est.kv_cache_capacity_bytes)} per replica"))
    else:
        out.append(_line("KV cache", kv_f, B(mb.kv_cache_bytes_per_gpu) + " per GPU"))
        share = (f" x {main}/{main + mtp_layers}" if mtp_layers else "")
        why = (f"; {main} of the {main + mtp_layers} layers' KV is the main model's, {mtp_layers} the MTP module's"
               if mtp_layers else "; the GPUs of one attention rank")
        rank = "attention rank" if dep.dp > 1 else "replica"
        out.append(_line(f"KV per {'attn rank' if dep.dp > 1 else 'replica'}",
                         f"{B(max(mb.kv_cache_bytes_per_gpu, 0.0))} x TP {tp}{share}{why}",
                         f"{B(est.kv_cache_capacity_bytes)} per {rank}"))
        if dep.dp > 1:
            out.append(_line("KV per replica", f"{B(est.kv_cache_capacity_bytes)} x DP {dep.dp}; each attention rank caches "
                             "its own requests", f"{B(est.kv_cache_capacity_bytes * dep.dp)} per replica ({dep.gpus} GPUs)"))
    kvb_el = mem.KV_BYTES[dep.kv_dtype]
    if m.mla is not None:
        f = f"{m.num_full_attention_layers} layers x ({m.mla.kv_lora_rank} + {m.mla.qk_rope_head_dim}) x {kvb_el:g} B x {tp} copies; MLA"
    else:
        f = f"2 x {m.num_full_attention_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim} x {kvb_el:g} B"
        if tp > m.num_kv_heads:  # each rank holds a whole KV head: the heads are replicated (mem.kv_heads_per_gpu)
            f += f" x {tp}/{m.num_kv_heads} copies; KV heads replicated where TP > KV heads"
    out.append(_line("KV per token", f, f"{est.kv_cache_bytes_per_token:,.0f} B ({est.kv_cache_bytes_per_token / 1024:.0f} KiB)"))
    if m.num_sliding_layers:
        out.append(_line("sliding window", f"{m.num_sliding_layers} layers hold at most {m.sliding_window} tokens each", "bounded"))
    seq = load.context_tokens if load.mode == "context" else load.prompt_tokens + load.output_tokens
    blocks = math.ceil(max(seq, 1) / cost.kv_block_tokens) * cost.kv_block_tokens
    per_seq = mem.kv_bytes_per_sequence(m, dep.kv_dtype, max(seq, 1), tp, cost.kv_block_tokens)
    out.append(_line("max sequences", f"{B(est.kv_cache_capacity_bytes)} / {per_seq:,.0f} B; {blocks:,} tokens "
                     f"({seq:,} in {cost.kv_block_tokens}-token blocks) x KV per token",
                     f"{est.max_concurrent_sequences:,} sequences" + (" per attention rank" if dep.dp > 1 else "")))
    reserves = mb.activation_bytes_per_gpu + mb.runtime_reserve_bytes_per_gpu + mb.cuda_graph_bytes_per_gpu
    out.append(_line("fits", f"{B(est.weights_bytes_per_gpu)} + {B(reserves)} + {B(mb.min_kv_bytes_per_gpu)} <= {B(mb.budget_bytes_per_gpu)}; "
                     "weights + reserves + one max-length sequence <= budget",
                     "yes" if est.fits else f"NO, short by {B(est.shortfall_bytes_per_gpu)} per GPU"))
    return out


def _weight_terms(dep: Deployment, weights_bytes_per_gpu: float) -> tuple[list[str], list[str]]:
    """The signed terms after ``stored / TP`` of the weights line, and what each is: K/V projections replicated
    where TP > KV heads (not MLA), the routed experts on the engine's other attention ranks' GPUs (DP attention:
    they spread over ``tp x dp`` GPUs, ``perf.moe.weights_bytes_per_gpu``) and the MTP modules
    (``perf.speculative.draft_weights_bytes_per_gpu``)."""
    from recommender.perf import moe
    from recommender.perf import speculative as spec

    m, wd, tp, dp = dep.stage_model, dep.weight_dtype, dep.tp, dep.dp
    base = mem.weight_bytes(m, wd) / tp
    terms: list[str] = []
    notes: list[str] = []
    acc = base
    kv_rep = mem.weights_bytes_per_gpu(m, wd, tp) - base
    if abs(kv_rep) >= 1.0:
        terms.append(f"{_sign(kv_rep)} {abs(kv_rep) / 1e9:.4f}e9 B replicated KV projections")
        notes.append("K/V projections replicated where TP > KV heads")
        acc += kv_rep
    if dp > 1 and m.moe is not None:
        experts = moe.routed_expert_bytes(m, wd)
        elsewhere = experts * (dp - 1) / dp / tp
        terms.append(f"- {experts / 1e9:.4f}e9 B routed experts x (DP {dp} - 1) / DP {dp} / TP {tp}")
        notes.append(f"{dp - 1}/{dp} of the routed experts on the other ranks' GPUs"
                     + (" (EP: whole experts)" if dep.ep else " (sharded over TP x DP)"))
        acc -= elsewhere
    if dep.spec is not None and dep.model.mtp_layers:
        rest, exp = spec.mtp_layer_params(dep.model)
        b = mem.bytes_per_weight(wd)
        inner = f"{rest / 1e9:.4f}e9 + {exp / 1e9:.4f}e9 experts" + (f" / DP {dp}" if dp > 1 and exp else "")
        terms.append(f"+ {dep.model.mtp_layers} MTP x ({inner}) params x {b:g} B / TP {tp}")
        notes.append(f"{'the MTP module' if dep.model.mtp_layers == 1 else 'the MTP modules'} (a decoder layer + eh_proj; "
                     "embedding and LM head shared)")
        acc += spec.draft_weights_bytes_per_gpu(dep.model, wd, tp, dp)
    rest_b = weights_bytes_per_gpu - acc
    if abs(rest_b) >= max(1.0, 1e-9 * weights_bytes_per_gpu):  # a term this line does not know of: still adds up
        terms.append(f"{_sign(rest_b)} {abs(rest_b) / 1e9:.4f}e9 B other")
        notes.append("other per-GPU weights")
    return terms, notes


def _sign(x: float) -> str:
    return "-" if x < 0 else "+"


def _overhead_formula(dep: Deployment, cost: StepCostModel) -> str:
    """The step's fixed time, term by term as ``perf.step`` adds it: the profile's step overhead, per-layer time
    under CUDA graphs, eager launches without them, every MoE layer's fixed time, the pipeline's hops."""
    m, p = dep.model, dep.profile
    n_moe = m.moe.num_moe_layers if m.moe is not None else 0
    parts = [f"{S(p.step_overhead_s)} per step"]
    if p.layer_overhead_s:
        parts.append(f"{m.num_layers} layers x {S(p.layer_overhead_s)}")
    if not dep.cuda_graphs:
        parts.append(f"{m.num_layers} layers x {S(p.layer_launch_overhead_s)} eager launches")
    if n_moe and cost.moe_layer_overhead_s:
        parts.append(f"{n_moe} MoE layers x {S(cost.moe_layer_overhead_s)}")
    if dep.pp > 1:
        parts.append(f"{dep.pp - 1} stage hops x {S(PP_HOP_LATENCY_S)}")
    why = "; scheduler, sampling, launch" + ("; each MoE layer's router, permutes, grouped-GEMM launches"
                                             if n_moe and cost.moe_layer_overhead_s else "")
    return " + ".join(parts) + why


def _decode_lines(dep: Deployment, est: Estimate, cost: StepCostModel, b: int, ctx: int) -> list[str]:
    """The decode step at batch ``b`` (per attention rank) and context ``ctx``: floors, then each real term. With
    MTP the step is the verify step: ``b x (k + 1)`` query tokens, the KV read once (``StepCostModel.spec_step_s``);
    its value per output token is the MTP section's ``TPOT (MTP)``."""
    m, tp, p = dep.model, dep.tp, dep.profile
    cdt = compute_dtype(dep.weight_dtype, dep.gpu)
    out: list[str] = []
    q = cost.query_tokens
    mtp = cost.draft is not None
    t = b * q  # the step's tokens: one per sequence, k + 1 with MTP
    kv, fl = cost.decode_seq_cost(max(ctx, 1))
    floor = cost.parts(t, b * kv, b * fl * q, floor=True)
    real = cost.parts(t, b * kv, b * fl * q)
    # the estimate's decode terms are those of a one-token step: a verify step's are this function's own
    floor_s = max(floor["memory_s"], floor["compute_s"]) if mtp else est.decode_step_floor_s
    bound = bound_of(real) if mtp else est.bound
    memory_s, compute_s = (real["memory_s"], real["compute_s"]) if mtp else (est.decode_memory_s, est.decode_compute_s)
    allreduce_s, overhead_s = (real["allreduce_s"], real["overhead_s"]) if mtp else (est.decode_allreduce_s, est.decode_overhead_s)
    wb = cost.weight_bytes_read_per_gpu(t)
    peak_gpu = cost.peak_group_flops_per_s / tp
    out.append(f"Decode step at batch {b}{' per attention rank' if dep.dp > 1 else ''}, context {ctx:,} tokens"
               + (f": the MTP verify step, {b} x {q} = {t} query tokens (KV read once)" if mtp else ""))
    out.append(_line("bytes per GPU", f"{B(wb)} weights + {B(b * kv / tp)} KV{f'; weights of the experts {t} tokens touch' if m.is_moe else ''}",
                     B(floor["bytes_per_gpu"])))
    out.append(_line("memory floor", f"{B(floor['bytes_per_gpu'])} / {_tbs(cost.peak_hbm_bytes_per_s)}", S(floor["memory_s"])))
    out.append(_line("compute floor", f"{floor['flops']:.4g} FLOPs / ({tp} x {_tflops(peak_gpu)} {cdt} peak)", S(floor["compute_s"])))
    out.append(_line("floor", f"max({S(floor['memory_s'])}, {S(floor['compute_s'])}); max(memory, compute)",
                     S(floor_s) + f" ({bound}-bound)"))
    out.append(_line("memory (real)", f"{B(floor['bytes_per_gpu'])} / {_tbs(cost.hbm_bytes_per_s)}; "
                     f"{p.hbm_bandwidth_efficiency:.0%} of HBM bandwidth", S(memory_s)))
    out.append(_line("compute (real)", f"{floor['flops']:.4g} FLOPs / {_tflops(cost.group_flops_per_s)}; "
                     f"{p.compute_efficiency:.0%} of the {cdt} peak", S(compute_s)))
    if cost.moe is not None and dep.dp > 1:
        out.append(_line("collectives", _collectives_formula(dep, cost, t), S(allreduce_s)))
    elif tp > 1:
        out.append(_line("all-reduce", f"{cost.allreduces_per_layer} x {m.num_layers} layers x ({S(cost.allreduce_latency_s)} + "
                         f"2 x {tp - 1} / {tp} x {t} x {m.hidden_size} x 2 B / {cost.allreduce_bytes_per_s / 1e9:.4g} GB/s); ring",
                         S(allreduce_s)))
    out.append(_line("overhead", _overhead_formula(dep, cost), S(overhead_s)))
    experts = wb - cost.dense_weight_bytes_per_gpu
    wbw = cost.hbm_bytes_per_s * cost.weight_stream_efficiency  # the weight dtype's kernels' bandwidth
    w_read = (f"{B(wb)} / {_tbs(wbw)}" if experts <= 0 or cost.expert_bandwidth_efficiency == 1.0 else
              f"{B(cost.dense_weight_bytes_per_gpu)} / {_tbs(wbw)} + {B(experts)} / {_tbs(wbw * cost.expert_bandwidth_efficiency)}")
    out += _gemm_flops_lines(cost, t)
    lin = f"{cost.gemm_effective_flops(t, cost.weight_read_s(t, cost.hbm_bytes_per_s)):.4g} FLOPs"
    if cost.imbalance_flops(t):
        extra = cost.imbalance_flops(t) / cost.expert_compute_efficiency
        lin = f"({lin} + {extra:.4g} FLOPs)"
    out.append(_line("GEMMs", f"max({w_read}, {lin} / {_tflops(cost.group_flops_per_s)})", S(real["gemm_s"])))
    attn_note = (f"; {cost.attention_ratio:.0%} of the GEMMs' rate" if cost.attention_ratio != 1.0 else "")
    out.append(_line("attention", f"max({B(b * kv / tp)} / {_tbs(cost.hbm_bytes_per_s)}, {b * fl * q:.4g} FLOPs / "
                     f"{_tflops(cost.group_flops_per_s * cost.attention_ratio)}){attn_note}", S(real["attention_s"])))
    hop, hop_s = "", t * cost.pp_hop_s_per_token
    if dep.pp > 1:
        out.append(_line("stage hops", f"{dep.pp - 1} x {t} tokens x {dep.model.hidden_size} x 2 B / "
                         f"{dep.stage_nic_bytes_per_s_per_gpu / 1e9:.4g} GB/s NIC per GPU; activations between "
                         f"stages (their fixed {dep.pp - 1} x {S(PP_HOP_LATENCY_S)} is in the overhead)", S(hop_s)))
        hop = f" + {S(hop_s)}"
    what = f"GEMMs + attention + {'collectives' if cost.moe is not None and dep.dp > 1 else 'all-reduce'} + overhead"
    step_s = (real["gemm_s"] + real["attention_s"] + real["allreduce_s"] + real["overhead_s"] + hop_s) if mtp else est.decode_step_s
    out.append(_line("decode step", f"{S(real['gemm_s'])} + {S(real['attention_s'])} + {S(real['allreduce_s'])} + "
                     f"{S(real['overhead_s'])}{hop}; {what}{' + stage hops' if hop else ''}"
                     + ("; the verify step (per output token: TPOT (MTP) below)" if mtp else ""), S(step_s)))
    return out


def _collectives_formula(dep: Deployment, cost: StepCostModel, t: int) -> str:
    """DP attention's collectives of a step of ``t`` tokens per rank (``StepCostModel.allreduce_s``): the attention
    all-reduce of each layer inside a rank, the MoE layers' all-to-all and the dense FFN layers' gather."""
    lay = cost.moe
    assert lay is not None
    ring = cost.allreduce_s(t) - lay.ffn_collectives_s(t)
    terms = [S(ring)] if dep.tp > 1 else []
    words = [f"{dep.model.num_layers} attention all-reduces over TP {dep.tp}"] if dep.tp > 1 else []
    terms.append(S(lay.num_moe_layers * lay.all_to_all_s(t)))
    words.append("all-to-all")
    if lay.num_dense_layers:
        terms.append(S(lay.num_dense_layers * lay.dense_ffn_collective_s(t)))
        words.append("dense FFN gather")
    return f"{' + '.join(terms)}; {' + '.join(words)} (Experts, below)"


def _prefill_lines(dep: Deployment, est: Estimate, cost: StepCostModel, prompt: int) -> list[str]:
    """The prompt's FLOPs, its compute floor and the chunked prefill as the engine runs it."""
    tp, p = dep.tp, dep.profile
    cdt = compute_dtype(dep.weight_dtype, dep.gpu)
    peak_gpu = cost.peak_group_flops_per_s / tp
    out = ["Prefill"]
    _, pfl = cost.prefill_chunk_cost(max(prompt, 1), 0)
    out.append(_line("FLOPs", f"2 x {cost.linear_flops_per_token / 2 / 1e9:.4f}e9 active params x {max(prompt, 1):,} tokens + "
                     f"{pfl:.4g} attention FLOPs", f"{est.prefill_flops:.3g} FLOPs"))
    out.append(_line("compute floor", f"{est.prefill_flops:.4g} FLOPs / ({tp} x {_tflops(peak_gpu)} {cdt} peak); "
                     f"at 50% utilisation: {S(2 * est.prefill_compute_floor_s)}", S(est.prefill_compute_floor_s)))
    chunk = dep.limits.max_num_batched_tokens if dep.limits.chunked_prefill else max(prompt, 1)
    n_chunks = max(1, math.ceil(max(prompt, 1) / max(chunk, 1)))
    out.append(_line("prefill (real)", f"{n_chunks} steps x {S(est.prefill_s / n_chunks)}; chunks of {chunk} tokens at "
                     f"{p.compute_efficiency:.0%} + all-reduce + overhead", S(est.prefill_s)))
    return out


def _load_lines(load: Load, est: Estimate, cost: StepCostModel, replicas: int, prompt: int, budget: int) -> list[str]:
    """Latencies under the load and the throughput they give."""
    out = [f"Load: {_describe(load, est)}"]
    ro = cost.request_overhead_s
    out.append(_ttft_line(est, cost, prompt, budget))
    mtp = "; MTP: per output token" if cost.draft is not None else ""
    how = ("the mean step of a request's life, its prefill steps among the decodes (perf.steady)"
           if load.mode == "closed" else "one decode step")
    out.append(_line("TPOT", f"{S(est.tpot_s)}; time per output token ({how}{mtp})", S(est.tpot_s)))
    n_out = load.output_tokens
    if est.e2e_s is not None:
        e2e_f = f"{S(est.ttft_s)} + ({n_out} - 1) x {S(est.tpot_s)}; TTFT + (output - 1) x TPOT"
        if abs(est.ttft_s + (n_out - 1) * est.tpot_s - est.e2e_s) > 1e-9 * max(est.e2e_s, 1.0):
            e2e_f = f"{S(est.e2e_s - ro)} + {S(ro)}; waves of the batch one after another + request overhead"
        out.append(_line("end-to-end", e2e_f, S(est.e2e_s)))
    gpus = max(est.gpus_total, 1)
    value = f"{est.output_tokens_per_s:,.0f} tok/s ({est.output_tokens_per_s / gpus:,.0f} per GPU)"
    if load.mode == "context" or est.e2e_s is None:
        out.append(_line("output tokens/s", f"{est.batch} seqs / {S(est.decode_step_s)} x {replicas} replicas", value))
        out.append(_line("total tokens/s", f"{est.output_tokens_per_s:,.0f} tok/s; decode only", f"{est.total_tokens_per_s:,.0f} tok/s"))
    else:
        out.append(_line("output tokens/s", f"{est.batch} x {n_out} tokens / {S(est.e2e_s)} x {replicas} replicas", value))
        out.append(_line("total tokens/s", f"{est.batch} x ({n_out} + {prompt:,}) tokens / {S(est.e2e_s)} x {replicas} replicas",
                         f"{est.total_tokens_per_s:,.0f} tok/s"))
    return out


def _ttft_line(est: Estimate, cost: StepCostModel, prompt: int, budget: int) -> str:
    """TTFT = time to first token + request overhead; a static batch's prompts prefill together, in steps of
    ``floor(budget / wave)`` tokens of each (``perf.steady``), after any earlier waves."""
    ro = cost.request_overhead_s
    if not est.wave_sequences:
        return _line("TTFT", f"{S(est.ttft_s - ro)} + {S(ro)}; time to first token + request overhead", S(est.ttft_s))
    steps = math.ceil(max(prompt, 1) / max(1, budget // est.wave_sequences))
    what = f"{est.wave_sequences} prompts prefilled together" if est.wave_sequences > 1 else "the prompt prefilled"
    together = f"{what} in {steps} step{'s' if steps > 1 else ''} of <= {budget:,} tokens"
    earlier = est.ttft_s - ro - est.wave_prefill_s
    if earlier > 1e-9 * max(est.ttft_s, 1.0):
        return _line("TTFT", f"{S(earlier)} + {S(est.wave_prefill_s)} + {S(ro)}; earlier waves + {together} + "
                     "request overhead", S(est.ttft_s))
    return _line("TTFT", f"{S(est.wave_prefill_s)} + {S(ro)}; {together} + request overhead", S(est.ttft_s))


def _cost_lines(est: Estimate, pricing: Pricing) -> list[str]:
    """The hourly price, where it comes from, and the dollars per million tokens, then the estimate's notes."""
    out = ["Cost"]
    if not pricing.priced:
        return [*out, f"  no price           {pricing.source}", *(f"note: {n}" for n in est.notes)]
    basis, _, why = pricing.basis.partition(" (")
    out.append(_line("USD/hour", basis + (f"; {why.rstrip(')')}" if why else ""), f"${est.usd_per_hour:,.2f}/h"))
    out.append(f"  price from         {pricing.source}")
    out += [f"  price note         {n}" for n in pricing.notes]
    out.append(_line("$/M output tokens", f"${est.usd_per_hour:,.2f}/h / ({est.output_tokens_per_s:,.4g} tok/s x 3600) x 1e6",
                     f"${est.usd_per_million_output_tokens:,.3f}"))
    out.append(_line("$/M tokens", f"${est.usd_per_hour:,.2f}/h / ({est.total_tokens_per_s:,.4g} tok/s x 3600) x 1e6",
                     f"${est.usd_per_million_tokens:,.3f}"))
    for n in est.notes:
        out.append(f"note: {n}")
    return out


def _moe_terms(dep: Deployment, cost: StepCostModel, t: int) -> dict[str, Any]:
    """The Experts section's numbers (perf.moe) for a step of ``t`` tokens per attention rank: the text's lines and
    the JSON's ``experts`` block both read them."""
    from recommender.perf import moe

    m = dep.model
    assert m.moe is not None
    e, k, g = m.moe.num_experts, m.moe.top_k, dep.tp * dep.dp
    tg = t * dep.dp
    one = m.params.expert_one * mem.bytes_per_weight(dep.weight_dtype)
    touched = moe.expected_experts_touched(e, k, tg)
    busiest = moe.busiest_rank_experts(e, k, tg, g) if dep.ep and g > 1 else None
    per_gpu = busiest if busiest is not None else touched / g
    d: dict[str, Any] = {
        "num_experts": e, "top_k": k, "moe_layers": m.moe.num_moe_layers, "gpus": g, "expert_parallel": dep.ep,
        "tokens_per_step_per_rank": t, "tokens_per_step": tg, "experts_touched_per_layer": touched,
        "busiest_ep_rank_experts": busiest, "expert_bytes": one, "expert_bytes_per_gpu": m.moe.num_moe_layers * per_gpu * one,
        "remote_ranks_per_token": None, "all_to_all_s": None, "dense_ffn_gather_s": None}
    if cost.moe is not None and dep.dp > 1:
        lay = cost.moe
        d["remote_ranks_per_token"] = moe.remote_ranks_per_token(k, g)
        d["all_to_all_s"] = m.moe.num_moe_layers * lay.all_to_all_s(t)
        dense = m.num_layers - m.moe.num_moe_layers
        d["dense_ffn_gather_s"] = dense * lay.dense_ffn_collective_s(t) if dense else None
    return d


def _moe_lines(dep: Deployment, cost: StepCostModel, t: int) -> list[str]:
    """The expert-read and all-to-all terms of a MoE decode step of ``t`` tokens per attention rank (perf.moe), each
    formula with its inputs."""
    from recommender.perf import moe

    m = dep.model
    assert m.moe is not None
    d = _moe_terms(dep, cost, t)
    e, k, g, tg = d["num_experts"], d["top_k"], d["gpus"], d["tokens_per_step"]
    lay = "EP, experts whole" if dep.ep else "experts TP-sharded"
    out = [f"Experts ({e} routed, top-{k}, {m.moe.num_moe_layers} MoE layers over {g} GPUs: {lay}; {tg} tokens per step)"]
    touched = d["experts_touched_per_layer"]
    out.append(_line("experts touched", f"{e} x (1 - (1 - {k}/{e})^{tg})", f"{touched:.2f} per layer"))
    one = d["expert_bytes"]
    if d["busiest_ep_rank_experts"] is not None:
        local = e / g
        p = 1.0 - (1.0 - k / e) ** tg
        busiest = d["busiest_ep_rank_experts"]
        out.append(_line("busiest EP rank", f"min({local:.1f}, {local:g} x {p:.4f} + {moe.extreme_z(g):.4f} x "
                                            f"sqrt({local:g} x {p:.4f} x {1 - p:.4f}))", f"{busiest:.2f} experts"))
        basis = f"{busiest:.2f} experts x {B(one)}"
    else:
        basis = f"{touched:.2f} / {g} GPUs x {B(one)}"
    out.append(_line("expert bytes/GPU", f"{m.moe.num_moe_layers} layers x {basis}", B(d["expert_bytes_per_gpu"])))
    if d["all_to_all_s"] is not None:
        lay_ = cost.moe
        assert lay_ is not None
        rr = d["remote_ranks_per_token"]
        out.append(_line("remote ranks", f"({g} - 1) x (1 - (1 - 1/{g})^{k})", f"{rr:.4f} per token"))
        out.append(_line("all-to-all", f"{m.moe.num_moe_layers} x 2 x ({lay_.link_latency_s * 1e6:.1f} us + {t} x {rr:.4f} x "
                                       f"{m.hidden_size} x 2 B / {lay_.link_bytes_per_s / 1e9:.1f} GB/s)", S(d["all_to_all_s"])))
        if d["dense_ffn_gather_s"] is not None:
            dense = m.num_layers - m.moe.num_moe_layers
            out.append(_line("dense FFN gather", f"{dense} x 2 x ({lay_.link_latency_s * 1e6:.1f} us + {t} x {g - 1} x "
                                                 f"{m.hidden_size} x 2 B / {lay_.link_bytes_per_s / 1e9:.1f} GB/s)",
                             S(d["dense_ffn_gather_s"])))
    return out


def _mtp_terms(cost: StepCostModel, b: int, ctx: int) -> dict[str, Any]:
    """The MTP section's numbers (perf.speculative) at ``b`` sequences per attention rank and context ``ctx``: the
    verify step (the decode section's step), the draft passes and the time per output token."""
    d = cost.draft
    assert d is not None
    k = d.num_speculative_tokens
    kv, fl = cost.decode_seq_cost(max(ctx, 1))
    verify = cost.step_s(b * (k + 1), b * kv, b * fl * (k + 1))
    draft = cost.draft_s(b, max(ctx, 1))
    return {"verify_query_tokens_per_rank": b * (k + 1), "verify_step_s": verify, "draft_pass_s": draft / k,
            "draft_passes_s": draft, "tokens_per_step": d.tokens_per_step,
            "step_s_per_output_token": (verify + draft) / d.tokens_per_step}


def _mtp_lines(dep: Deployment, cost: StepCostModel, b: int, ctx: int) -> list[str]:
    """The MTP terms (perf.speculative): tokens per step, verify step, draft passes, TPOT."""
    d = cost.draft
    assert d is not None and dep.spec is not None
    k, a = d.num_speculative_tokens, d.acceptance_rate
    v = _mtp_terms(cost, b, ctx)
    tps, verify, draft = v["tokens_per_step"], v["verify_step_s"], v["draft_passes_s"]
    out = [f"MTP speculative decoding (k = {k} draft tokens, acceptance {a:g} per position: {dep.spec.acceptance_source})"]
    terms = " + ".join(f"{a:g}^{i}" for i in range(k + 1))
    out.append(_line("tokens per step", terms, f"{tps:.4f}"))
    out.append(_line("verify step", f"{S(verify)}; the decode step above: {b} x {k + 1} query tokens, KV read once", S(verify)))
    out.append(_line("draft passes", f"{k} x {S(v['draft_pass_s'])}; the MTP layer over {b} tokens each (its weights, "
                                     "the experts they touch, the LM head)", S(draft)))
    out.append(_line("TPOT (MTP)", f"({S(verify)} + {S(draft)}) / {tps:.4f}",
                     S(v["step_s_per_output_token"])))
    return out


def parallel_flags(dep: Deployment) -> list[str]:
    """The ``vllm serve`` flags of the deployment's parallelism and speculation, checked against vLLM 0.33's flag
    table (``recommender.deploy.vllm_flags.check_serve_args``, the check ``deploy`` applies)."""
    from recommender.deploy.vllm_flags import check_serve_args

    flags = ["--tensor-parallel-size", str(dep.tp)]
    if dep.pp > 1:
        flags += ["--pipeline-parallel-size", str(dep.pp)]
    if dep.dp > 1:
        flags += ["--data-parallel-size", str(dep.dp)]
    if dep.ep:
        flags.append("--enable-expert-parallel")
    if dep.spec is not None:
        flags += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": dep.spec.num_speculative_tokens},
                                                     separators=(",", ":"))]
    check_serve_args([dep.model.hf_repo or dep.model.id, *flags])
    return flags


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(ch in arg for ch in '{}" ') else arg


def _fit_label(dep: Deployment) -> str:
    """' (hopper family fit)', ' (hopper family fit, llama-3.1-8b's own: 9 rows)' where the family holds an override
    for this model (``recommend calibrate`` on one configuration), and '; deepseek-v3's terms borrowed from sglang's
    hopper fit: 75 rows' where the profile borrows the model's terms (:meth:`EngineProfile.borrowed_fit`); '' for
    none of these."""
    p = dep.profile
    fam = p.family_fit(dep.gpu.id) if p.family else None
    own = fam.model_fit(dep.model.id) if fam is not None else None
    lent = p.borrowed_note(dep.gpu.id, dep.model.id)
    parts = [f"{p.family} family fit" + (f", {own.model}'s own: {own.rows} rows" if own is not None else "")] if p.family else []
    if lent:
        parts.append(f"{dep.model.id}'s terms borrowed from {lent}")
    return f" ({'; '.join(parts)})" if parts else ""


def _borrowed_json(dep: Deployment) -> dict[str, Any] | None:
    """The JSON's ``borrowed_terms``: the donor engine, its family, rows and the parameters taken; None without."""
    lent = dep.profile.borrowed_fit(dep.gpu.id, dep.model.id)
    if lent is None:
        return None
    return {"engine": lent.borrowed_from, "family": gpu_family(dep.gpu.id), "rows": lent.rows,
            "parameters": dict(lent.parameters)}


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
                  conditions: list[str] | None = None, pricing: Pricing | None = None,
                  bands: EstimateBands | None = None, serve: WeightsChoice | None = None) -> str:
    """The estimate as JSON (docs/usage.md lists its keys); ``serve_weights``: what ``vllm serve`` loads (the text's
    ``vllm serve`` line: repo, ``--quantization``, ``--dtype``), null where vLLM needs a pre-quantized checkpoint no one
    named."""
    d = est.to_dict()
    d["serve_weights"] = None if serve is None else {"model": serve.model, "quantization": serve.quantization,
                                                     "dtype": serve.dtype}
    d.update({"model": dep.model.id, "gpu": dep.gpu.id, "tp": dep.tp, "weight_dtype": dep.weight_dtype,
              "kv_dtype": dep.kv_dtype, "engine": dep.profile.engine, "profile_family": dep.profile.family or None,
              "borrowed_terms": _borrowed_json(dep),
              "mode": str(load.mode), "vllm_serve_flags": parallel_flags(dep), "data_parallel_size": dep.dp, "enable_expert_parallel": dep.ep,
              "pipeline_parallel_size": dep.pp, "stage_nic_bytes_per_s_per_gpu": dep.stage_nic_bytes_per_s_per_gpu or None,
              "speculative": None if dep.spec is None else {
                  "method": "mtp", "num_speculative_tokens": dep.spec.num_speculative_tokens,
                  "acceptance_rate": dep.spec.acceptance_rate, "acceptance_source": dep.spec.acceptance_source,
                  "tokens_per_step": dep.spec.tokens_per_step}})
    # what the walkthrough's Decode step, Experts and MTP sections show (docs/usage.md lists these keys)
    cost = StepCostModel.build(dep)
    b = _rank_batch(dep, load, est, cost)
    d["batch_per_attention_rank"] = b
    d["kv_cache_capacity_bytes_per_replica"] = est.kv_cache_capacity_bytes * dep.dp  # kv_cache_capacity_bytes: one rank's
    d["experts"] = _moe_terms(dep, cost, b * cost.query_tokens) if dep.model.moe is not None else None
    if d["speculative"] is not None and cost.draft is not None:
        d["speculative"].update(_mtp_terms(cost, b, _decode_context(load)))
    if conditions:
        d["conditions"] = conditions
    if pricing is not None:
        d["pricing"] = pricing.to_dict()
    if extra:
        d.update(extra)
    if pricing is not None and not pricing.priced:   # no price: no cost figures (0 would read as free)
        d.update(usd_per_hour=None, usd_per_million_output_tokens=None, usd_per_million_tokens=None)
    if bands is not None:
        d["bands"] = bands.to_dict()
    return json.dumps(_finite(d), indent=2)


def _finite(d: Any) -> Any:
    if isinstance(d, float) and (d != d or d in (float("inf"), float("-inf"))):
        return None
    if isinstance(d, dict):
        return {k: _finite(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_finite(v) for v in d]
    return d


def _gemm_flops_lines(cost: StepCostModel, b: int) -> list[str]:
    """The GEMM-curve lines: the occupancy factor r and the FLOPs the weight GEMMs cost at eff_max."""
    if not cost.gemm_m_half_tokens:
        return []
    w_s = cost.weight_read_s(b, cost.hbm_bytes_per_s)
    r = cost.gemm_curve_factor(b, w_s)
    out = []
    if cost.gemm_curve_hidden:
        m_mem = w_s * cost.group_flops_per_s / cost.linear_flops_per_token
        out.append(_line("GEMM curve r", f"1 - {cost.gemm_curve_hidden:.4g} x {m_mem:.4g} / ({b} + {m_mem:.4g}); memory knee "
                         f"{m_mem:.4g} tokens", f"{r:.4g}"))
    rt = float(f"{r:.4g}")
    dense = cost.linear_flops_per_token - cost.routed_flops_per_token
    f = f"({b} + {rt:g} x {cost.gemm_m_half_tokens:.4g}) tokens x {dense:.4g} FLOPs"
    if cost.routed_flops_per_token and cost.experts_top_k:
        e, k = cost.num_experts, cost.experts_top_k
        dp = cost.moe.dp if cost.moe is not None else 1
        touched = e * (1.0 - (1.0 - k / e) ** max(b * dp, 0)) / dp   # this rank's share of the layer's expert GEMMs
        share = f" / {dp} ranks" if dp > 1 else ""
        f += (f" + ({b} + {rt:g} x {touched * dp if dp > 1 else touched:.4g}{share} x {cost.gemm_m_half_tokens:.4g} / {k}) "
              f"tokens x {cost.routed_flops_per_token:.4g} FLOPs")
        if cost.expert_compute_efficiency != 1.0:
            f += f" / {cost.expert_compute_efficiency:.4g} (the experts' share of the GEMMs' rate)"
    f += "; half point per GEMM"
    out.append(_line("GEMM FLOPs", f, f"{cost.gemm_effective_flops(b, w_s):.4g} FLOPs"))
    return out


_BAND_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "end-to-end", "output_tokens_per_s": "output tokens/s",
               "total_tokens_per_s": "total tokens/s"}


def _band_value(key: str, v: float) -> str:
    """A band end in the metric's unit: seconds (``*_s``, ``duration``), ms (``*_ms``), a rate."""
    if key.endswith("_ms"):
        return f"{v:,.2f} ms"
    if key.endswith(("tokens_per_s", "throughput")):
        return f"{v:,.4g}/s" if key == "request_throughput" else f"{v:,.0f} tok/s"
    return S(v)


def render_bands(bands: EstimateBands, values: dict[str, Any]) -> str:
    """The 'Expected error' section: per metric, the p10-p90 band around the value shown above (docs/bands.md).

    ``values``: the metrics shown above (the estimate's, ``--rate``'s under load, or a ``--bench`` run's)."""
    c = bands.evidence
    counted = f"{c.rows} rows" if c.ttft_sigma is None else f"{c.rows} decode and {c.ttft_rows} TTFT rows"
    rows = f"{counted}, each predicted by a fit that did not see it" if c.rows + c.ttft_rows else "no measured rows: the wide prior"
    out = [f"Expected error: p10-p90 of the held-out errors of class {c.label} ({rows}; log-sd {c.sigma:.3f}, "
           f"TTFT {c.sigma_ttft:.3f}; docs/bands.md)"]
    rate = bands.rate_per_s
    for k, (lo, hi) in bands.ranges.items():
        v = values.get(k)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or lo is None and hi is None:
            continue
        name = _BAND_NAMES.get(k) or k.removesuffix("_s").replace("_", " ")
        ttft = "ttft" in k
        factor = f"exp(+/-1.2816 x {c.sigma_ttft if ttft else c.sigma:.3f})"
        op = "/" if k.endswith(("tokens_per_s", "throughput")) else "x"
        if rate is None or not math.isfinite(rate):
            formula = f"{_band_value(k, v)} {op} {factor}"
        else:  # time rescaling: the model at g x the rate, g = exp(+/-1.2816 sigma)
            name += " mean" if k in ("ttft_s", "tpot_s", "e2e_s") else ""
            at = f"{name} at g x {rate:g} req/s"
            formula = f"{factor} x {at}" if ttft else f"{'1 / ' if op == '/' else ''}g x {at}; g = {factor}"
        far = "saturates" if hi is None else _band_value(k, hi)
        out.append(_line(name, formula, f"{'-' if lo is None else _band_value(k, lo)} - {far}"))
    return "\n".join(out)
