"""The Pareto chart's cost axis is labelled in dollars (round-3 issue #27: log ticks read '1, 9 8 7 ... 2').

Expected tick sets are worked by hand from the 1-2-5 rule in :func:`recommender.render.figure.dollar_ticks`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from recommender.plan import load_plan
from recommender.render.figure import RANK1_TRACE, PLANS_TRACE, dollar_ticks, fmt_usd_tick, pareto_figure

EXAMPLE_PLANS = sorted((Path(__file__).resolve().parents[1] / "examples" / "plans").glob("*.plan.json"))


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (0.12, 1.2, [0.2, 0.5, 1.0]),
    (0.012, 1.5, [0.02, 0.05, 0.1, 0.2, 0.5, 1.0]),
    (3.0, 250.0, [5.0, 10.0, 20.0, 50.0, 100.0, 200.0]),
    (0.3, 0.9, [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]),   # under three 1-2-5 values: every digit
])
def test_ticks_follow_the_1_2_5_rule(lo: float, hi: float, expected: list[float]) -> None:
    assert dollar_ticks(lo, hi) == pytest.approx(expected)


@pytest.mark.parametrize(("usd", "text"), [(0.02, "$0.02"), (0.5, "$0.5"), (0.1, "$0.1"), (1.0, "$1"),
                                          (20.0, "$20"), (1000.0, "$1,000"), (0.0005, "$0.0005")])
def test_tick_text(usd: float, text: str) -> None:
    assert fmt_usd_tick(usd) == text


def test_bad_ranges_give_no_ticks() -> None:
    assert dollar_ticks(0.0, 1.0) == [] and dollar_ticks(2.0, 1.0) == [] and dollar_ticks(1.0, math.inf) == []


@pytest.mark.parametrize("path", EXAMPLE_PLANS, ids=lambda p: p.name)
def test_every_example_chart_has_dollar_ticks_spanning_its_plans(path: Path) -> None:
    plan = load_plan(path)
    fig = pareto_figure(plan)
    axis = fig.layout.yaxis
    texts = list(axis.ticktext)
    assert texts and all(t.startswith("$") for t in texts)
    assert len(set(texts)) == len(texts), texts              # no two ticks read alike ('2' and '2')
    lo, hi = (10 ** v for v in axis.range)
    costs = [r.usd_per_million_tokens for r in plan.rows if r.usd_per_million_tokens]
    assert lo <= min(costs) and max(costs) <= hi
    assert len(texts) >= 3
    # rank 1 is a star in its own legend entry; every ranked plan is a circle in 'ranked plans'
    names = [t.name for t in fig.data]
    assert RANK1_TRACE in names and PLANS_TRACE in names
    assert all(t.marker.symbol == "circle" for t in fig.data if t.name == PLANS_TRACE)


def test_the_chart_title_shows_the_workloads_name_as_text() -> None:
    """Plotly renders <a href>, <i> and <span style> in a title: a workload named with markup drew a live link and an
    80px red word in the report's chart. The name goes in as HTML entities, which Plotly shows as the literal text."""
    import dataclasses

    plan = load_plan(EXAMPLE_PLANS[0])
    name = "<a href='https://evil.example/x'>click</a> <i>it</i> & more"
    plan = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, name=name))
    title = pareto_figure(plan).layout.title.text
    assert "<a" not in title and "<i>" not in title
    assert title.startswith(f"{plan.workload.model} / &lt;a href=&#x27;https://evil.example/x&#x27;&gt;click&lt;/a&gt; "
                            "&lt;i&gt;it&lt;/i&gt; &amp; more: ")
