"""``catalogs/evidence.yaml``: the plans' error-band classes (engine x GPU family x weight dtype x model class), read
once and cached, and a class's entry in it. Written by ``benchmarks/bench_bands.py --write``; read by
``recommender.search.bands`` (the bands, P(SLO met)) and ``recommender.search.recommend_rows`` (a MoE plan's
measured rows), so that both count the same rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from recommender.catalog import catalog_dir
from recommender.errors import CatalogError

EVIDENCE_FILE = "evidence.yaml"  # in the catalog folder (catalogs/evidence.yaml)

_EVIDENCE_CACHE: dict[tuple[str, float], Mapping[str, Any] | None] = {}


def evidence_table(path: Path | None = None) -> Mapping[str, Any] | None:
    """``catalogs/evidence.yaml`` parsed (cached by path and modification time); None when absent."""
    p = path or catalog_dir() / EVIDENCE_FILE
    try:
        key = (str(p), p.stat().st_mtime)
    except OSError:
        return None
    if key not in _EVIDENCE_CACHE:
        try:
            doc = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise CatalogError(f"{p} is not valid YAML: {e}; rerun benchmarks/bench_bands.py --write") from None
        if not isinstance(doc, Mapping) or not isinstance(doc.get("classes"), list):
            raise CatalogError(f"{p} must be a mapping with 'classes' (a list); rerun benchmarks/bench_bands.py --write")
        _EVIDENCE_CACHE[key] = doc
    return _EVIDENCE_CACHE[key]


def class_entry(table: Mapping[str, Any], engine: str, family: str, dtype: str, model_class: str) -> Mapping[str, Any]:
    """The table's entry for one class (``{decode: {rows, sigma}, ttft: {...}}``); {} where it has none."""
    return next((c for c in table.get("classes") or () if isinstance(c, Mapping) and (
        c.get("engine"), c.get("family"), c.get("dtype"), c.get("model_class")) == (engine, family, dtype, model_class)), {})


def class_rows(table: Mapping[str, Any] | None, engine: str, family: str, dtype: str, model_class: str) -> int:
    """The class's measured rows, both metric kinds (``decode``: TPOT, ITL, e2e, throughput; ``ttft``), as the plan
    table's P(SLO) column counts them; 0 without an entry."""
    entry = class_entry(table or {}, engine, family, dtype, model_class)
    return sum(int(k.get("rows") or 0) for k in (entry.get("decode"), entry.get("ttft")) if isinstance(k, Mapping))
