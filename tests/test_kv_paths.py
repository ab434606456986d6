"""P/D KV paths: offers' NICs from the catalog, one instance over its fabric, the link a plan is sized with.

Figures: catalogs/gpus/*.yaml ``network:`` with sources [N1]-[N5] (AWS P5 3,200 Gbps per instance of 8 GPUs;
AWS P4d 400 Gbps per instance; Azure ND H100 v5 400 Gb/s InfiniBand per GPU); unknown NICs are 10 Gb/s Ethernet
per instance (recommender.offers.UNKNOWN_NIC_GBPS).
"""

from __future__ import annotations

import pytest

from recommender.catalog import default_catalog
from recommender.errors import CatalogError
from recommender.offers import KvPath, Offer, network_from_doc, rent_colocated
from recommender.profiles import engine_profile
from recommender.search.evaluate import evaluate
from recommender.search.planner import build_context
from recommender.search.policy import SearchPolicy
from recommender.search.space import Candidate
from recommender.workload import LengthDist, Slo, Workload

CAT = default_catalog()


def _offer(gpu: str, provider: str, sku_part: str, n: int) -> Offer:
    return next(o for o in CAT.gpu(gpu).offers if o.provider == provider and sku_part in o.sku and o.gpus_per_instance == n)


def test_offer_nics_per_gpu_from_their_sources() -> None:
    # [N1] p5.48xlarge: 3,200 Gbps over 8 GPUs = 400 Gb/s = 50e9 B/s per GPU
    assert _offer("h100-sxm", "aws", "p5", 8).nic_bytes_per_s_per_gpu == pytest.approx(3200e9 / 8 / 8)
    # [N2] p4d.24xlarge: 400 Gbps per instance of 8 GPUs = 50 Gb/s = 6.25e9 B/s per GPU
    assert _offer("a100-40gb", "aws", "p4d", 8).nic_bytes_per_s_per_gpu == pytest.approx(400e9 / 8 / 8)
    # [N3] ND96isr_H100_v5: 400 Gb/s InfiniBand per GPU
    o = _offer("h100-sxm", "azure", "ND96isr", 8)
    assert o.network.kind == "infiniband" and o.network.rdma and o.nic_bytes_per_s_per_gpu == pytest.approx(50e9)
    # no NIC in the catalog: 10 Gb/s per instance, shared by its 8 GPUs = 1.25 Gb/s each
    o = _offer("h100-sxm", "runpod", "community", 8)
    assert not o.network.known and o.network.kind == "ethernet"
    assert o.nic_bytes_per_s_per_gpu == pytest.approx(10e9 / 8 / 8)


def test_every_known_network_names_a_dated_source() -> None:
    for g in CAT.gpus.values():
        for o in g.offers:
            if o.network.known:
                assert o.network.source.startswith("[N") and o.network.date, (g.id, o.sku)


@pytest.mark.parametrize("doc", [{"kind": "token-ring", "gbps_per_gpu": 1},
                                 {"kind": "efa", "gbps_per_gpu": 400, "gbps_per_instance": 3200},
                                 {"kind": "roce"}])
def test_a_bad_network_entry_is_refused(doc: dict[str, object]) -> None:
    with pytest.raises(CatalogError):
        network_from_doc(doc, "x")


def test_both_pools_on_one_instance_when_they_fit() -> None:
    eight = Offer("p", "h100-sxm", 8, 8.0)
    assert rent_colocated(eight, [(1, 5), (2, 1)]) == (1, 8)  # 5 + 2 = 7 of 8 GPUs
    assert rent_colocated(eight, [(1, 5), (2, 2)]) is None  # 9 GPUs
    assert rent_colocated(eight, [(8, 1), (1, 1)]) is None  # 9 GPUs
    # a GB200 NVL72 tray is one host of 4 GPUs: P and D share a tray, not the domain
    tray = Offer("p", "gb200", 4, 42.0, nvlink_domain_gpus=72)
    assert rent_colocated(tray, [(2, 1), (1, 2)]) == (1, 4)
    assert rent_colocated(tray, [(4, 1), (4, 1)]) is None and rent_colocated(tray, [(8, 1), (1, 1)]) is None


def test_path_labels_name_the_bandwidth_one_transfer_gets() -> None:
    assert KvPath("pcie5", 64e9, same_instance=True).label(2) == "pcie5 128 GB/s (same instance, via host memory)"
    assert KvPath("efa", 50e9).label(1) == "efa 400 Gb/s"
    assert KvPath("ethernet", 1.25e9, known=False).label(1).startswith("ethernet 10 Gb/s (assumed")


LONG = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.lognormal(6000, 1500, 2000, 8000),
                output_tokens=LengthDist.lognormal(150, 60, 8, 512), arrival_rate_per_s=20.0,
                gpus=("h100-sxm", "mi300x"), slos=(Slo("tpot", 0.03, "p90"),), name="long-prompts")
# Llama-3.1-8B: 32 layers x 8 KV heads x head dim 128 x (K and V) x 1 byte (fp8) = 65,536 B of KV per token
KV_BYTES_PER_TOKEN_FP8 = 32 * 8 * 128 * 2


def _needs_below_link(ctx, ev) -> None:  # type: ignore[no-untyped-def]
    """The KV bytes/s the plan moves at its sizing rate stay below its link's capacity x the utilisation cap:
    each prefill replica has its own link (min(tp_p, tp_d) GPUs), the decode side takes R_d x tp_d GPUs."""
    p, d = ev.pools
    path = ev.kv_path
    assert path is not None
    rate = ctx.workload.effective_rate_per_s * (1 + ctx.headroom)
    need = rate * ctx.workload.prompt_tokens.mean * KV_BYTES_PER_TOKEN_FP8
    cap = ctx.rules.max_utilisation
    assert need <= cap * p.replicas * min(p.tp, d.tp) * path.bytes_per_s_per_gpu
    assert need <= cap * d.replicas * d.tp * path.bytes_per_s_per_gpu


@pytest.mark.parametrize("gpu,tp,dtp", [("h100-sxm", 1, 1), ("h100-sxm", 2, 2), ("mi300x", 1, 1)])
def test_the_kv_rate_a_plan_needs_is_below_its_links_bandwidth_x_cap(gpu: str, tp: int, dtp: int) -> None:
    ctx = build_context(LONG, SearchPolicy(), engine_profile("vllm"), CAT)
    ev = evaluate(ctx, Candidate(gpu, tp, "fp8", "fp8", 64, 2048, True, gpu, dtp))
    if gpu == "mi300x":
        # DigitalOcean's 1-GPU droplets are the only MI300X offer and give no NIC figure: 10 Gb/s Ethernet,
        # 1.25e9 B/s; one 6,000-token prompt (393 MB of KV) holds it 0.31 s, so 20 req/s x 1.2 needs 8 prefill
        # replicas' links at least (20 x 1.2 x 0.31 / 0.85 = 8.9)
        assert ev.kv_path is not None and ev.kv_path.kind == "ethernet" and not ev.kv_path.known
        assert ev.kv_path.bytes_per_s_per_gpu == pytest.approx(1.25e9)
        if ev.feasible:
            assert ev.pools[0].replicas >= 9
    assert ev.feasible, ev.reason
    _needs_below_link(ctx, ev)
    if ev.kv_path is not None and ev.kv_path.same_instance:
        # engines see only their own GPUs: the KV goes through host memory at the GPU's host link (H100 SXM:
        # PCIe Gen5 x16, 64 GB/s one direction; catalogs/gpus/h100-sxm.yaml host_link), not NVLink
        assert (ev.kv_path.kind, ev.kv_path.bytes_per_s_per_gpu) == ("pcie5", 64e9)
        # one instance, billed once: the two pools' shares add up to its price
        rp, rd = ev.pools[0].rental, ev.pools[1].rental
        assert rp is not None and rd is not None and rp.offer == rd.offer and rp.shared and rd.shared
        assert rp.usd_per_hour + rd.usd_per_hour == pytest.approx(rp.instances * rp.offer.usd_per_instance_hour)


def test_pools_that_need_two_instances_cross_one_providers_nic() -> None:
    # 120 req/s of 6k-token prompts on H100 TP1/TP1: more than 8 GPUs, so the KV crosses instances of ONE provider
    w = Workload(model="llama-3.1-8b", prompt_tokens=LONG.prompt_tokens, output_tokens=LONG.output_tokens,
                 arrival_rate_per_s=120.0, gpus=("h100-sxm",), slos=LONG.slos, name="long-prompts-busy")
    ctx = build_context(w, SearchPolicy(), engine_profile("vllm"), CAT)
    ev = evaluate(ctx, Candidate("h100-sxm", 1, "fp8", "fp8", 64, 2048, True, "h100-sxm", 1))
    assert ev.feasible, ev.reason
    assert ev.gpus_total > 8 and ev.kv_path is not None and not ev.kv_path.same_instance
    rp, rd = ev.pools[0].rental, ev.pools[1].rental
    assert rp is not None and rd is not None and rp.offer.provider == rd.offer.provider
    assert min(rp.offer.nic_bytes_per_s_per_gpu, rd.offer.nic_bytes_per_s_per_gpu) == pytest.approx(ev.kv_path.bytes_per_s_per_gpu)
    _needs_below_link(ctx, ev)
