"""Issue #31 item 5: rows that differ only in a dtype with identical predicted numbers are one row naming both.
Checked on every shipped plan (examples/plans/*.plan.json, the search's own output, regenerated with the model)
and the P/D fixture: no two rows share a shape (GPU, TP, replicas, limits, P/D pools) with the same cost and
latencies, and the collapsed rows name their twin as weight/KV dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "examples" / "plans").glob("*.plan.json")) + [ROOT / "tests/data/plans/pd-rag-tpot30.plan.json"]


def _shape_and_numbers(p: dict) -> tuple:
    pools = tuple((q["role"], q["gpu"], q["tp"], q["replicas"], q["max_num_seqs"], q["max_num_batched_tokens"])
                  for q in p["pools"])
    return pools, round(p["usd_per_million_tokens"], 9), round(p["ttft_s"], 9), round(p["tpot_s"], 9)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_no_two_rows_are_dtype_twins(path: Path) -> None:
    plans = json.loads(path.read_text())["plans"]
    keys = [_shape_and_numbers(p) for p in plans]
    assert len(set(keys)) == len(keys), f"{path.name}: rows with the same shape and numbers"
    for p in plans:
        for twin in p.get("twin_dtypes", []):
            w, k = twin.split("/")
            assert (w, k) != (p["weight_dtype"], p["kv_dtype"]) and w in {"fp8", "int8", "int4", "bf16", "fp16", "fp4"}


def test_the_long_context_plan_names_its_int8_twins() -> None:
    """On H100 int8 and fp8 weights stream the same bytes (1 byte a weight) and the H100 int8 and fp8 dense peaks
    are equal (1,979 TFLOP/s, catalogs/gpus/h100-sxm.yaml), so an fp8 row has an int8 twin with the same numbers."""
    plans = json.loads((ROOT / "examples/plans/long-context.plan.json").read_text())["plans"]
    h100 = [p for p in plans if p["gpu"] == "h100-sxm" and p["weight_dtype"] == "fp8"]
    assert h100 and all(p["twin_dtypes"] == [f"int8/{p['kv_dtype']}"] for p in h100)
