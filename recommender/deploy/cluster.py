"""Where the manifests land: namespace, images, scheduling (GPU pinning, tolerations, node selector) and
the cache volume's storage class. From ``recommend deploy`` flags or a small values file.

GPU selection: ``--gpu-label`` (``gpu_label:``) picks the node label that names the GPU model
(``recommender.deploy.gpu_select``: NVIDIA GPU feature discovery, GKE, EKS, none; by default a soft
preference on all of them, so clusters without those labels still schedule). ``--node-selector`` adds
required labels of the user's own (a node pool, a zone).

Values file (YAML, every key optional)::

    namespace: llm
    image: registry.example.com/vllm/vllm-openai:v0.33.0     # engine image (both vendors)
    router_image: lmcache/lmstack-router:v0.1.12
    storage_class: fast-rwx
    node_selector: {cloud.google.com/gke-nodepool: h200-pool}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
    gpu_label: gke                                            # auto | gfd | gke | eks | none
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recommender.deploy.gpu_select import GpuLabel
from recommender.errors import DeployError
from recommender.yamlfile import read_yaml_file

#: production-stack's router, pinned to a released tag (never ``latest``); ``--router-image`` overrides.
ROUTER_IMAGE = "lmcache/lmstack-router:v0.1.12"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")


@dataclass(frozen=True)
class ClusterOptions:
    """Cluster-side settings of the Kubernetes and Helm output (defaults: none, pinned router)."""

    namespace: str | None = None
    image: str | None = None
    router_image: str = ROUTER_IMAGE
    storage_class: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, str], ...] = ()
    gpu_label: GpuLabel = GpuLabel.AUTO  # how engine pods select the GPU model's nodes (deploy/gpu_select.py)


def gpu_label_of(value: str | GpuLabel | None, what: str = "--gpu-label") -> GpuLabel:
    """``auto|gfd|gke|eks|none`` -> :class:`GpuLabel` (one-line error otherwise)."""
    if value is None or isinstance(value, GpuLabel):
        return value or GpuLabel.AUTO
    try:
        return GpuLabel(str(value).strip().lower())
    except ValueError:
        raise DeployError(f"{what} {value!r}: use one of {', '.join(g.value for g in GpuLabel)}") from None


def _check_label(key: str, value: str, what: str) -> None:
    if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
        raise DeployError(f"{what} {key}={value!r} is not a valid Kubernetes label key/value")


def parse_node_selector(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``["key=value", ...]`` -> pairs (validated as Kubernetes labels)."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise DeployError(f"--node-selector {item!r}: use key=value")
        _check_label(key.strip(), value.strip(), "--node-selector")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def parse_toleration(item: str) -> dict[str, str]:
    """``key=value:Effect``, ``key:Effect`` (operator Exists) or ``key`` (Exists, any effect)."""
    body, _, effect = item.partition(":")
    key, sep, value = body.partition("=")
    tol: dict[str, str] = {"key": key.strip(), "operator": "Equal" if sep else "Exists"}
    if sep:
        tol["value"] = value.strip()
    if effect:
        if effect not in EFFECTS:
            raise DeployError(f"--toleration {item!r}: effect must be one of {', '.join(EFFECTS)}")
        tol["effect"] = effect
    _check_label(tol["key"], tol.get("value", ""), "--toleration")
    return tol


def _tolerations_from_doc(items: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(items, list):
        raise DeployError("values file: tolerations must be a list of {key, operator, value, effect}")
    out = []
    for t in items:
        if not isinstance(t, dict) or not set(t) <= {"key", "operator", "value", "effect"} or "key" not in t:
            raise DeployError(f"values file: toleration {t!r} needs key (and optional operator, value, effect)")
        tol = {k: str(v) for k, v in t.items()}
        if tol.get("operator", "Equal") not in ("Equal", "Exists") or tol.get("effect", "NoSchedule") not in EFFECTS:
            raise DeployError(f"values file: toleration {t!r}: operator Equal|Exists, effect {'|'.join(EFFECTS)}")
        _check_label(tol["key"], tol.get("value", ""), "values file toleration")
        out.append(tol)
    return tuple(out)


def check(opts: ClusterOptions) -> ClusterOptions:
    """Validate names and images (they reach manifests verbatim)."""
    if opts.namespace is not None and not _DNS_LABEL.fullmatch(opts.namespace):
        raise DeployError(f"namespace {opts.namespace!r} is not a DNS-1123 label (lowercase letters, digits, '-')")
    if opts.storage_class is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", opts.storage_class):
        raise DeployError(f"storage class {opts.storage_class!r} is not a valid Kubernetes name")
    for what, image in (("image", opts.image), ("router image", opts.router_image)):
        if image is not None and not _IMAGE.fullmatch(image):
            raise DeployError(f"{what} {image!r} is not an image reference (registry/name:tag or @sha256:...)")
    if opts.router_image.endswith(":latest") or ":" not in opts.router_image.rsplit("/", 1)[-1] and "@" not in opts.router_image:
        raise DeployError(f"router image {opts.router_image!r} must be pinned to a tag or digest, not latest")
    return opts


def cluster_options(*, values_file: str | Path | None = None, namespace: str | None = None, image: str | None = None,
                    router_image: str | None = None, storage_class: str | None = None,
                    node_selector: Sequence[str] = (), tolerations: Sequence[str] = (),
                    gpu_label: str | GpuLabel | None = None) -> ClusterOptions:
    """Values file first, then flags on top (flags win; list flags add to the file's lists)."""
    opts = ClusterOptions()
    if values_file is not None:
        doc = read_yaml_file(Path(values_file), "deploy values file", "see recommend deploy -h") or {}
        if not isinstance(doc, dict):
            raise DeployError(f"values file {values_file}: must be a mapping")
        unknown = set(doc) - {"namespace", "image", "router_image", "storage_class", "node_selector", "tolerations",
                              "gpu_label"}
        if unknown:
            raise DeployError(f"values file {values_file}: unknown key {min(unknown)!r}")
        sel = doc.get("node_selector") or {}
        if not isinstance(sel, dict):
            raise DeployError(f"values file {values_file}: node_selector must be a mapping")
        opts = ClusterOptions(
            namespace=doc.get("namespace"), image=doc.get("image"), router_image=str(doc.get("router_image") or ROUTER_IMAGE),
            storage_class=doc.get("storage_class"),
            node_selector=parse_node_selector([f"{k}={v}" for k, v in sel.items()]),
            tolerations=_tolerations_from_doc(doc.get("tolerations") or []),
            gpu_label=gpu_label_of(doc.get("gpu_label"), f"values file {values_file}: gpu_label"))
    opts = replace(
        opts, namespace=namespace or opts.namespace, image=image or opts.image,
        router_image=router_image or opts.router_image, storage_class=storage_class or opts.storage_class,
        node_selector=opts.node_selector + parse_node_selector(node_selector),
        tolerations=opts.tolerations + tuple(parse_toleration(t) for t in tolerations),
        gpu_label=gpu_label_of(gpu_label) if gpu_label is not None else opts.gpu_label)
    return check(opts)
