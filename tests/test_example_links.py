"""Every P/D row of the example plans (and the test plans) names a KV link its rented offers have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recommender.catalog import default_catalog

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "examples" / "plans").glob("*.plan.json")) + [ROOT / "tests" / "data" / "plans" / "pd-h100-one-instance.plan.json"]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_pd_rows_name_a_link_their_offers_have(path: Path) -> None:
    doc = json.loads(path.read_text())
    cat = default_catalog()
    for row in doc["plans"]:
        if not row["disaggregated"]:
            assert row.get("kv_link") is None
            continue
        link = row["kv_link"]
        assert link and link["label"], row["id"]
        p, d = (q["rental"] for q in row["pools"])
        assert p["provider"] == d["provider"], row["id"]  # one network between the pools
        if link["same_instance"]:
            # one instance shared by both pools; the path is the GPU's host link (catalogs/gpus interconnect.host_link)
            assert p["shared"] and d["shared"] and p["instances"] == d["instances"] == 1
            ic = cat.gpu(row["pools"][0]["gpu"]).interconnect
            assert (link["kind"], link["bytes_per_s_per_gpu"]) == (ic.host_kind, ic.host_bandwidth_bytes_per_s)
        else:
            # across instances: the slower offer's NIC (an offer without a NIC figure: 10 Gb/s per instance)
            offers = [o for g in (row["pools"][0]["gpu"], row["pools"][1]["gpu"]) for o in cat.gpu(g).offers
                      if o.provider == p["provider"]]
            assert any(abs(o.nic_bytes_per_s_per_gpu - link["bytes_per_s_per_gpu"]) < 1 for o in offers), row["id"]
            assert link["known"] == bool(p["network"] and d["network"])
