"""Hugging Face ``config.json`` -> frozen :class:`ModelArch`, and parameter counts from the architecture.

Supported families (``model_type``): llama, mistral, mixtral, qwen2, qwen3, qwen2_moe, qwen3_moe,
deepseek_v3 (and deepseek_v2), gpt_oss, gptj, falcon. Anything else raises
:class:`UnsupportedArchitectureError` naming the field.

Parameter counting convention (matches ``hardware-and-models.md`` table 2b): embeddings + lm_head
(unless tied) + attention (incl. biases and q/k norms) + MLP or experts + router + norms; multi-token
prediction (MTP) modules are excluded. "Active" parameters count the top-k routed experts plus shared
experts instead of all experts, and include embeddings and lm_head.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from recommender.bounded import load_json_text, read_file_text
from recommender.dtypes import WEIGHT_DTYPES
from recommender.errors import ConfigError, UnsupportedArchitectureError

SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "gpt_oss", "gptj", "falcon",
)


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-experts layout. ``expert_intermediate_size`` is one expert's FFN width."""

    num_experts: int
    top_k: int
    num_shared_experts: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    num_moe_layers: int
    router_bias: bool = False
    expert_bias: bool = False


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek): the KV cache holds ``kv_lora_rank + qk_rope_head_dim`` per layer."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by role (all integers, parameters not bytes)."""

    embedding: int
    lm_head: int
    attention: int
    dense_mlp: int
    experts: int           # all routed experts, all layers
    expert_one: int        # one routed expert of one layer
    shared_experts: int
    router: int
    norms: int
    top_k_experts_per_layer: int = 0
    num_moe_layers: int = 0

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + self.attention + self.dense_mlp + self.experts
                + self.shared_experts + self.router + self.norms)

    @property
    def active(self) -> int:
        """Parameters one token touches: top-k routed experts instead of all (incl. embedding + head)."""
        routed_active = self.expert_one * self.top_k_experts_per_layer * self.num_moe_layers
        return self.total - self.experts + routed_active

    @property
    def linear(self) -> int:
        """Parameters in quantizable linear layers (attention projections, MLPs, experts)."""
        return self.attention + self.dense_mlp + self.experts + self.shared_experts


@dataclass(frozen=True)
class ModelArch:
    """Architecture of a decoder-only LLM, as far as memory and time are concerned."""

    id: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    gated_mlp: bool = True
    mlp_bias: bool = False
    attention_sinks: bool = False
    norms_per_layer: int = 2
    final_norm_bias: bool = False      # LayerNorm (weight + bias) before the head, as in GPT-J and Falcon
    lm_head_bias: bool = False         # GPT-J's lm_head is a Linear with bias
    parallel_attention: bool = False   # attention and MLP read the same input and sum: one TP all-reduce per layer
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    hf_repo: str = ""
    checkpoint_dtype: str = "bf16"
    mtp_layers: int = 0                # multi-token-prediction modules (``num_nextn_predict_layers``), not in params
    #: ``quantization_config.weight_block_size`` ``(block_n, block_k)`` of a block-quantized checkpoint (DeepSeek-V3's
    #: fp8 [128, 128]); None for per-tensor / per-channel / 16-bit weights. vLLM needs every TP shard of such a layer
    #: to be whole blocks (``recommender.perf.blocks``)
    weight_block: tuple[int, int] | None = None
    params: ParamCounts = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", count_params(self))

    @property
    def total_params(self) -> int:
        return self.params.total

    @property
    def active_params(self) -> int:
        return self.params.active

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers


def _attention_params(m: ModelArch) -> int:
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            q = h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * m.num_heads * qk
        else:
            q = h * m.num_heads * qk
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        kv += a.kv_lora_rank * m.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
        o = m.num_heads * a.v_head_dim * h
        return q + kv + o
    q_dim = m.num_heads * m.head_dim
    kv_dim = m.num_kv_heads * m.head_dim
    p = h * q_dim + 2 * h * kv_dim + q_dim * h
    if m.qkv_bias:
        p += q_dim + 2 * kv_dim
    if m.o_bias:
        p += h
    if m.qk_norm:
        p += 2 * m.head_dim
    if m.attention_sinks:
        p += m.num_heads
    return p


def _mlp_params(hidden: int, inter: int, gated: bool, bias: bool) -> int:
    mats = 3 if gated else 2
    p = mats * hidden * inter
    if bias:
        p += (2 * inter if gated else inter) + hidden
    return p


def count_params(m: ModelArch) -> ParamCounts:
    """Count parameters by role from the architecture (see module docstring for the convention)."""
    h, L = m.hidden_size, m.num_layers
    embedding = m.vocab_size * h
    lm_head = 0 if m.tied_embeddings else m.vocab_size * h + (m.vocab_size if m.lm_head_bias else 0)
    attention = L * _attention_params(m)
    norms = L * m.norms_per_layer * h + (2 * h if m.final_norm_bias else h)
    if m.mla is not None:  # q_a / kv_a layernorms are counted inside attention
        pass
    dense_mlp = experts = expert_one = shared = router = 0
    top_k = n_moe = 0
    if m.moe is None:
        dense_mlp = L * _mlp_params(h, m.intermediate_size, m.gated_mlp, m.mlp_bias)
    else:
        e = m.moe
        n_moe = e.num_moe_layers
        n_dense = L - n_moe
        dense_mlp = n_dense * _mlp_params(h, m.intermediate_size, m.gated_mlp, m.mlp_bias)
        expert_one = _mlp_params(h, e.expert_intermediate_size, True, e.expert_bias)
        experts = n_moe * e.num_experts * expert_one
        shared = n_moe * e.num_shared_experts * _mlp_params(h, e.shared_intermediate_size, True, False)
        router = n_moe * (h * e.num_experts + (e.num_experts if e.router_bias else 0))
        top_k = e.top_k
    return ParamCounts(
        embedding=embedding, lm_head=lm_head, attention=attention, dense_mlp=dense_mlp,
        experts=experts, expert_one=expert_one, shared_experts=shared, router=router, norms=norms,
        top_k_experts_per_layer=top_k, num_moe_layers=n_moe,
    )


def _req(cfg: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    raise UnsupportedArchitectureError(
        f"config.json (model_type {cfg.get('model_type')!r}) lacks field {names[0]!r}"
        + (f" (or {', '.join(names[1:])})" if len(names) > 1 else "")
    )


def _int(cfg: Mapping[str, Any], *names: str) -> int:
    v = _req(cfg, *names)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
        raise UnsupportedArchitectureError(f"config.json field {names[0]!r} must be a non-negative integer, got {v!r}")
    return int(v)


def _opt_int(cfg: Mapping[str, Any], names: tuple[str, ...], default: int, *, minimum: int = 1) -> int:
    """The first of ``names`` present (not null) as an integer >= ``minimum`` (a JSON bool, a fraction or a string
    is refused, naming the field), else ``default``."""
    for n in names:
        v = cfg.get(n)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")) \
                or int(v) != v or v < minimum:
            raise UnsupportedArchitectureError(f"config.json field {n!r} must be an integer >= {minimum}, got "
                                               f"{str(v)[:40]!r}")
        return int(v)
    return default


def _opt_bool(cfg: Mapping[str, Any], name: str, default: bool) -> bool:
    """A JSON boolean field (``"false"`` as a string would read as true), else ``default``."""
    v = cfg.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise UnsupportedArchitectureError(f"config.json field {name!r} must be true or false, got {str(v)[:40]!r}")
    return v


#: torch dtypes a config.json states for its weights -> our checkpoint dtype
_TORCH_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "bf16", "float": "bf16"}


def weight_block_size(raw: Any, where: str) -> tuple[int, int] | None:
    """``weight_block_size: [block_n, block_k]`` (two positive integers) -> a tuple; None when absent."""
    if raw is None:
        return None
    if (not isinstance(raw, (list, tuple)) or len(raw) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1_000_000 for v in raw)):
        raise UnsupportedArchitectureError(f"{where} weight_block_size must be two positive integers [block_n, block_k], "
                                           f"got {str(raw)[:40]!r}")
    return int(raw[0]), int(raw[1])


def _weight_block(cfg: Mapping[str, Any]) -> tuple[int, int] | None:
    q = cfg.get("quantization_config") or {}
    if not isinstance(q, Mapping):
        raise UnsupportedArchitectureError("config.json field 'quantization_config' must be an object")
    return weight_block_size(q.get("weight_block_size"), "config.json quantization_config")


def _checkpoint_dtype(cfg: Mapping[str, Any]) -> str:
    q = cfg.get("quantization_config") or {}
    if not isinstance(q, Mapping):
        raise UnsupportedArchitectureError("config.json field 'quantization_config' must be an object")
    method = str(q.get("quant_method", "")).lower()
    if method == "mxfp4":
        return "mxfp4"
    if method == "fp8" or "fp8" in str(q.get("fmt", "")):
        return "fp8"
    if method in ("awq", "gptq"):
        bits = _opt_int(q, ("bits",), 4)
        if bits not in (4, 8):
            raise UnsupportedArchitectureError(f"config.json quantization_config.bits is {bits}: {method} checkpoints "
                                               f"this model describes have 4 or 8 bits")
        return "int4" if bits == 4 else "int8"
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if not isinstance(raw, str) or raw.removeprefix("torch.") not in _TORCH_DTYPES:
        raise UnsupportedArchitectureError(f"config.json field 'torch_dtype' is {str(raw)[:40]!r}; expected one of "
                                           f"{', '.join(sorted(_TORCH_DTYPES))} (or a quantization_config)")
    return _TORCH_DTYPES[raw.removeprefix("torch.")]


#: one part of a Hugging Face repo id (huggingface_hub's rule: alphanumerics, '-', '_', '.'; no leading or
#: trailing '-' / '.', no '--' or '..'), at most 96 characters for the whole id
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
HF_REPO_ID = re.compile(rf"{_HF_PART}(?:/{_HF_PART})?")
#: a local checkpoint directory vLLM can load instead: an absolute path of the same characters
LOCAL_MODEL_PATH = re.compile(r"(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)+/?")


def is_model_repo(s: str) -> bool:
    """True for a Hugging Face repo id (``org/name``, <= 96 characters) or an absolute local path of safe characters.

    Only such strings may become ``vllm serve``'s model argument (Kubernetes expands ``$(VAR)`` in container
    args; a shell sees ``;``, quotes, spaces).
    """
    if len(s) <= 96 and HF_REPO_ID.fullmatch(s) and "--" not in s and ".." not in s:
        return True
    return len(s) <= 4096 and LOCAL_MODEL_PATH.fullmatch(s) is not None and "/../" not in s + "/"


def not_a_model_repo(s: str, what: str) -> str | None:
    """None where ``s`` is a model repo (:func:`is_model_repo`), else why not, in one line of bounded length (``s``
    quoted with its control characters escaped, cut to 60 characters): the check ``deploy`` applies to a checkpoint
    and ``estimate`` to ``--checkpoint``."""
    if is_model_repo(s):
        return None
    shown = repr(s if len(s) <= 60 else s[:57] + "...")
    return (f"{what} {shown} is not a Hugging Face repo id (org/name: letters, digits, '-', '_', '.'; at most 96 "
            f"characters) nor an absolute local path")


#: upper bounds of config.json sizes (10x the largest published model's value, so typos and attacks stop here)
ARCH_LIMITS: Mapping[str, int] = {
    "hidden_size": 1_000_000, "num_layers": 10_000, "num_heads": 10_000, "num_kv_heads": 10_000,
    "head_dim": 10_000, "intermediate_size": 10_000_000, "vocab_size": 100_000_000,
    "max_position_embeddings": 1_000_000_000,
}


#: shortest context a served model can have (a prompt and an answer); the smallest published models have 512+
MIN_CONTEXT_TOKENS = 128
#: largest MLA rank or head dimension accepted (DeepSeek-V3: kv_lora_rank 512, q_lora_rank 1536)
MAX_MLA_DIM = 100_000
#: values of config.json's per-layer ``layer_types`` this model knows
LAYER_TYPES = ("full_attention", "sliding_attention")


def check_arch(m: ModelArch) -> ModelArch:
    """Refuse sizes no model has: every size positive and below ARCH_LIMITS, KV heads dividing the heads,
    heads x head_dim = hidden size unless config.json states head_dim, top-k <= experts, windows positive."""
    for name, cap in ARCH_LIMITS.items():
        v = getattr(m, name)
        if not 0 < v <= cap:
            raise UnsupportedArchitectureError(f"config.json: {name} must be in 1..{cap:,}, got {v}")
    if m.num_heads % m.num_kv_heads:
        raise UnsupportedArchitectureError(f"config.json: num_key_value_heads ({m.num_kv_heads}) must divide "
                                           f"num_attention_heads ({m.num_heads})")
    if m.mla is None and m.head_dim * m.num_heads != m.hidden_size and m.hidden_size % m.num_heads:
        raise UnsupportedArchitectureError(f"config.json: num_attention_heads ({m.num_heads}) must divide hidden_size "
                                           f"({m.hidden_size}) or head_dim must be given")
    if m.sliding_window is not None and m.sliding_window <= 0:
        raise UnsupportedArchitectureError(f"config.json: sliding_window must be positive, got {m.sliding_window}")
    if not 0 <= m.num_sliding_layers <= m.num_layers:
        raise UnsupportedArchitectureError(f"config.json: {m.num_sliding_layers} sliding-window layers but "
                                           f"{m.num_layers} layers")
    if m.max_position_embeddings < MIN_CONTEXT_TOKENS:
        raise UnsupportedArchitectureError(f"config.json: max_position_embeddings {m.max_position_embeddings} is below "
                                           f"{MIN_CONTEXT_TOKENS} tokens; no request fits")
    if m.checkpoint_dtype not in WEIGHT_DTYPES:
        raise UnsupportedArchitectureError(f"checkpoint dtype {m.checkpoint_dtype!r} is not one of "
                                           f"{', '.join(WEIGHT_DTYPES)}")
    if m.mla is not None:
        a = m.mla
        for name, v, lo in (("kv_lora_rank", a.kv_lora_rank, 1), ("qk_rope_head_dim", a.qk_rope_head_dim, 1),
                            ("qk_nope_head_dim", a.qk_nope_head_dim, 0), ("v_head_dim", a.v_head_dim, 1),
                            ("q_lora_rank", a.q_lora_rank or 1, 1)):
            if not lo <= v <= MAX_MLA_DIM:
                raise UnsupportedArchitectureError(f"config.json: MLA {name} must be in {lo}..{MAX_MLA_DIM:,}, got {v}")
    if m.moe is not None:
        e = m.moe
        if not 0 < e.num_experts <= 100_000 or not 0 < e.top_k <= e.num_experts:
            raise UnsupportedArchitectureError(f"config.json: need 1 <= experts per token ({e.top_k}) <= experts "
                                               f"({e.num_experts}) <= 100,000")
        if e.expert_intermediate_size <= 0 or e.shared_intermediate_size < 0:
            raise UnsupportedArchitectureError("config.json: expert intermediate sizes must be positive")
    if m.params.total <= 0:
        raise UnsupportedArchitectureError("config.json: the sizes give no parameters")
    return m


def arch_from_config(cfg: Mapping[str, Any], model_id: str = "", hf_repo: str = "",
                     checkpoint_dtype: str | None = None) -> ModelArch:
    """Build a :class:`ModelArch` from a parsed HF ``config.json`` mapping.

    Raises :class:`UnsupportedArchitectureError` naming the missing or unsupported field; a field of
    the wrong type (``"num_key_value_heads": "x"``, ``"quantization_config": "fp8"``) raises it too,
    never a bare ``TypeError`` / ``ValueError``.
    """
    try:
        return check_arch(_arch_from_config(cfg, model_id, hf_repo, checkpoint_dtype))
    except UnsupportedArchitectureError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
        mt = cfg.get("model_type") if isinstance(cfg, Mapping) else None
        raise UnsupportedArchitectureError(
            f"config.json (model_type {mt!r}) has a field of the wrong type or shape: {e}") from None


def _arch_from_config(cfg: Mapping[str, Any], model_id: str, hf_repo: str,
                      checkpoint_dtype: str | None) -> ModelArch:
    if not isinstance(cfg, Mapping):
        raise UnsupportedArchitectureError("config.json must be a JSON object")
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"config.json field 'model_type' is {mt!r}, which this model cannot describe; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(cfg, "num_attention_heads", "n_head")
    if heads == 0 or hidden == 0 or layers == 0:
        raise UnsupportedArchitectureError("config.json: hidden_size, num_hidden_layers and num_attention_heads must be > 0")
    kv_heads = _opt_int(cfg, ("num_key_value_heads", "num_kv_heads"), heads)
    head_dim = _opt_int(cfg, ("head_dim",), hidden // heads)
    vocab = _int(cfg, "vocab_size")
    kw: dict[str, Any] = dict(
        id=model_id or str(cfg.get("_name_or_path") or mt), model_type=mt, hidden_size=hidden,
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_opt_int(cfg, ("intermediate_size", "n_inner"), 4 * hidden),
        vocab_size=vocab, tied_embeddings=_opt_bool(cfg, "tie_word_embeddings", False),
        max_position_embeddings=_opt_int(cfg, ("max_position_embeddings", "n_positions", "max_seq_len"), 4096,
                                         minimum=MIN_CONTEXT_TOKENS),
        hf_repo=hf_repo, checkpoint_dtype=checkpoint_dtype or _checkpoint_dtype(cfg),
        weight_block=_weight_block(cfg),
    )
    if mt == "qwen2" or mt == "qwen2_moe":
        kw["qkv_bias"] = True
    if mt == "qwen3" or mt == "qwen3_moe":
        kw["qk_norm"] = True
    if cfg.get("attention_bias"):
        kw["qkv_bias"] = kw["o_bias"] = True
    if mt == "gptj":
        # GPT-J: parallel attention+MLP, one LayerNorm (weight+bias), plain GELU MLP with biases,
        # untied lm_head with bias; no QKV bias.
        kw.update(gated_mlp=False, mlp_bias=True, norms_per_layer=2, tied_embeddings=_opt_bool(cfg, "tie_word_embeddings", False),
                  final_norm_bias=True, lm_head_bias=True, parallel_attention=True)
    if mt == "falcon":
        kv = 1 if cfg.get("multi_query", True) and not cfg.get("new_decoder_architecture") \
            else _opt_int(cfg, ("num_kv_heads",), heads)
        kw.update(num_kv_heads=kv, gated_mlp=False, intermediate_size=_opt_int(cfg, ("ffn_hidden_size",), 4 * hidden),
                  tied_embeddings=_opt_bool(cfg, "tie_word_embeddings", True), qkv_bias=_opt_bool(cfg, "bias", False),
                  final_norm_bias=True,
                  # FalconConfig.parallel_attn defaults to True; the new decoder architecture is parallel too
                  parallel_attention=bool(cfg.get("parallel_attn", True) or cfg.get("new_decoder_architecture")))
    if mt == "gpt_oss":
        kw["attention_sinks"] = True
    if mt == "gpt_neox" and cfg.get("use_parallel_residual", True):
        kw["parallel_attention"] = True
    # sliding-window layers
    layer_types = cfg.get("layer_types")
    window = _opt_int(cfg, ("sliding_window",), 0) or None
    if layer_types:
        if not isinstance(layer_types, list) or not all(t in LAYER_TYPES for t in layer_types):
            raise UnsupportedArchitectureError(f"config.json field 'layer_types' must list {' or '.join(LAYER_TYPES)} "
                                               f"per layer")
        if len(layer_types) != layers:
            raise UnsupportedArchitectureError(f"config.json: layer_types lists {len(layer_types)} layers but "
                                               f"num_hidden_layers is {layers}")
        n_sliding = sum(1 for t in layer_types if t == "sliding_attention")
        if n_sliding and not window:
            raise UnsupportedArchitectureError(f"config.json: layer_types has {n_sliding} sliding_attention layers but "
                                               f"no sliding_window")
        if n_sliding:
            kw.update(sliding_window=window, num_sliding_layers=n_sliding)
    elif window and mt in ("mistral", "mixtral") and cfg.get("use_sliding_window") is not False:
        kw.update(sliding_window=window, num_sliding_layers=layers)
    elif window and mt in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and cfg.get("use_sliding_window"):
        n_full = _opt_int(cfg, ("max_window_layers",), layers, minimum=0)
        kw.update(sliding_window=window, num_sliding_layers=max(0, layers - n_full))
    # MoE
    if mt in ("mixtral", "gpt_oss"):
        e = _int(cfg, "num_local_experts", "num_experts")
        kw["moe"] = MoeSpec(num_experts=e, top_k=_int(cfg, "num_experts_per_tok", "experts_per_token"),
                            num_shared_experts=0, expert_intermediate_size=kw["intermediate_size"],
                            shared_intermediate_size=0, num_moe_layers=layers,
                            router_bias=mt == "gpt_oss", expert_bias=mt == "gpt_oss")
    elif mt in ("qwen2_moe", "qwen3_moe"):
        e = _int(cfg, "num_experts")
        step = _opt_int(cfg, ("decoder_sparse_step",), 1)
        mlp_only_raw = cfg.get("mlp_only_layers") or []
        if not isinstance(mlp_only_raw, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                         and 0 <= i < layers for i in mlp_only_raw):
            raise UnsupportedArchitectureError(f"config.json field 'mlp_only_layers' must list layer indices 0..{layers - 1}")
        mlp_only = set(mlp_only_raw)
        n_moe = sum(1 for i in range(layers) if i not in mlp_only and (i + 1) % step == 0)
        shared_i = _opt_int(cfg, ("shared_expert_intermediate_size",), 0, minimum=0)
        kw["moe"] = MoeSpec(num_experts=e, top_k=_int(cfg, "num_experts_per_tok"),
                            num_shared_experts=1 if shared_i else 0,
                            expert_intermediate_size=_int(cfg, "moe_intermediate_size"),
                            shared_intermediate_size=shared_i, num_moe_layers=n_moe)
        if shared_i:  # qwen2_moe shared-expert gate is a 1-wide linear: negligible, not counted
            pass
    elif mt in ("deepseek_v2", "deepseek_v3"):
        e = _int(cfg, "n_routed_experts")
        first_dense = _opt_int(cfg, ("first_k_dense_replace",), 0, minimum=0)
        freq = _opt_int(cfg, ("moe_layer_freq",), 1)
        n_moe = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
        moe_i = _int(cfg, "moe_intermediate_size")
        n_shared = _opt_int(cfg, ("n_shared_experts",), 0, minimum=0)
        kw["moe"] = MoeSpec(num_experts=e, top_k=_int(cfg, "num_experts_per_tok"), num_shared_experts=n_shared,
                            expert_intermediate_size=moe_i, shared_intermediate_size=moe_i,
                            num_moe_layers=n_moe, router_bias=mt == "deepseek_v3")
        kw["mla"] = MlaSpec(kv_lora_rank=_int(cfg, "kv_lora_rank"),
                            q_lora_rank=_opt_int(cfg, ("q_lora_rank",), 0) or None,
                            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
                            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"), v_head_dim=_int(cfg, "v_head_dim"))
        kw["head_dim"] = kw["mla"].qk_nope_head_dim + kw["mla"].qk_rope_head_dim
        kw["mtp_layers"] = int(cfg.get("num_nextn_predict_layers") or 0)
        kw["num_kv_heads"] = heads
    return ModelArch(**kw)


def load_config_file(path: str | Path) -> ModelArch:
    """Read a ``config.json`` from disk (a file, or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = read_file_text(p, "model config")
    except ConfigError as e:
        raise UnsupportedArchitectureError(str(e)) from None
    try:
        cfg = load_json_text(text, f"model config {str(p)!r}")
    except ValueError as e:
        raise UnsupportedArchitectureError(f"model config {str(p)!r} is not valid JSON: {e}") from None
    name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    if not isinstance(name, str) or not is_model_repo(name):
        name = None  # a relative path or anything else is no repo vLLM could load (and must not reach a manifest)
    return arch_from_config(cfg, model_id=p.parent.name if p.name == "config.json" else p.stem,
                            hf_repo=str(name or ""))
