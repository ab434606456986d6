"""Helpers on plan JSON documents (docs/ARCHITECTURE.md, "Plan JSON"): read, compare, resize.

The re-planner treats a plan document as data: its rank-1 row is "the deployment". Two rows have the
same *shape* when everything but the replica counts (and the numbers derived from them) is equal;
then a change between them is a pure scale-out/in and can be capped per step.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Mapping

from recommender.errors import ConfigError
from recommender.plan import load_plan as read_plan
from recommender.plan import plan_document

# row keys that follow from the replica count (not part of the shape)
# (max_model_len follows the observed lengths, not the hardware; it rides along with any change)
_DERIVED = {"rank", "id", "replicas", "gpus_total", "pools", "ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s",
            "utilisation", "load_utilisation", "usd_per_hour", "usd_per_million_output_tokens", "usd_per_million_tokens", "pareto",
            "binding", "quality_note", "percentile", "latency_percentiles", "simulated", "max_model_len"}
_POOL_DERIVED = {"replicas", "kv_capacity_tokens"}


def load_plan(path: str | Path) -> dict[str, Any]:
    """Read a plan file through the one reader (:func:`recommender.plan.load_plan`: versions 1 and 2, checked
    field by field) and return its document (version 2), checked for a usable rank-1 row."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"current plan {p} does not exist; create it with `recommend WORKLOAD --format json > {p}`")
    doc = plan_document(read_plan(p))
    check_plan(doc, str(p))
    return doc


def check_plan(doc: Any, where: str) -> None:
    """Raise ConfigError (naming the field) unless ``doc`` is a plan document with a costed rank-1 row."""
    if not isinstance(doc, dict) or not isinstance(doc.get("plans"), list) or not doc["plans"]:
        raise ConfigError(f"{where}: not a plan document (needs a non-empty 'plans' list; see `recommend --format json`)")
    row = doc["plans"][0]
    for key in ("gpu", "tp", "replicas", "usd_per_hour"):
        if not isinstance(row, dict) or key not in row:
            raise ConfigError(f"{where}: plans[0] lacks field '{key}'")
    if not isinstance(row["replicas"], int) or row["replicas"] < 0:
        raise ConfigError(f"{where}: plans[0].replicas must be a non-negative integer")


def top(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The rank-1 row (lowest 'rank', else the first)."""
    rows = doc["plans"]
    return min(rows, key=lambda r: r.get("rank", math.inf)) if any("rank" in r for r in rows) else rows[0]


def usd_per_hour(doc: Mapping[str, Any]) -> float:
    return float(top(doc)["usd_per_hour"])


def sized_rate_per_s(doc: Mapping[str, Any]) -> float | None:
    """Arrival rate (req/s) the plan was sized for: its workload's rate x (1 + the search's headroom,
    ``search.headroom`` in the plan JSON, 0 if absent); None for offline plans."""
    r = (doc.get("workload") or {}).get("arrival_rate_per_s")
    if r is None:
        return None
    headroom = (doc.get("search") or {}).get("headroom") or 0.0
    return float(r) * (1.0 + float(headroom))


def replicas(row: Mapping[str, Any]) -> tuple[int, ...]:
    """Replica count per pool (one entry for a co-located plan)."""
    pools = row.get("pools") or []
    if len(pools) > 1:
        return tuple(int(p["replicas"]) for p in pools)
    return (int(row["replicas"]),)


def shape(row: Mapping[str, Any]) -> str:
    """Everything but replica-derived fields, as a canonical string."""
    core = {k: v for k, v in row.items() if k not in _DERIVED}
    core["pools"] = [{k: v for k, v in p.items() if k not in _POOL_DERIVED} for p in (row.get("pools") or [])]
    return json.dumps(core, sort_keys=True)


def same_shape(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return shape(a) == shape(b)


def same_deployment(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Same shape and the same replica counts: nothing to roll out."""
    return same_shape(a, b) and replicas(a) == replicas(b)


def describe(doc: Mapping[str, Any]) -> str:
    """'h100-sxm tp4 fp8/fp8 x2 replicas ($31.90/h)'."""
    r = top(doc)
    dt = f" {r['weight_dtype']}/{r.get('kv_dtype', r['weight_dtype'])}" if "weight_dtype" in r else ""
    reps = "+".join(str(x) for x in replicas(r))
    disagg = " disaggregated" if r.get("disaggregated") else ""
    return f"{r['gpu']} tp{r['tp']}{dt}{disagg} x{reps} replicas (${float(r['usd_per_hour']):.2f}/h)"


def total_replicas(row: Mapping[str, Any]) -> int:
    return sum(replicas(row))


def with_replicas(doc: Mapping[str, Any], new: tuple[int, ...], note: str) -> dict[str, Any]:
    """Copy of ``doc`` whose rank-1 row runs ``new`` replicas per pool (only that row is kept).

    Cost, GPU count and throughput scale with the GPUs actually run: a pool's share of the cost is taken
    as its share of GPUs (``tp * replicas``); utilisation scales inversely with capacity. Latency figures
    are the planner's for its own replica count, which ``note`` (put in ``quality_note``) says.
    """
    out = copy.deepcopy(dict(doc))
    row = copy.deepcopy(top(doc))
    old = replicas(row)
    pools = row.get("pools") or []
    tps = [int(p.get("tp", row["tp"])) for p in pools] if len(pools) > 1 else [int(row["tp"])]
    old_gpus = sum(t * r for t, r in zip(tps, old))
    new_gpus = sum(t * r for t, r in zip(tps, new))
    scale = new_gpus / old_gpus if old_gpus else 1.0
    if len(pools) > 1:
        for p, r in zip(pools, new):
            p["replicas"] = r
        decode = [p for p in pools if p.get("role") == "decode"]
        row["replicas"] = int(decode[0]["replicas"]) if decode else new[-1]
    else:
        row["replicas"] = new[0]
        for p in pools:
            p["replicas"] = new[0]
    row["gpus_total"] = int(round(float(row.get("gpus_total", old_gpus)) * scale))
    row["usd_per_hour"] = round(float(row["usd_per_hour"]) * scale, 4)
    if "output_tokens_per_s" in row:
        row["output_tokens_per_s"] = round(float(row["output_tokens_per_s"]) * scale, 3)
    for key in ("utilisation", "load_utilisation"):  # version 1 and version 2 names
        if isinstance(row.get(key), (int, float)) and scale > 0:
            row[key] = round(float(row[key]) / scale, 4)
    if "id" in row and isinstance(row["id"], str):
        base = row["id"].rsplit("-r", 1)[0] if "-r" in row["id"] else row["id"]
        row["id"] = f"{base}-r{'+'.join(str(x) for x in new)}"
    row["quality_note"] = "; ".join(x for x in (row.get("quality_note", ""), note) if x)
    row["rank"] = 1
    out["plans"] = [row]
    wl = out.get("workload")
    if isinstance(wl, dict) and wl.get("arrival_rate_per_s") is not None:
        wl["arrival_rate_per_s"] = round(float(wl["arrival_rate_per_s"]) * scale, 6)
    return out
