"""Validate custom resources against a CRD's structural ``openAPIV3Schema`` the way the API server does.

The schemas are the copies in tests/data/crds/ (README.md there: sources, commits, licences). A Kubernetes
structural schema is almost JSON Schema; :func:`to_draft7` turns one into a Draft 7 schema for ``jsonschema``:

* unknown fields are errors wherever a node lists ``properties`` (or says ``type: object``) and neither has
  ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields: true`` (the API server prunes such
  fields, ``kubectl apply`` with its default ``--validate=strict`` refuses them): so a renamed field fails;
* ``x-kubernetes-int-or-string`` accepts an integer or a string; ``nullable`` adds null;
* ``x-kubernetes-embedded-resource`` objects need ``apiVersion`` and ``kind``;
* ``x-kubernetes-list-type: map`` lists may not repeat a key, ``set`` lists a value (checked beside jsonschema);
* the root ``metadata`` is ObjectMeta: ``name`` a DNS-1123 subdomain, labels and annotations string maps;
* ``default`` values are filled in and nulls of non-nullable fields dropped before validation, as the API
  server does (a required field with a default may be left out).

Not evaluated: CEL ``x-kubernetes-validations``, ``format``, admission webhooks.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_DIR = Path(__file__).parent / "data" / "crds"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": DNS1123_SUBDOMAIN},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}
#: Kubernetes keywords with no Draft 7 meaning (or a different one)
ANNOTATION_KEYS = {"nullable", "default", "description", "example", "format"}


def to_draft7(node: Any, *, inside_junctor: bool = False) -> Any:
    """One structural-schema node -> Draft 7 (see the module docstring)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: to_draft7(sub, inside_junctor=inside_junctor) for name, sub in value.items()}
        elif key == "additionalProperties":
            out[key] = to_draft7(value, inside_junctor=inside_junctor) if isinstance(value, dict) else value
        elif key == "items":
            out[key] = to_draft7(value, inside_junctor=inside_junctor)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_draft7(sub, inside_junctor=True) for sub in value]
        elif key == "not":
            out[key] = to_draft7(value, inside_junctor=True)
        elif key in ANNOTATION_KEYS or key.startswith("x-kubernetes-"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        for name in ("apiVersion", "kind"):
            props.setdefault(name, {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
        out["required"] = sorted(set(out.get("required", [])) | {"apiVersion", "kind"})
    lists_fields = node.get("type") == "object" or "properties" in node
    open_ended = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
    if lists_fields and not open_ended and not inside_junctor:
        out["additionalProperties"] = False
    if node.get("nullable") and not inside_junctor and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _child(node: dict[str, Any], key: str) -> Any:
    props = node.get("properties") or {}
    if key in props:
        return props[key]
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def with_defaults_and_list_checks(obj: Any, node: Any, path: str, errors: list[str]) -> None:
    """Fill ``default``s in place (as the API server does) and check list-type map/set uniqueness."""
    if not isinstance(node, dict):
        return
    if isinstance(obj, dict):
        for key in [k for k, v in obj.items() if v is None]:  # the API server prunes nulls of non-nullable fields
            sub = _child(node, key)
            if sub is not None and not sub.get("nullable"):
                del obj[key]
        for key, sub in (node.get("properties") or {}).items():
            if key not in obj and isinstance(sub, dict) and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
        for key, value in obj.items():
            sub = _child(node, key)
            if sub is not None:
                with_defaults_and_list_checks(value, sub, f"{path}.{key}", errors)
    elif isinstance(obj, list):
        items = node.get("items")
        for i, value in enumerate(obj):
            with_defaults_and_list_checks(value, items, f"{path}[{i}]", errors)
        kind = node.get("x-kubernetes-list-type")
        if kind in ("map", "set"):
            keys = node.get("x-kubernetes-list-map-keys") or []
            seen: set[str] = set()
            for i, value in enumerate(obj):
                ident = json.dumps([value.get(k) for k in keys] if kind == "map" and isinstance(value, dict) else value,
                                   sort_keys=True)
                if ident in seen:
                    errors.append(f"{path}[{i}]: duplicate entry in x-kubernetes-list-type={kind} list")
                seen.add(ident)


@functools.lru_cache(maxsize=None)
def crd(file_stem: str) -> tuple[dict[str, Any], jsonschema.Draft7Validator]:
    """The stored schema document of ``<file_stem>.schema.json`` and its compiled validator."""
    doc = json.loads((CRD_DIR / f"{file_stem}.schema.json").read_text())
    root = to_draft7(doc["openAPIV3Schema"])
    root.setdefault("properties", {})
    root["properties"]["metadata"] = OBJECT_META
    root["properties"]["apiVersion"] = {"const": f"{doc['group']}/{doc['version']}"}
    root["properties"]["kind"] = {"const": doc["kind"]}
    root["required"] = sorted(set(root.get("required", [])) | {"apiVersion", "kind", "metadata"})
    return doc, jsonschema.Draft7Validator(root)


#: (apiVersion, kind) -> schema file stem
KINDS = {
    ("serving.kserve.io/v1alpha2", "LLMInferenceService"): "serving.kserve.io_llminferenceservices.v1alpha2",
    ("nvidia.com/v1beta1", "DynamoGraphDeployment"): "nvidia.com_dynamographdeployments.v1beta1",
    ("disaggregatedset.x-k8s.io/v1", "DisaggregatedSet"): "disaggregatedset.x-k8s.io_disaggregatedsets.v1",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_leaderworkersets.v1",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inference.networking.k8s.io_inferencepools.v1",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.v1alpha1",
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): "resource.nvidia.com_computedomains.v1beta1",
}


def errors_of(obj: dict[str, Any]) -> list[str]:
    """Every schema error of one custom resource (empty: valid); KeyError for a kind without a stored CRD."""
    doc, validator = crd(KINDS[(obj.get("apiVersion"), obj.get("kind"))])
    assert doc["served"], f"{doc['kind']} {doc['version']} is not served"
    inst = copy.deepcopy(obj)
    errors: list[str] = []
    with_defaults_and_list_checks(inst, doc["openAPIV3Schema"], "", errors)
    for e in sorted(validator.iter_errors(inst), key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(map(str, e.absolute_path)) or "<root>"
        errors.append(f"{where}: {e.message[:200]}")
    return errors


def custom_resources(text: str) -> list[dict[str, Any]]:
    """The documents of a YAML stream whose kind has a stored CRD."""
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and (d.get("apiVersion"), d.get("kind")) in KINDS]
