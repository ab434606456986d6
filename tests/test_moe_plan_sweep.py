"""A user's sweep of the main job's outputs for mixture-of-experts plans (DeepSeek-V3 on H200 / B200, moe-chat):

* under ``--confidence`` the verifier's extra rows continued the search's own ranking past as many rows as the
  confident ranking kept, so a plan both rankings hold (DeepSeek-V3's b200 TP4 x DP2 MTP2) was listed twice, rank 1
  and rank 3, with the same id and simulation;
* the footer said "rank 1 proven cheapest in the space" under ``--confidence``, where rank 1 is a dearer plan ranked
  for its P(all SLOs met) (the proof is of the point prediction's cheapest plan, which ranks below it);
* the verification line truncated the warm-up share: ``int(n x 0.2)`` of 4,029 requests is 805, 19.98%, "19%";
* the HTML report's footer dropped the search's own account ("rank 1 NOT proven cheapest: raise --trials") and its
  band section left out TTFT's own log-sd, which ``recommend estimate`` states beside the step-time one.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from recommender.plan import load_plan
from recommender.render.plan import render_table, search_footer, verified_line
from recommender.search import SearchSettings, recommend
from recommender.workload import load_workload

ROOT = Path(__file__).resolve().parent.parent
MOE_CHAT = ROOT / "examples" / "plans" / "moe-chat.plan.json"


@pytest.fixture(scope="module")
def dsv3_confident():  # type: ignore[no-untyped-def]
    w = dataclasses.replace(load_workload(ROOT / "benchmarks" / "workloads" / "large-dsv3.yaml"), gpus=("h200", "b200"))
    return recommend(w, settings=SearchSettings(seed=0, confidence=0.9))


def test_a_confident_ranking_lists_each_plan_once(dsv3_confident) -> None:  # type: ignore[no-untyped-def]
    plan = dsv3_confident
    ids = [r.id for r in plan.rows]
    assert len(ids) == len(set(ids)), ids
    assert plan.search.confidence == 0.9 and plan.search.confidence_met
    assert all(r.bands and r.bands["p_slo"] >= 0.9 for r in plan.rows)
    # the verification line names each verified plan once
    line = verified_line(plan)
    assert line.count("rank 3") <= 1 and len(plan.rows) >= 1


def test_a_confident_footer_does_not_call_rank_1_the_proven_cheapest(dsv3_confident) -> None:  # type: ignore[no-untyped-def]
    plan = dsv3_confident
    assert plan.search.rank1_proven
    foot = search_footer(plan.search)
    assert "rank 1 proven cheapest" not in foot
    assert "rank 1 is the cheapest evaluated plan with P(all SLOs met) >= 0.9" in foot
    assert "proven cheapest" not in render_table(plan, width=None)
    # without --confidence the footer is as before
    plain = dataclasses.replace(plan.search, confidence=None, confidence_met=None)
    assert "; rank 1 proven cheapest in the space;" in search_footer(plain)


def test_a_footer_under_an_unmet_confidence_says_so() -> None:
    plan = load_plan(MOE_CHAT)
    m = dataclasses.replace(plan.search, confidence=0.99, confidence_met=False, rank1_proven=False)
    foot = search_footer(m)
    assert "no evaluated plan reaches P(all SLOs met) >= 0.99" in foot and "NOT proven: raise --trials" in foot
    assert "rank 1 proven" not in foot


def test_the_warm_up_share_is_rounded_not_truncated() -> None:
    plan = load_plan(MOE_CHAT)
    r = plan.rows[0]
    sim = {**(r.simulated or {}), "requests": 4029, "warmup_requests": 805}  # int(4,029 x 0.2): 19.98%
    one = dataclasses.replace(plan, rows=(dataclasses.replace(r, simulated=sim),))
    assert "first 20% discarded as warm-up" in verified_line(one)


def test_the_report_footer_carries_the_searchs_account_and_ttft_sigma() -> None:
    pytest.importorskip("plotly")
    from recommender.render.report import render_report

    plan = load_plan(MOE_CHAT)
    r = plan.rows[0]
    bands = {**(r.bands or {}), "sigma": 0.3654, "sigma_ttft": 0.4131}
    plan = dataclasses.replace(plan, rows=(dataclasses.replace(r, bands=bands), *plan.rows[1:]),
                               search=dataclasses.replace(plan.search, rank1_proven=False, stopped_by="trials",
                                                          trials_run=10, trials_asked=10))
    page = render_report(plan)
    assert "rank 1 NOT proven cheapest: raise --trials" in page
    assert search_footer(plan.search) in page
    assert re.search(r"log-sd 0\.3654, TTFT 0\.4131\)", page)
