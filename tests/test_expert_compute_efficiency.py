"""The routed experts' compute rate (``expert_compute_efficiency``, issue 22 stage B): a MoE prefill step's expert
GEMMs run at that share of the dense GEMMs' rate.

Hand calculation from DeepSeek-V3's config (catalogs/models/deepseek-v3.yaml, from the HF config.json): an expert
is three 7168 x 2048 matrices (gate, up, down) = 44,040,192 parameters; a token runs 8 of them in each of the
61 - 3 = 58 MoE layers (``first_k_dense_replace: 3``), so its routed FLOPs are 2 x 44,040,192 x 8 x 58 = 40.868e9.
"""

from __future__ import annotations

import pytest

from recommender.catalog import default_catalog
from recommender.estimator import build_deployment
from recommender.perf.step import StepCostModel
from recommender.profiles import BOUNDS, EngineProfile, engine_profile

CAT = default_catalog()
ROUTED_FLOPS_PER_TOKEN = 2 * 3 * 7168 * 2048 * 8 * 58  # 40,868,003,840


def _cost(profile: EngineProfile, model: str = "deepseek-v3") -> StepCostModel:
    dep = build_deployment(model=CAT.model(model), gpu=CAT.gpu("h200"), tp=8, weight_dtype="fp8", kv_dtype="fp8",
                           profile=profile, max_model_len=16384)
    return StepCostModel.build(dep)


def test_routed_flops_by_hand() -> None:
    assert _cost(engine_profile("vllm")).routed_flops_per_token == pytest.approx(ROUTED_FLOPS_PER_TOKEN, rel=1e-12)


def test_a_compute_bound_prefill_step_pays_the_experts_flops_at_their_rate() -> None:
    # a flat GEMM curve (M_half = 0): the step's GEMM FLOPs are T x (dense + routed / e), so halving e adds
    # exactly T x routed FLOPs / the group's rate to an 8,192-token prefill step (compute-bound: checked below)
    base = engine_profile("vllm").replace(families=(), gemm_m_half_tokens=0.0)
    full, half = _cost(base), _cost(base.replace(expert_compute_efficiency=0.5))
    assert half.expert_compute_efficiency == 0.5
    t = 8192
    kv, fl = full.prefill_chunk_cost(t, 0)
    assert full.effective_linear_flops(t) / full.group_flops_per_s > full.weight_read_s(t, full.hbm_bytes_per_s)
    extra_s = t * ROUTED_FLOPS_PER_TOKEN / full.group_flops_per_s
    assert half.step_s(t, kv, fl, prefill=True) - full.step_s(t, kv, fl, prefill=True) == pytest.approx(extra_s, rel=1e-6)


def test_decode_at_batch_one_is_memory_bound_and_does_not_see_it() -> None:
    base = engine_profile("vllm").replace(families=())
    full, low = _cost(base), _cost(base.replace(expert_compute_efficiency=0.3))
    assert low.decode_step_s(1, 2048) == pytest.approx(full.decode_step_s(1, 2048), rel=1e-12)


def test_dense_models_ignore_it_and_the_bound_is_a_share() -> None:
    base = engine_profile("vllm").replace(families=())
    assert _cost(base.replace(expert_compute_efficiency=0.3), "llama-3.1-70b").expert_compute_efficiency == 1.0
    assert BOUNDS["expert_compute_efficiency"] == (0.1, 1.0)
    assert EngineProfile().expert_compute_efficiency == 1.0
