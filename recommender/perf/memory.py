"""Memory arithmetic: weights, KV cache, capacity. Pure functions, bytes everywhere.

Weights: linear layers (attention projections, MLP, experts) are stored at the weight dtype plus its
quantization-scale overhead; embeddings, lm_head, norms and routers stay 16-bit (as vLLM's FP8, AWQ,
GPTQ and NVFP4 schemes keep them)::

    weight_bytes = linear_params x (bytes_per_param + scale_bytes_per_param) + other_params x 2

Tensor parallelism shards every matrix (vocab-parallel embedding and head included); K/V projections
are replicated when there are fewer KV heads than GPUs::

    weights_bytes_per_gpu = (weight_bytes - kv_proj_bytes) / tp + kv_proj_bytes / min(tp, kv_heads)

KV cache per token (GQA/MHA): ``2 (K and V) x layers x kv_heads x head_dim x kv_bytes``; MLA stores
one latent ``layers x (kv_lora_rank + qk_rope_head_dim) x kv_bytes``, replicated on every TP rank.
Sliding-window layers hold at most ``window`` tokens per sequence.

KV capacity per GPU = ``memory x gpu_memory_utilization - weights - activation peak - runtime reserve
- CUDA-graph memory`` (vLLM profiles the peak activation with a dummy batch of
``max_num_batched_tokens`` tokens and ``max_num_seqs`` sampled sequences).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recommender.catalog import Gpu
from recommender.hf_config import ModelArch
from recommender.profiles import EngineProfile

#: Stored bytes per parameter of a quantized linear layer.
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5, "mxfp4": 0.5}
#: Quantization-scale overhead in bytes per parameter: fp8/int8 per-channel or 128x128-block scales
#: (~0); int4 AWQ/GPTQ: fp16 scale + fp16 zero per group of 128 (4/128); NVFP4: one fp8 scale per 16
#: (1/16); MXFP4: one e8m0 scale per 32 (1/32).
SCALE_BYTES_PER_PARAM = {"bf16": 0.0, "fp16": 0.0, "fp8": 0.0, "int8": 0.0, "int4": 4 / 128, "fp4": 1 / 16, "mxfp4": 1 / 32}
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
ACTIVATION_BYTES = 2.0  # bf16 activations
LOGIT_BYTES = 4.0       # fp32 logits in the sampler


def bytes_per_weight(dtype: str) -> float:
    """Stored bytes per quantized parameter including scales."""
    return BYTES_PER_PARAM[dtype] + SCALE_BYTES_PER_PARAM[dtype]


def _linear_split(model: ModelArch, dtype: str) -> tuple[float, float]:
    """(bytes of parameters stored at ``dtype``, bytes of parameters stored 16-bit)."""
    p = model.params
    if dtype == "mxfp4":  # gpt-oss checkpoints: experts MXFP4, attention and the rest bf16
        quant = p.experts
    else:
        quant = p.linear
    other = p.total - quant
    return quant * bytes_per_weight(dtype), other * 2.0


def weight_bytes(model: ModelArch, dtype: str) -> float:
    """Total weight bytes of the model at ``dtype`` (all GPUs together)."""
    q, other = _linear_split(model, dtype)
    return q + other


def _kv_proj_bytes(model: ModelArch, dtype: str) -> float:
    if model.mla is not None:
        return 0.0
    return model.num_layers * 2 * model.hidden_size * model.num_kv_heads * model.head_dim * bytes_per_weight(dtype)


def weights_bytes_per_gpu(model: ModelArch, dtype: str, tp: int) -> float:
    """Weight bytes on each GPU of a TP group (K/V projections replicated when kv_heads < tp)."""
    total = weight_bytes(model, dtype)
    kv = _kv_proj_bytes(model, dtype)
    return (total - kv) / tp + kv / min(tp, model.num_kv_heads)


def expert_bytes_per_gpu(model: ModelArch, dtype: str, tp: int) -> float:
    """Bytes of ONE routed expert of one layer on one GPU (experts are sharded over the TP group)."""
    if model.moe is None:
        return 0.0
    return model.params.expert_one * bytes_per_weight(dtype) / tp


def kv_heads_per_gpu(model: ModelArch, tp: int) -> float:
    """KV heads each GPU stores: heads are split, and replicated when there are fewer heads than GPUs."""
    return max(1.0, model.num_kv_heads / tp)


def kv_bytes_per_token_per_layer_per_gpu(model: ModelArch, kv_dtype: str, tp: int = 1) -> float:
    b = KV_BYTES[kv_dtype]
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * b
    return 2 * kv_heads_per_gpu(model, tp) * model.head_dim * b


def kv_cache_bytes_per_token(model: ModelArch, kv_dtype: str, tp: int = 1) -> float:
    """KV bytes one token adds in full-attention layers, summed over the TP group.

    GQA/MHA: 2 x layers x kv_heads x head_dim x bytes (= 327,680 for Llama-2-70B in bf16). MLA:
    layers x (kv_lora_rank + rope_dim) x bytes per GPU, times ``tp`` because every rank holds a copy.
    Sliding-window layers add nothing here once a sequence is longer than the window
    (see :func:`kv_bytes_per_sequence`).
    """
    per_gpu = model.num_full_attention_layers * kv_bytes_per_token_per_layer_per_gpu(model, kv_dtype, tp)
    return per_gpu * tp


def kv_bytes_per_sequence(model: ModelArch, kv_dtype: str, context_tokens: int, tp: int = 1,
                          block_tokens: int = 1) -> float:
    """KV bytes (whole TP group) of one sequence holding ``context_tokens``, rounded up to blocks."""
    ctx = math.ceil(context_tokens / block_tokens) * block_tokens
    per_layer = kv_bytes_per_token_per_layer_per_gpu(model, kv_dtype, tp) * tp
    full = model.num_full_attention_layers * ctx
    sliding = model.num_sliding_layers * min(ctx, model.sliding_window or 0)
    return per_layer * (full + sliding)


def activation_peak_bytes_per_gpu(model: ModelArch, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Peak activation memory of vLLM's profiling run on one GPU.

    tokens x (4 x hidden + 2 x intermediate / tp) x 2 B (residual, attention and MLP buffers of one
    layer; the gate/up output is the widest tensor) + max_num_seqs x vocab x 4 B (fp32 logits).
    For MoE the intermediate is the routed experts' width x top_k.
    """
    inter = model.intermediate_size if model.moe is None else model.moe.expert_intermediate_size * model.moe.top_k
    per_token = (4 * model.hidden_size + 2 * inter / tp) * ACTIVATION_BYTES
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * LOGIT_BYTES


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory budget of one replica (bytes), and what it leaves for the KV cache."""

    memory_bytes_per_gpu: float
    budget_bytes_per_gpu: float          # memory x gpu_memory_utilization
    weights_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    runtime_reserve_bytes_per_gpu: float
    cuda_graph_bytes_per_gpu: float
    kv_cache_bytes_per_gpu: float        # may be negative: the shortfall
    kv_cache_bytes_per_token: float      # whole TP group
    kv_cache_capacity_bytes: float       # whole TP group (>= 0)
    kv_capacity_tokens: int              # tokens of full-attention KV one replica holds
    min_kv_bytes_per_gpu: float          # one max-length sequence must fit

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes_per_gpu >= self.min_kv_bytes_per_gpu and self.kv_cache_bytes_per_gpu > 0

    @property
    def shortfall_bytes_per_gpu(self) -> float:
        return max(0.0, self.min_kv_bytes_per_gpu - self.kv_cache_bytes_per_gpu)


def memory_breakdown(model: ModelArch, gpu: Gpu, tp: int, weight_dtype: str, kv_dtype: str,
                     profile: EngineProfile, gpu_memory_utilization: float = 0.92,
                     max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                     cuda_graphs: bool = True, max_model_len: int = 0,
                     weights_bytes_per_gpu: float | None = None) -> MemoryBreakdown:
    """Where each GPU's memory goes; ``fits`` needs room for one ``max_model_len`` sequence at least.

    ``weights_bytes_per_gpu``: the caller's per-GPU weights (``perf.moe`` layouts, MTP modules) instead of TP's."""
    budget = gpu.memory_bytes * gpu_memory_utilization
    w = _weights_bytes_per_gpu(model, weight_dtype, tp) if weights_bytes_per_gpu is None else weights_bytes_per_gpu
    act = activation_peak_bytes_per_gpu(model, tp, max_num_batched_tokens, max_num_seqs)
    graphs = profile.cuda_graph_bytes_per_gpu if cuda_graphs else 0.0
    kv_gpu = budget - w - act - profile.runtime_reserve_bytes_per_gpu - graphs
    per_tok = kv_cache_bytes_per_token(model, kv_dtype, tp)
    cap = max(0.0, kv_gpu) * tp
    full_per_tok = per_tok if per_tok > 0 else 1.0
    min_seq = kv_bytes_per_sequence(model, kv_dtype, max(max_model_len, 1), tp, 16) / tp
    return MemoryBreakdown(
        memory_bytes_per_gpu=gpu.memory_bytes, budget_bytes_per_gpu=budget, weights_bytes_per_gpu=w,
        activation_bytes_per_gpu=act, runtime_reserve_bytes_per_gpu=profile.runtime_reserve_bytes_per_gpu,
        cuda_graph_bytes_per_gpu=graphs, kv_cache_bytes_per_gpu=kv_gpu, kv_cache_bytes_per_token=per_tok,
        kv_cache_capacity_bytes=cap, kv_capacity_tokens=int(cap // full_per_tok), min_kv_bytes_per_gpu=min_seq,
    )


def max_concurrent_sequences(mem: MemoryBreakdown, model: ModelArch, kv_dtype: str, tp: int,
                             context_tokens: int, block_tokens: int = 16) -> int:
    """How many sequences of ``context_tokens`` fit in the KV cache at once (paged, block-rounded)."""
    per_seq = kv_bytes_per_sequence(model, kv_dtype, context_tokens, tp, block_tokens)
    return int(mem.kv_cache_capacity_bytes // per_seq) if per_seq > 0 else 0


_weights_bytes_per_gpu = weights_bytes_per_gpu
