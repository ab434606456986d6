"""`recommend estimate` end to end through typer's CliRunner: JSON contents, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.profiles import engine_profile
from recommender.units import fmt_bytes

HF = Path(__file__).resolve().parent / "data" / "hf_configs"

JSON_KEYS = (
    "fits", "weights_bytes_per_gpu", "kv_cache_bytes_per_token", "kv_cache_capacity_bytes",
    "max_concurrent_sequences", "decode_step_floor_s", "decode_step_s", "tpot_s", "prefill_s", "ttft_s", "e2e_s",
    "output_tokens_per_s", "total_tokens_per_s", "usd_per_hour", "usd_per_million_output_tokens",
    "usd_per_million_tokens", "bound",
)


def run(*args: str):
    return CliRunner().invoke(app, ["estimate", *args])


def run_json(*args: str) -> tuple[int, dict]:
    res = run(*args, "--format", "json")
    assert "Traceback" not in res.output
    return res.exit_code, json.loads(res.stdout)


# =========================================================================== good calls
@pytest.mark.parametrize(
    "mode, args",
    [
        ("context", ("--batch", "64", "--context", "2048")),
        ("static", ("--batch", "8", "--prompt-tokens", "1024", "--output-tokens", "256")),
        ("closed", ("--concurrency", "32", "--prompt-tokens", "1024", "--output-tokens", "256")),
        ("max", ("--concurrency", "max", "--prompt-tokens", "1024", "--output-tokens", "256")),
    ],
)
def test_json_has_every_key_in_every_mode(mode: str, args: tuple[str, ...]) -> None:
    code, d = run_json("--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8", "--price", "2.5", *args)
    assert code == 0
    for key in JSON_KEYS:
        assert key in d, key
    assert d["mode"] == mode and d["fits"] is True
    assert d["bound"] in ("memory", "compute")
    for key in JSON_KEYS:
        if key not in ("fits", "bound", "e2e_s"):
            assert isinstance(d[key], (int, float)) and d[key] > 0, key
    assert (d["e2e_s"] is None) == (mode == "context")
    assert d["usd_per_hour"] == 8 * 2.5
    # llama-3.1-70b: 70,553,706,496 params x 2 B / 8 GPUs; 2 x 80 x 8 x 128 x 2 B per token
    assert d["weights_bytes_per_gpu"] == pytest.approx(70_553_706_496 * 2 / 8, rel=1e-12)
    assert d["kv_cache_bytes_per_token"] == 327_680
    assert d["usd_per_million_output_tokens"] == pytest.approx(20.0 / (d["output_tokens_per_s"] * 3600) * 1e6, rel=1e-9)


def test_static_batch_end_to_end_is_ttft_plus_the_decode_steps() -> None:
    code, d = run_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "8", "--prompt-tokens", "1000",
                       "--output-tokens", "200", "--price", "3")
    assert code == 0
    assert d["e2e_s"] == pytest.approx(d["ttft_s"] + 199 * d["tpot_s"], rel=1e-12)
    assert d["output_tokens_per_s"] == pytest.approx(8 * 200 / d["e2e_s"], rel=1e-12)
    assert d["total_tokens_per_s"] == pytest.approx(8 * 1200 / d["e2e_s"], rel=1e-12)
    assert d["usd_per_million_tokens"] < d["usd_per_million_output_tokens"]


def test_a_static_batch_prefills_within_the_token_budget() -> None:
    """One prompt of 2,000 tokens in steps of at most 16 tokens is ceil(2000 / 16) = 125 steps: the static batch's
    TTFT is the prefill line's 125 steps (it had been one 2,000-token step whatever the budget), and a batch of 64
    shares a step's 8,192 tokens: floor(8192 / 64) = 128 of each prompt, ceil(2000 / 128) = 16 steps."""
    args = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "2000", "--output-tokens", "100")
    code, small = run_json(*args, "--batch", "1", "--max-num-batched-tokens", "16")
    _, whole = run_json(*args, "--batch", "1", "--max-num-batched-tokens", "2048")
    assert code == 0
    assert small["wave_sequences"] == 1
    overhead_s = engine_profile("vllm").request_overhead_s
    assert small["ttft_s"] == pytest.approx(small["wave_prefill_s"] + overhead_s, rel=1e-12)
    assert small["wave_prefill_s"] == pytest.approx(small["prefill_s"], rel=1e-12)   # both: 125 chunks of 16 tokens
    assert small["ttft_s"] > 5 * whole["ttft_s"]          # 125 steps' fixed overheads, not one step's
    text = run(*args, "--batch", "64", "--max-num-batched-tokens", "8192").stdout
    assert "64 prompts prefilled together in 16 steps of <= 8,192 tokens" in text
    assert "the prompt prefilled in 125 steps of <= 16 tokens" in run(*args, "--batch", "1", "--max-num-batched-tokens",
                                                                       "16").stdout


def test_replicas_multiply_throughput_and_price() -> None:
    _, one = run_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "16", "--context", "1024", "--price", "2")
    _, three = run_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "16", "--context", "1024", "--price", "2",
                        "--replicas", "3")
    assert three["output_tokens_per_s"] == pytest.approx(3 * one["output_tokens_per_s"], rel=1e-12)
    assert three["usd_per_hour"] == 3 * one["usd_per_hour"] == 6.0
    assert three["usd_per_million_output_tokens"] == pytest.approx(one["usd_per_million_output_tokens"], rel=1e-12)


def test_catalog_price_is_the_default() -> None:
    # catalogs/gpus/h100-sxm.yaml: the cheapest offer per GPU-hour is RunPod community cloud $2.69
    # (hardware-and-models.md 1b, [P1] read 2026-11-09)
    _, d = run_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "1024")
    assert d["usd_per_hour"] == pytest.approx(2.69)


def test_hf_config_path_is_a_model() -> None:
    # GPT-J-6B from its config.json: 6,050,882,784 params x 2 B; MHA KV 2 x 28 x 16 x 256 x 2 B = 458,752 B/token
    code, d = run_json("--model", str(HF / "gpt-j-6b"), "--gpu", "a100-80gb", "--context", "2048")
    assert code == 0 and d["fits"] is True
    assert d["model"] == "gpt-j-6b"
    assert d["weights_bytes_per_gpu"] == 6_050_882_784 * 2
    assert d["kv_cache_bytes_per_token"] == 458_752
    code, d = run_json("--model", str(HF / "falcon-7b" / "config.json"), "--gpu", "l4", "--context", "2048")
    assert code == 0 and d["kv_cache_bytes_per_token"] == 2 * 32 * 1 * 64 * 2        # MQA: one K/V head


def test_tp_up_to_a_large_nvlink_domain_is_fine() -> None:
    # GB200 NVL72: 72 GPUs per NVLink domain, so TP 16 is allowed where 8-GPU boards stop at 8
    code, d = run_json("--model", "llama-3.1-70b", "--gpu", "gb200", "--tp", "16", "--context", "2048")
    assert code == 0 and d["tp"] == 16


def test_text_walkthrough() -> None:
    res = run("--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8", "--batch", "64", "--context", "2048")
    assert res.exit_code == 0 and res.stderr == ""
    for part in ("Memory (per GPU)", "Decode step at batch 64", "Prefill", "Cost", "$/M output tokens"):
        assert part in res.stdout


# =========================================================================== does not fit
def test_a_model_that_does_not_fit_reports_the_shortfall() -> None:
    # llama-2-70b fp16 on one H100 (80 GB x 0.92 = 73.6 GB): weights 68,976,648,192 x 2 B, the profiled
    # activation peak of vLLM's H100 defaults (8192 tokens x (4 x 8192 + 2 x 28672) x 2 B + 1024 seqs x
    # 32000 vocab x 4 B), runtime reserve and CUDA graphs (shipped profile), one 4096-token sequence's KV.
    res = run("--model", "llama-2-70b", "--gpu", "h100-sxm", "--context", "4096", "--format", "json")
    assert res.exit_code == 3
    d = json.loads(res.stdout)
    assert d["fits"] is False
    prof = engine_profile("vllm")
    need = (68_976_648_192 * 2 + 8192 * (4 * 8192 + 2 * 28672) * 2 + 1024 * 32000 * 4
            + prof.runtime_reserve_bytes_per_gpu + prof.cuda_graph_bytes_per_gpu + 4096 * 327_680)
    assert d["shortfall_bytes_per_gpu"] == pytest.approx(need - 80e9 * 0.92, rel=1e-9)
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("error: ")
    assert "does not fit" in err and f"short by {fmt_bytes(d['shortfall_bytes_per_gpu'])} per GPU" in err
    assert "Traceback" not in res.output


def test_does_not_fit_in_text_mode_too() -> None:
    res = run("--model", "llama-3.1-405b", "--gpu", "h100-sxm", "--tp", "8", "--context", "2048")
    assert res.exit_code == 3
    assert "NO, short by" in res.stdout
    assert res.stderr.strip().count("\n") == 0 and "does not fit" in res.stderr


# =========================================================================== bad input: one line, non-zero, no traceback
def _bad_configs(tmp: Path) -> dict[str, Path]:
    out = {}
    d = tmp / "malformed"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "hidden_size": 4096,')
    out["malformed"] = d / "config.json"
    base = json.loads((HF / "Llama-3.1-405B-Instruct" / "config.json").read_text())
    for name, cfg in {
        "unsupported": {**base, "model_type": "mamba"},
        "missing": {k: v for k, v in base.items() if k != "num_hidden_layers"},
        "wrongtype": {**base, "num_key_value_heads": "eight"},
    }.items():
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps(cfg))
        out[name] = tmp / name / "config.json"
    out["absent"] = tmp / "absent" / "config.json"
    return out


BAD = [
    # (args, words the one line must contain)
    (("--model", "llama-3.1-8b", "--gpu", "h999"), ("unknown GPU", "h100-sxm", "mi300x")),
    (("--model", "llama-9", "--gpu", "h100-sxm"), ("unknown model", "llama-3.1-70b", "config.json")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "0"), ("--context", "positive")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "-5"), ("--context", "-5")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "0", "--output-tokens", "10"), ("--prompt-tokens",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "-100", "--output-tokens", "10"), ("--prompt-tokens",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "100", "--output-tokens", "0"), ("--output-tokens",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "0"), ("--batch",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "0"), ("--tp must be a positive number of GPUs",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--bench", "--burstiness", "0"), ("--burstiness 0: must be above 0",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--bench", "--request-rate", "0"), ("--request-rate 0: must be above 0",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "16"), ("--tp 16", "interconnect domain", "8")),
    (("--model", "llama-3.1-70b", "--gpu", "gb200", "--tp", "128"), ("--tp 128", "72")),
    (("--model", "qwen2.5-7b", "--gpu", "h100-sxm", "--tp", "8"), ("--tp 8", "28 attention heads", "valid: 1, 2, 4")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "3"), ("power of two",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--weight-dtype", "fp5"), ("--weight-dtype", "int4")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--kv-dtype", "int4"), ("--kv-dtype", "fp8")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--format", "xml"), ("--format",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "abc", "--prompt-tokens", "5", "--output-tokens", "5"),
     ("--concurrency",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "8"), ("--prompt-tokens",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "5"), ("--output-tokens",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpu-memory-utilization", "1.5"), ("--gpu-memory-utilization",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--price", "-1"), ("price",)),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "bogus"), ("unknown engine", "vllm")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--profile", "/nonexistent/profile.yaml"), ("does not exist",)),
    # vLLM refuses a max_model_len above the model's context (Llama-3.1-8B's config.json: max_position_embeddings
    # 131072), whether it is given or the longest request / context needs it
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "200k", "--output-tokens", "10"),
     ("prompt + output 200,010 tokens", "context of 131,072 tokens")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "200k"), ("--context 200,000", "131,072")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "500k"), ("--max-model-len 500,000", "131,072")),
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--bench", "--random-input-len", "200k"), ("200,128 tokens", "131,072")),
    # with chunked prefill off vLLM's SchedulerConfig requires max_num_batched_tokens >= max_model_len
    (("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--no-chunked-prefill", "--max-num-batched-tokens", "512",
      "--prompt-tokens", "2k", "--output-tokens", "200"), ("--max-num-batched-tokens 512", "max_model_len (2,200)")),
]


def test_without_chunked_prefill_the_default_budget_holds_a_whole_prompt() -> None:
    """vLLM's default token budget with chunked prefill off is max(max_model_len, its default): a 10k prompt is one
    prefill step of 10,200 tokens, where the estimate kept H100's 8,192 default and prefilled 10k tokens in one step
    anyway."""
    code, d = run_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--no-chunked-prefill", "--prompt-tokens", "10k",
                       "--output-tokens", "200")
    assert code == 0
    assert any("max_num_batched_tokens 10200" in c for c in d["conditions"]), d["conditions"]


def test_simulate_refuses_what_vllm_refuses_too() -> None:
    res = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
                                   "--requests", "100", "--max-num-batched-tokens", "512", "--no-chunked-prefill",
                                   "--prompt-tokens", "2k", "--output-tokens", "200"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --max-num-batched-tokens 512") and res.stdout == ""


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("args, words", BAD, ids=[" ".join(a[2:]) or a[1] for a, _ in BAD])
def test_bad_input_is_one_line_and_a_nonzero_exit(args: tuple[str, ...], words: tuple[str, ...], fmt: str) -> None:
    res = run(*args, "--format", fmt) if "--format" not in args else run(*args)
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit)                     # not an uncaught exception
    assert "Traceback" not in res.output
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err
    for w in words:
        assert w in err, (w, err)
    assert res.stdout == ""                                          # nothing half-printed


@pytest.mark.parametrize(
    "case, words",
    [
        ("malformed", ("not valid JSON",)),
        ("unsupported", ("model_type", "mamba")),
        ("missing", ("num_hidden_layers",)),
        ("wrongtype", ("num_key_value_heads", "must be an integer")),
        ("absent", ("does not exist",)),
    ],
)
def test_bad_config_json_is_one_line_and_a_nonzero_exit(tmp_path: Path, case: str, words: tuple[str, ...]) -> None:
    path = _bad_configs(tmp_path)[case]
    res = run("--model", str(path), "--gpu", "h100-sxm", "--format", "json")
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err
    for w in words:
        assert w in err, (w, err)


# =========================================================================== what vLLM cannot run
# catalogs/kernel-support.yaml: blackwell (b200) lists no int8 weights ("vLLM's sm100 scaled_mm has no INT8
# kernel" [K3]) and runs bf16, fp16, fp8, int4, fp4, mxfp4; int8 W8A8 runs on ampere, ada and hopper [K1].
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_int8_on_blackwell_is_refused_like_deploy_refuses_it(fmt: str) -> None:
    res = run("--model", "llama-3.1-8b", "--gpu", "b200", "--weight-dtype", "int8", "--prompt-tokens", "1000",
              "--output-tokens", "200", "--concurrency", "16", "--format", fmt)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit) and res.stdout == ""
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "does not run int8 weights on b200 (blackwell)" in err                # the GPU's architecture, the dtype
    assert "it runs bf16, fp16, fp8, int4, fp4, mxfp4 weights there" in err     # what vLLM 0.33 runs there
    assert "try --weight-dtype fp8 or a --gpu whose architecture runs int8 (ada, ampere, hopper)" in err


def test_the_same_int8_configuration_runs_on_hopper() -> None:
    code, d = run_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--weight-dtype", "int8", "--context", "1024")
    assert code == 0 and d["weight_dtype"] == "int8"


def test_int4_on_amd_proposes_the_nearest_dtype_it_runs() -> None:
    # cdna3 (mi300x) runs bf16, fp16, fp8, mxfp4: no AWQ/GPTQ [K1]; mxfp4 is gpt-oss experts only, so 8-bit fp8
    res = run("--model", "llama-3.1-8b", "--gpu", "mi300x", "--weight-dtype", "int4", "--context", "1024")
    err = res.stderr.strip()
    assert res.exit_code == 2 and "does not run int4 weights on mi300x (cdna3)" in err
    assert "try --weight-dtype fp8 or" in err and "(ada, ampere, blackwell, hopper)" in err


def test_deploy_and_estimate_give_the_same_reason() -> None:
    from recommender.plan import load_plan
    from recommender import deploy
    from recommender.errors import DeployError

    doc = json.loads((Path(__file__).parent / "data" / "plans" / "agg-llama70b-h100.json").read_text())
    for row in doc["plans"]:
        row.update(gpu="b200", weight_dtype="int8", checkpoint="org/m-w8a8")
        for pool in row["pools"]:
            pool.update(gpu="b200", weight_dtype="int8")
    with pytest.raises(DeployError) as e:
        deploy.build_spec(load_plan(doc))
    res = run("--model", "llama-3.1-70b", "--gpu", "b200", "--weight-dtype", "int8", "--context", "1024")
    reason = "vLLM 0.33 does not run int8 weights on b200 (blackwell): "
    deploy_reason = str(e.value)[str(e.value).index(reason):].split("; re-run")[0]
    assert deploy_reason.endswith("weights there") and deploy_reason in res.stderr


# =========================================================================== where the price comes from
def test_default_price_is_whole_instances_of_the_cheapest_offer_that_holds_the_tp_group() -> None:
    # catalogs/gpus/b200.yaml offers: hyperstack $6.00/GPU-h in 8-GPU instances only (8 x 6.00 = $48.00/h for
    # one B200), runpod-secure $6.79/GPU-h in 1/2/4/8-GPU instances (read 2026-10-07), lambda 8 x $6.69,
    # coreweave 8 GPUs for $68.80: one B200 rents cheapest as runpod-secure's 1-GPU instance, $6.79/h
    code, d = run_json("--model", "llama-3.1-8b", "--gpu", "b200", "--context", "1024")
    assert code == 0 and d["usd_per_hour"] == pytest.approx(6.79, rel=1e-12)
    p = d["pricing"]
    assert (p["provider"], p["gpus_per_instance"], p["instances"], p["date"]) == ("runpod-secure", 1, 1, "2026-10-07")
    res = run("--model", "llama-3.1-8b", "--gpu", "b200", "--context", "1024")
    cost = res.stdout[res.stdout.index("\nCost"):]
    assert "1 x runpod-secure 1-GPU instance at $6.79/h" in cost and "= $6.79/h" in cost
    assert "cheapest whole-instance offer: runpod-secure 'B200 secure cloud'" in cost and "2026-10-07" in cost
    assert "(hyperstack, $6.00) sells 8-GPU instances only, which would cost $48.00/h here" in cost


def test_idle_gpus_of_a_whole_instance_are_named_and_paid() -> None:
    # catalogs/gpus/a100-40gb.yaml: every offer is an 8-GPU instance; lambda's 8 x $1.99 = $15.92/h is the cheapest
    # (aws $21.96, azure 8 x $3.3996); TP 2 x 1 replica runs 2 of its 8 GPUs and pays for all 8
    code, d = run_json("--model", "llama-3.1-8b", "--gpu", "a100-40gb", "--tp", "2", "--context", "1024")
    assert code == 0 and d["usd_per_hour"] == pytest.approx(8 * 1.99, rel=1e-12)
    assert d["pricing"]["notes"] == ["1 instance holds 8 GPUs for the 2 this runs: up to 4 replicas cost the same"]


def test_a_tp_group_no_offer_holds_is_said_and_priced_per_gpu() -> None:
    # catalogs/gpus/mi300x.yaml: the only offer is digitalocean's 1-GPU instance at $2.59/h, so TP 2 fits none
    res = run("--model", "llama-3.1-8b", "--gpu", "mi300x", "--tp", "2", "--context", "1024")
    assert res.exit_code == 0
    cost = res.stdout[res.stdout.index("\nCost"):]
    assert "$2.59/GPU-hour x 2 GPUs; no instance holds TP 2" in cost and "= $5.18/h" in cost  # note after the ";"
    assert "TP 2 does not fit one instance of any mi300x offer (the largest holds 1 GPU)" in cost
    assert "digitalocean 'gpu-mi300x1-192gb'" in cost and "2026-10-07" in cost


def test_price_flag_is_per_gpu_and_says_so() -> None:
    res = run("--model", "llama-3.1-8b", "--gpu", "a100-40gb", "--tp", "2", "--context", "1024", "--price", "2")
    cost = res.stdout[res.stdout.index("\nCost"):]
    assert "$2/GPU-hour x 2 GPUs" in cost and "= $4.00/h" in cost and "price from         --price" in cost
    assert "price note" not in cost
