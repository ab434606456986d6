"""Speculative decoding with multi-token-prediction (MTP) heads: tokens per step, verify cost, draft cost, memory.

vLLM's ``--speculative-config '{"method": "mtp", "num_speculative_tokens": k}'`` runs, every decode step of
every sequence, ``k`` draft passes of the model's MTP module (one decoder layer for DeepSeek-V3/R1, reused for
each of the ``k`` positions, sharing the embedding and LM head) and one verify pass of the full model over
``k + 1`` query tokens (the last accepted token and the ``k`` drafts). With a per-position acceptance rate
``a`` (draft ``i`` is kept only if drafts ``1..i-1`` were: probability ``a^i``) one step emits::

    tokens_per_step = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a)          (= k + 1 at a = 1)

    verify_step_s   = step_s(B (k + 1) + prefill tokens, KV of the B sequences read once, attention FLOPs x (k + 1))
    draft_pass_s(B) = max(draft_bytes_per_gpu(B) / bw, B x draft_flops_per_token / compute)
                      + B x ctx x draft-layer KV / tp / bw + one layer's collectives
    TPOT            = (verify_step_s + k x draft_pass_s(B)) / tokens_per_step

``draft_bytes_per_gpu(B)`` = the MTP layer's non-expert weights and the shared LM head over ``tp`` + the experts
``B`` tokens touch in that one layer (``perf.moe``). Memory: the MTP module's own weights (11.5e9 unique
parameters for DeepSeek-V3 per its README_WEIGHTS, ~14e9 with the shared embedding and head) and one more
layer of KV per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from recommender.hf_config import ModelArch
from recommender.perf import memory as mem

#: vLLM's default ``num_speculative_tokens`` for MTP: the model's ``num_nextn_predict_layers`` (SpeculativeConfig:
#: "It will default to the number in the draft model config if present").
MAX_SPECULATIVE_TOKENS = 8


def tokens_per_step(num_speculative_tokens: int, acceptance_rate: float) -> float:
    """Expected tokens one verify step emits per sequence: ``sum_{i=0..k} a^i``."""
    k, a = num_speculative_tokens, acceptance_rate
    return float(sum(a**i for i in range(k + 1)))


def acceptance_for(num_speculative_tokens: int, accepted_per_step: float) -> float:
    """The per-position acceptance ``a`` at which a verify step accepts ``accepted_per_step`` draft tokens on average:
    the inverse of :func:`tokens_per_step` less the bonus token, ``sum_{i=1..k} a^i = accepted_per_step``
    (increasing in ``a``; bisection on (0, 1], at least 1e-6). 0.96 at ``k = 2`` is 0.6."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if tokens_per_step(num_speculative_tokens, mid) - 1.0 < accepted_per_step else (lo, mid)
    return max(hi, 1e-6)


def mtp_layer_params(model: ModelArch) -> tuple[float, float]:
    """(non-expert, routed-expert) parameters of ONE MTP module: a decoder layer (attention, the MoE of a MoE
    layer or the dense MLP) + ``eh_proj`` (2 hidden -> hidden) + two RMSNorms; embedding and head are shared."""
    p, h = model.params, model.hidden_size
    attention = p.attention / model.num_layers
    eh_proj = 2.0 * h * h
    if model.moe is not None and p.num_moe_layers:
        shared = p.shared_experts / p.num_moe_layers
        router = p.router / p.num_moe_layers
        experts = float(model.moe.num_experts * p.expert_one)
        return attention + shared + router + eh_proj + 3 * h, experts
    dense = p.dense_mlp / max(1, model.num_layers)
    return attention + dense + eh_proj + 3 * h, 0.0


def draft_weights_bytes_per_gpu(model: ModelArch, dtype: str, tp: int, dp: int = 1) -> float:
    """Per-GPU bytes of the MTP modules: non-expert parameters over ``tp``, routed experts over ``tp x dp``."""
    rest, experts = mtp_layer_params(model)
    b = mem.bytes_per_weight(dtype)
    return model.mtp_layers * (rest * b / tp + experts * b / (tp * dp))


@dataclass(frozen=True)
class SpecDecode:
    """MTP speculative decoding as configured: ``k`` draft tokens per step, per-position acceptance ``a``."""

    num_speculative_tokens: int
    acceptance_rate: float
    acceptance_source: str = ""

    @property
    def query_tokens(self) -> int:
        """Query tokens per sequence in a verify step: ``k + 1``."""
        return self.num_speculative_tokens + 1

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.num_speculative_tokens, self.acceptance_rate)


@dataclass(frozen=True)
class DraftCost:
    """Coefficients of one draft pass of one attention rank (module docstring), built by ``StepCostModel.build``."""

    num_speculative_tokens: int
    acceptance_rate: float
    dense_bytes_per_gpu: float       # MTP layer non-expert weights + shared LM head, per GPU
    flops_per_token: float           # 2 x (MTP layer active params + LM head), whole rank
    kv_bytes_per_token: float        # the draft layer's KV per context token, whole rank (all its TP copies)
    attn_flops_per_pair: float       # one layer's attention FLOPs per (query, key) pair

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.num_speculative_tokens, self.acceptance_rate)

    @property
    def query_tokens(self) -> int:
        return self.num_speculative_tokens + 1




def draft_pass_s(d: DraftCost, *, batch: float, context_tokens: float, expert_bytes_per_gpu: float, tp: int,
                 hbm_bytes_per_s: float, group_flops_per_s: float, collective_s: float) -> float:
    """One draft pass of ``batch`` sequences at ``context_tokens`` (module docstring): the MTP layer's weights
    (``dense_bytes_per_gpu`` + ``expert_bytes_per_gpu`` for the experts these tokens touch) against its FLOPs, its KV
    read against its attention FLOPs, plus ``collective_s`` (one layer's collectives)."""
    if batch <= 0:
        return 0.0
    gemm = max((d.dense_bytes_per_gpu + expert_bytes_per_gpu) / hbm_bytes_per_s, batch * d.flops_per_token / group_flops_per_s)
    attn = max(batch * context_tokens * d.kv_bytes_per_token / tp / hbm_bytes_per_s,
               batch * context_tokens * d.attn_flops_per_pair / group_flops_per_s)
    return gemm + attn + collective_s


__all__ = ["SpecDecode", "DraftCost", "tokens_per_step", "mtp_layer_params", "draft_weights_bytes_per_gpu", "draft_pass_s",
           "MAX_SPECULATIVE_TOKENS"]
