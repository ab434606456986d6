"""The GPU facts a deployment needs: vendor, vLLM support, Kubernetes resource and node label, kernels.

Read from the GPU catalog (``recommender.catalog``, files ``catalogs/gpus/<id>.yaml``): ``vendor``
(nvidia|amd), ``vllm.supported``, ``vllm.k8s_resource``, ``vllm.arch`` and that architecture's row of
``catalogs/kernel-support.yaml`` (weight dtypes with their kernel path, KV dtypes, features), and
``k8s.node_labels`` (the node label values that identify the GPU model, for pinning).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from recommender.catalog import Catalog, Gpu, default_catalog
from recommender.dtypes import FORMAT_DTYPE
from recommender.errors import CatalogError, DeployError
from recommender.kernels import UNKNOWN_ARCH, ArchSupport

__all__ = ["FORMAT_DTYPE", "GpuFacts", "GpuLookup", "catalog_gpu_lookup", "default_gpu_lookup", "facts_from_gpu"]


@dataclass(frozen=True)
class GpuFacts:
    """What the deploy renderers need to know about one GPU type."""

    id: str
    vendor: str  # "nvidia" | "amd"
    vllm_supported: bool
    k8s_resource: str  # e.g. "nvidia.com/gpu", "amd.com/gpu"
    kernels: ArchSupport = UNKNOWN_ARCH
    node_labels: tuple[tuple[str, str], ...] = field(default=())  # (label key, value) pinning the GPU model
    gke_accelerators: tuple[str, ...] = ()  # GKE cloud.google.com/gke-accelerator values (catalog k8s.gke_accelerator)
    aws_instance_types: tuple[str, ...] = ()  # EKS node.kubernetes.io/instance-type values (the AWS offers' SKUs)
    node_gpus: int = 0  # GPUs of one Kubernetes node where fewer than the NVLink domain (a GB200 tray: 4); 0 = the domain
    nvlink_domain_gpus: int = 0  # GPUs of one NVLink domain (72 on a GB200 NVL72 rack)

    def supports_dtype(self, dtype: str) -> bool:
        """True when vLLM 0.33 has a kernel for ``dtype`` weights on this GPU."""
        return self.kernels.runs_weights(dtype)

    def why_unsupported(self, weight_dtype: str, kv_dtype: str | None = None) -> str | None:
        """None when vLLM 0.33 runs the combination here, else a one-line reason."""
        return self.kernels.why_not(self.id, weight_dtype=weight_dtype, kv_dtype=kv_dtype)


GpuLookup = Callable[[str], GpuFacts]


def facts_from_gpu(gpu: Gpu) -> GpuFacts:
    """Project a catalog :class:`~recommender.catalog.Gpu` onto what deployment needs."""
    return GpuFacts(
        id=gpu.id,
        vendor=gpu.vendor,
        vllm_supported=gpu.vllm_supported,
        k8s_resource=gpu.k8s_resource or ("amd.com/gpu" if gpu.vendor == "amd" else "nvidia.com/gpu"),
        kernels=gpu.kernels,
        node_labels=gpu.node_labels,
        gke_accelerators=gpu.gke_accelerators,
        aws_instance_types=tuple(dict.fromkeys(o.sku.split()[0] for o in gpu.offers if o.provider == "aws" and o.sku)),
        node_gpus=gpu.k8s_gpus_per_node,
        nvlink_domain_gpus=gpu.interconnect.gpus_per_domain,
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
