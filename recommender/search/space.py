"""The deployment space: what a candidate is, and which candidates are valid for a model and GPU."""

from __future__ import annotations

from dataclasses import dataclass

from recommender.catalog import Catalog, Gpu
from recommender.errors import ConfigError
from recommender.hf_config import ModelArch
from recommender.perf.step import check_parallelism


@dataclass(frozen=True)
class Candidate:
    """One point of the space. Aggregated: one pool on (gpu, tp). Disaggregated: prefill on (gpu, tp),
    decode on (decode_gpu, decode_tp); ``max_num_seqs`` bounds the decode pool, ``max_num_batched_tokens``
    is the (prefill) chunk budget; 0 means chunked prefill off."""

    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    disaggregated: bool = False
    decode_gpu: str = ""
    decode_tp: int = 0

    @property
    def key(self) -> str:
        chunk = f"b{self.max_num_batched_tokens}" if self.max_num_batched_tokens else "nochunk"
        base = f"{self.gpu}-tp{self.tp}-{self.weight_dtype}-kv{self.kv_dtype}-s{self.max_num_seqs}-{chunk}"
        return f"pd-{base}-d-{self.decode_gpu}-tp{self.decode_tp}" if self.disaggregated else base


def resolve_dtype(dtype: str, model: ModelArch) -> str:
    """``native`` -> the checkpoint's dtype (fp16 checkpoints count as bf16-sized)."""
    if dtype == "native":
        return model.checkpoint_dtype if model.checkpoint_dtype in ("bf16", "fp16", "fp8", "mxfp4") else "bf16"
    return dtype


def weight_dtype_valid(model: ModelArch, gpu: Gpu, dtype: str) -> str | None:
    """None if valid, else why not. A quantized checkpoint is never upcast to a wider dtype on purpose."""
    order = {"fp4": 0, "mxfp4": 0, "int4": 0, "int8": 1, "fp8": 1, "bf16": 2, "fp16": 2}
    native = resolve_dtype("native", model)
    if order[dtype] > order[native]:
        return f"{model.id}'s checkpoint is {native}; serving it at {dtype} would only waste memory"
    if native == "mxfp4" and dtype not in ("mxfp4",):
        return f"{model.id} ships MXFP4 experts; re-quantizing to {dtype} is not a vLLM path"
    if not gpu.supports_dtype(dtype):
        return f"{gpu.id} does not run {dtype} weights in vLLM"
    return None


def parallelism_valid(model: ModelArch, gpu: Gpu, tp: int) -> str | None:
    try:
        check_parallelism(model, gpu, tp)
    except ConfigError as e:
        return str(e)
    return None


def allowed_gpus(catalog: Catalog, requested: tuple[str, ...] | None, overrides: dict[str, float] | None = None) -> list[Gpu]:
    """GPUs the search may use: the workload's list (validated) or every vLLM-supported, priced GPU."""
    overrides = overrides or {}
    if requested:
        gpus = [catalog.gpu(g) for g in requested]
    else:
        gpus = [g for g in catalog.gpus.values() if g.vllm_supported]
    priced = [g for g in gpus if g.usd_per_gpu_hour is not None or g.id in overrides]
    if requested:
        missing = [g.id for g in gpus if g not in priced]
        if missing:
            raise ConfigError(f"no price for {', '.join(missing)}: add prices: {{{missing[0]}: \"$X/h\"}} to the workload")
    return sorted(priced, key=lambda g: g.id)
