"""The P/D KV-transfer link is a server with a capacity (recommender.load.link), in both the analytic
model and the simulator."""

from __future__ import annotations

import pytest

from recommender.load import Disaggregated, PoolSpec, Traffic, analyze_disaggregated, simulate_disaggregated
from recommender.load.link import KvLink
from recommender.load.toy import FixedLength, LinearStepCost, ToyLimits, UniformLength

PLAIN = LinearStepCost(attention_flops_per_token_pair=0.0, kv_bytes_per_token=1e6)


def test_over_subscribed_link_is_unstable_and_named() -> None:
    # issue #13: 5.2 GB/s of KV pushed through a 4 GB/s NIC: 1,000-token prompts x 520 kB/token x 10 req/s.
    link = KvLink(bytes_per_token=520_000, nic_bytes_per_s=4e9)
    r = analyze_disaggregated(Disaggregated(prefill=PoolSpec(cost=PLAIN, limits=ToyLimits()), decode=PoolSpec(cost=PLAIN, limits=ToyLimits()), kv_link=link), Traffic(rate_per_s=10.0, prompt=FixedLength(1000), output=FixedLength(11)))
    assert not r.stable and r.bottleneck == "kv_link"
    assert r.utilisation == pytest.approx(5.2e9 / 4e9, rel=1e-6)


def test_link_queue_wait_is_md1_and_enters_ttft() -> None:
    # S = 1,000 tokens x 1e5 B / 1e9 B/s = 0.1 s per transfer; 7 req/s on one link: rho = 0.7,
    # M/D/1 mean wait = rho S / (2 (1 - rho)) = 0.1167 s. Without the link queue TTFT would miss it.
    link = KvLink(bytes_per_token=1e5, nic_bytes_per_s=1e9)
    pools = {"prefill": PoolSpec(cost=PLAIN, limits=ToyLimits()), "decode": PoolSpec(cost=PLAIN, limits=ToyLimits())}
    traffic = Traffic(rate_per_s=7.0, prompt=FixedLength(1000), output=FixedLength(11))
    with_link = analyze_disaggregated(Disaggregated(**pools, kv_link=link), traffic)
    no_link = analyze_disaggregated(Disaggregated(**pools), traffic)
    assert with_link.stable and with_link.link_utilisation == pytest.approx(0.7)
    wait = 0.7 * 0.1 / (2 * 0.3)
    assert with_link.ttft_s.mean - no_link.ttft_s.mean == pytest.approx(0.1 + wait, rel=0.02)


# Prefill 3-4x faster than the link (the case where the link binds): transfers arrive about as the
# requests do. (With prefill and transfer times alike, the prefill queue already spaces the transfers
# and the M/G/1 link wait is conservative: TTFT mean +12% at link utilisation 0.6.)
FAST = LinearStepCost(s_per_token=2e-6, attention_flops_per_token_pair=0.0, kv_bytes_per_token=1e6)


@pytest.mark.parametrize("link_util", [0.3, 0.6, 0.85])
def test_analytic_link_matches_the_simulated_link_queue(link_util: float) -> None:
    prompt, output = UniformLength(500, 1500), UniformLength(5, 50)
    link = KvLink(bytes_per_token=1e5, nic_bytes_per_s=2e9, prefill_tp=2, decode_tp=4)  # min(2, 4) NICs: 4 GB/s
    rate = link_util / (prompt.mean * 1e5 / 4e9)
    topology = Disaggregated(prefill=PoolSpec(cost=FAST, limits=ToyLimits()), decode=PoolSpec(cost=FAST, limits=ToyLimits()),
                             kv_link=link)
    traffic = Traffic(rate_per_s=rate, prompt=prompt, output=output)
    a = analyze_disaggregated(topology, traffic)
    s = simulate_disaggregated(topology, traffic, n_requests=6000, seed=3, warmup_requests=600)
    assert a.stable and s.stable and a.link_utilisation == pytest.approx(link_util, rel=0.02)
    assert a.ttft_s.mean == pytest.approx(s.ttft_s.mean, rel=0.10)
    assert a.ttft_s.p90 == pytest.approx(s.ttft_s.p90, rel=0.20)


def test_simulated_link_over_capacity_grows_a_queue() -> None:
    link = KvLink(bytes_per_token=1e5, nic_bytes_per_s=1e9)  # 0.1 s per 1,000-token transfer: 10 req/s at most
    s = simulate_disaggregated(Disaggregated(prefill=PoolSpec(cost=PLAIN, limits=ToyLimits()), decode=PoolSpec(cost=PLAIN, limits=ToyLimits()), kv_link=link), Traffic(rate_per_s=12.0, prompt=FixedLength(1000), output=FixedLength(11)), n_requests=3000, seed=1)
    assert not s.stable and s.requests_per_s == pytest.approx(10.0, rel=0.05)


def test_the_handoff_is_a_delay_in_ttft_that_holds_no_link() -> None:
    # the same M/D/1 link as above (S = 0.1 s, 7 req/s: rho 0.7) with a 60 ms handoff (recommender.load.link):
    # TTFT moves by exactly 0.06 s, mean and p90, analytic and simulated; the link's utilisation does not move
    # (a 0.06 s service time would have made it 7 x 0.16 = 1.12, over-subscribed)
    pools = {"prefill": PoolSpec(cost=PLAIN, limits=ToyLimits()), "decode": PoolSpec(cost=PLAIN, limits=ToyLimits())}
    traffic = Traffic(rate_per_s=7.0, prompt=FixedLength(1000), output=FixedLength(11))
    runs = []
    for handoff in (0.0, 0.06):
        topo = Disaggregated(**pools, kv_link=KvLink(bytes_per_token=1e5, nic_bytes_per_s=1e9, handoff_s=handoff))
        a = analyze_disaggregated(topo, traffic)
        s = simulate_disaggregated(topo, traffic, n_requests=3000, seed=4, warmup_requests=300)
        assert a.stable and s.stable and a.link_utilisation == pytest.approx(0.7)
        runs.append((a, s))
    (a0, s0), (a1, s1) = runs
    for q in ("mean", "p90"):
        assert a1.ttft_s.at(q) - a0.ttft_s.at(q) == pytest.approx(0.06, rel=1e-6)
        assert s1.ttft_s.at(q) - s0.ttft_s.at(q) == pytest.approx(0.06, rel=1e-6)
    assert a1.tpot_s.mean == pytest.approx(a0.tpot_s.mean, rel=1e-9)


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf")])
def test_a_handoff_must_be_finite_and_not_negative(bad: float) -> None:
    from recommender.errors import ConfigError

    with pytest.raises(ConfigError, match="handoff_s"):
        KvLink(bytes_per_token=1e5, nic_bytes_per_s=1e9, handoff_s=bad)
