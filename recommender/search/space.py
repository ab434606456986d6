"""The deployment space: what a candidate is, and which candidates are valid for a model and GPU."""

from __future__ import annotations

from dataclasses import dataclass

from recommender.catalog import Catalog, Gpu
from recommender.dtypes import (
    narrower_or_equal,
    native_weight_dtype,
    resolve_weight_dtype,
)
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
    """``native`` -> the checkpoint's own dtype (:func:`recommender.dtypes.native_weight_dtype`)."""
    return resolve_weight_dtype(dtype, model.checkpoint_dtype)


def weight_dtype_valid(model: ModelArch, gpu: Gpu, dtype: str, kv_dtype: str | None = None) -> str | None:
    """None if valid, else why not. A quantized checkpoint is never upcast to a wider dtype on purpose,
    and the GPU must run the dtype pair per the kernel-support table."""
    native = native_weight_dtype(model.checkpoint_dtype)
    if not narrower_or_equal(dtype, native):
        return f"{model.id}'s checkpoint is {native}; serving it at {dtype} would only waste memory"
    if native == "mxfp4" and dtype != "mxfp4":
        return f"{model.id} ships MXFP4 experts; re-quantizing to {dtype} is not a vLLM path"
    return gpu.why_unsupported(dtype, kv_dtype)


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
