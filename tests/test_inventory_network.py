"""Owned nodes with a stated NIC between them: a model no node holds (DeepSeek-R1, 671B of fp8 weights, on 8-GPU H100
nodes) is planned in pipeline stages over them, as on rented instances whose NIC the catalog names; without one the
refusal says how to state it. The NIC is the user's word: kind and Gb/s only, bounded, nothing of it reaches a
manifest but the stages' flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.errors import DoesNotFitError
from recommender.search import SearchSettings, recommend
from recommender.workload import load_workload

R1 = ("model: deepseek-r1\ntraffic: {arrival_rate: 1}\nprompt_tokens: 2000\noutput_tokens: 500\nslo: [tpot=50ms]\n")


def _load(tmp_path: Path, inventory: str) -> object:
    path = tmp_path / "w.yaml"
    path.write_text(R1 + "inventory:\n  " + inventory + "\n", encoding="utf-8")
    return load_workload(path)


def test_the_inventory_network_is_parsed_into_the_owned_offer(tmp_path: Path) -> None:
    w = _load(tmp_path, "h100-sxm: {gpus: 16, network: {kind: infiniband, gbps_per_gpu: 400}}")
    (owned,) = w.inventory  # type: ignore[attr-defined]
    assert owned.network.known and owned.network.rdma
    assert owned.network.bytes_per_s_per_gpu(8) == 400e9 / 8  # 400 Gb/s = 50 GB/s per GPU, one direction
    per_node = _load(tmp_path, "h100-sxm: {gpus: 16, network: {kind: roce, gbps_per_node: 800}}")
    assert per_node.inventory[0].network.bytes_per_s_per_gpu(8) == 800e9 / 8 / 8  # type: ignore[attr-defined]


def test_deepseek_r1_runs_in_two_stages_over_two_owned_nodes(tmp_path: Path) -> None:
    w = _load(tmp_path, "h100-sxm: {gpus: 16, usd_per_gpu_hour: 2.0, network: {kind: infiniband, gbps_per_gpu: 400}}")
    plan = recommend(w, settings=SearchSettings(seed=0, verify=0, top=1))  # type: ignore[arg-type]
    (pool,) = plan.top.pools
    assert (pool.tp, pool.pp, pool.replicas) == (8, 2, 1) and pool.rental is not None
    assert pool.rental.provider == "owned" and pool.rental.instances == 2
    assert pool.stage_nic_bytes_per_s_per_gpu == pytest.approx(50e9)
    assert plan.top.usd_per_hour == pytest.approx(16 * 2.0)  # 16 GPUs in use at the amortised $2/GPU-h


def test_without_a_network_the_refusal_says_how_to_state_one(tmp_path: Path) -> None:
    w = _load(tmp_path, "h100-sxm: {gpus: 16}")
    with pytest.raises(DoesNotFitError) as e:
        recommend(w, settings=SearchSettings(seed=0, verify=0))  # type: ignore[arg-type]
    assert "pipeline stages over your 2 nodes of h100-sxm" in str(e.value)
    assert "--inventory-network infiniband=400" in str(e.value) and "allow larger GPUs" not in str(e.value)
    assert len(str(e.value)) <= 500  # an error line is cut at 500 characters (cli.app.MAX_MESSAGE_CHARS)
    one_node = _load(tmp_path, "h100-sxm: {gpus: 8}")
    with pytest.raises(DoesNotFitError) as e:
        recommend(one_node, settings=SearchSettings(seed=0, verify=0))  # type: ignore[arg-type]
    assert "pipeline stages" not in str(e.value)  # one node: no stages to spread over


@pytest.mark.parametrize(("network", "needle"), [
    ("{kind: carrier-pigeon, gbps_per_gpu: 400}", "kind"),
    ("{kind: infiniband, gbps_per_gpu: 1e9}", "gbps_per_gpu"),
    ("{kind: infiniband, gbps_per_gpu: 400, gbps_per_node: 3200}", "exactly one"),
    ("{kind: infiniband}", "exactly one"),
    ("{kind: infiniband, gbps_per_gpu: 400, k8s: {resource: 'evil/$(rm -rf)'}}", "k8s"),
])
def test_a_bad_inventory_network_is_one_line(tmp_path: Path, network: str, needle: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(R1 + f"inventory:\n  h100-sxm: {{gpus: 16, network: {network}}}\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["--workload", str(path)])
    assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1


QUICK = ["--model", "deepseek-r1", "--rate", "1", "--prompt-tokens", "2000", "--output-tokens", "500", "--slo", "tpot=50ms"]


def test_the_inventory_network_flag_plans_the_stages() -> None:
    res = CliRunner().invoke(app, [*QUICK, "--inventory", "h100-sxm=16@$2/h", "--inventory-network", "infiniband=400Gb/s",
                                   "-f", "json", "--verify", "0"])
    assert res.exit_code == 0, res.output
    (pool,) = __import__("json").loads(res.output)["plans"][0]["pools"]
    assert (pool["tp"], pool["pp"], pool["stage_nic_bytes_per_s_per_gpu"]) == (8, 2, 400e9 / 8)


@pytest.mark.parametrize(("flags", "needle"), [
    (["--inventory", "h100-sxm=16", "--inventory-network", "ib=400"], "KIND=GBPS"),
    (["--inventory", "h100-sxm=16", "--inventory-network", "infiniband=0"], "above 0"),
    (["--inventory", "h100-sxm=16", "--inventory-network", "infiniband=1e9"], "at most 100000"),
    (["--inventory-network", "infiniband=400"], "give them with --inventory"),
])
def test_a_bad_inventory_network_flag_is_one_line(flags: list[str], needle: str) -> None:
    res = CliRunner().invoke(app, [*QUICK, *flags])
    assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("k8s_resource", 'evil"\n  x: $(rm -rf /)', "not a Kubernetes extended resource name"),
    ("kind", "carrier-pigeon", "network.kind"),
    ("gbps_per_gpu", 1e12, "network.gbps_per_gpu"),
])
def test_a_plan_files_owned_network_is_checked(tmp_path: Path, field: str, value: object, needle: str) -> None:
    """The re-planner rents the plan's owned nodes again, and their NIC's device resource becomes a key of the
    pods' resource limits: a hand-edited plan file is refused before any of it is used."""
    import json

    from recommender.errors import ConfigError
    from recommender.plan import dump_plan, load_plan

    w = _load(tmp_path, "h100-sxm: {gpus: 16, network: {kind: infiniband, gbps_per_gpu: 400}}")
    doc = json.loads(dump_plan(recommend(w, settings=SearchSettings(seed=0, verify=0, top=1))))  # type: ignore[arg-type]
    doc["workload"]["inventory"][0]["network"][field] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=needle) as e:
        load_plan(path)
    assert "\n" not in str(e.value)
