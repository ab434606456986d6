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

Every value is a YAML string, as in a Kubernetes manifest: ``namespace: 123``, ``node_selector: {a: true}`` or a
toleration's ``value: true`` are refused in one line naming the field (quote them, ``'123'``, ``'true'``; the API
server refuses a number or boolean label value too), never written as Python's ``str()`` (``True``).
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


def _kind(value: Any) -> str:
    """What a YAML value is, for a message: 'a boolean', 'a number', 'a list', 'a mapping', 'null'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def _string(value: Any, where: str, expected: str) -> str:
    """``value`` when it is a YAML string, else one DeployError line "``where`` must be a string (``expected``),
    got ..." (a scalar gets the quoted spelling to write: ``true`` -> ``'true'``, as kubectl wants it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        spelt = str(value).lower() if isinstance(value, bool) else str(value)
        raise DeployError(f"{where} must be a string ({expected}), got {_kind(value)}: {spelt}; quote it, "
                          f"'{spelt}', as a Kubernetes manifest needs")
    raise DeployError(f"{where} must be a string ({expected}), got {_kind(value)}")


def _node_selector_from_doc(sel: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(sel, dict):
        raise DeployError(f"{where}: node_selector must be a mapping of label key: value strings, got {_kind(sel)}")
    out = []
    for k, v in sel.items():
        key = _string(k, f"{where}: node_selector key {k!r}", "a label key").strip()
        value = _string(v, f"{where}: node_selector {key}", "a label value").strip()
        _check_label(key, value, f"{where}: node_selector")
        out.append((key, value))
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


def _tolerations_from_doc(items: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(items, list):
        raise DeployError(f"{where}: tolerations must be a list of {{key, operator, value, effect}}, got {_kind(items)}")
    out = []
    for t in items:
        if not isinstance(t, dict) or not set(t) <= {"key", "operator", "value", "effect"} or "key" not in t:
            raise DeployError(f"{where}: toleration {t!r} needs key (and optional operator, value, effect)")
        tol = {str(k): _string(v, f"{where}: toleration {k}", f"a toleration {k}") for k, v in t.items()}
        if tol.get("operator", "Equal") not in ("Equal", "Exists") or tol.get("effect", "NoSchedule") not in EFFECTS:
            raise DeployError(f"{where}: toleration {t!r}: operator Equal|Exists, effect {'|'.join(EFFECTS)}")
        _check_label(tol["key"], tol.get("value", ""), f"{where}: toleration")
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


#: the values file's string keys and what each must be (the message of a wrong type names it)
_STRING_VALUES = {"namespace": "a DNS-1123 label such as llm", "image": "an image reference, registry/name:tag",
                  "router_image": "an image reference, registry/name:tag", "storage_class": "a StorageClass name",
                  "gpu_label": "auto, gfd, gke, eks or none"}


def _values_from_file(path: Path) -> ClusterOptions:
    """The values file (module docstring) as options: every key known, every value of its type (one line each)."""
    doc = read_yaml_file(path, "deploy values", "see recommend deploy -h")
    where = f"values file {path}"
    if doc is None:
        return ClusterOptions()
    if not isinstance(doc, dict):
        raise DeployError(f"{where}: must be a mapping of namespace, image, router_image, storage_class, "
                          f"node_selector, tolerations, gpu_label, got {_kind(doc)}")
    unknown = {str(k) for k in doc} - {*_STRING_VALUES, "node_selector", "tolerations"}
    if unknown:
        raise DeployError(f"{where}: unknown key {min(unknown)!r}; use {', '.join([*_STRING_VALUES, 'node_selector', 'tolerations'])}")
    text = {k: None if doc.get(k) is None else _string(doc[k], f"{where}: {k}", what)
            for k, what in _STRING_VALUES.items()}
    return ClusterOptions(
        namespace=text["namespace"], image=text["image"], router_image=text["router_image"] or ROUTER_IMAGE,
        storage_class=text["storage_class"],
        node_selector=_node_selector_from_doc({} if doc.get("node_selector") is None else doc["node_selector"], where),
        tolerations=_tolerations_from_doc([] if doc.get("tolerations") is None else doc["tolerations"], where),
        gpu_label=gpu_label_of(text["gpu_label"], f"{where}: gpu_label"))


def cluster_options(*, values_file: str | Path | None = None, namespace: str | None = None, image: str | None = None,
                    router_image: str | None = None, storage_class: str | None = None,
                    node_selector: Sequence[str] = (), tolerations: Sequence[str] = (),
                    gpu_label: str | GpuLabel | None = None) -> ClusterOptions:
    """Values file first, then flags on top (flags win; list flags add to the file's lists)."""
    opts = ClusterOptions()
    if values_file is not None:
        opts = _values_from_file(Path(values_file))
    opts = replace(
        opts, namespace=namespace or opts.namespace, image=image or opts.image,
        router_image=router_image or opts.router_image, storage_class=storage_class or opts.storage_class,
        node_selector=opts.node_selector + parse_node_selector(node_selector),
        tolerations=opts.tolerations + tuple(parse_toleration(t) for t in tolerations),
        gpu_label=gpu_label_of(gpu_label) if gpu_label is not None else opts.gpu_label)
    return check(opts)
