"""`recommend estimate` on InferenceX-like MoE configurations says what it computes (a sweep of 2026-12-07 that set the
CLI beside `benchmarks/bench_inferencex.py` on 16 rows: the numbers agreed; these lines did not):

- the `--bench` header counts the engine's GPUs (`tp x dp`), not its TP group;
- the conditions name the profile's engine (they read "engine vllm" under `--engine sglang`), and the front end the
  figures are timed by: behind an HTTP server the TTFT carries `server_request_overhead_s`, so the front-end line
  states it (under `--engine trtllm` it read "engine timer: 0.00 ms" beside a TTFT with 91.6 ms added);
- `--scheduler-poll-steps N` (SGLang's `--scheduler-recv-interval`), which the benchmark applies per launch script and
  an error message already named, is a flag: a prompt waits `(N - 1) / 2` steps on average;
- an fp4 plan whose checkpoint the catalog does not name prints `vllm serve CHECKPOINT` and says so (it printed the
  fp8 repo, which loads twice the weights the memory section counts).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.profiles import engine_profile

DSV3_H200 = ["estimate", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "--weight-dtype", "fp8", "--kv-dtype", "fp8"]
CLOSED = ["--concurrency", "16", "--prompt-tokens", "1000", "--output-tokens", "1000"]


def _run(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_the_bench_header_counts_the_engines_gpus() -> None:
    out = _run("estimate", "-m", "deepseek-v3", "-g", "b200", "--tp", "1", "-dp", "8", "-ep", "--weight-dtype", "fp8",
               "--kv-dtype", "fp8", "--engine", "trtllm", "--bench", "--num-prompts", "100", "--max-concurrency", "32")
    assert out.startswith("Predicted `vllm bench serve` on deepseek-v3, 1 x 8 b200 (fp8 weights, fp8 KV, tp 1 x dp 8, "
                          "expert parallel):")


def test_the_conditions_name_the_engine_and_the_overhead_the_ttft_carries() -> None:
    sg = json.loads(_run(*DSV3_H200, "--engine", "sglang", *CLOSED, "--format", "json"))["conditions"]
    assert sg[0].startswith("engine sglang:")
    tr = json.loads(_run(*DSV3_H200, "--engine", "trtllm", *CLOSED, "--format", "json"))["conditions"]
    assert tr[0].startswith("engine trtllm:")
    # trtllm.yaml's hopper family: request_overhead_s plus the HTTP server's server_request_overhead_s, as
    # StepCostModel charges it behind a server (limits.engine_timer off, the estimate's conditions)
    p = engine_profile("trtllm").for_gpu("h200", "deepseek-v3")
    assert tr[1] == (f"front end OpenAI API server: {(p.request_overhead_s + p.server_request_overhead_s) * 1e3:.2f} ms "
                     "per request (profile request_overhead_s + server_request_overhead_s)")
    assert p.server_request_overhead_s > 0.0  # the line it replaced read 0.00 ms


def test_scheduler_poll_steps_adds_half_the_interval_in_steps() -> None:
    one = json.loads(_run(*DSV3_H200, "--engine", "sglang", *CLOSED, "--format", "json"))
    ten = json.loads(_run(*DSV3_H200, "--engine", "sglang", *CLOSED, "--scheduler-poll-steps", "10", "--format", "json"))
    # (10 - 1) / 2 = 4.5 steps of the closed loop's mean step (its TPOT: no MTP) before the prefill
    assert ten["ttft_s"] - one["ttft_s"] == pytest.approx(4.5 * one["tpot_s"], rel=1e-9)
    assert ten["tpot_s"] == one["tpot_s"]
    assert ten["conditions"][-1] == ("scheduler takes new requests every 10 steps (--scheduler-poll-steps): a prompt "
                                     "waits 4.5 steps on average before its prefill")
    assert "pass it as --scheduler-poll-steps" in one["conditions"][-1]  # SGLang at 1: the assumption is said
    vllm = json.loads(_run(*DSV3_H200, *CLOSED, "--format", "json"))["conditions"]
    assert not any("scheduler" in c for c in vllm)


def test_an_fp4_estimate_without_a_checkpoint_names_the_one_it_needs() -> None:
    args = ["estimate", "-m", "deepseek-v3", "-g", "b200", "--tp", "4", "-ep", "--weight-dtype", "fp4", "--kv-dtype",
            "fp8", *CLOSED]
    out = _run(*args)
    line = next(ln for ln in out.splitlines() if "vllm serve" in ln)
    assert line.strip().startswith("vllm serve CHECKPOINT --tensor-parallel-size 4 --enable-expert-parallel")
    assert "give it with --checkpoint REPO" in line
    assert "deepseek-ai/DeepSeek-V3" not in line
    assert json.loads(_run(*args, "--format", "json"))["serve_weights"] is None
    named = json.loads(_run(*args, "--checkpoint", "nvidia/DeepSeek-V3-0324-FP4", "--format", "json"))["serve_weights"]
    assert named == {"model": "nvidia/DeepSeek-V3-0324-FP4", "quantization": None, "dtype": None}


def test_an_estimate_on_a_gpu_without_a_catalog_price_states_no_cost() -> None:
    """MI355X has no dated offer in the catalog (catalogs/gpus/mi355x.yaml): the estimate of a GPU a user owns used to
    stop at "pass --price"; its performance stands, its cost is not stated (0 would read as free)."""
    args = ["estimate", "-m", "deepseek-v3", "-g", "mi355x", "--tp", "8", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
            "--engine", "sglang", *CLOSED]
    out = _run(*args)
    cost = out[out.index("\nCost\n"):].split("\n\n")[0]
    assert "no price           none: mi355x has no catalog price" in cost and "$" not in cost
    d = json.loads(_run(*args, "--rate", "1", "--format", "json"))
    assert d["usd_per_hour"] is None and d["usd_per_million_tokens"] is None and d["pricing"]["usd_per_hour"] is None
    assert d["output_tokens_per_s"] > 0
    priced = json.loads(_run(*args, "--price", "2", "--format", "json"))
    assert priced["usd_per_hour"] == pytest.approx(16.0)   # $2 x 8 GPUs
    assert "$" not in "\n".join(ln for ln in _run(*args, "--rate", "1").splitlines() if "Under load" in ln or "usd" in ln)


@pytest.mark.parametrize("extra", [["--rate", "2"], ["--bench", "--request-rate", "2"]])
def test_scheduler_poll_steps_is_refused_where_it_is_not_modelled(extra: list[str]) -> None:
    """The poll wait is a closed loop's term; under open arrivals the estimate ignored it while its conditions said
    "a prompt waits 4.5 steps" (hostile-input sweep, 2026-12-07)."""
    args = [*DSV3_H200, "--engine", "sglang", "--prompt-tokens", "1000", "--output-tokens", "200", *extra]
    res = CliRunner().invoke(app, [*args, "--scheduler-poll-steps", "10"])
    assert res.exit_code == 2 and "applies to closed loops" in res.output and "Traceback" not in res.output
    assert CliRunner().invoke(app, args).exit_code == 0


def test_the_library_estimate_of_an_unpriced_gpu_has_unknown_cost() -> None:
    import math

    from recommender import api

    e = api.estimate(model="llama-3.1-8b", gpu="mi355x", concurrency="8", prompt_tokens=100, output_tokens=100)
    assert math.isnan(e.usd_per_hour) and math.isnan(e.usd_per_million_tokens) and e.output_tokens_per_s > 0
    priced = api.estimate(model="llama-3.1-8b", gpu="mi355x", concurrency="8", prompt_tokens=100, output_tokens=100,
                          usd_per_gpu_hour=3.0)
    assert priced.usd_per_hour == pytest.approx(3.0)
