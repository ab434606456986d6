"""`recommend estimate --pipeline-parallel-size`: one configuration of the kind the search plans for a model no
instance holds (DeepSeek-R1 / V3 on H100: TP 8 x PP 2), explained with the physics the search prices it with
(recommender.perf.pipeline), and the hint to use it when a model does not fit one instance."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.estimator import EstimateRequest, estimate_request
from recommender.perf.pipeline import PP_HOP_LATENCY_S
from recommender.perf.step import StepCostModel
from recommender.profiles import engine_profile
from recommender.search.planner import build_context
from recommender.search.policy import SearchPolicy
from recommender.workload import LengthDist, Slo, Workload

R1 = ["--model", "deepseek-r1", "--gpu", "h100-sxm", "--tp", "8", "--prompt-tokens", "2000", "--output-tokens", "500"]


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["estimate", *args])
    return res.exit_code, res.output


def test_deepseek_r1_in_two_stages_by_hand() -> None:
    code, out = _run(*R1, "-pp", "2", "--concurrency", "8", "--kv-dtype", "fp8", "-f", "json")
    assert code == 0, out
    d = json.loads(out)
    assert d["pipeline_parallel_size"] == 2 and d["fits"]
    assert d["vllm_serve_flags"] == ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
    # the fullest stage holds ceil(61 / 2) = 31 layers: MLA KV per token 31 x (512 + 64) x 1 B (fp8) x 8 copies
    # (catalogs/models/deepseek-v3.yaml: kv_lora_rank 512, qk_rope_head_dim 64; one latent copy per TP rank)
    assert d["kv_cache_bytes_per_token"] == 31 * 576 * 1 * 8
    # two 8-GPU CoreWeave HGX H100 instances at $49.24/h each (catalogs/gpus/h100-sxm.yaml, [P4]): the cheapest
    # offer naming the NIC between instances (RunPod's is cheaper per GPU-hour and names none)
    assert d["usd_per_hour"] == pytest.approx(2 * 49.24)
    assert (d["pricing"]["provider"], d["pricing"]["instances"]) == ("coreweave", 2)
    # the replica's GPUs are both stages': TP 8 x PP 2 = 16 (it counted one stage, 8)
    assert d["gpus_total"] == 16
    assert d["output_tokens_per_s"] / d["gpus_total"] == pytest.approx(d["output_tokens_per_s"] / 16)


def test_a_pipeline_counts_a_replica_as_all_its_stages() -> None:
    """TP 4 x PP 3 of Llama-3.1-70B: 12 GPUs on two 8-GPU instances (16 billed). The text names 3 stages, not
    instances, and the spare 4 GPUs hold no second replica (one would need 12 more), where it said 4."""
    args = ["--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "-pp", "3"]
    code, out = _run(*args)
    assert code == 0, out
    assert "on 12 x h100-sxm (TP 4 x PP 3: 3 pipeline stages a replica, 1 replica)" in out
    assert "2 instances hold 16 GPUs for the 12 this runs\n" in out + "\n" and "replicas cost the same" not in out
    code, out = _run(*args, "-f", "json")
    assert json.loads(out)["gpus_total"] == 12
    # two replicas: 24 GPUs on three instances, nothing spare
    code, out = _run(*args, "--replicas", "2", "-f", "json")
    d = json.loads(out)
    assert (d["gpus_total"], d["pricing"]["instances"]) == (24, 3) and not any("cost the same" in n for n in d["pricing"]["notes"])


def test_the_estimate_prices_a_pipeline_as_the_search_does() -> None:
    """One physics: the step the estimate explains is the step the search sizes a TP8 x PP2 replica with."""
    req = EstimateRequest(model="deepseek-r1", gpu="h100-sxm", tp=8, pp=2, kv_dtype="fp8", prompt_tokens=2000,
                          output_tokens=500, max_num_seqs=16, max_num_batched_tokens=2048)
    dep, _, est = estimate_request(req)
    cost = StepCostModel.build(dep)
    w = Workload(model="deepseek-r1", prompt_tokens=LengthDist.constant(2000), output_tokens=LengthDist.constant(500),
                 arrival_rate_per_s=1.0, gpus=("h100-sxm",), slos=(Slo("tpot", 0.05, "p90"),), name="r1")
    ctx = build_context(w, SearchPolicy(), engine_profile("vllm"), default_catalog())
    searched, why = ctx.cost_model("h100-sxm", 8, "fp8", "fp8", dep.limits, pp=2)
    assert searched is not None, why
    ctx_len = 2250
    assert cost.decode_step_s(8, ctx_len) == pytest.approx(searched.decode_step_s(8, ctx_len), rel=1e-12)
    assert cost.kv_capacity_tokens == searched.kv_capacity_tokens
    # one hop: 7,168 hidden x 2 B per token over 400 Gb/s = 50e9 B/s per GPU, and 50 us fixed in the overhead
    assert cost.pp_hop_s_per_token == pytest.approx(7168 * 2 / 50e9)
    one_stage = StepCostModel.build(dataclasses.replace(dep, pp=1, stage_nic_bytes_per_s_per_gpu=0.0))
    assert cost.overhead_s - one_stage.overhead_s == pytest.approx(PP_HOP_LATENCY_S)
    assert est.fits


def test_a_model_no_instance_holds_is_told_the_stages_that_would() -> None:
    code, out = _run(*R1, "--concurrency", "8")
    assert code != 0 and "try --pipeline-parallel-size 2 (stages on 2 instances)" in out
    error = out.strip().splitlines()[-1]  # the walkthrough, then the one-line error
    assert error.startswith("error: ") and "a larger --tp" not in error  # TP 8 fills an H100 NVLink domain


@pytest.mark.parametrize(("extra", "needle"), [
    (["-pp", "0"], "--pipeline-parallel-size must be a positive"),
    (["--tp", "4", "-pp", "2", "-dp", "2"], "pipeline stages are modelled for plain TP engines"),
    (["-pp", "2", "-ep"], "pipeline stages are modelled for plain TP engines"),
])
def test_pipelines_the_model_does_not_price_are_one_line(extra: list[str], needle: str) -> None:
    code, out = _run(*R1, *extra)  # a later --tp overrides R1's
    assert code == 2 and needle in out and len(out.strip().splitlines()) == 1


def test_a_sliding_window_model_is_not_pipelined() -> None:
    code, out = _run("--model", "gpt-oss-20b", "--gpu", "h100-sxm", "--context", "2000", "-pp", "2")
    assert code == 2 and "pipeline parallel is not modelled for gpt-oss-20b" in out


def test_simulate_takes_the_same_stages() -> None:
    res = CliRunner().invoke(app, ["simulate", *R1, "-pp", "2", "--rate", "1", "-n", "200", "-f", "json", "-q"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["config"] == "deepseek-v3 on 1 x 8 x PP2 h100-sxm"
    tpot = d["latency_s"]["tpot"]
    assert tpot["simulated"]["p50"] == pytest.approx(tpot["analytic"]["p50"], rel=0.15)  # the simulator agrees
