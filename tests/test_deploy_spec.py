"""Plan JSON -> DeploySpec: quantization policy, GPU refusals, vLLM start-up checks, sizes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from recommender.catalog import gpu_from_doc, load_catalog
from recommender.deploy.gpus import GpuFacts, catalog_gpu_lookup, facts_from_gpu
from recommender.kernels import ArchSupport
from recommender.deploy.k8s import cache_size_gib, startup_failure_threshold
from recommender.deploy.spec import dns_label, params_from_name, resolve_weights
from recommender.errors import ConfigError, DeployError

from recommender import deploy as _deploy
from recommender.plan import load_plan


def render_deploy(doc, **kw):  # the tests edit plan documents, then read them through the one loader
    return _deploy.render_deploy(load_plan(doc), **kw)


def build_spec(doc, *args, **kw):
    return _deploy.build_spec(load_plan(doc), *args, **kw)


def write_deploy_files(doc, *args, **kw):
    return _deploy.write_deploy_files(load_plan(doc), *args, **kw)

PLANS = Path(__file__).parent / "data" / "plans"
# Llama-3.1-70B parameter count (hardware-and-models.md table 2b; catalogs/models/llama-3.1-70b.yaml
# reference_computed.total_params). Linear part by hand: per layer q,o 8192x8192, k,v 8192x1024,
# MLP 3 x 8192x28672 -> 855,638,016 x 80 layers; the rest (embeddings, untied lm_head 128256x8192
# each, 161 norms of 8192) stays 16-bit.
LLAMA70B_PARAMS = 70_553_706_496
LLAMA70B_LINEAR = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
LLAMA70B_OTHER = 2 * 128256 * 8192 + 161 * 8192


def load(name: str) -> dict[str, Any]:
    return json.loads((PLANS / name).read_text())


def agg() -> dict[str, Any]:
    return load("agg-llama70b-h100.json")


def with_pool(doc: dict[str, Any], rank: int = 1, **changes: Any) -> dict[str, Any]:
    """Copy of ``doc`` with fields of plan ``rank`` and all its pools changed."""
    doc = copy.deepcopy(doc)
    row = next(p for p in doc["plans"] if p["rank"] == rank)
    row.update(changes)
    for pool in row["pools"]:
        pool.update({k: v for k, v in changes.items() if k in pool or k == "checkpoint"})
    return doc


# ---------------------------------------------------------------- quantization policy


@pytest.mark.parametrize(
    ("weight", "ckpt", "checkpoint", "model", "quantization", "dtype"),
    [
        ("bf16", "bf16", None, "org/m", None, None),            # same dtype: load as is
        ("fp16", "bf16", None, "org/m", None, "float16"),        # both 16-bit: cast at load
        ("bf16", "fp16", None, "org/m", None, "bfloat16"),
        ("fp8", "bf16", None, "org/m", "fp8", None),             # vLLM online dynamic FP8
        ("fp8", "fp8", None, "org/m", None, None),               # FP8 checkpoint: auto-detected
        ("mxfp4", "mxfp4", None, "org/m", None, None),           # gpt-oss: native MXFP4
        ("int4", "bf16", "org/m-awq", "org/m-awq", None, None),  # pre-quantized: vLLM reads its config
        ("fp4", "bf16", "org/m-nvfp4", "org/m-nvfp4", None, None),
        ("int8", "bf16", "org/m-w8a8", "org/m-w8a8", None, None),
    ],
)
def test_quantization_policy(weight: str, ckpt: str, checkpoint: str | None, model: str,
                             quantization: str | None, dtype: str | None) -> None:
    w = resolve_weights(weight, ckpt, "org/m", checkpoint)
    assert (w.model, w.quantization, w.dtype) == (model, quantization, dtype)


@pytest.mark.parametrize(("weight", "ckpt", "hint"), [("int4", "bf16", "AWQ or GPTQ"), ("int8", "bf16", "W8A8"),
                                                      ("fp4", "bf16", "NVFP4"), ("fp8", "int4", "FP8"),
                                                      ("bf16", "fp8", "a bf16")])
def test_weights_needing_a_checkpoint_are_refused_with_the_fix(weight: str, ckpt: str, hint: str) -> None:
    with pytest.raises(DeployError) as e:
        resolve_weights(weight, ckpt, "org/m", None)
    msg = str(e.value)
    assert hint in msg and "pre-quantized checkpoint" in msg and "--checkpoint REPO" in msg and '"checkpoint"' in msg


def test_int4_plan_without_checkpoint_is_refused_and_cli_checkpoint_fixes_it(tmp_path: Path) -> None:
    doc = agg()
    del doc["plans"][2]["checkpoint"]
    with pytest.raises(DeployError, match="int4 weights"):
        render_deploy(doc, rank=3)
    with pytest.raises(DeployError):
        write_deploy_files(doc, tmp_path / "out", rank=3)
    assert not (tmp_path / "out").exists()
    spec = build_spec(doc, rank=3, checkpoint="TechxGenus/Meta-Llama-3.1-70B-Instruct-GPTQ")
    assert spec.pools[0].weights.model == "TechxGenus/Meta-Llama-3.1-70B-Instruct-GPTQ"


def test_cli_checkpoint_overrides_the_plan_checkpoint() -> None:
    spec = build_spec(agg(), rank=3, checkpoint="other/awq")
    assert spec.pools[0].weights.model == "other/awq"
    assert build_spec(agg(), rank=3).pools[0].weights.model == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"


# ---------------------------------------------------------------- GPU refusals


def test_fp4_on_hopper_is_refused() -> None:
    doc = with_pool(load("fp4-llama70b-b200.json"), gpu="h100-sxm")
    with pytest.raises(DeployError, match=r"does not run fp4 weights on h100-sxm \(hopper\)"):
        build_spec(doc)


def test_fp4_on_blackwell_is_accepted() -> None:
    spec = build_spec(load("fp4-llama70b-b200.json"))
    assert spec.pools[0].gpu.id == "b200" and spec.pools[0].weights.model == "nvidia/Llama-3.3-70B-Instruct-FP4"


def test_fp8_on_ampere_runs_weight_only_through_marlin() -> None:
    # vLLM docs (llm_compressor/fp8): below CC 8.9 FP8 checkpoints run as weight-only W8A16 FP8 Marlin
    spec = build_spec(with_pool(agg(), gpu="a100-80gb"))
    assert "W8A16" in spec.pools[0].gpu.kernels.kernel("fp8")


def test_int8_on_b200_is_refused_in_one_line() -> None:
    # csrc/quantization/cutlass_w8a8/scaled_mm_c3x_sm100.cu: "int8 not supported on SM100"
    doc = with_pool(agg(), gpu="b200", weight_dtype="int8", checkpoint="org/m-w8a8")
    with pytest.raises(DeployError) as e:
        build_spec(doc)
    msg = str(e.value)
    assert "\n" not in msg and "does not run int8 weights on b200 (blackwell)" in msg and "re-run `recommend`" in msg
    build_spec(with_pool(agg(), gpu="h100-sxm", weight_dtype="int8", checkpoint="org/m-w8a8"))  # Hopper has INT8 W8A8


def test_fp8_kv_cache_is_checked_against_the_table() -> None:
    only_bf16_kv = ArchSupport("old", "nvidia", {"bf16": "x", "fp8": "y"}, {}, ("bf16",), frozenset())
    facts = GpuFacts("old", "nvidia", True, "nvidia.com/gpu", only_bf16_kv)
    with pytest.raises(DeployError, match="no fp8 KV cache on old"):
        build_spec(agg(), gpus=lambda _id: facts)


def test_unknown_gpu_is_refused() -> None:
    with pytest.raises(DeployError, match="tpu-v9"):
        build_spec(with_pool(agg(), gpu="tpu-v9"))


GAUDI3 = {"id": "gaudi3", "vendor": "intel", "memory": "128 GB", "hbm_bandwidth": "3.7 TB/s",
          "dense_tflops": {"bf16": 1835, "fp8": 1835}, "interconnect": {"kind": "roce", "bandwidth": "600 GB/s", "gpus_per_domain": 8},
          "vllm": {"supported": False, "k8s_resource": "habana.ai/gaudi"}}


def test_gpu_vllm_does_not_support_is_refused(tmp_path: Path) -> None:
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "gaudi3.yaml").write_text(yaml.safe_dump(GAUDI3))
    with pytest.raises(DeployError, match="does not support GPU 'gaudi3'"):
        build_spec(with_pool(agg(), gpu="gaudi3"), gpus=catalog_gpu_lookup(load_catalog(tmp_path)))


def test_int4_needs_kernel_support() -> None:
    fp8_only = ArchSupport("old", "nvidia", {"bf16": "x", "fp16": "x", "fp8": "y"}, {"int4": "no Marlin"}, ("bf16", "fp8"), frozenset())
    facts = GpuFacts("old", "nvidia", True, "nvidia.com/gpu", fp8_only)
    with pytest.raises(DeployError, match="does not run int4 weights on old \\(old\\): no Marlin"):
        build_spec(agg(), rank=3, gpus=lambda _id: facts)


def test_gpu_facts_from_catalog_fields() -> None:
    doc = {**GAUDI3, "id": "x", "vendor": "amd", "dense_tflops": {"bf16": 1307.4, "fp8": 2614.9},
           "vllm": {"supported": True, "arch": "cdna3"}}
    facts = facts_from_gpu(gpu_from_doc(doc))
    assert facts.k8s_resource == "amd.com/gpu" and facts.supports_dtype("fp8") and not facts.supports_dtype("fp4")
    assert not facts.supports_dtype("int4")  # AWQ/GPTQ are not on vLLM's AMD list


def test_real_catalog_facts() -> None:
    b200 = build_spec(load("fp4-llama70b-b200.json")).pools[0].gpu
    mi300x = build_spec(load("amd-qwen7b-mi300x.json")).pools[0].gpu
    assert b200.supports_dtype("fp4") and b200.k8s_resource == "nvidia.com/gpu"
    assert mi300x.vendor == "amd" and mi300x.k8s_resource == "amd.com/gpu"


# ---------------------------------------------------------------- vLLM start-up checks


def test_chunked_prefill_off_needs_a_token_budget_of_max_model_len() -> None:
    # vLLM SchedulerConfig: without chunked prefill a whole prompt must fit one step
    doc = with_pool(agg(), chunked_prefill=False, max_num_batched_tokens=8192)  # max_model_len 8448
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(8192\) >= max_model_len \(8448\)"):  # load_plan
        build_spec(doc)
    build_spec(with_pool(agg(), chunked_prefill=False, max_num_batched_tokens=8448))


def test_token_budget_below_max_num_seqs_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(64\) >= max_num_seqs \(128\)"):  # load_plan
        build_spec(with_pool(agg(), max_num_batched_tokens=64))


@pytest.mark.parametrize("gmu", [0.0, 1.2, -0.5])
def test_gpu_memory_utilization_outside_0_1_is_refused(gmu: float) -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):  # load_plan refuses it, before deploy
        build_spec(with_pool(agg(), gpu_memory_utilization=gmu))


def test_malformed_plans_name_the_problem() -> None:
    doc = agg()
    del doc["plans"][0]["pools"][0]["tp"], doc["plans"][0]["tp"]
    with pytest.raises(ConfigError, match="field 'plans.0.pools.0.tp': Field required"):
        build_spec(doc)
    with pytest.raises(DeployError, match="no plan with rank 7.*\\[1, 2, 3\\]"):
        build_spec(agg(), rank=7)
    with pytest.raises(DeployError, match="holds no plans"):
        build_spec({**agg(), "plans": []})
    bad = with_pool(agg(), tp="4")
    with pytest.raises(ConfigError, match="field 'plans.0.pools.0.tp': Input should be a valid integer"):
        build_spec(bad)
    prefill_only = agg()
    prefill_only["plans"][0]["pools"][0]["role"] = "prefill"
    with pytest.raises(ConfigError, match="pools \\['prefill'\\]"):
        build_spec(prefill_only)
    with pytest.raises(ConfigError, match="unknown weight_dtype 'int3'"):  # load_plan, the one validator
        build_spec(with_pool(agg(), weight_dtype="int3"))
    with pytest.raises(ConfigError, match="unknown kv_dtype 'int8'"):
        build_spec(with_pool(agg(), kv_dtype="int8"))


def test_model_names_that_look_like_flags_or_hold_control_characters_are_refused() -> None:
    doc = agg()
    doc["workload"]["hf_repo"] = "--trust-remote-code"
    with pytest.raises(DeployError, match="starts with '-'"):
        build_spec(doc, rank=2)
    doc["workload"]["hf_repo"] = "org/model\nrm -rf /"
    with pytest.raises(DeployError, match="control characters"):
        build_spec(doc, rank=2)


# ---------------------------------------------------------------- derived numbers


def test_engine_limits_come_from_the_pool_and_max_model_len_from_the_workload() -> None:
    doc = load("disagg-llama70b-h200.json")
    doc["workload"]["max_model_len"] = 12000
    doc["plans"][0]["pools"][0]["max_num_batched_tokens"] = 16384
    spec = build_spec(doc)
    prefill, decode = spec.pools
    assert (prefill.role, prefill.tp, prefill.replicas, prefill.max_num_seqs, prefill.chunked_prefill) == ("prefill", 2, 2, 16, False)
    assert (decode.role, decode.tp, decode.replicas, decode.max_num_seqs, decode.chunked_prefill) == ("decode", 4, 1, 256, True)
    assert prefill.max_model_len == decode.max_model_len == 12000
    assert spec.gpus_total == 2 * 2 + 4 * 1


def test_checkpoint_bytes_from_the_model_catalog_use_the_dtype_on_disk() -> None:
    assert LLAMA70B_LINEAR + LLAMA70B_OTHER == LLAMA70B_PARAMS
    bf16_bytes = 2 * LLAMA70B_PARAMS
    # rank 1 runs fp8 weights made online from the bf16 checkpoint: vLLM still downloads 16-bit weights
    assert build_spec(agg(), rank=1).pools[0].checkpoint_bytes == pytest.approx(bf16_bytes)
    assert build_spec(agg(), rank=2).pools[0].checkpoint_bytes == pytest.approx(bf16_bytes)
    # rank 3 loads an AWQ INT4 checkpoint: 4 bits + fp16 scale and zero per 128 weights, rest 16-bit
    awq = LLAMA70B_LINEAR * (0.5 + 4 / 128) + LLAMA70B_OTHER * 2
    assert build_spec(agg(), rank=3).pools[0].checkpoint_bytes == pytest.approx(awq)


def test_startup_probe_budget_by_hand() -> None:
    # 300 s + 141.107 GB / 150 MB/s = 1240.7 s -> 125 probes of 10 s
    assert startup_failure_threshold(2 * LLAMA70B_PARAMS) == 125
    # 8B bf16 (16.06 GB): 300 + 107.1 = 407.1 s -> 41
    assert startup_failure_threshold(16.06e9) == 41
    assert startup_failure_threshold(0) == 30


def test_cache_volume_size_by_hand() -> None:
    # 141.1e9 x 1.25 / 2^30 = 164.3 GiB -> 170 GiB; small models get the 20 GiB floor
    assert cache_size_gib(2 * LLAMA70B_PARAMS) == 170
    assert cache_size_gib(1e9) == 20


def test_params_from_name() -> None:
    assert params_from_name("llama-3.1-70b") == 70e9
    assert params_from_name("Qwen/Qwen3-0.6B") == pytest.approx(0.6e9)
    assert params_from_name("mistralai/Mixtral-8x7B-Instruct-v0.1") == 56e9
    assert params_from_name("Qwen/Qwen3-30B-A3B") == 30e9
    assert params_from_name("gpt2") is None


def test_model_size_falls_back_to_the_name_when_not_in_the_catalog() -> None:
    doc = agg()
    doc["workload"].update(model="custom-13b", hf_repo="me/custom-13b")
    spec = build_spec(doc, rank=2)
    assert spec.pools[0].checkpoint_bytes == 13e9 * 2 and "name" in spec.weights_source


def test_dns_label() -> None:
    assert dns_label("vllm-RAG chat_v2") == "vllm-rag-chat-v2"
    long = dns_label("vllm-" + "x" * 100)
    assert len(long) <= 40 and long[-7] == "-" and long == dns_label("vllm-" + "x" * 100)
    assert dns_label("$$$") == "plan"
    assert dns_label("é") == "plan"


def test_missing_hf_repo_and_checkpoint_dtype_come_from_the_model_catalog() -> None:
    doc = agg()
    del doc["workload"]["hf_repo"], doc["workload"]["checkpoint_dtype"]
    spec = build_spec(doc, rank=1)
    # catalogs/models/llama-3.1-70b.yaml: hf_repo meta-llama/Llama-3.1-70B-Instruct, checkpoint bf16
    assert (spec.hf_repo, spec.checkpoint_dtype) == ("meta-llama/Llama-3.1-70B-Instruct", "bf16")
    assert spec.pools[0].weights.quantization == "fp8"
    doc["workload"]["model"] = "not-in-catalog"
    with pytest.raises(DeployError, match="missing field 'hf_repo'"):
        build_spec(doc, rank=1)
