"""A pool whose engine is wider than one rented instance is refused at deploy (recommender/deploy/spec.py,
``_check_one_instance``): the renderers run one engine in one pod, and a pod asking for more GPUs than a node has
does not schedule. GB200 NVL72 is sold as 4-GPU trays (catalogs/gpus/gb200.yaml, CoreWeave [P4]); the search prices
a TP 8 engine there as two trays of one rack."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli.app import app
from recommender.deploy.spec import build_spec
from recommender.errors import DeployError

PLAN = Path(__file__).resolve().parents[1] / "examples" / "plans" / "batch-summarization.plan.json"


def _gb200_plan(tp: int) -> tuple[dict, int]:
    """The example plan with its GB200 row's engine set to ``tp`` GPUs (rank 5: gb200 TP 1 x 8 replicas)."""
    doc = json.loads(PLAN.read_text())
    row = next(p for p in doc["plans"] if p["pools"][0]["gpu"] == "gb200")
    assert row["pools"][0]["rental"]["gpus_per_instance"] == 4
    doc = copy.deepcopy(doc)
    row = next(p for p in doc["plans"] if p["rank"] == row["rank"])
    row["tp"] = row["pools"][0]["tp"] = tp
    return doc, row["rank"]


def test_an_engine_within_a_tray_deploys_and_one_across_two_trays_is_refused() -> None:
    doc, rank = _gb200_plan(4)
    assert build_spec(doc, rank).pools[0].tp == 4
    doc, rank = _gb200_plan(8)
    with pytest.raises(DeployError, match="one engine of 8 GPUs .* spans 2 4-GPU gb200 instances"):
        build_spec(doc, rank)


def test_the_refusal_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    doc, rank = _gb200_plan(8)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["deploy", str(plan), "--rank", str(rank), "--format", "k8s", "--out", str(out)])
    assert res.exit_code != 0
    assert len(res.output.strip().splitlines()) == 1 and "tensor_parallel up to 4" in res.output
    assert not out.exists()
