"""A plan made with the user's own prices (``--price GPU=$X/h``, ``prices:``) carries them, so the re-planner can
search again: MI355X has no dated offer in the catalog, and re-planning such a plan failed on every run with
"no offer for mi355x: price it with --price" (found by a randomized sweep of `recommend replan`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.errors import ConfigError
from recommender.plan import dump_plan, load_plan
from recommender.search import SearchSettings, recommend
from recommender.workload import LengthDist, Slo, Workload

W = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.constant(1000), output_tokens=LengthDist.constant(200),
             arrival_rate_per_s=2.0, gpus=("mi355x",), slos=(Slo("tpot", 0.05, "p90"),), name="priced",
             usd_per_gpu_hour_overrides={"mi355x": 3.5})


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("priced") / "plan.json"
    path.write_text(dump_plan(recommend(W, settings=SearchSettings(seed=0, verify=0, top=1))))
    return path


def _log(path: Path, rate: float) -> Path:
    rng, t = random.Random(0), 0.0
    with path.open("w") as f:
        while t < 600:
            t += rng.expovariate(rate)
            f.write(json.dumps({"created": 1_760_000_000 + t, "usage": {"prompt_tokens": 1000, "completion_tokens": 200}}) + "\n")
    return path


def test_the_plan_carries_the_users_prices(plan_file: Path) -> None:
    doc = json.loads(plan_file.read_text())
    assert doc["workload"]["prices"] == [{"gpu": "mi355x", "usd_per_gpu_hour": 3.5}]
    assert load_plan(plan_file).top.pools[0].usd_per_gpu_hour == pytest.approx(3.5)


def test_replanning_a_priced_plan_searches_at_those_prices(plan_file: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["replan", "--current", str(plan_file), "--traffic", str(_log(tmp_path / "x15.jsonl", 30.0)),
                                   "--storage", str(tmp_path / "h.db"), "-f", "json"])
    assert res.exit_code == 10, res.output  # 15 times the traffic: changed, on MI355X at $3.50/GPU-h
    out = json.loads(res.output)
    (pool,) = out["proposed"]["plans"][0]["pools"]
    assert pool["gpu"] == "mi355x" and pool["usd_per_gpu_hour"] == pytest.approx(3.5)


def test_a_plan_without_prices_writes_no_prices_key() -> None:
    doc = json.loads((Path(__file__).parents[1] / "examples" / "plans" / "chat.plan.json").read_text())
    assert "prices" not in doc["workload"]


@pytest.mark.parametrize("price", [-1.0, 0.0, 1e9])
def test_a_hand_edited_price_out_of_range_is_refused(plan_file: Path, tmp_path: Path, price: float) -> None:
    doc = json.loads(plan_file.read_text())
    doc["workload"]["prices"][0]["usd_per_gpu_hour"] = price
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="workload.prices mi355x") as e:
        load_plan(bad)
    assert "\n" not in str(e.value)
