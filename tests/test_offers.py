"""Rental offers: whole instances, TP groups inside an instance (or an NVLink domain), the cheapest offer,
--provider, workload prices:, and the P/D rules (one GPU type, NixlConnector TP pairs, the margin)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from recommender.catalog import default_catalog
from recommender.errors import CatalogError, ConfigError
from recommender.offers import (
    Offer,
    cheapest_rental,
    offers_from_doc,
    rent,
    restrict,
    workload_offer,
)
from recommender.profiles import EngineProfile, engine_profile
from recommender.search.evaluate import SearchContext, evaluate
from recommender.search.planner import build_context
from recommender.search.policy import SearchPolicy
from recommender.search.recommend_rows import (
    evidence_band,
    evidence_of,
    measured_rows,
    pd_saving,
    prefer_measured,
)
from recommender.search.space import Candidate, allowed_gpus, pd_pair_valid
from recommender.workload import LengthDist, Slo, Workload

CAT = default_catalog()
# Lambda 8x B200 SXM6: $6.69/GPU-h x 8 = $53.52 per instance-hour (hardware-and-models.md 1b, [P3])
LAMBDA_8X = Offer("lambda", "b200", 8, 6.69 * 8)
# RunPod secure B200 at $6.79/GPU-h in pods of 1 GPU ([P6])
RUNPOD_1X = Offer("runpod-secure", "b200", 1, 6.79)
# CoreWeave GB200 NVL72: $42.00/hr per 4-GPU tray of a 72-GPU NVLink domain ([P4])
GB200_TRAY = Offer("coreweave", "gb200", 4, 42.0, nvlink_domain_gpus=72)


def test_rounding_to_whole_instances_by_hand() -> None:
    r = rent(LAMBDA_8X, tp=2, replicas=3)  # 4 TP2 groups per instance -> 1 instance holds 4 replicas
    assert r is not None and (r.instances, r.replicas, r.gpus_billed) == (1, 4, 8)
    assert r.usd_per_hour == pytest.approx(53.52)
    r = rent(LAMBDA_8X, tp=4, replicas=3)  # 2 per instance -> 2 instances, 4 replicas
    assert r is not None and (r.instances, r.replicas) == (2, 4)
    assert rent(RUNPOD_1X, tp=2, replicas=1) is None  # a TP2 group never straddles two 1-GPU pods


def test_nvl72_slices_let_a_tp_group_span_trays() -> None:
    r = rent(GB200_TRAY, tp=8, replicas=3)  # 24 GPUs = 6 trays of the same NVLink domain
    assert r is not None and (r.instances, r.replicas) == (6, 3) and r.usd_per_hour == pytest.approx(252.0)
    r = rent(GB200_TRAY, tp=1, replicas=1)  # a single GB200 is bought as a whole 4-GPU tray
    assert r is not None and (r.instances, r.replicas, r.gpus_billed) == (1, 4, 4)


def test_cheapest_rental_compares_instance_cost_not_gpu_price() -> None:
    # 1 GPU needed: one $6.79 pod beats an 8-GPU instance at $6.69/GPU-h ($53.52)
    best = cheapest_rental([LAMBDA_8X, RUNPOD_1X], tp=1, replicas=1)
    assert best is not None and best.offer is RUNPOD_1X
    # 8 GPUs needed: 8 pods cost 8 x 6.79 = 54.32 > 53.52
    best = cheapest_rental([LAMBDA_8X, RUNPOD_1X], tp=1, replicas=8)
    assert best is not None and best.offer is LAMBDA_8X


def test_workload_prices_bill_per_gpu() -> None:
    r = rent(workload_offer("h100-sxm", 2.0), tp=4, replicas=3)
    assert r is not None and r.usd_per_hour == pytest.approx(24.0) and r.replicas == 3


def test_offer_yaml_is_validated() -> None:
    offs = offers_from_doc("x", [{"provider": "RunPod", "gpus_per_instance": [1, 2], "usd_per_gpu_hour": 2.0}])
    assert [(o.provider, o.gpus_per_instance, o.usd_per_instance_hour) for o in offs] == [("runpod", 1, 2.0), ("runpod", 2, 4.0)]
    with pytest.raises(CatalogError, match="exactly one of"):
        offers_from_doc("x", [{"provider": "a", "gpus_per_instance": 1, "usd_per_gpu_hour": 1, "usd_per_instance_hour": 1}])
    with pytest.raises(CatalogError, match="positive"):
        offers_from_doc("x", [{"provider": "a", "gpus_per_instance": 1, "usd_per_gpu_hour": -1}])


def test_provider_restriction() -> None:
    gpus = allowed_gpus(CAT, None, {}, provider="coreweave")
    assert {g.id for g in gpus} == {"h100-sxm", "h200", "b200", "gb200"}
    assert all(o.provider == "coreweave" for g in gpus for o in restrict(g.offers, "coreweave"))
    with pytest.raises(ConfigError, match="provider 'nobody' offers none"):
        allowed_gpus(CAT, None, {}, provider="nobody")
    with pytest.raises(ConfigError, match="no offer from provider 'coreweave' for mi300x"):
        allowed_gpus(CAT, ("mi300x",), {}, provider="coreweave")
    assert [g.id for g in allowed_gpus(CAT, ("mi300x",), {"mi300x": 1.5}, provider="coreweave")] == ["mi300x"]


CHAT = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(1000, 600, 32, 4096),
                output_tokens=LengthDist.lognormal(250, 150, 8, 1024), arrival_rate_per_s=10.0,
                gpus=("h100-sxm", "h200", "gb200", "mi300x"), slos=(Slo("tpot", 0.05, "p90"),), name="chat-offers")


def _ctx(policy: SearchPolicy | None = None) -> SearchContext:
    return build_context(CHAT, policy or SearchPolicy(), engine_profile("vllm"), CAT)


def test_every_sized_pool_is_a_whole_number_of_instances_of_a_named_offer() -> None:
    ctx = _ctx()
    for c in (Candidate("gb200", 1, "fp8", "fp8", 256, 8192), Candidate("h100-sxm", 2, "bf16", "bf16", 256, 8192),
              Candidate("h200", 1, "fp8", "fp8", 128, 4096, True, "h200", 2)):
        ev = evaluate(ctx, c)
        assert ev.feasible, ev.reason
        for p in ev.pools:
            r = p.rental
            assert r is not None and r.offer in ctx.offers[p.gpu] and r.instances >= 1
            assert p.tp <= r.offer.gpus_per_instance  # TP group inside one instance
            assert r.instances * r.offer.gpus_per_instance >= p.tp * p.replicas
        assert ev.usd_per_hour == pytest.approx(sum(p.rental.usd_per_hour for p in ev.pools))
    gb = evaluate(ctx, Candidate("gb200", 1, "fp8", "fp8", 256, 8192))
    assert gb.gpus_total % 4 == 0  # GB200 is rented by 4-GPU trays, never one GPU


# --------------------------------------------------------------------------- P/D rules


@pytest.mark.parametrize(("tp_p", "tp_d", "ok"), [(1, 1, True), (2, 1, True), (1, 8, True), (8, 2, True), (2, 4, True)])
def test_nixl_tp_pairs_divide(tp_p: int, tp_d: int, ok: bool) -> None:
    # vllm/distributed/kv_transfer/kv_connector/utils.py TransferTopology.tp_ratio: one TP divides the other
    h = CAT.gpu("h200")
    assert (pd_pair_valid(h, h, tp_p, tp_d, False) is None) is ok
    why = pd_pair_valid(h, h, 2, 3, False)
    assert why is not None and "divide" in why


def test_pd_pools_share_one_gpu_type_unless_the_policy_allows() -> None:
    h100, h200, mi = CAT.gpu("h100-sxm"), CAT.gpu("h200"), CAT.gpu("mi300x")
    assert "one GPU type" in (pd_pair_valid(h100, h200, 1, 1, False) or "")
    assert pd_pair_valid(h100, h200, 1, 1, True) is None
    assert "one vendor" in (pd_pair_valid(h200, mi, 1, 1, True) or "")
    ev = evaluate(_ctx(), Candidate("h100-sxm", 1, "fp8", "fp8", 128, 4096, True, "h200", 1))
    assert not ev.feasible and "one GPU type" in ev.reason


def test_pd_listed_only_when_it_beats_aggregated_by_the_margin() -> None:
    ctx = _ctx()
    agg = evaluate(ctx, Candidate("h200", 1, "fp8", "fp8", 256, 8192))
    pd = evaluate(ctx, Candidate("h200", 1, "fp8", "fp8", 256, 8192, True, "h200", 1))
    assert agg.feasible and pd.feasible
    s = pd_saving(pd, agg.usd_per_million_tokens)
    assert s == pytest.approx(1 - pd.usd_per_million_tokens / agg.usd_per_million_tokens)
    assert pd_saving(agg, agg.usd_per_million_tokens) is None
    assert pd_saving(pd, None) == 1.0  # no aggregated plan meets the SLOs
    assert math.isfinite(s)


# --------------------------------------------------------------------------- property: random workloads

ALL_GPUS = sorted(g.id for g in CAT.gpus.values() if g.offers)


@settings(max_examples=30, deadline=None)
@given(rate=st.floats(0.2, 40.0), prompt=st.floats(200, 6000), output=st.floats(20, 800),
       gpu=st.sampled_from(ALL_GPUS), tp=st.sampled_from([1, 2, 4, 8]),
       wd=st.sampled_from(["bf16", "fp8", "int8", "int4", "fp4"]), kd=st.sampled_from(["bf16", "fp8"]),
       pd=st.booleans(), dtp=st.sampled_from([1, 2, 4]), max_gpus=st.sampled_from([None, 8, 32]))
def test_random_workloads_yield_supported_whole_instance_plans(rate, prompt, output, gpu, tp, wd, kd, pd, dtp, max_gpus):
    w = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(prompt, prompt / 2, 16, 8192),
                 output_tokens=LengthDist.lognormal(output, output / 2, 4, 2048), arrival_rate_per_s=rate,
                 gpus=tuple(ALL_GPUS), max_gpus=max_gpus, slos=(Slo("tpot", 0.1, "p90"),), name="prop",
                 checkpoints={"int8": "org/m-w8a8", "int4": "org/m-awq", "fp4": "org/m-nvfp4"})
    ctx = build_context(w, SearchPolicy(), engine_profile("vllm"), CAT)
    c = Candidate(gpu, tp, wd, kd, 128, 4096, pd, gpu if pd else "", dtp if pd else 0)
    ev = evaluate(ctx, c)
    unsupported = CAT.gpu(gpu).why_unsupported(wd, kd)
    if unsupported:
        assert not ev.feasible and unsupported in ev.reason
    assume(ev.feasible)
    for p in ev.pools:
        assert CAT.gpu(p.gpu).why_unsupported(p.weight_dtype, p.kv_dtype) is None
        r = p.rental
        assert r is not None and r.offer in ctx.offers[p.gpu] and r.instances >= 1
        assert r.instances * r.offer.gpus_per_instance >= p.tp * p.replicas
        assert p.tp <= r.offer.gpus_per_instance or r.offer.nvlink_domain_gpus >= p.tp
    if max_gpus:
        assert ev.gpus_total <= max_gpus


# --------------------------------------------------------------------------- evidence per plan

def _fake(gpu: str, usd: float) -> Any:
    return SimpleNamespace(usd_per_million_tokens=usd, pools=(SimpleNamespace(gpu=gpu),))


def _evidence_ctx(band: float | None) -> Any:
    # an engine fit whose held-out report names 7 rows on h100-sxm (hopper) and none elsewhere
    fit: dict[str, Any] = {"held_out": [{"by": "gpu", "per_group": {"h100-sxm": {"start": {"n": 7}}}}]}
    if band is not None:
        fit["residual_scale"] = band
    return SimpleNamespace(profile=EngineProfile(engine="vllm", source="test", fit=fit), policy=SearchPolicy())


def test_measured_rows_count_the_family_of_the_fit_gpus() -> None:
    prof = _evidence_ctx(0.2).profile
    assert measured_rows(prof, "h200") == ("hopper", 7)  # same family as h100-sxm
    assert measured_rows(prof, "l40s") == ("ada", 0)


def test_unmeasured_plan_ranks_below_a_measured_one_within_the_error_band() -> None:
    ctx = _evidence_ctx(0.2)
    feas = [_fake("l40s", 1.00), _fake("h200", 1.15), _fake("mi300x", 1.30)]
    # h200 (measured) costs 15% more than l40s (unmeasured): within the 20% band -> l40s moves below it;
    # mi300x has no measured alternative within 20% above it... except h200 at 1.15 <= 1.56, already above it
    assert prefer_measured(ctx, feas, [0, 1, 2]) == [1, 0, 2]
    ctx = _evidence_ctx(0.1)  # a 10% band: 1.15 > 1.10, l40s keeps rank 1
    assert prefer_measured(ctx, feas, [0, 1, 2]) == [0, 1, 2]
    ctx = _evidence_ctx(None)  # no residual_scale in the fit: the policy's evidence_band (15%)
    assert evidence_band(ctx) == SearchPolicy().evidence_band == 0.15
    ev = evidence_of(_evidence_ctx(0.2), _fake("l40s", 1.0))
    assert not ev.measured and ev.unmeasured_families() == ["ada"] and ev.pools[0].measured_rows == 0
