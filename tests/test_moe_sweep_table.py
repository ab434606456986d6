"""MoE sweep: an MTP plan says so in the plan table.

`recommend --workload dsv3.yaml` (DeepSeek-R1, H200 + B200) ranked ``h200 TP8 MTP2 x3`` first (the summary line said
so), but the table's deployment cell read ``h200 3xTP8``, and no column of the table (``--wide`` included) showed
the draft tokens: a row with MTP and one without were the same line, and a reader deploying from the table lost
``--speculative-config``. The cell now ends with ``MTPk`` where the pool sets it, as it ends with ``EP``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from recommender import load_plan
from recommender.render.plan import deployment_cell, render_table

PLAN = Path(__file__).parent / "data" / "plans" / "moe-dsv3-h200-dp8.json"


def test_an_mtp_pool_names_its_draft_tokens_in_the_deployment_cell() -> None:
    plan = load_plan(PLAN)
    # the fixture's rank 2 is 3 replicas of plain TP 8 on H200; rank 1 2 engines of TP 1 x DP 8
    tp8 = plan.rows[1].pools[0]
    assert deployment_cell((tp8,)) == "h200 3xTP8"  # no MTP: unchanged
    assert deployment_cell((dataclasses.replace(tp8, num_speculative_tokens=2),)) == "h200 3xTP8 MTP2"
    dp8 = dataclasses.replace(plan.rows[0].pools[0], enable_expert_parallel=True, num_speculative_tokens=1)
    assert deployment_cell((dp8,)) == "h200 2xTP1xDP8 EP MTP1"


def test_the_table_tells_an_mtp_row_from_the_same_shape_without_it() -> None:
    plan = load_plan(PLAN)
    rows = list(plan.rows)
    rows[1] = dataclasses.replace(rows[1], pools=(dataclasses.replace(rows[1].pools[0], num_speculative_tokens=3),))
    body = render_table(dataclasses.replace(plan, rows=tuple(rows)), width=200).split("\n\n")[1].splitlines()
    assert "h200 3xTP8 MTP3 " in body[3]  # rank 2's line (header, rule, rank 1, rank 2)
    assert "MTP" not in body[2]
