"""Issue 27 item 7: plans on GPUs the user owns (``--inventory``), and the shortfall when they are not enough.

Owned nodes are billed per GPU in use at the amortised price the user gives (``recommender.offers``
docstring): 5 TP2 groups on 8-GPU nodes use ceil(5 / (8 // 2)) = 2 nodes and cost 2 x 5 x $2.10 = $21/h.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.errors import CatalogError, InfeasibleError, RecommenderError
from recommender.offers import OwnedGpus, owned_offer, parse_inventory, rent
from recommender.search import SearchSettings, recommend
from recommender.workload import Slo, load_workload, workload_from_flags


def test_parse_inventory_and_the_owned_offer_arithmetic() -> None:
    assert parse_inventory("h100-sxm=16, a100-80gb=8@$1.20/h") == (
        OwnedGpus(gpu="h100-sxm", count=16), OwnedGpus(gpu="a100-80gb", count=8, usd_per_gpu_hour=1.2))
    offer = owned_offer(OwnedGpus(gpu="h100-sxm", count=16, usd_per_gpu_hour=2.1), 8)
    assert offer.owned_nodes == 2 and offer.usd_per_gpu_hour == pytest.approx(2.1)
    r = rent(offer, 2, 5)
    assert r is not None and r.instances == 2 and r.replicas == 5  # nothing rounded up: only the GPUs in use
    assert r.gpus_billed == 10 and r.usd_per_hour == pytest.approx(21.0)
    assert rent(offer, 2, 9) is None  # ceil(9 / 4) = 3 nodes > the 2 owned
    assert rent(offer, 16, 1) is None  # a TP group never straddles two nodes
    no_price = owned_offer(OwnedGpus(gpu="h100-sxm", count=8), 8)
    assert rent(no_price, 1, 3).usd_per_hour == pytest.approx(3.0)  # type: ignore[union-attr]  # counts GPU-hours
    with pytest.raises(CatalogError, match="gpus_per_node"):
        owned_offer(OwnedGpus(gpu="h100-sxm", count=12), 8)
    for bad in ("h100-sxm", "h100-sxm=0", "h100-sxm=x", "=4", "h100-sxm=4@$0/h"):
        with pytest.raises(RecommenderError):
            parse_inventory(bad)


def _workload(model: str, rate: float, owned: str) -> object:
    w = workload_from_flags(None, model=model, rate_per_s=rate, prompt_tokens=2000, output_tokens=300)
    return dataclasses.replace(w.with_slos([Slo.parse("tpot=30ms")]), inventory=parse_inventory(owned))


def test_a_workload_planned_onto_16_owned_h100s() -> None:
    w = _workload("llama-3.1-8b", 20.0, "h100-sxm=16@$2.10/h")
    plan = recommend(w, settings=SearchSettings(trials=150, verify=0))  # type: ignore[arg-type]
    assert plan.rows
    for r in plan.rows:
        assert all(p.gpu == "h100-sxm" and p.rental is not None and p.rental.provider == "owned" for p in r.pools)
        assert r.gpus_total <= 16
        # amortised: $2.10 per GPU in use, whatever the node holds
        assert r.usd_per_hour == pytest.approx(2.1 * r.gpus_total, rel=1e-6)
    assert "owned GPUs only" in plan.search.pricing


def test_not_enough_owned_gpus_reports_how_many_more() -> None:
    w = _workload("llama-3.1-70b", 40.0, "h100-sxm=16")
    settings = SearchSettings(trials=150, verify=0)
    with pytest.raises(InfeasibleError) as err:
        recommend(w, settings=settings)  # type: ignore[arg-type]
    msg = str(err.value)
    assert msg.startswith("the inventory (16 x h100-sxm) cannot carry 40 req/s within tpot=30.00ms@p90")
    # independently: the same search without the count; its rank 1 is what the message sizes the shortfall on
    unlimited = recommend(w, settings=dataclasses.replace(settings, unlimited_inventory=True, top=1))  # type: ignore[arg-type]
    need = unlimited.rows[0].gpus_total
    assert need > 16 and f"needs {need} GPUs" in msg and f"{need - 16} more h100-sxm" in msg
    whole = -(-need // 8) * 8
    assert f"--inventory h100-sxm={whole}" in msg


def test_cli_inventory_flag_and_yaml_form(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["-m", "llama-3.1-8b", "--rate", "5", "--prompt-tokens", "1k", "--output-tokens", "200",
                                   "--inventory", "h100=8", "--trials", "60", "--verify", "0", "-q"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert re.search(r"1 owned 8-GPU node", res.stdout) and "a100" not in res.stdout
    bad = CliRunner().invoke(app, ["-m", "llama-3.1-8b", "--rate", "5", "--prompt-tokens", "1k", "--output-tokens", "200",
                                   "--inventory", "h100-sxm=12", "-q"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "gpus_per_node" in bad.stderr
    f = tmp_path / "w.yaml"
    f.write_text("model: llama-3.1-8b\ntraffic: {arrival_rate: 5}\nprompt_tokens: 1000\noutput_tokens: 200\n"
                 "inventory:\n  h100: 16\n  a100-80gb: {gpus: 12, usd_per_gpu_hour: $1.20/h, gpus_per_node: 4}\n")
    w = load_workload(f)
    assert w.inventory == (OwnedGpus(gpu="h100-sxm", count=16),
                           OwnedGpus(gpu="a100-80gb", count=12, usd_per_gpu_hour=1.2, gpus_per_node=4))


def test_inventory_and_provider_are_one_or_the_other() -> None:
    res = CliRunner().invoke(app, ["-m", "llama-3.1-8b", "--rate", "1", "--prompt-tokens", "1k", "--output-tokens",
                                   "100", "--inventory", "h100=8", "--provider", "aws"])
    assert res.exit_code == 2 and "--provider aws prices rented GPUs and --inventory" in res.stderr


def test_the_plan_file_keeps_the_inventory_so_replanning_stays_on_owned_gpus() -> None:
    from recommender.plan import dump_plan, load_plan
    from recommender.replan.observe import base_workload_from_plan

    w = _workload("llama-3.1-8b", 10.0, "h100-sxm=8@$2.10/h")
    plan = load_plan(json.loads(dump_plan(recommend(w, settings=SearchSettings(trials=40, verify=0)))))  # type: ignore[arg-type]
    assert plan.workload.inventory == (OwnedGpus(gpu="h100-sxm", count=8, usd_per_gpu_hour=2.1),)
    again = recommend(base_workload_from_plan(plan), settings=SearchSettings(trials=40, verify=0))
    assert all(p.rental is not None and p.rental.provider == "owned" for r in again.rows for p in r.pools)
