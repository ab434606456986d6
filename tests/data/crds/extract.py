"""Regenerate the schema files in this folder from the CRD copies in ../shared/reference/crds (see README.md).

    python3 tests/data/crds/extract.py [CRD_DIR]     # default: ../shared/reference/crds beside the checkout

For each CRD: the ``openAPIV3Schema`` of the one served version the renderers emit, with every ``description``
removed (they are 80% of the bytes and never validate anything), as sorted compact JSON, plus where it came
from (repository, commit, path, the source file's sha256, licence). tests/test_deploy_platforms.py checks
that the files here still match a fresh extraction when the shared folder exists.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DEFAULT_SRC = HERE.parents[3] / "shared" / "reference" / "crds"
#: source CRD file -> the version our renderers emit
VERSIONS = {
    "serving.kserve.io_llminferenceservices.yaml": "v1alpha2",
    "nvidia.com_dynamographdeployments.yaml": "v1beta1",
    "disaggregatedset.x-k8s.io_disaggregatedsets.yaml": "v1",
    "leaderworkerset.x-k8s.io_leaderworkersets.yaml": "v1",
    "inference.networking.k8s.io_inferencepools.yaml": "v1",
    "keda.sh_scaledobjects.yaml": "v1alpha1",
}


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def extract(src: Path, name: str, sources: dict[str, Any]) -> str:
    """The JSON text of one schema file."""
    raw = (src / name).read_bytes()
    crd = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = VERSIONS[name]
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    meta = sources[name]
    doc = {
        "group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version,
        "served": entry.get("served", False), "deprecated": entry.get("deprecated", False),
        "source": {"repo": meta["repo"], "path": meta["path"], "snapshot_head": meta["snapshot_head"],
                   "last_commit_touching_file": meta["last_commit_touching_file"], "license": meta["license"],
                   "file": name, "sha256": hashlib.sha256(raw).hexdigest()},
        "openAPIV3Schema": _strip(entry["schema"]["openAPIV3Schema"]),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


def out_name(name: str) -> str:
    return name.removesuffix(".yaml") + "." + VERSIONS[name] + ".schema.json"


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else DEFAULT_SRC
    sources = {e["file"]: e for e in json.loads((src / "SOURCES.json").read_text())}
    for name in VERSIONS:
        (HERE / out_name(name)).write_text(extract(src, name, sources))
        print(HERE / out_name(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
