"""One front for the analytic model and the simulator: the topology and traffic types both take, their
validation; the old positional form is gone."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from recommender.errors import ConfigError
from recommender.load import (
    Disaggregated,
    PoolKind,
    PoolSpec,
    Replay,
    StepCost,
    Traffic,
    analyze,
    analyze_disaggregated,
    simulate,
)
from recommender.load.topology import prompt_tokens_in_kv
from recommender.load.toy import FixedLength, LinearStepCost, LogNormalLength, ToyLimits

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


def test_no_caller_uses_the_old_positional_form() -> None:
    # the last one, recommender/replan/predict.py, moved to PoolSpec / Traffic (and the search's KV link)
    files = [p for d in ("recommender", "benchmarks", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    calls = [c for p in files if p.name != "test_load_front.py" for c in _positional_calls(p)]
    assert calls == []


def test_the_old_positional_form_is_refused() -> None:
    with pytest.raises(TypeError):
        analyze(COST, ToyLimits(), 6.0, PROMPT, OUTPUT)  # type: ignore[arg-type, call-arg]
    with pytest.raises(TypeError):
        analyze_disaggregated(COST, ToyLimits(), 1, COST, ToyLimits(), 2, 1e-5, 3.0, PROMPT, OUTPUT)  # type: ignore[arg-type, call-arg]


def test_typed_form_takes_exactly_two_arguments() -> None:
    pool, traffic = PoolSpec(cost=COST, limits=ToyLimits()), Traffic(rate_per_s=1.0, prompt=PROMPT, output=OUTPUT)
    with pytest.raises(TypeError):
        analyze(pool, traffic, 2)  # type: ignore[call-arg]
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


def test_one_rule_for_tokens_already_in_kv() -> None:
    prompts = np.array([1.0, 16.0, 17.0, 100.0, 1000.0, 1001.0])
    hits = prompt_tokens_in_kv(prompts, kind=PoolKind.AGGREGATED, shared_prefix_fraction=0.3, block_tokens=16,
                               prefix_caching=True)
    # whole 16-token blocks of floor(0.3 P), never the whole prompt
    assert hits.tolist() == [0.0, 0.0, 0.0, 16.0, 288.0, 288.0]
    off = prompt_tokens_in_kv(prompts, kind=PoolKind.PREFILL, shared_prefix_fraction=0.3, block_tokens=16,
                              prefix_caching=False)
    assert not off.any()
    remote = prompt_tokens_in_kv(prompts, kind=PoolKind.DECODE, shared_prefix_fraction=0.3, block_tokens=16,
                                 prefix_caching=True)
    assert remote.tolist() == (prompts - 1.0).tolist()


@pytest.mark.parametrize("overhead_s", [0.0, 0.05])
def test_both_fronts_apply_the_same_hit_and_request_overhead(overhead_s: float) -> None:
    # One 1000-token request with a 30% shared prefix, alone: 288 cached tokens, 712 computed, then the
    # fixed per-request overhead: the analytic model at a vanishing rate and the simulator agree.
    cost = LinearStepCost(attention_flops_per_token_pair=0.0, kv_bytes_per_token=1e6, request_overhead_s=overhead_s)
    assert isinstance(cost, StepCost)
    pool = PoolSpec(cost=cost, limits=ToyLimits(enable_prefix_caching=True))
    hand = 5e-3 + 712 * 20e-6 + 288 * 1e6 / 2e12 + overhead_s
    a = analyze(pool, Traffic(rate_per_s=1e-4, prompt=FixedLength(1000), output=FixedLength(1), shared_prefix_fraction=0.3))
    s = simulate(pool, Replay(rows=[(0.0, 1000, 1)], shared_prefix_fraction=0.3))
    assert s.ttft_s.p50 == pytest.approx(hand, rel=1e-12)
    assert a.ttft_s.p50 == pytest.approx(hand, rel=1e-6)


def test_request_overhead_is_part_of_the_step_cost_protocol() -> None:
    @dataclass(frozen=True)
    class NoOverhead:
        kv_capacity_tokens: int = 1000
        kv_block_tokens: int = 16

        def step_s(self, new_tokens: int, kv_read_bytes: float, attention_flops: float) -> float:
            return 1e-3

        def decode_seq_cost(self, context_tokens: int) -> tuple[float, float]:
            return 0.0, 0.0

        def prefill_chunk_cost(self, chunk_tokens: int, prefix_tokens: int) -> tuple[float, float]:
            return 0.0, 0.0

    assert not isinstance(NoOverhead(), StepCost)
