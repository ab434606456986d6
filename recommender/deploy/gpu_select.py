"""GPU selection for engine pods: the ONE rule every Kubernetes renderer uses (k8s, Helm, and the targets that
take a :class:`~recommender.deploy.spec.DeploySpec`) to put a pod on the plan's GPU model.

Which node label names the GPU depends on the cluster (``--gpu-label``, :class:`GpuLabel`):

=========  ==========================================  =================================================
choice     label key                                   values (from the catalog)
=========  ==========================================  =================================================
``gfd``    ``nvidia.com/gpu.product`` (NVIDIA GPU      ``k8s.node_labels`` of ``catalogs/gpus/<id>.yaml``
           feature discovery; AMD: ``amd.com/gpu.      (NVML product name, spaces as dashes; AMD device id)
           device-id``, the AMD node labeller)
``gke``    ``cloud.google.com/gke-accelerator``        ``k8s.gke_accelerator`` (Compute Engine accelerator type)
``eks``    ``node.kubernetes.io/instance-type``        the AWS offers' instance types (``p5.48xlarge``)
``none``   no GPU-model affinity                        (the GPU resource request alone)
``auto``   every label above that the catalog knows,   soft: ``preferredDuringScheduling``, so a cluster
           as a preference (the default)               without these labels still schedules the pods
=========  ==========================================  =================================================

The explicit choices are hard (``requiredDuringScheduling``): a plan sized for H200 never lands on A100s
there. The user's ``--node-selector`` labels are always required.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from recommender.deploy.gpus import GpuFacts
from recommender.errors import DeployError

__all__ = ["EKS_LABEL", "GKE_LABEL", "GpuLabel", "gpu_affinity", "gpu_label_terms"]

GKE_LABEL = "cloud.google.com/gke-accelerator"
EKS_LABEL = "node.kubernetes.io/instance-type"


class GpuLabel(str, Enum):
    """How engine pods select the GPU model's nodes (``recommend deploy --gpu-label``)."""

    AUTO = "auto"
    GFD = "gfd"
    GKE = "gke"
    EKS = "eks"
    NONE = "none"


def gpu_label_terms(gpu: GpuFacts, scheme: GpuLabel) -> list[dict[str, Any]]:
    """``matchExpressions`` naming ``gpu`` under one labelling scheme (empty when the catalog has no values)."""
    pairs: list[tuple[str, tuple[str, ...]]] = []
    if scheme is GpuLabel.GFD:
        by_key: dict[str, list[str]] = {}
        for key, value in gpu.node_labels:
            by_key.setdefault(key, []).append(value)
        pairs = [(k, tuple(v)) for k, v in by_key.items()]
    elif scheme is GpuLabel.GKE and gpu.gke_accelerators:
        pairs = [(GKE_LABEL, gpu.gke_accelerators)]
    elif scheme is GpuLabel.EKS and gpu.aws_instance_types:
        pairs = [(EKS_LABEL, gpu.aws_instance_types)]
    return [{"key": k, "operator": "In", "values": list(v)} for k, v in pairs]


def gpu_affinity(gpu: GpuFacts, choice: GpuLabel, required: Sequence[tuple[str, str]] = ()) -> dict[str, Any] | None:
    """The pod ``affinity`` putting it on ``gpu``'s nodes under ``choice`` (see the module docstring), with the
    ``required`` (key, value) labels as hard terms too (renderers whose chart has no separate nodeSelector);
    None when there is nothing to select on. An explicit choice the catalog has no label for is refused."""
    user = [{"key": k, "operator": "In", "values": [v]} for k, v in required]
    node: dict[str, Any] = {}
    if choice is GpuLabel.AUTO:
        prefs = [{"weight": 100, "preference": {"matchExpressions": t}}
                 for s in (GpuLabel.GFD, GpuLabel.GKE, GpuLabel.EKS) if (t := gpu_label_terms(gpu, s))]
        if prefs:
            node["preferredDuringSchedulingIgnoredDuringExecution"] = prefs
    elif choice is not GpuLabel.NONE:
        terms = gpu_label_terms(gpu, choice)
        if not terms:
            raise DeployError(f"--gpu-label {choice.value}: the catalog names no {choice.value} node label for "
                              f"{gpu.id}; use --gpu-label auto (a soft preference) or none")
        user = terms + user
    if user:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [{"matchExpressions": user}]}
    return {"nodeAffinity": node} if node else None
