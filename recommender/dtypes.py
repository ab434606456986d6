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
