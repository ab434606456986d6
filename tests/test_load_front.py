"""One front for the analytic model and the simulator: the topology and traffic types both take, their
validation, and the old positional form kept for recommender/replan only."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from recommender.errors import ConfigError
from recommender.load import Disaggregated, PoolSpec, Replay, Traffic, analyze, analyze_disaggregated, simulate
from recommender.load.link import KvLink
from recommender.load.toy import LinearStepCost, LogNormalLength, ToyLimits

ROOT = Path(__file__).resolve().parents[1]
COST = LinearStepCost(s_per_token=5e-6)
PROMPT, OUTPUT = LogNormalLength(1000, 0.8, 16, 8000), LogNormalLength(200, 0.7, 4, 1500)
FRONT = {"analyze", "analyze_disaggregated", "simulate", "simulate_disaggregated"}


def _positional_calls(path: Path) -> list[str]:
    """Calls of the four front functions with more than two positional arguments (the old form)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in FRONT and (len(node.args) > 2 or any(isinstance(a, ast.Starred) for a in node.args)):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return out


def test_only_replan_still_calls_the_positional_form() -> None:
    # recommender/load/positional.py goes when recommender/replan/predict.py moves to PoolSpec / Traffic.
    files = [p for d in ("recommender", "benchmarks", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    calls = [c for p in files if p.name != "test_load_front.py" for c in _positional_calls(p)]
    assert all(c.startswith("recommender/replan/") for c in calls), calls


def test_positional_form_equals_the_typed_form() -> None:
    limits = ToyLimits(enable_prefix_caching=True)
    typed = analyze(PoolSpec(cost=COST, limits=limits, replicas=2),
                    Traffic(rate_per_s=6.0, prompt=PROMPT, output=OUTPUT, shared_prefix_fraction=0.3))
    old = analyze(COST, limits, 6.0, PROMPT, OUTPUT, replicas=2, shared_prefix_fraction=0.3)
    assert old == typed and old.ttft_s.to_dict() == typed.ttft_s.to_dict()
    link = KvLink(bytes_per_token=1e5, nic_bytes_per_s=4e9)
    topology = Disaggregated(prefill=PoolSpec(cost=COST, limits=limits), decode=PoolSpec(cost=COST, limits=limits, replicas=2),
                             kv_transfer_s_per_token=1e-5, kv_link=link)
    typed = analyze_disaggregated(topology, Traffic(rate_per_s=3.0, prompt=PROMPT, output=OUTPUT, shared_prefix_fraction=0.3))
    old = analyze_disaggregated(COST, limits, 1, COST, limits, 2, 1e-5, 3.0, PROMPT, OUTPUT, 0.3, kv_link=link)
    assert old == typed and old.e2e_s.to_dict() == typed.e2e_s.to_dict()


def test_typed_form_takes_exactly_two_arguments() -> None:
    pool, traffic = PoolSpec(cost=COST, limits=ToyLimits()), Traffic(rate_per_s=1.0, prompt=PROMPT, output=OUTPUT)
    with pytest.raises(TypeError):
        analyze(pool, traffic, 2)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        simulate(pool, traffic, 100)  # type: ignore[misc]


@pytest.mark.parametrize("make", [
    lambda: PoolSpec(cost=COST, limits=ToyLimits(), replicas=0),
    lambda: Traffic(rate_per_s=0.0, prompt=PROMPT, output=OUTPUT),
    lambda: Traffic(rate_per_s=math.nan, prompt=PROMPT, output=OUTPUT),
    lambda: Traffic(rate_per_s=math.inf, prompt=PROMPT, output=OUTPUT),
    lambda: Traffic(rate_per_s=1.0, prompt=PROMPT, output=OUTPUT, shared_prefix_fraction=1.5),
    lambda: Replay(rows=[(0.0, 10, 10)], shared_prefix_fraction=-0.1),
    lambda: Disaggregated(prefill=PoolSpec(cost=COST, limits=ToyLimits()), decode=PoolSpec(cost=COST, limits=ToyLimits()),
                          kv_transfer_s_per_token=-1.0),
], ids=["replicas", "rate-0", "rate-nan", "rate-inf", "fraction", "replay-fraction", "transfer"])
def test_both_fronts_refuse_the_same_inputs_at_construction(make) -> None:
    with pytest.raises(ConfigError):
        make()


def test_replay_rows_are_frozen() -> None:
    rows = [(0.0, 100, 11)]
    replay = Replay(rows=rows)
    rows.append((1.0, 100, 11))
    assert replay.rows == ((0.0, 100, 11),)
    assert simulate(PoolSpec(cost=COST, limits=ToyLimits()), replay).completed == 1
