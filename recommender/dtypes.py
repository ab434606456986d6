"""Dtype rules, in one place: which weight and KV dtypes exist, what a checkpoint's own ("native")
dtype is, and which weight dtypes vLLM can serve from a checkpoint without another one.

Every layer asks here (estimate, the search space, calibration readers, deploy). Whether a GPU runs
a dtype is a separate question, answered by the kernel-support table (:mod:`recommender.kernels`).

Rules:

- ``native_weight_dtype(checkpoint_dtype)``: the checkpoint's dtype as stored (``bf16``, ``fp16``,
  ``fp8``, ``int8``/``int4`` for GPTQ/AWQ, ``mxfp4`` ...); anything unknown counts as ``bf16``. An AWQ
  checkpoint is ``int4`` everywhere (estimate and search agree).
- ``loads_without_checkpoint(native, dtype)``: vLLM loads the checkpoint as is, casts 16-bit to
  16-bit (``--dtype``), or quantizes 16-bit to fp8 at load (``--quantization fp8``). Any other dtype
  needs a pre-quantized checkpoint of its own.
- ``narrower_or_equal(dtype, native)``: serving a checkpoint at a *wider* dtype only wastes memory, so
  the search never proposes it (bytes per weight: 16-bit 2 > 8-bit 1 > 4-bit 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from recommender.errors import DeployError

#: Weight dtypes the model knows. "fp4" = NVFP4 (W4A4); "mxfp4" = OCP MXFP4 (gpt-oss experts).
WEIGHT_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4", "fp4", "mxfp4")
#: KV-cache dtypes the model knows.
KV_DTYPES: tuple[str, ...] = ("bf16", "fp8")
SIXTEEN_BIT = frozenset({"bf16", "fp16"})
#: Weight dtypes served from a pre-quantized checkpoint only (never quantized at load by vLLM).
PREQUANTIZED_ONLY = frozenset({"int8", "int4", "fp4", "mxfp4"})
#: Bits per stored weight (scales and zero points ignored): orders dtypes from wide to narrow.
WEIGHT_BITS = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4, "mxfp4": 4}

#: Checkpoint format name (as in a quantization_config or a user's ``checkpoints:`` key) -> weight dtype.
FORMAT_DTYPE = {
    "awq": "int4", "gptq": "int4", "awq_marlin": "int4", "gptq_marlin": "int4", "w4a16": "int4",
    "int4": "int4", "w8a8": "int8", "w8a16": "int8", "int8": "int8", "smoothquant": "int8",
    "fp8": "fp8", "w8a8_fp8": "fp8", "nvfp4": "fp4", "modelopt_fp4": "fp4", "fp4": "fp4", "mxfp4": "mxfp4",
}


def native_weight_dtype(checkpoint_dtype: str) -> str:
    """The weight dtype a checkpoint stores; unknown strings count as ``bf16``."""
    d = checkpoint_dtype.strip().lower()
    return d if d in WEIGHT_DTYPES else "bf16"


def loads_without_checkpoint(native: str, dtype: str) -> bool:
    """True when vLLM serves ``dtype`` from a ``native`` checkpoint with no other checkpoint."""
    return dtype == native or (dtype in SIXTEEN_BIT and native in SIXTEEN_BIT) or (dtype == "fp8" and native in SIXTEEN_BIT)


def narrower_or_equal(dtype: str, native: str) -> bool:
    """True when ``dtype`` stores no more bits per weight than the ``native`` checkpoint."""
    return WEIGHT_BITS[dtype] <= WEIGHT_BITS[native]


def resolve_weight_dtype(dtype: str, checkpoint_dtype: str) -> str:
    """``native`` -> :func:`native_weight_dtype`; any other name lower-cased."""
    d = dtype.strip().lower()
    return native_weight_dtype(checkpoint_dtype) if d == "native" else d


# -- which repo vLLM loads for a weight dtype, and with which flag (deploy's policy; estimate names it too)

VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
PREQUANTIZED_HINT = {"int4": "an AWQ or GPTQ INT4", "int8": "a W8A8 INT8", "fp4": "an NVFP4", "fp8": "an FP8",
                     "mxfp4": "an MXFP4"}


@dataclass(frozen=True)
class WeightsChoice:
    """Which repo vLLM loads and how: ``model`` + optional ``--quantization`` / ``--dtype`` values."""

    model: str
    quantization: str | None
    dtype: str | None
    note: str


def resolve_weights(weight_dtype: str, checkpoint_dtype: str, hf_repo: str, checkpoint: str | None) -> WeightsChoice:
    """The quantization policy (``recommender.deploy.spec``'s module docstring): a given checkpoint as is; the
    checkpoint at its own dtype; 16-bit cast to 16-bit (``--dtype``); 16-bit quantized to fp8 at load
    (``--quantization fp8``); anything else needs a pre-quantized checkpoint (:class:`DeployError`, one line)."""
    if checkpoint:
        return WeightsChoice(checkpoint, None, None,
                             f"pre-quantized {weight_dtype} checkpoint {checkpoint} (vLLM reads its quantization config)")
    if weight_dtype == checkpoint_dtype:
        return WeightsChoice(hf_repo, None, None, f"{hf_repo} is already {weight_dtype}; no --quantization")
    if weight_dtype in SIXTEEN_BIT and checkpoint_dtype in SIXTEEN_BIT:
        return WeightsChoice(hf_repo, None, VLLM_DTYPE[weight_dtype],
                             f"{checkpoint_dtype} checkpoint {hf_repo} cast to {weight_dtype} at load (--dtype)")
    if weight_dtype == "fp8" and checkpoint_dtype in SIXTEEN_BIT:
        return WeightsChoice(hf_repo, "fp8", None,
                             f"{checkpoint_dtype} checkpoint {hf_repo} quantized to FP8 at load (--quantization fp8, online dynamic)")
    hint = PREQUANTIZED_HINT.get(weight_dtype, f"a {weight_dtype}")
    raise DeployError(
        f"the plan runs {weight_dtype} weights but {hf_repo} is a {checkpoint_dtype} checkpoint: that needs {hint} "
        f"pre-quantized checkpoint and the plan names none; add \"checkpoint\": \"<hf repo>\" to the plan "
        f"or pass --checkpoint REPO"
    )
