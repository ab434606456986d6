"""Time of one engine step (one forward pass over the running batch): a roofline with real overheads.

For one replica (a TP group of ``tp`` GPUs) processing ``T`` new tokens::

    bytes_per_gpu   = dense_weight_bytes_per_gpu + moe_layers x E[experts touched by T tokens] x expert_bytes_per_gpu
                      + kv_read_bytes / tp
    flops           = T x 2 x linear_active_params + attention_flops          (whole group)
    bw              = hbm_bandwidth x hbm_bandwidth_efficiency            (per GPU)
    compute         = tp x dense_flops(compute dtype) x compute_efficiency x r_dtype (whole group)
                      r_dtype = fp8_gemm_efficiency_ratio for 8-bit GEMMs (fp8, int8 W8A8),
                                fp4_gemm_efficiency_ratio for fp4 (W4A4), 1 for 16-bit: low-precision
                                kernels reach a smaller fraction of their (2x, 4x) peak than bf16 ones
    gemm_s          = max(weight_bytes_per_gpu / bw, (T + M_half) x 2 x linear_active_params / compute)
    attention_s     = max(kv_read_bytes / tp / bw, attention_flops / (compute x attention_efficiency_ratio))
                      (flash attention at long context reaches a smaller fraction of the peak than the GEMMs)
    allreduce_s     = a x layers x (latency + 2 (tp-1)/tp x T x hidden x 2 B / busbw)   [tp > 1]
                      busbw = the interconnect's measured all-reduce bus bandwidth (nccl-tests ``busbw``,
                      catalog ``interconnect.allreduce_busbw``), else link_bw x allreduce_bandwidth_efficiency;
                      a = 2 all-reduces per layer (after attention, after the MLP), 1 for parallel attention+MLP
                      blocks (GPT-J, Falcon, GPT-NeoX: ``parallel_attention`` from config.json)
    overhead_s      = step_overhead_s + layers x layer_overhead_s        (CUDA graphs on or off)
                      (+ layers x layer_launch_overhead_s without CUDA graphs)
                      + prefill_step_overhead_s on a step that carries prefill tokens (not graph-captured:
                        eager attention launches per layer, TP collectives' latency)
    step_s          = gemm_s + attention_s + allreduce_s + overhead_s

Units: bytes, FLOPs, seconds; bw in bytes/s per GPU, compute in FLOP/s per group, busbw in bytes/s.
``busbw`` follows the nccl-tests definition (``busbw = algbw x 2 (n-1)/n`` for an all-reduce), so a ring
all-reduce of S bytes takes ``2 (n-1)/n x S / busbw`` plus its latency.

GEMM efficiency grows with the tokens in the step, ``eff(T) = compute_efficiency x T / (T + M_half)``
(a saturating curve per GPU family; ``gemm_m_half_tokens = 0`` is a flat efficiency), so
``T x 2 x params / (compute x eff(T) / compute_efficiency) = (T + M_half) x 2 x params / compute``.
``M_half = gemm_m_half_tokens x tp x 4096 / hidden`` (:func:`gemm_m_half`: a TP shard is narrower), and a
MoE's routed experts each pay it on their own share of the tokens (:meth:`StepCostModel.gemm_effective_flops`).

The weight GEMMs and the attention kernels are separate kernels, each bounded by its own roofline, so
their times add: a decode step is memory-bound in both, a long prefill compute-bound in both, and a
mixed chunked-prefill step can be compute-bound in its GEMMs while its attention still streams KV.

The expected number of distinct routed experts T tokens touch in one layer is
``E x (1 - (1 - k/E)^T)`` (each token picks k of E uniformly). The *floor* the seeds quote is the same
roofline at 100% of datasheet bandwidth and FLOP/s, without all-reduce or overhead.

MoE layouts and speculation live beside this module: with ``--enable-expert-parallel`` or data-parallel attention
(``Deployment.dp > 1``) the expert read, the EP FLOP imbalance and the all-to-all come from ``perf.moe`` (one
attention rank per model); with MTP (``Deployment.spec``) ``decode_step_s`` is per output token and
``spec_step_s`` a verify step plus its draft passes (``perf.speculative``). Weight bytes stream at
``bw x weight_stream_efficiency`` (the dtype's kernel-table row) and routed experts at that x the profile's
``expert_bandwidth_efficiency``; every MoE layer adds the profile's ``moe_layer_overhead_s`` per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from recommender.catalog import Gpu
from recommender.perf.pipeline import PP_HOP_LATENCY_S, hop_s_per_token, pipeline_stage
from recommender.errors import ConfigError
from recommender.hf_config import ModelArch
from recommender.perf import memory as mem
from recommender.perf import moe as moe_mod
from recommender.perf import speculative as spec_mod
from recommender.profiles import EngineProfile


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler limits vLLM is given (``--max-num-seqs``, ``--max-num-batched-tokens``, ...)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    #: the engine takes in new requests every this many steps (SGLang ``--scheduler-recv-interval``, or its
    #: ``--num-continuous-decode-steps``); vLLM's scheduler looks at every step: 1
    scheduler_poll_steps: int = 1
    #: the figures are the engine's own timer (trtllm-bench, a static-batch table), not a client behind its HTTP
    #: server: the profile's ``server_request_overhead_s`` is not added (``StepCostModel.request_overhead_s``)
    engine_timer: bool = False
    #: a static batch's context runs in one pass whatever ``max_num_batched_tokens`` (another engine's static-batch
    #: benchmark: ``gptSessionBenchmark``, LMDeploy ``profile_generation``, gpt-fast; ``perf.conditions``); vLLM's
    #: scheduler splits it into steps of the budget: False
    static_prefill_one_pass: bool = False


def default_limits(gpu: Gpu, max_model_len: int = 0) -> EngineLimits:
    """vLLM 0.33's defaults for ``vllm serve`` (``EngineArgs.get_batch_defaults``).

    >= 160 GiB: 16384 tokens / 1024 seqs; >= 70 GiB and not A100: 8192 / 1024; otherwise 2048 / 256.
    """
    gib = gpu.memory_bytes / 1024**3
    if gib >= 160:
        tokens, seqs = 16384, 1024
    elif gib >= 70 and not gpu.id.startswith("a100"):
        tokens, seqs = 8192, 1024
    else:
        tokens, seqs = 2048, 256
    return EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens)


def check_parallelism(model: ModelArch, gpu: Gpu, tp: int) -> None:
    """TP must be a power of two within the GPU's interconnect domain and divide the attention heads."""
    if tp < 1 or tp & (tp - 1):
        raise ConfigError(f"--tp {tp}: tensor parallelism must be a power of two (1, 2, 4, 8, ...)")
    if tp > gpu.interconnect.gpus_per_domain:
        raise ConfigError(
            f"--tp {tp} exceeds {gpu.id}'s interconnect domain of {gpu.interconnect.gpus_per_domain} GPUs "
            f"({gpu.interconnect.kind}); use --tp <= {gpu.interconnect.gpus_per_domain} and more replicas"
        )
    if model.num_heads % tp:
        raise ConfigError(
            f"--tp {tp} does not divide {model.id}'s {model.num_heads} attention heads; "
            f"valid: {', '.join(str(t) for t in (1, 2, 4, 8, 16) if model.num_heads % t == 0)}"
        )
    kv = model.num_kv_heads
    if model.mla is None and kv % tp and tp % kv:
        raise ConfigError(f"--tp {tp} and {model.id}'s {kv} KV heads: one must divide the other")


@dataclass(frozen=True)
class Deployment:
    """One replica's configuration: model on ``tp`` GPUs of one type, dtypes, engine profile and limits."""

    model: ModelArch
    gpu: Gpu
    tp: int
    weight_dtype: str
    kv_dtype: str
    profile: EngineProfile
    limits: EngineLimits = field(default_factory=EngineLimits)
    gpu_memory_utilization: float = 0.92
    cuda_graphs: bool = True
    max_model_len: int = 0
    dp: int = 1                                  # attention data-parallel ranks (``--data-parallel-size``)
    ep: bool = False                             # ``--enable-expert-parallel``
    spec: spec_mod.SpecDecode | None = None      # MTP speculative decoding (``--speculative-config``)
    pp: int = 1                                  # pipeline stages (``--pipeline-parallel-size``), one instance each
    stage_nic_bytes_per_s_per_gpu: float = 0.0   # pp > 1: the NIC per GPU between the stages' instances (bytes/s)

    def __post_init__(self) -> None:
        if self.pp < 1 or (self.pp > 1 and not self.stage_nic_bytes_per_s_per_gpu > 0):
            raise ConfigError(f"pipeline stages must be >= 1 and more than one needs the NIC between them "
                              f"(got pp={self.pp}, {self.stage_nic_bytes_per_s_per_gpu:g} B/s per GPU)")

    @property
    def gpus(self) -> int:
        """GPUs of one engine: ``tp x dp x pp``."""
        return self.tp * self.dp * self.pp

    @property
    def stage_model(self) -> ModelArch:
        """What one GPU holds the layers of: the fullest pipeline stage (``perf.pipeline``), else the model."""
        return pipeline_stage(self.model, self.pp) if self.pp > 1 else self.model

    def memory(self) -> mem.MemoryBreakdown:
        """Per-GPU memory of one attention rank (perf.moe: experts over tp x dp; MTP weights and draft-layer KV);
        with ``pp > 1``, of the fullest stage (its layers' weights and KV)."""
        model = self.stage_model
        w = moe_mod.weights_bytes_per_gpu(model, self.weight_dtype, self.tp, self.dp)
        if self.spec is not None:
            w += spec_mod.draft_weights_bytes_per_gpu(self.model, self.weight_dtype, self.tp, self.dp)
        b = mem.memory_breakdown(
            model, self.gpu, self.tp, self.weight_dtype, self.kv_dtype, self.profile,
            self.gpu_memory_utilization, self.limits.max_num_batched_tokens, self.limits.max_num_seqs,
            self.cuda_graphs, self.max_model_len, weights_bytes_per_gpu=w,
        )
        if self.spec is not None and self.model.mtp_layers:
            # the draft layer keeps its own KV: the main layers get L / (L + mtp) of the cache
            share = self.model.num_full_attention_layers / (self.model.num_full_attention_layers + self.model.mtp_layers)
            cap = b.kv_cache_capacity_bytes * share
            b = replace(b, kv_cache_capacity_bytes=cap, kv_capacity_tokens=int(cap // max(b.kv_cache_bytes_per_token, 1.0)))
        return b


def compute_dtype(weight_dtype: str, gpu: Gpu) -> str:
    """Tensor-core dtype the GEMMs run in: the kernel table's ``compute_dtype`` where it names one (MXFP4 W4A4 on
    CDNA4), W8A8 fp8/int8 and fp4 where the GPU has them; else 16-bit."""
    named = gpu.kernels.efficiency(weight_dtype).compute_dtype
    if named and named in gpu.dense_flops_per_s:
        return named
    if weight_dtype in ("fp8", "int8", "fp4") and weight_dtype in gpu.dense_flops_per_s:
        return weight_dtype
    return "bf16"


#: Hidden size at which ``gemm_m_half_tokens`` is stated (Llama-3.1-8B, Mistral-7B: 4,096).
GEMM_REFERENCE_HIDDEN = 4096


def gemm_m_half(m_half_tokens: float, hidden_size: int, tp: int) -> float:
    """The GEMM curve's half point for this model and TP size, in tokens.

    A GEMM fills the GPU with output tiles, ``M x N_per_gpu / tile``; a TP shard has ``N / tp`` columns, so it
    needs ``tp`` times the tokens to fill the GPU as well, and a model ``hidden / 4096`` times wider needs
    that many times fewer: ``M_half = gemm_m_half_tokens x tp x 4096 / hidden`` (the profile's value is the
    half point of a 4,096-wide model on one GPU)."""
    return m_half_tokens * tp * GEMM_REFERENCE_HIDDEN / max(hidden_size, 1)


def gemm_dtype_ratio(compute_dtype_: str, profile: EngineProfile) -> float:
    """Achieved-fraction ratio of the GEMMs' tensor-core dtype to 16-bit ones (profile terms, fitted)."""
    if compute_dtype_ in ("fp8", "int8"):
        return profile.fp8_gemm_efficiency_ratio
    if compute_dtype_ == "fp4":
        return profile.fp4_gemm_efficiency_ratio
    return 1.0


@dataclass(frozen=True)
class StepCostModel:
    """Precomputed coefficients for fast step times of one replica (see module docstring)."""

    tp: int
    num_layers: int
    hidden_size: int
    dense_weight_bytes_per_gpu: float
    expert_bytes_per_gpu: float
    num_experts: int
    experts_top_k: int
    num_moe_layers: int
    linear_flops_per_token: float
    attn_flops_per_pair_full: float      # per (query token, key token) in full-attention layers
    attn_flops_per_pair_sliding: float   # per pair in sliding-window layers (each)
    num_sliding_layers: int
    sliding_window: int
    kv_bytes_per_token_full: float       # whole group, full-attention layers
    kv_bytes_per_token_sliding_layer: float  # whole group, one sliding layer
    hbm_bytes_per_s: float               # effective, per GPU
    peak_hbm_bytes_per_s: float
    group_flops_per_s: float             # effective, whole group
    peak_group_flops_per_s: float
    allreduce_latency_s: float
    allreduce_bytes_per_s: float
    overhead_s: float
    kv_capacity_tokens: int
    kv_block_tokens: int = 16
    request_overhead_s: float = 0.0      # s, added once to every request's TTFT (and E2E): profile request_overhead_s
    #                                      + server_request_overhead_s behind an HTTP server (not limits.engine_timer)
    allreduces_per_layer: int = 2        # 1 for parallel attention+MLP blocks
    prefill_step_overhead_s: float = 0.0  # added to every step that carries prefill tokens
    gemm_m_half_tokens: float = 0.0       # tokens at which the GEMMs reach half their peak efficiency
    moe: moe_mod.MoeLayout | None = None  # EP / DP-attention layout of the routed experts (perf.moe); None = TP experts
    routed_flops_per_token: float = 0.0   # part of linear_flops_per_token in routed experts (scaled by EP imbalance)
    draft: spec_mod.DraftCost | None = None  # MTP speculative decoding (perf.speculative)
    weight_stream_efficiency: float = 1.0  # the weight dtype's kernels' share of the profile's HBM efficiency
    expert_bandwidth_efficiency: float = 1.0  # routed-expert grouped GEMMs' share of it (profile)
    expert_compute_efficiency: float = 1.0  # their share of the GEMMs' compute rate (profile; MoE prefill)
    moe_layer_overhead_s: float = 0.0     # fixed time per MoE layer per step (profile; already in overhead_s)
    pp_hop_s_per_token: float = 0.0       # pipeline parallel: seconds per new token to pass activations between stages
    gemm_curve_hidden: float = 0.0        # fraction of the curve's small-M loss hidden under the weight stream
    attention_ratio: float = 1.0          # attention kernels' achieved fraction over the GEMMs' (eff_max)
    decode_attention_scale: float = 1.0   # decode's attention FLOPs per pair over prefill's (absorbed MLA: 1088 / 320)

    @staticmethod
    def build(dep: Deployment) -> "StepCostModel":
        m, g, p, tp = dep.model, dep.gpu, dep.profile, dep.tp
        params = m.params
        total_w = mem.weights_bytes_per_gpu(m, dep.weight_dtype, tp)
        e_bytes = mem.expert_bytes_per_gpu(m, dep.weight_dtype, tp)
        n_exp = m.moe.num_experts if m.moe else 0
        n_moe = m.moe.num_moe_layers if m.moe else 0
        dense_w = total_w - e_bytes * n_exp * n_moe
        # FLOPs per token: every active matmul parameter except the input embedding (a lookup).
        linear_flops = 2.0 * (params.active - params.embedding)
        if m.mla is not None:
            a = m.mla
            per_head = a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim
        else:
            per_head = 2 * m.head_dim
        pair = 2.0 * m.num_heads * per_head  # QK^T and PV, 2 FLOPs per multiply-add, one layer
        # decode attends the cached latent with the up-projections absorbed into the query and output: QK^T over
        # kv_lora_rank + qk_rope_head_dim, PV over kv_lora_rank per head (FlashMLA / trtllm_mla / aiter MLA)
        decode_scale = ((2 * m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) / per_head) if m.mla is not None else 1.0
        kv_layer = mem.kv_bytes_per_token_per_layer_per_gpu(m, dep.kv_dtype, tp) * tp
        ic = g.interconnect
        lat = p.allreduce_latency_pcie_s if ic.is_pcie else p.allreduce_latency_s
        memb = dep.memory()
        cdt = compute_dtype(dep.weight_dtype, g)
        overhead = (p.step_overhead_s + m.num_layers * p.layer_overhead_s
                    + (0.0 if dep.cuda_graphs else m.num_layers * p.layer_launch_overhead_s)
                    + n_moe * p.moe_layer_overhead_s
                    + (dep.pp - 1) * PP_HOP_LATENCY_S)  # a step passes every stage: perf.pipeline
        layout = _moe_layout(dep) if m.moe is not None and (dep.dp > 1 or dep.ep) else None
        routed = 2.0 * params.expert_one * (m.moe.top_k if m.moe else 0) * n_moe
        eff = g.kernels.efficiency(dep.weight_dtype)
        busbw = ic.allreduce_bus_bytes_per_s(tp)
        ar_bw = busbw if busbw is not None else ic.ring_bandwidth_bytes_per_s(tp) * p.allreduce_bandwidth_efficiency
        ratio = min(gemm_dtype_ratio(cdt, p), eff.compute)
        return StepCostModel(
            tp=tp, num_layers=m.num_layers, hidden_size=m.hidden_size,
            dense_weight_bytes_per_gpu=dense_w, expert_bytes_per_gpu=e_bytes, num_experts=n_exp,
            experts_top_k=m.moe.top_k if m.moe else 0, num_moe_layers=n_moe,
            linear_flops_per_token=linear_flops,
            attn_flops_per_pair_full=pair * m.num_full_attention_layers,
            attn_flops_per_pair_sliding=pair, num_sliding_layers=m.num_sliding_layers,
            sliding_window=m.sliding_window or 0,
            kv_bytes_per_token_full=kv_layer * m.num_full_attention_layers,
            kv_bytes_per_token_sliding_layer=kv_layer,
            hbm_bytes_per_s=g.hbm_bandwidth_bytes_per_s * p.hbm_bandwidth_efficiency,
            peak_hbm_bytes_per_s=g.hbm_bandwidth_bytes_per_s,
            group_flops_per_s=tp * g.flops_per_s(cdt) * p.compute_efficiency * ratio,
            peak_group_flops_per_s=tp * g.flops_per_s(cdt),
            allreduce_latency_s=lat,
            allreduce_bytes_per_s=ar_bw,
            overhead_s=overhead, kv_capacity_tokens=memb.kv_capacity_tokens,
            request_overhead_s=p.request_overhead_s + (0.0 if dep.limits.engine_timer else p.server_request_overhead_s),
            allreduces_per_layer=1 if m.parallel_attention else 2,
            prefill_step_overhead_s=p.prefill_step_overhead_s,
            gemm_m_half_tokens=gemm_m_half(p.gemm_m_half_tokens, m.hidden_size, tp),
            moe=layout, routed_flops_per_token=routed, draft=_draft_cost(dep, pair * decode_scale),
            weight_stream_efficiency=eff.bandwidth, expert_bandwidth_efficiency=p.expert_bandwidth_efficiency,
            expert_compute_efficiency=p.expert_compute_efficiency if m.moe is not None else 1.0,
            moe_layer_overhead_s=p.moe_layer_overhead_s if m.moe is not None else 0.0,
            gemm_curve_hidden=p.gemm_curve_hidden_fraction,
            attention_ratio=p.attention_efficiency_ratio, decode_attention_scale=decode_scale,
            pp_hop_s_per_token=hop_s_per_token(m, dep.pp, dep.stage_nic_bytes_per_s_per_gpu),
        )

    # -- per-sequence costs -------------------------------------------------------------------
    def decode_seq_cost(self, context_tokens: int) -> tuple[float, float]:
        """(KV bytes read, attention FLOPs) one decoding sequence at ``context_tokens`` adds to a step."""
        slide = min(context_tokens, self.sliding_window) * self.num_sliding_layers
        kv = context_tokens * self.kv_bytes_per_token_full + slide * self.kv_bytes_per_token_sliding_layer
        fl = (context_tokens * self.attn_flops_per_pair_full + slide * self.attn_flops_per_pair_sliding) * self.decode_attention_scale
        return kv, fl

    def decode_seq_costs(self, context_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`decode_seq_cost` at each of ``context_tokens`` (arrays; the same formula, vectorised)."""
        slide = np.minimum(context_tokens, self.sliding_window) * self.num_sliding_layers
        kv = context_tokens * self.kv_bytes_per_token_full + slide * self.kv_bytes_per_token_sliding_layer
        fl = (context_tokens * self.attn_flops_per_pair_full + slide * self.attn_flops_per_pair_sliding) * self.decode_attention_scale
        return kv, fl

    def prefill_chunk_cost(self, chunk_tokens: int, prefix_tokens: int) -> tuple[float, float]:
        """(KV bytes read, attention FLOPs) for a prefill chunk after ``prefix_tokens`` cached tokens.

        Causal attention: query i of the chunk sees prefix + i + 1 keys, so pairs =
        chunk x prefix + chunk (chunk + 1) / 2. The prefix KV is read once.
        """
        c, p = chunk_tokens, prefix_tokens
        pairs = c * p + c * (c + 1) / 2.0
        kv = p * self.kv_bytes_per_token_full
        fl = pairs * self.attn_flops_per_pair_full
        if self.num_sliding_layers:
            w = self.sliding_window
            kv += min(p, w) * self.num_sliding_layers * self.kv_bytes_per_token_sliding_layer
            pairs_w = c * min(w, p + (c + 1) / 2.0)
            fl += pairs_w * self.num_sliding_layers * self.attn_flops_per_pair_sliding
        return kv, fl

    # -- step time ----------------------------------------------------------------------------
    def weight_read_s(self, new_tokens: int, hbm_bytes_per_s: float) -> float:
        """Seconds to stream the step's weights: dense bytes at ``bw x weight_stream_efficiency``, routed-expert
        bytes at that x ``expert_bandwidth_efficiency``."""
        total = self.weight_bytes_read_per_gpu(new_tokens)
        experts = total - self.dense_weight_bytes_per_gpu
        bw = hbm_bytes_per_s * self.weight_stream_efficiency
        return self.dense_weight_bytes_per_gpu / bw + experts / (bw * self.expert_bandwidth_efficiency)

    def weight_bytes_read_per_gpu(self, new_tokens: int) -> float:
        if not self.num_experts:
            return self.dense_weight_bytes_per_gpu
        if self.moe is not None:
            return self.dense_weight_bytes_per_gpu + self.moe.expert_bytes_read_per_gpu(max(new_tokens, 0))
        touched = moe_mod.expected_experts_touched(self.num_experts, self.experts_top_k, max(new_tokens, 0))
        return self.dense_weight_bytes_per_gpu + self.num_moe_layers * touched * self.expert_bytes_per_gpu

    def parts(self, new_tokens: int, kv_read_bytes: float, attention_flops: float, floor: bool = False) -> dict[str, float]:
        """The roofline terms of one step (seconds): memory, compute (totals, for the bound), gemm,
        attention, allreduce, overhead. ``floor``: at datasheet peaks, without all-reduce or overhead."""
        w_bytes = self.weight_bytes_read_per_gpu(new_tokens)
        kv_bytes = kv_read_bytes / self.tp
        lin = new_tokens * self.linear_flops_per_token + self.imbalance_flops(new_tokens)
        bw = self.peak_hbm_bytes_per_s if floor else self.hbm_bytes_per_s
        w_s = w_bytes / bw if floor else self.weight_read_s(new_tokens, bw)
        comp = self.peak_group_flops_per_s if floor else self.group_flops_per_s
        lin_eff = lin if floor else self.effective_linear_flops(new_tokens, w_s)
        out = {"memory_s": (w_bytes + kv_bytes) / bw, "compute_s": (lin + attention_flops) / comp,
               "gemm_s": max(w_s, lin_eff / comp),
               "attention_s": max(kv_bytes / bw, attention_flops / (comp * (1.0 if floor else self.attention_ratio))),
               "allreduce_s": 0.0, "overhead_s": 0.0, "bytes_per_gpu": w_bytes + kv_bytes, "flops": lin + attention_flops}
        if not floor:
            out["allreduce_s"] = self.allreduce_s(new_tokens)
            out["overhead_s"] = self.overhead_s
        return out

    def imbalance_flops(self, new_tokens: int) -> float:
        """Extra routed-expert FLOPs the busiest EP rank does over the mean share (0 without EP; perf.moe)."""
        if self.moe is None or not self.moe.ep:
            return 0.0
        return new_tokens * self.routed_flops_per_token * (self.moe.imbalance(new_tokens) - 1.0)

    def gemm_effective_flops(self, new_tokens: int, weight_s: float | None = None) -> float:
        """FLOPs the weight GEMMs cost at ``eff_max`` once the saturating curve is applied (whole group).

        Dense GEMMs see all ``T`` tokens: ``(T + r M_half) x dense_flops_per_token``. A MoE layer's routed
        experts each see only their share, ``T k / E_t`` tokens over the ``E_t`` experts touched, so each
        pays its own half point: ``sum_e (T k / E_t + r M_half) = T k + r E_t M_half``, i.e.
        ``(T + r E_t M_half / k) x routed_flops_per_token``. With ``dp`` attention ranks (perf.moe) ``T`` is one
        rank's tokens, the MoE layer routes all ranks' (``T dp``), and the group's GPUs share its expert GEMMs (TP
        slices, or whole experts with EP): one rank's ``tp`` GPUs run ``E_t(T dp) / dp`` of them, not ``E_t``.

        ``r = 1 - h M_mem / (T + M_mem)`` ramps the occupancy loss in past the memory knee ``M_mem =
        weight_s x compute / linear_flops_per_token`` (the tokens at which full-efficiency compute equals
        the weight stream): a GEMM waiting on HBM hides the fraction ``h`` (``gemm_curve_hidden_fraction``)
        of its tensor cores' idle tiles (``h = 1``: ``r = T / (T + M_mem)``; ``h = 0``: ``r = 1``).
        ``weight_s`` = weight bytes / bandwidth (default: at ``new_tokens``).

        The routed experts' grouped GEMMs run at ``expert_compute_efficiency`` x the dense GEMMs' rate, so their
        FLOPs count ``1 / expert_compute_efficiency`` times here (at ``eff_max``)."""
        t = max(new_tokens, 0)
        r = self.gemm_curve_factor(new_tokens, weight_s)
        dense = self.linear_flops_per_token - self.routed_flops_per_token
        out = (t + r * self.gemm_m_half_tokens) * dense
        if self.routed_flops_per_token and self.experts_top_k:
            k = self.experts_top_k
            dp = self.moe.dp if self.moe is not None else 1
            touched = moe_mod.expected_experts_touched(self.num_experts, k, t * dp) / dp
            out += (t + r * touched * self.gemm_m_half_tokens / k) * self.routed_flops_per_token / self.expert_compute_efficiency
        return out

    def effective_linear_flops(self, new_tokens: int, weight_s: float | None = None) -> float:
        """:meth:`gemm_effective_flops` + the busiest EP rank's extra routed FLOPs (:meth:`imbalance_flops`), the
        latter at the experts' rate too (``/ expert_compute_efficiency``): what ``step_s`` divides by the compute rate."""
        return self.gemm_effective_flops(new_tokens, weight_s) + self.imbalance_flops(new_tokens) / self.expert_compute_efficiency

    def gemm_curve_factor(self, new_tokens: int, weight_s: float | None = None) -> float:
        """``r = 1 - h M_mem / (T + M_mem)``, the share of the half-point loss a step pays (see
        :meth:`gemm_effective_flops`); ``M_mem = weight_s x compute / linear_flops_per_token`` tokens."""
        t = max(new_tokens, 0)
        if weight_s is None:
            weight_s = self.weight_bytes_read_per_gpu(new_tokens) / self.hbm_bytes_per_s
        m_mem = weight_s * self.group_flops_per_s / self.linear_flops_per_token if self.linear_flops_per_token else 0.0
        return 1.0 - self.gemm_curve_hidden * m_mem / (t + m_mem) if t + m_mem > 0 else 1.0

    def gemm_efficiency(self, new_tokens: int) -> float:
        """Achieved / peak FLOP/s of the weight GEMMs at ``new_tokens`` tokens in the step (compute-bound side)."""
        eff_max = self.group_flops_per_s / self.peak_group_flops_per_s
        return eff_max * new_tokens / (new_tokens + self.gemm_m_half_tokens) if new_tokens > 0 else 0.0

    def allreduce_s(self, new_tokens: int) -> float:
        """Ring all-reduces (two per layer, one for parallel blocks) of ``new_tokens x hidden`` bf16 activations (0 without TP).

        Under DP attention (perf.moe): one attention all-reduce per layer inside the rank, and the FFN layers'
        all-to-all / all-gather over the engine instead of the second all-reduce."""
        if self.moe is not None and self.moe.dp > 1:
            ring = 0.0
            if self.tp > 1:
                ring = (self.allreduce_latency_s + 2 * (self.tp - 1) / self.tp
                        * new_tokens * self.hidden_size * 2.0 / self.allreduce_bytes_per_s)
            return self.num_layers * ring + self.moe.ffn_collectives_s(new_tokens)
        if self.tp <= 1:
            return 0.0
        return self.allreduces_per_layer * self.num_layers * (self.allreduce_latency_s + 2 * (self.tp - 1) / self.tp
                                      * new_tokens * self.hidden_size * 2.0 / self.allreduce_bytes_per_s)

    @cached_property
    def _dense_terms(self) -> tuple[float, float, float, float] | None:
        """For a model without routed experts, the token-independent parts of :meth:`step_s`, computed as its
        general path computes them (so both give the same floats): the weight read ``w_s`` (s), the memory knee
        ``M_mem`` (tokens, :meth:`gemm_curve_factor`), the ring's ``2 (n - 1) / n`` and ``a x layers`` of
        :meth:`allreduce_s` (the search and the simulator call ``step_s`` ~10^5-10^6 times a run)."""
        if self.num_experts or self.moe is not None or self.routed_flops_per_token:
            return None
        w_s = self.dense_weight_bytes_per_gpu / (self.hbm_bytes_per_s * self.weight_stream_efficiency)
        lin = self.linear_flops_per_token
        m_mem = w_s * self.group_flops_per_s / lin if lin else 0.0
        return w_s, m_mem, 2 * (self.tp - 1) / self.tp, float(self.allreduces_per_layer * self.num_layers)

    def step_s(self, new_tokens: int, kv_read_bytes: float, attention_flops: float, prefill: bool = False) -> float:
        """Wall time of one step (see module docstring); ``prefill``: the step carries prefill tokens."""
        bw, comp = self.hbm_bytes_per_s, self.group_flops_per_s
        dense = self._dense_terms
        if dense is not None:  # the terms below, inlined (same operations in the same order)
            w_s, m_mem, ring, n_ar = dense
            t = max(new_tokens, 0)
            r = 1.0 - self.gemm_curve_hidden * m_mem / (t + m_mem) if t + m_mem > 0 else 1.0
            lin = (t + r * self.gemm_m_half_tokens) * self.linear_flops_per_token
            ar = (n_ar * (self.allreduce_latency_s + ring * new_tokens * self.hidden_size * 2.0 / self.allreduce_bytes_per_s)
                  if self.tp > 1 else 0.0)
            return (max(w_s, lin / comp) + max(kv_read_bytes / self.tp / bw, attention_flops / (comp * self.attention_ratio))
                    + ar + (self.overhead_s + (self.prefill_step_overhead_s if prefill else 0.0))
                    + new_tokens * self.pp_hop_s_per_token)
        if self.moe is None and self.weight_stream_efficiency == 1.0 and self.expert_bandwidth_efficiency == 1.0:
            w_s = self.weight_bytes_read_per_gpu(new_tokens) / bw   # experts without an EP / DP layout (dense models took the path above)
            lin = self.gemm_effective_flops(new_tokens, w_s)
        else:
            w_s = self.weight_read_s(new_tokens, bw)
            lin = self.effective_linear_flops(new_tokens, w_s)
        gemm = max(w_s, lin / comp)
        attn = max(kv_read_bytes / self.tp / bw, attention_flops / (comp * self.attention_ratio))
        fixed = self.overhead_s + (self.prefill_step_overhead_s if prefill else 0.0)
        return gemm + attn + self.allreduce_s(new_tokens) + fixed + new_tokens * self.pp_hop_s_per_token

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """A decode-only step per output token: ``batch`` sequences each holding ``context_tokens``.

        With MTP (perf.speculative): ``(verify step over B (k + 1) tokens + k draft passes) / tokens_per_step``."""
        kv, fl = self.decode_seq_cost(context_tokens)
        if self.draft is None:
            return self.step_s(batch, batch * kv, batch * fl)
        return self.spec_step_s(batch, batch * kv, batch * fl, context_tokens) / self.tokens_per_step

    @property
    def tokens_per_step(self) -> float:
        """Tokens one decode step emits per sequence: 1, or ``sum_{i<=k} a^i`` with MTP."""
        return 1.0 if self.draft is None else self.draft.tokens_per_step

    @property
    def query_tokens(self) -> int:
        """Query tokens per decoding sequence in a step: 1, or ``k + 1`` with MTP."""
        return 1 if self.draft is None else self.draft.query_tokens

    def draft_s(self, decodes: float, context_tokens: float) -> float:
        """The ``k`` MTP draft passes of a step with ``decodes`` decoding sequences (0 without MTP)."""
        d = self.draft
        if d is None or decodes <= 0:
            return 0.0
        t = max(decodes, 1.0)
        experts = 0.0
        if self.num_experts:
            per_layer = (self.moe.expert_bytes_read_per_gpu(t) / max(1, self.moe.num_moe_layers) if self.moe is not None
                         else moe_mod.expected_experts_touched(self.num_experts, self.experts_top_k, t) * self.expert_bytes_per_gpu)
            experts = per_layer
        layers = max(1, self.num_layers)
        coll = self.allreduce_s(int(round(t))) / layers + self.moe_layer_overhead_s
        one = spec_mod.draft_pass_s(d, batch=decodes, context_tokens=context_tokens,
                                    expert_bytes_per_gpu=experts / self.expert_bandwidth_efficiency, tp=self.tp,
                                    hbm_bytes_per_s=self.hbm_bytes_per_s * self.weight_stream_efficiency,
                                    group_flops_per_s=self.group_flops_per_s, collective_s=coll)
        return d.num_speculative_tokens * one

    def spec_step_s(self, decodes: float, kv_decode_bytes: float, decode_attention_flops: float, context_tokens: float,
                    prefill_tokens: float = 0.0, kv_prefill_bytes: float = 0.0, prefill_attention_flops: float = 0.0,
                    prefill: bool = False) -> float:
        """Real wall time of one step: ``decodes`` sequences (their one-query-token KV bytes and attention FLOPs
        given) each verify ``k + 1`` query tokens (KV read once, attention FLOPs x (k + 1)), plus a prefill's
        tokens and costs, plus the ``k`` draft passes. Without MTP this is :meth:`step_s`."""
        q = self.query_tokens
        tokens = int(round(decodes * q + prefill_tokens))
        return (self.step_s(tokens, kv_decode_bytes + kv_prefill_bytes, decode_attention_flops * q + prefill_attention_flops,
                            prefill=prefill)
                + self.draft_s(decodes, context_tokens))

    def prefill_s(self, prompt_tokens: int, batch: int = 1, chunk_tokens: int | None = None) -> float:
        """Prefill ``batch`` prompts of ``prompt_tokens`` alone (no decodes), in chunks of ``chunk_tokens``."""
        total = prompt_tokens * batch
        chunk = chunk_tokens or total
        t, done = 0.0, 0
        per_seq_chunk = max(1, chunk // batch)
        while done < prompt_tokens:
            c = min(per_seq_chunk, prompt_tokens - done)
            kv, fl = self.prefill_chunk_cost(c, done)
            t += self.step_s(c * batch, kv * batch, fl * batch, prefill=True)
            done += c
        return t


def _moe_layout(dep: Deployment) -> moe_mod.MoeLayout:
    """The EP / DP-attention layout of a MoE deployment (perf.moe)."""
    m, g, p = dep.model, dep.gpu, dep.profile
    assert m.moe is not None
    ic = g.interconnect
    n_gpus = dep.tp * dep.dp
    return moe_mod.MoeLayout(
        tp=dep.tp, dp=dep.dp, ep=dep.ep, num_experts=m.moe.num_experts, top_k=m.moe.top_k,
        num_moe_layers=m.moe.num_moe_layers, num_dense_layers=m.num_layers - m.moe.num_moe_layers,
        expert_bytes=m.params.expert_one * mem.bytes_per_weight(dep.weight_dtype), hidden_size=m.hidden_size,
        link_bytes_per_s=ic.ring_bandwidth_bytes_per_s(n_gpus) * p.allreduce_bandwidth_efficiency,
        link_latency_s=p.allreduce_latency_pcie_s if ic.is_pcie else p.allreduce_latency_s)


def _draft_cost(dep: Deployment, attn_flops_per_pair_layer: float) -> spec_mod.DraftCost | None:
    """The MTP draft pass's coefficients (perf.speculative), or None without speculative decoding."""
    if dep.spec is None:
        return None
    m, tp = dep.model, dep.tp
    rest, _experts = spec_mod.mtp_layer_params(m)
    bpw = mem.bytes_per_weight(dep.weight_dtype)
    head = m.params.lm_head or m.params.embedding
    active_routed = m.params.expert_one * m.moe.top_k if m.moe is not None else 0
    return spec_mod.DraftCost(
        num_speculative_tokens=dep.spec.num_speculative_tokens, acceptance_rate=dep.spec.acceptance_rate,
        dense_bytes_per_gpu=(rest * bpw + head * 2.0) / tp,
        flops_per_token=2.0 * (rest + active_routed + head),
        kv_bytes_per_token=mem.kv_bytes_per_token_per_layer_per_gpu(m, dep.kv_dtype, tp) * tp,
        attn_flops_per_pair=attn_flops_per_pair_layer)


def bound_of(parts: dict[str, float]) -> str:
    """'memory' or 'compute': which roofline term is larger."""
    return "memory" if parts["memory_s"] >= parts["compute_s"] else "compute"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["EngineLimits", "Deployment", "StepCostModel", "default_limits", "check_parallelism",
           "compute_dtype", "gemm_dtype_ratio", "bound_of", "ceil_div"]
