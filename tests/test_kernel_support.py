"""The kernel-support table (catalogs/kernel-support.yaml) and the one dtype rules module.

Facts asserted here come from vLLM itself, cited per test: the supported-hardware table in vLLM's docs
(features/quantization/supported_hardware), the FP8 page (llm_compressor/fp8) and the sm100 CUTLASS
dispatch (csrc/quantization/cutlass_w8a8/scaled_mm_c3x_sm100.cu).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.plan import load_plan
from recommender.catalog import default_catalog
from recommender.dtypes import (
    loads_without_checkpoint,
    narrower_or_equal,
    native_weight_dtype,
)
from recommender.hf_config import arch_from_config
from recommender.search.space import weight_dtype_valid

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "plans"
CAT = default_catalog()
ARCH_OF = {g.id: g.arch for g in CAT.gpus.values()}


def test_every_gpu_names_an_architecture_of_the_table() -> None:
    assert all(ARCH_OF.values()), {k for k, v in ARCH_OF.items() if not v}
    assert ARCH_OF["a100-80gb"] == ARCH_OF["a10g"] == "ampere"
    assert ARCH_OF["l4"] == ARCH_OF["l40s"] == "ada"
    assert {ARCH_OF[g] for g in ("h100-sxm", "h100-pcie", "h100-nvl", "h200")} == {"hopper"}
    assert {ARCH_OF[g] for g in ("b200", "gb200", "gb300", "b300")} == {"blackwell"}
    assert {ARCH_OF[g] for g in ("mi300x", "mi325x")} == {"cdna3"} and ARCH_OF["mi355x"] == "cdna4"


@pytest.mark.parametrize("gpu", ["a100-80gb", "a10g", "l4", "l40s", "h100-sxm", "h200"])
def test_int8_w8a8_runs_turing_to_hopper(gpu: str) -> None:
    # docs supported_hardware: INT8 (W8A8) Turing, Ampere, Ada, Hopper
    assert CAT.gpu(gpu).supports_dtype("int8")


@pytest.mark.parametrize("gpu", ["b200", "gb200", "gb300", "b300", "mi300x", "mi325x", "mi355x"])
def test_int8_is_refused_on_blackwell_and_amd(gpu: str) -> None:
    # scaled_mm_c3x_sm100.cu passes nullptr for int8 ("int8 not supported on SM100");
    # docs supported_hardware: INT8 (W8A8) not on AMD GPU
    why = CAT.gpu(gpu).why_unsupported("int8")
    assert why is not None and f"int8 weights on {gpu}" in why


def test_fp8_needs_cc_8_9_for_w8a8_and_ampere_runs_it_weight_only() -> None:
    # docs llm_compressor/fp8: FP8 W8A8 on CC >= 8.9; lower CCs run FP8 checkpoints as W8A16 via Marlin
    for gpu in ("l40s", "h100-sxm", "b200", "mi300x"):
        assert "W8A8" in CAT.gpu(gpu).kernels.kernel("fp8"), gpu
    for gpu in ("a100-40gb", "a100-80gb", "a10g"):
        assert "W8A16" in CAT.gpu(gpu).kernels.kernel("fp8") and "Marlin" in CAT.gpu(gpu).kernels.kernel("fp8")


def test_nvfp4_is_blackwell_only() -> None:
    runs = {g.id for g in CAT.gpus.values() if g.supports_dtype("fp4")}
    assert runs == {"b200", "gb200", "gb300", "b300"}


def test_awq_gptq_are_not_on_amd() -> None:
    # docs supported_hardware: AWQ and GPTQ columns "AMD GPU" are not supported
    assert not any(g.supports_dtype("int4") for g in CAT.gpus.values() if g.vendor == "amd")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.plan.json")), ids=lambda p: p.stem)
def test_every_example_plan_is_on_the_support_table(path: Path) -> None:
    plan = load_plan(path)
    assert plan.rows
    for row in plan.rows:
        for pool in row.pools:
            gpu = CAT.gpu(pool.gpu)
            assert gpu.why_unsupported(pool.weight_dtype, pool.kv_dtype) is None, (row.id, pool)
            # a whole number of instances of a named, dated offer holds every TP group of the pool
            r = pool.rental
            assert r is not None and r.instances >= 1 and r.provider
            assert r.instances * r.gpus_per_instance >= pool.tp * pool.replicas
            assert pool.tp <= r.gpus_per_instance or pool.gpu == "gb200"  # NVL72 trays may span
            assert r.offer.date and r.offer.source
            assert r.usd_per_hour == pytest.approx(r.instances * r.usd_per_instance_hour)
        assert row.usd_per_hour == pytest.approx(sum(p.usd_per_hour or 0.0 for p in row.pools))


# --------------------------------------------------------------------------- one dtype rules module

AWQ_CONFIG = {"hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
              "model_type": "llama", "torch_dtype": "float16",
              "quantization_config": {"quant_method": "awq", "bits": 4}}


def test_awq_checkpoint_is_int4_for_estimate_and_search_alike() -> None:
    from recommender.estimator import native_weight_dtype as estimate_native
    from recommender.search.space import resolve_dtype

    model = arch_from_config(AWQ_CONFIG, model_id="m-awq")
    assert model.checkpoint_dtype == "int4"
    assert estimate_native(model) == resolve_dtype("native", model) == "int4"
    assert weight_dtype_valid(model, CAT.gpu("h100-sxm"), "bf16") is not None  # upcasting AWQ to bf16 wastes memory
    assert weight_dtype_valid(model, CAT.gpu("h100-sxm"), "int4") is None
    assert weight_dtype_valid(model, CAT.gpu("mi300x"), "int4") is not None  # no AWQ kernels on ROCm


def test_dtype_rules() -> None:
    assert native_weight_dtype("fp16") == "fp16" and native_weight_dtype("float32") == "bf16"
    assert loads_without_checkpoint("bf16", "fp8") and loads_without_checkpoint("fp16", "bf16")
    assert not loads_without_checkpoint("bf16", "int4") and not loads_without_checkpoint("fp8", "bf16")
    assert narrower_or_equal("int4", "fp8") and not narrower_or_equal("bf16", "fp8")
