"""The GPU facts a deployment needs: vendor, vLLM support, Kubernetes resource name, dtypes.

Source of truth is the GPU catalog. When ``recommender.catalog`` exists its
``default_catalog().gpu(id)`` is used; otherwise (the catalog module is being written in parallel)
a small adapter reads ``catalogs/gpus/<id>.yaml`` directly, using the catalog's documented fields:
``vendor`` (nvidia|amd), ``vllm.supported``, ``vllm.k8s_resource``, ``vllm.quantized_checkpoints``
and ``dense_tflops`` (one key per dtype the tensor cores run; ``fp4`` only on Blackwell).

``quantized_checkpoints`` is read as "weight dtypes vLLM can serve on this GPU from a pre-quantized
checkpoint". Entries may be dtypes (``int4``) or checkpoint formats (``awq``, ``gptq``, ``w8a8``,
``nvfp4`` ...); formats are mapped to the dtype they store (``FORMAT_DTYPE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from recommender.errors import CatalogError, DeployError

#: Checkpoint format name -> the weight dtype it stores.
FORMAT_DTYPE = {
    "awq": "int4", "gptq": "int4", "awq_marlin": "int4", "gptq_marlin": "int4", "w4a16": "int4",
    "int4": "int4", "w8a8": "int8", "w8a16": "int8", "int8": "int8", "smoothquant": "int8",
    "fp8": "fp8", "w8a8_fp8": "fp8", "nvfp4": "fp4", "modelopt_fp4": "fp4", "fp4": "fp4", "mxfp4": "mxfp4",
}
_REPO_ROOT = Path(__file__).resolve().parents[2]


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


def _default_resource(vendor: str) -> str:
    return "amd.com/gpu" if vendor == "amd" else "nvidia.com/gpu"


def facts_from_yaml(doc: dict[str, Any], gpu_id: str) -> GpuFacts:
    """Build :class:`GpuFacts` from one parsed catalog YAML document."""
    vendor = str(doc.get("vendor", "nvidia")).lower()
    vllm = doc.get("vllm") or {}
    tflops = doc.get("dense_tflops") or {}
    return GpuFacts(
        id=str(doc.get("id", gpu_id)),
        vendor=vendor,
        vllm_supported=bool(vllm.get("supported", False)),
        k8s_resource=str(vllm.get("k8s_resource") or _default_resource(vendor)),
        quantized_checkpoints=tuple(str(q) for q in (vllm.get("quantized_checkpoints") or ())),
        tensor_dtypes=frozenset(str(k) for k, v in tflops.items() if v not in (None, 0, "n/a")),
    )


def yaml_gpu_lookup(catalog_dir: Path) -> GpuLookup:
    """A lookup reading ``<catalog_dir>/<id>.yaml`` (the adapter used until ``recommender.catalog`` exists)."""

    def lookup(gpu_id: str) -> GpuFacts:
        path = catalog_dir / f"{gpu_id}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in catalog_dir.glob("*.yaml"))
            raise DeployError(f"GPU {gpu_id!r} is not in the GPU catalog ({catalog_dir}); known: {', '.join(known) or 'none'}")
        with path.open(encoding="utf-8") as f:
            return facts_from_yaml(yaml.safe_load(f) or {}, gpu_id)

    return lookup


def _from_catalog_object(gpu: Any) -> GpuFacts:
    vendor = str(getattr(gpu, "vendor", "nvidia")).lower()
    flops = getattr(gpu, "dense_flops_per_s", None)
    dtypes = [d for d, v in flops.items() if v] if flops else [
        d for d in ("bf16", "fp16", "fp8", "int8", "fp4") if gpu.supports_dtype(d)]
    return GpuFacts(
        id=str(gpu.id),
        vendor=vendor,
        vllm_supported=bool(getattr(gpu, "vllm_supported", False)),
        k8s_resource=str(getattr(gpu, "k8s_resource", "") or _default_resource(vendor)),
        quantized_checkpoints=tuple(getattr(gpu, "quantized_checkpoints", ()) or ()),
        tensor_dtypes=frozenset(dtypes),
    )


def default_gpu_lookup() -> GpuLookup:
    """``recommender.catalog.default_catalog().gpu`` when that module exists, else the YAML adapter."""
    try:
        from recommender.catalog import default_catalog  # type: ignore[attr-defined]
    except ImportError:
        return yaml_gpu_lookup(_REPO_ROOT / "catalogs" / "gpus")

    def lookup(gpu_id: str) -> GpuFacts:
        try:
            return _from_catalog_object(default_catalog().gpu(gpu_id))
        except CatalogError as e:
            raise DeployError(f"GPU {gpu_id!r}: {e}") from None

    return lookup
