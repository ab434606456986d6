"""Typed registry over the YAML catalogs (``catalogs/gpus/*.yaml``, ``catalogs/models/*.yaml``).

Adding a GPU or a model is one YAML file. Unknown ids raise :class:`CatalogError` listing the valid
ones; a duplicate id raises too. Strings with units ("80 GB", "3.35 TB/s") are converted here, once.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from recommender import units
from recommender.errors import CatalogError
from recommender.hf_config import ModelArch, arch_from_config, load_config_file

#: Weight / compute dtypes the model knows. "mxfp4" is the gpt-oss checkpoint format.
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4", "mxfp4")
KV_DTYPES = ("bf16", "fp8")


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def catalog_dir() -> Path:
    """``$RECOMMENDER_CATALOGS`` or the ``catalogs/`` folder beside the package."""
    env = os.environ.get("RECOMMENDER_CATALOGS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "catalogs"


@dataclass(frozen=True)
class Interconnect:
    """Scale-up fabric: ``bandwidth_bytes_per_s`` is one direction per GPU (aggregate over links).

    ``peer_bandwidth_bytes_per_s`` is set for point-to-point meshes (AMD xGMI) where one peer pair
    gets one link only; a ring over n GPUs then gets ``min(aggregate, peer x (n-1))``.
    """

    kind: str
    bandwidth_bytes_per_s: float
    gpus_per_domain: int
    peer_bandwidth_bytes_per_s: float | None = None

    def ring_bandwidth_bytes_per_s(self, tp: int) -> float:
        """Bandwidth one GPU gets in a ring collective over ``tp`` GPUs."""
        if self.peer_bandwidth_bytes_per_s is None or tp <= 1:
            return self.bandwidth_bytes_per_s
        return min(self.bandwidth_bytes_per_s, self.peer_bandwidth_bytes_per_s * (tp - 1))

    @property
    def is_pcie(self) -> bool:
        return self.kind.startswith("pcie")


@dataclass(frozen=True)
class Gpu:
    """One accelerator's datasheet figures (dense, no sparsity) and default price."""

    id: str
    name: str
    vendor: str
    memory_bytes: float
    hbm_bandwidth_bytes_per_s: float
    dense_flops_per_s: Mapping[str, float]
    interconnect: Interconnect
    usd_per_gpu_hour: float | None
    price_source: str = ""
    price_date: str = ""
    vllm_supported: bool = True
    k8s_resource: str = "nvidia.com/gpu"
    quantized_checkpoints: tuple[str, ...] = ()

    def flops_per_s(self, dtype: str) -> float:
        """Dense tensor throughput for a compute dtype; int4/mxfp4 weight-only run at 16-bit."""
        d = {"fp16": "bf16", "int4": "bf16", "mxfp4": "bf16"}.get(dtype, dtype)
        if d == "fp4" and "fp4" not in self.dense_flops_per_s:
            d = "bf16"
        return self.dense_flops_per_s.get(d) or self.dense_flops_per_s["bf16"]

    def supports_dtype(self, dtype: str) -> bool:
        """Whether the GPU runs this weight dtype well (16-bit always; others per catalog)."""
        if dtype in ("bf16", "fp16"):
            return True
        if dtype == "mxfp4":
            return "fp4" in self.quantized_checkpoints or "mxfp4" in self.quantized_checkpoints or "int4" in self.quantized_checkpoints
        return dtype in self.quantized_checkpoints


@dataclass(frozen=True)
class Catalog:
    """All GPUs and models by id."""

    gpus: Mapping[str, Gpu]
    models: Mapping[str, ModelArch]
    model_meta: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def gpu(self, gpu_id: str) -> Gpu:
        key = gpu_id.strip().lower()
        if key not in self.gpus:
            raise CatalogError(f"unknown GPU {gpu_id!r}; valid GPUs: {', '.join(sorted(self.gpus))}")
        return self.gpus[key]

    def model(self, name: str) -> ModelArch:
        """A catalog id, or a path to a Hugging Face ``config.json`` (or a folder holding one)."""
        key = name.strip().lower()
        if key in self.models:
            return self.models[key]
        if name.endswith(".json") or os.sep in name or Path(name).is_dir():
            return load_config_file(name)
        raise CatalogError(
            f"unknown model {name!r}; valid models: {', '.join(sorted(self.models))} "
            "(or pass a path to a Hugging Face config.json)"
        )


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.load(path.read_text(), Loader=_LOADER)  # safe loader (libyaml's when available)
    except yaml.YAMLError as e:
        raise CatalogError(f"catalog file {path} is not valid YAML: {e}") from None
    if not isinstance(doc, dict) or "id" not in doc:
        raise CatalogError(f"catalog file {path} must be a mapping with an 'id'")
    return doc


def gpu_from_doc(doc: Mapping[str, Any], where: str = "") -> Gpu:
    """Parse one GPU catalog entry (units converted here)."""
    try:
        ic = doc["interconnect"]
        price = doc.get("price") or {}
        vllm = doc.get("vllm") or {}
        peer = ic.get("peer_bandwidth")
        return Gpu(
            id=str(doc["id"]).lower(),
            name=str(doc.get("name", doc["id"])),
            vendor=str(doc.get("vendor", "nvidia")).lower(),
            memory_bytes=units.parse_bytes(doc["memory"], f"{where} memory"),
            hbm_bandwidth_bytes_per_s=units.parse_bandwidth(doc["hbm_bandwidth"], f"{where} hbm_bandwidth"),
            dense_flops_per_s={str(k): float(v) * 1e12 for k, v in doc["dense_tflops"].items() if v is not None},
            interconnect=Interconnect(
                kind=str(ic["kind"]),
                bandwidth_bytes_per_s=units.parse_bandwidth(ic["bandwidth"], f"{where} interconnect.bandwidth"),
                gpus_per_domain=int(ic["gpus_per_domain"]),
                peer_bandwidth_bytes_per_s=units.parse_bandwidth(peer) if peer else None,
            ),
            usd_per_gpu_hour=None if price.get("usd_per_gpu_hour") is None else float(price["usd_per_gpu_hour"]),
            price_source=str(price.get("source", "")),
            price_date=str(price.get("date", "")),
            vllm_supported=bool(vllm.get("supported", True)),
            k8s_resource=str(vllm.get("k8s_resource", "amd.com/gpu" if doc.get("vendor") == "amd" else "nvidia.com/gpu")),
            quantized_checkpoints=tuple(vllm.get("quantized_checkpoints") or ()),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogError(f"GPU catalog entry {where or doc.get('id')}: missing or bad field {e}") from None


def _register(table: dict[str, Any], key: str, value: Any, path: Path, kind: str) -> None:
    if key in table:
        raise CatalogError(f"duplicate {kind} id {key!r} (again in {path})")
    table[key] = value


def load_catalog(root: Path | None = None, extra_dirs: Iterable[Path] = ()) -> Catalog:
    """Load every YAML under ``root/gpus`` and ``root/models`` (and ``extra_dirs``)."""
    root = root or catalog_dir()
    gpus: dict[str, Gpu] = {}
    models: dict[str, ModelArch] = {}
    meta: dict[str, Mapping[str, Any]] = {}
    for base in (root, *extra_dirs):
        for path in sorted((base / "gpus").glob("*.yaml")):
            doc = _load_yaml(path)
            _register(gpus, str(doc["id"]).lower(), gpu_from_doc(doc, str(path)), path, "GPU")
        for path in sorted((base / "models").glob("*.yaml")):
            doc = _load_yaml(path)
            key = str(doc["id"]).lower()
            arch = arch_from_config(doc.get("config") or {}, model_id=key, hf_repo=str(doc.get("hf_repo", "")),
                                    checkpoint_dtype=doc.get("checkpoint_dtype"))
            _register(models, key, arch, path, "model")
            meta[key] = doc
    return Catalog(gpus=gpus, models=models, model_meta=meta)


@functools.lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped with the project (cached: loaded once per process)."""
    return load_catalog()
