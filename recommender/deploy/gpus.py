"""The GPU facts a deployment needs: vendor, vLLM support, Kubernetes resource name, dtypes.

Read from the GPU catalog (``recommender.catalog``, files ``catalogs/gpus/<id>.yaml``): ``vendor``
(nvidia|amd), ``vllm.supported``, ``vllm.k8s_resource``, ``vllm.quantized_checkpoints`` and
``dense_tflops`` (one key per dtype the tensor cores run natively; ``fp4`` only on Blackwell and MI355X).

``quantized_checkpoints`` lists the weight dtypes vLLM has kernels for on that GPU (``int4``, ``int8``,
``fp8``, ``fp4``, ``mxfp4``); checkpoint format names (``awq``, ``gptq``, ``w8a8``, ``nvfp4`` ...) are
accepted too and mapped to the dtype they store (``FORMAT_DTYPE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from recommender.catalog import Catalog, Gpu, default_catalog
from recommender.errors import CatalogError, DeployError

#: Checkpoint format name -> the weight dtype it stores.
FORMAT_DTYPE = {
    "awq": "int4", "gptq": "int4", "awq_marlin": "int4", "gptq_marlin": "int4", "w4a16": "int4",
    "int4": "int4", "w8a8": "int8", "w8a16": "int8", "int8": "int8", "smoothquant": "int8",
    "fp8": "fp8", "w8a8_fp8": "fp8", "nvfp4": "fp4", "modelopt_fp4": "fp4", "fp4": "fp4", "mxfp4": "mxfp4",
}


@dataclass(frozen=True)
class GpuFacts:
    """What the deploy renderers need to know about one GPU type."""

    id: str
    vendor: str  # "nvidia" | "amd"
    vllm_supported: bool
    k8s_resource: str  # e.g. "nvidia.com/gpu", "amd.com/gpu"
    quantized_checkpoints: tuple[str, ...]
    tensor_dtypes: frozenset[str]  # dtypes with a dense_tflops entry (bf16, fp16, fp8, int8, fp4 ...)

    def supports_dtype(self, dtype: str) -> bool:
        """True when the GPU's tensor cores run ``dtype`` natively (it has a dense_tflops entry)."""
        return dtype in self.tensor_dtypes

    def serves_prequantized(self, weight_dtype: str) -> bool:
        """True when vLLM can serve a pre-quantized ``weight_dtype`` checkpoint on this GPU."""
        return weight_dtype in {FORMAT_DTYPE.get(q.lower(), q.lower()) for q in self.quantized_checkpoints}


GpuLookup = Callable[[str], GpuFacts]


def facts_from_gpu(gpu: Gpu) -> GpuFacts:
    """Project a catalog :class:`~recommender.catalog.Gpu` onto what deployment needs."""
    return GpuFacts(
        id=gpu.id,
        vendor=gpu.vendor,
        vllm_supported=gpu.vllm_supported,
        k8s_resource=gpu.k8s_resource or ("amd.com/gpu" if gpu.vendor == "amd" else "nvidia.com/gpu"),
        quantized_checkpoints=tuple(gpu.quantized_checkpoints),
        tensor_dtypes=frozenset(d for d, v in gpu.dense_flops_per_s.items() if v),
    )


def catalog_gpu_lookup(catalog: Catalog | None = None) -> GpuLookup:
    """A lookup over ``catalog`` (default: the shipped catalog); unknown ids raise DeployError."""

    def lookup(gpu_id: str) -> GpuFacts:
        try:
            return facts_from_gpu((catalog or default_catalog()).gpu(gpu_id))
        except CatalogError as e:
            raise DeployError(f"cannot deploy on GPU {gpu_id!r}: {e}") from None

    return lookup


def default_gpu_lookup() -> GpuLookup:
    """The lookup used when the caller passes none: the shipped GPU catalog."""
    return catalog_gpu_lookup()
