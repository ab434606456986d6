"""The report's per-pool walkthrough is ``recommend estimate`` of the engine the plan deploys: its pipeline stages,
DP attention, EP and MTP included (it explained a plain-TP engine of the same GPUs, which for DeepSeek-R1 on H100
does not fit), and the command it prints runs and gives the same numbers."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.estimator import estimate_request
from recommender.plan import Pool, PoolRole
from recommender.render.pool_estimate import estimate_command, pool_request
from recommender.search import SearchSettings, recommend
from recommender.workload import LengthDist, Slo, Workload


@pytest.fixture(scope="module")
def r1_h100():  # type: ignore[no-untyped-def]
    w = Workload(model="deepseek-r1", prompt_tokens=LengthDist.constant(2000), output_tokens=LengthDist.constant(500),
                 arrival_rate_per_s=1.0, gpus=("h100-sxm",), slos=(Slo("tpot", 0.05, "p90"),), name="r1")
    return recommend(w, settings=SearchSettings(seed=0, verify=0, top=1))


def test_a_pipeline_pool_is_estimated_as_its_stages(r1_h100) -> None:  # type: ignore[no-untyped-def]
    plan = r1_h100
    (pool,) = plan.top.pools
    req = pool_request(plan, plan.top, pool, prompt_tokens=2000, output_tokens=500)
    assert (req.model, req.pp, req.tp) == ("deepseek-ai/DeepSeek-R1", 2, 8)
    dep, _, est = estimate_request(req)
    assert est.fits and dep.pp == 2 and dep.stage_nic_bytes_per_s_per_gpu == pytest.approx(50e9)
    # the walkthrough's KV capacity is the plan's: the same stage memory
    assert est.kv_capacity_tokens == pool.kv_capacity_tokens


def test_the_printed_command_runs_and_agrees(r1_h100) -> None:  # type: ignore[no-untyped-def]
    plan = r1_h100
    (pool,) = plan.top.pools
    req = pool_request(plan, plan.top, pool, prompt_tokens=2000, output_tokens=500, usd_per_gpu_hour=6.155)
    argv = shlex.split(estimate_command(req))
    assert argv[:2] == ["recommend", "estimate"] and "--pipeline-parallel-size" in argv and "--no-chunked-prefill" in argv
    res = CliRunner().invoke(app, [*argv[1:], "-f", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    _, _, est = estimate_request(req)
    assert got["tpot_s"] == pytest.approx(est.tpot_s, rel=1e-9) and got["ttft_s"] == pytest.approx(est.ttft_s, rel=1e-9)
    assert got["usd_per_hour"] == pytest.approx(6.155 * 16)


def test_dp_ep_and_mtp_reach_the_command() -> None:
    from recommender.plan import Plan, PlanRow, WorkloadEcho

    pool = Pool(role=PoolRole.BOTH, gpu="b200", tp=2, replicas=1, weight_dtype="fp8", kv_dtype="fp8", max_num_seqs=256,
                max_num_batched_tokens=1024, data_parallel_size=4, enable_expert_parallel=True,
                num_speculative_tokens=2)
    row = PlanRow(rank=1, id="x", pools=(pool,), max_model_len=2000)
    plan = Plan(workload=WorkloadEcho(model="deepseek-v3", hf_repo="deepseek-ai/DeepSeek-R1"), rows=(row,))
    argv = shlex.split(estimate_command(pool_request(plan, row, pool, prompt_tokens=1000, output_tokens=1000)))
    for flag, value in (("--data-parallel-size", "4"), ("--speculative-config", '{"method":"mtp","num_speculative_tokens":2}'),
                        ("--model", "deepseek-ai/DeepSeek-R1")):
        assert argv[argv.index(flag) + 1] == value
    assert "--enable-expert-parallel" in argv and "--pipeline-parallel-size" not in argv
    plain = dataclasses.replace(pool, data_parallel_size=1, enable_expert_parallel=False, num_speculative_tokens=0)
    argv = shlex.split(estimate_command(pool_request(plan, row, plain, prompt_tokens=1000, output_tokens=1000)))
    assert not {"--data-parallel-size", "--enable-expert-parallel", "--speculative-config"} & set(argv)


def test_estimate_plan_explains_a_row_as_deployed(r1_h100, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`recommend estimate --plan`: the row's engine at the workload's (constant) lengths and rate gives the plan's
    own latencies, and the first line names the flags that reproduce it."""
    from recommender.plan import dump_plan

    path = tmp_path / "plan.json"
    path.write_text(dump_plan(r1_h100))
    res = CliRunner().invoke(app, ["estimate", "--plan", str(path), "-f", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    lat = r1_h100.top.latency_percentiles
    assert got["pipeline_parallel_size"] == 2 and got["rate_per_s"] == 1.0
    assert got["tpot_p90_s"] == pytest.approx(lat["tpot"]["p90"], rel=1e-6)
    assert got["ttft_p90_s"] == pytest.approx(lat["ttft"]["p90"], rel=1e-6)
    text = CliRunner().invoke(app, ["estimate", "--plan", str(path)]).output
    first = text.splitlines()[0]
    assert first.startswith(f"{path} rank 1 (") and "--pipeline-parallel-size 2" in first and first.endswith("--rate 1")


@pytest.mark.parametrize(("args", "needle"), [
    (["--model", "llama-3.1-8b"], "--plan takes the model and the GPUs from the plan"),
    (["--rank", "7"], "--rank 7"),
])
def test_estimate_plan_refusals_are_one_line(r1_h100, tmp_path, args: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    from recommender.plan import dump_plan

    path = tmp_path / "plan.json"
    path.write_text(dump_plan(r1_h100))
    res = CliRunner().invoke(app, ["estimate", "--plan", str(path), *args])
    assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1


def test_estimate_plan_points_a_pd_row_to_the_report() -> None:
    from pathlib import Path

    pd = Path(__file__).parent / "data" / "plans" / "disagg-llama70b-h200.json"
    res = CliRunner().invoke(app, ["estimate", "--plan", str(pd)])
    assert res.exit_code == 2 and "prefill/decode plan" in res.output and "--report" in res.output


def test_estimate_plan_serves_the_workloads_shared_prefix_as_the_plan_did(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A workload whose prompts share half their tokens: the search priced the prefix cache, and `estimate --plan`
    gives the plan's own p90s (it ignored the prefix: TTFT 1.50 s and TPOT 70.4 ms against the plan's 0.327 s and
    16.9 ms, over the plan's own 30 ms SLO). The reproducing command carries --shared-prefix-fraction."""
    from recommender.plan import dump_plan

    w = Workload(model="llama-3.1-70b", prompt_tokens=LengthDist.constant(6000), output_tokens=LengthDist.constant(200),
                 arrival_rate_per_s=4.0, gpus=("h100-sxm",), slos=(Slo("tpot", 0.03, "p90"),), name="pf",
                 shared_prefix_fraction=0.5)
    plan = recommend(w, settings=SearchSettings(seed=0, verify=0, top=1, trials=200))
    assert plan.top.pools[0].enable_prefix_caching
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    res = CliRunner().invoke(app, ["estimate", "--plan", str(path), "-f", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    lat = plan.top.latency_percentiles
    assert got["ttft_p90_s"] == pytest.approx(lat["ttft"]["p90"], rel=1e-6)
    assert got["tpot_p90_s"] == pytest.approx(lat["tpot"]["p90"], rel=1e-6)
    first = CliRunner().invoke(app, ["estimate", "--plan", str(path)]).output.splitlines()[0]
    assert "--shared-prefix-fraction 0.5" in first
    bad = CliRunner().invoke(app, ["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--shared-prefix-fraction", "1"])
    assert bad.exit_code == 2 and "--shared-prefix-fraction 1.0: must be in [0, 1)" in bad.output
