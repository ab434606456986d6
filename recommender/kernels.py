"""Kernel support: what vLLM 0.33 runs per GPU architecture (``catalogs/kernel-support.yaml``).

Typed, frozen view of the table: per architecture the weight dtypes with the kernel path vLLM takes,
the reasons others are unsupported, the KV-cache dtypes and the plan features (``prefix_caching``,
``nixl_connector``). Each GPU catalog entry names its architecture (``vllm.arch``). The search asks
:meth:`ArchSupport.why_not` before it evaluates a candidate and ``deploy`` asks it again for plans
read from JSON, so both agree on what can start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recommender.dtypes import KV_DTYPES, WEIGHT_BITS, WEIGHT_DTYPES
from recommender.errors import CatalogError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class KernelEfficiency:
    """How a weight dtype's kernels run on an architecture, relative to the engine profile (``efficiency:`` rows).

    ``bandwidth``: share of the profile's ``hbm_bandwidth_efficiency`` the dtype's GEMMs reach streaming weights
    (1 = as fast per byte as the profile's kernels); ``compute``: share of ``compute_efficiency`` at the dtype's
    peak; ``compute_dtype``: the tensor-core dtype the GEMMs run in when not the default rule (e.g. MXFP4 W4A4)."""

    bandwidth: float = 1.0
    compute: float = 1.0
    compute_dtype: str = ""
    source: str = ""


NEUTRAL_EFFICIENCY = KernelEfficiency()


@dataclass(frozen=True)
class ArchSupport:
    """One GPU architecture's row of the kernel-support table."""

    arch: str
    vendor: str
    weight_kernels: Mapping[str, str]  # weight dtype -> kernel path (text, with sources)
    unsupported: Mapping[str, str]  # weight dtype -> why not
    kv_dtypes: tuple[str, ...]
    features: frozenset[str]
    efficiencies: Mapping[str, KernelEfficiency] = field(default_factory=dict)

    def efficiency(self, weight_dtype: str) -> KernelEfficiency:
        """The dtype's kernel efficiency row (neutral when the table has none)."""
        return self.efficiencies.get(weight_dtype, NEUTRAL_EFFICIENCY)

    def runs_weights(self, dtype: str) -> bool:
        return dtype in self.weight_kernels

    def why_not(self, gpu_id: str, *, weight_dtype: str, kv_dtype: str | None = None) -> str | None:
        """None when vLLM 0.33 runs this combination on the architecture, else a one-line reason that names
        the architecture, the dtype, why, and what vLLM 0.33 runs there instead (callers add what to try).

        The one rule for every command: the search skips such a candidate, ``estimate`` / ``simulate`` refuse
        the configuration and ``deploy`` refuses the plan, each with this text."""
        if weight_dtype not in self.weight_kernels:
            why = self.unsupported.get(weight_dtype, "no kernel listed")
            return (f"vLLM 0.33 does not run {weight_dtype} weights on {gpu_id} ({self.arch}): {why}; "
                    f"it runs {', '.join(self.weight_kernels) or 'no'} weights there")
        if kv_dtype is not None and kv_dtype not in self.kv_dtypes:
            return (f"vLLM 0.33 has no {kv_dtype} KV cache on {gpu_id} ({self.arch}); "
                    f"it has {', '.join(self.kv_dtypes) or 'no'} KV caches there")
        return None

    def closest_weight_dtype(self, dtype: str) -> str | None:
        """The weight dtype this architecture runs that is nearest to ``dtype``: as many bits per weight
        (int8 -> fp8), else the fewest bits above (4-bit -> 8-bit), else the most bits below. ``mxfp4`` (gpt-oss
        experts only) is never proposed for another dtype. None when ``dtype`` runs here or nothing else does."""
        if dtype in self.weight_kernels or dtype not in WEIGHT_BITS:
            return None
        bits = WEIGHT_BITS[dtype]
        others = [d for d in self.weight_kernels if d in WEIGHT_BITS and d != "mxfp4"]
        if not others:
            return None
        return min(others, key=lambda d: (WEIGHT_BITS[d] < bits, abs(WEIGHT_BITS[d] - bits)))

    def kernel(self, weight_dtype: str) -> str:
        """The kernel path for a supported weight dtype ('' when unsupported)."""
        return self.weight_kernels.get(weight_dtype, "")


#: Support of a GPU whose catalog entry names no architecture: 16-bit weights only.
UNKNOWN_ARCH = ArchSupport(arch="unknown", vendor="", weight_kernels={"bf16": "native BF16 GEMMs", "fp16": "native FP16 GEMMs"},
                           unsupported={}, kv_dtypes=("bf16",), features=frozenset({"prefix_caching"}))


def _arch_from_doc(name: str, doc: Mapping[str, Any], where: str) -> ArchSupport:
    try:
        weights = {str(k): str(v) for k, v in (doc.get("weights") or {}).items()}
        unsupported = {str(k): str(v) for k, v in (doc.get("unsupported") or {}).items()}
        kv = tuple(str(k) for k in doc.get("kv") or ())
        features = frozenset(str(f) for f in doc.get("features") or ())
        vendor = str(doc["vendor"]).lower()
        effs = {str(k): KernelEfficiency(bandwidth=float(v.get("bandwidth", 1.0)), compute=float(v.get("compute", 1.0)),
                                         compute_dtype=str(v.get("compute_dtype", "")), source=str(v.get("source", "")))
                for k, v in (doc.get("efficiency") or {}).items()}
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise CatalogError(f"{where}: architecture {name!r}: missing or bad field {e}") from None
    bad = [d for d in (*weights, *unsupported, *effs) if d not in WEIGHT_DTYPES] + [d for d in kv if d not in KV_DTYPES]
    if bad:
        raise CatalogError(f"{where}: architecture {name!r}: unknown dtype {bad[0]!r} (weights: {', '.join(WEIGHT_DTYPES)}; "
                           f"KV: {', '.join(KV_DTYPES)})")
    out_of_range = [k for k, e in effs.items() if not (0 < e.bandwidth <= 1.0 and 0 < e.compute <= 1.0)]
    if out_of_range:
        raise CatalogError(f"{where}: architecture {name!r}: efficiency of {out_of_range[0]!r} must be in (0, 1]")
    return ArchSupport(arch=name, vendor=vendor, weight_kernels=weights, unsupported=unsupported, kv_dtypes=kv, features=features,
                       efficiencies=effs)


def load_kernel_support(path: Path) -> dict[str, ArchSupport]:
    """Parse the kernel-support table; an absent file means no architectures (every GPU 16-bit only)."""
    if not path.exists():
        return {}
    try:
        doc = yaml.load(path.read_text(), Loader=_LOADER)
    except yaml.YAMLError as e:
        raise CatalogError(f"{path} is not valid YAML: {e}") from None
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    if not isinstance(archs, dict):
        raise CatalogError(f"{path} must be a mapping with 'architectures'")
    return {str(k).lower(): _arch_from_doc(str(k).lower(), v or {}, str(path)) for k, v in archs.items()}
