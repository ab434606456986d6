"""The load model prices MTP speculative decoding: verify steps of k + 1 query tokens per sequence that emit
``tau = sum_{i<=k} a^i`` tokens per sequence (analytic and simulator, ``recommender.load``).

Hand calculations use ``LinearStepCost`` (recommender/load/toy.py: ``step_s = 5 ms + 20 us x tokens + KV bytes /
2e12 + FLOPs / 4e14``, 163,840 KV bytes and 2.6e6 FLOPs per (query, key) pair) with a 1 ms draft pass per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from recommender.load import PoolSpec, Traffic, analyze, simulate
from recommender.load.pool import _Slots
from recommender.load.pool_inputs import pool_inputs
from recommender.load.summaries import cost_summary, speculation
from recommender.load.toy import LinearStepCost
from recommender.load.topology import PoolKind
from recommender.perf.step import EngineLimits
from recommender.workload import LengthDist


@dataclass(frozen=True)
class SpecLinear(LinearStepCost):
    """A linear step cost with MTP: ``k`` drafts at per-position acceptance ``a``, ``draft_s`` fixed per step."""

    k: int = 2
    a: float = 0.5
    draft_step_s: float = 1e-3

    @property
    def query_tokens(self) -> int:
        return self.k + 1

    @property
    def tokens_per_step(self) -> float:
        return sum(self.a**i for i in range(self.k + 1))

    def draft_s(self, decodes: float, context_tokens: float) -> float:
        return self.draft_step_s if decodes > 0 else 0.0


LIMITS = EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192)


def test_speculation_read_from_the_cost() -> None:
    # k = 2, a = 0.5: q = 3 query tokens, tau = 1 + 0.5 + 0.25 = 1.75 tokens per step
    assert speculation(SpecLinear()) == (3, 1.75)
    assert speculation(LinearStepCost()) == (1, 1.0)
    assert speculation(SpecLinear(k=0)) == (1, 1.0)
    cs = cost_summary(SpecLinear(k=3, a=0.8))
    assert cs.query_tokens == 4 and cs.tokens_per_step == pytest.approx(1 + 0.8 + 0.64 + 0.512)


def test_decode_steps_per_request_are_output_over_tau() -> None:
    # constant 201-token outputs: 200 decode tokens take 200 / 1.75 = 114.29 steps; contexts stay in tokens
    # (prompt 100 + O^2 / (2 O) = 100 + 100.5)
    p, o = LengthDist.constant(100), LengthDist.constant(201)
    plain = pool_inputs(p, o, kind=PoolKind.AGGREGATED, shared_prefix_fraction=0.0, block_tokens=16, prefix_caching=False)
    mtp = pool_inputs(p, o, kind=PoolKind.AGGREGATED, shared_prefix_fraction=0.0, block_tokens=16, prefix_caching=False,
                      tokens_per_step=1.75)
    assert plain.E_steps == pytest.approx(200.0)
    assert mtp.E_steps == pytest.approx(200.0 / 1.75)
    assert float(mtp.Om1.mean()) == pytest.approx(200.0 / 1.75)
    assert mtp.E_O == plain.E_O == pytest.approx(201.0)
    assert mtp.mean_ctx == plain.mean_ctx == pytest.approx(200.5)


def test_slots_take_q_tokens_of_the_budget() -> None:
    # 2048-token budget, 4 query tokens per decoder (k = 3): at most 512 decoders fit a step, below max_num_seqs 1024
    limits = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=2048)
    cost = SpecLinear(k=3, kv_capacity_tokens=10**8)
    inp = pool_inputs(LengthDist.constant(100), LengthDist.constant(101), kind=PoolKind.AGGREGATED,
                      shared_prefix_fraction=0.0, block_tokens=16, prefix_caching=False, tokens_per_step=1.875)
    assert _Slots.of(limits, cost_summary(cost), inp).c == 512
    assert _Slots.of(limits, cost_summary(LinearStepCost(kv_capacity_tokens=10**8)), inp).c == 1024


def _hand_tpot_s(q: int, tau: float, ctx: float, draft_s: float) -> float:
    """One verify step of one sequence at context ``ctx`` over ``tau``: 5 ms + q x 20 us + ctx x 163,840 B / 2e12
    + q x ctx x 2.6e6 / 4e14, plus the draft passes."""
    step = 5e-3 + q * 20e-6 + ctx * 163_840.0 / 2e12 + q * ctx * 2.6e6 / 4e14
    return (step + draft_s) / tau


def test_light_load_tpot_is_verify_step_over_tau_analytic_and_simulated() -> None:
    # one request at a time: TPOT = (5 ms + 60 us + 200.5 x 8.192e-8 + 3 x 200.5 x 6.5e-9 + 1 ms) / 1.75 = 3.4745 ms
    cost = SpecLinear()
    hand = _hand_tpot_s(3, 1.75, 200.5, 1e-3)
    assert hand == pytest.approx(3.4745e-3, rel=1e-4)
    traffic = Traffic(rate_per_s=0.05, prompt=LengthDist.constant(100), output=LengthDist.constant(201))
    res = analyze(PoolSpec(cost=cost, limits=LIMITS), traffic)
    assert res.tpot_s.mean == pytest.approx(hand, rel=0.01)
    assert res.tpot_s.p50 == pytest.approx(hand, rel=0.01)
    # E2E - TTFT = (O - 1) x TPOT = 200 / 1.75 verify steps
    assert res.e2e_s.mean - res.ttft_s.mean == pytest.approx(200.0 * res.tpot_s.mean, rel=1e-6)
    sim = simulate(PoolSpec(cost=cost, limits=LIMITS), traffic, n_requests=60, seed=3)
    # the simulated request takes ceil-ish(200 / 1.75) = 114-115 whole steps on the token clock floor(1.75 s)
    assert sim.tpot_s.p50 == pytest.approx(hand, rel=0.01)
    plain = analyze(PoolSpec(cost=LinearStepCost(), limits=LIMITS), traffic)
    # without MTP: 5 ms + 20 us + 200.5 x (8.192e-8 + 6.5e-9) = 5.0377 ms per token
    assert plain.tpot_s.mean == pytest.approx(5e-3 + 20e-6 + 200.5 * (8.192e-8 + 6.5e-9), rel=0.01)


@pytest.mark.parametrize("rate", [8.0, 16.0])
def test_analytic_and_simulator_agree_on_an_mtp_pool(rate: float) -> None:
    # a loaded pool (12 and 50 decoders per step, utilisation 0.20 and 0.44; chunked prefill sharing steps with
    # verify steps). Without MTP the same cost at utilisation 0.38 agrees as closely (TPOT p90 -10%, TTFT p50 -9%).
    cost = SpecLinear(k=2, a=0.6)
    traffic = Traffic(rate_per_s=rate, prompt=LengthDist.lognormal(800, 400, 16, 4000),
                      output=LengthDist.lognormal(300, 150, 8, 1500))
    res = analyze(PoolSpec(cost=cost, limits=LIMITS), traffic)
    sim = simulate(PoolSpec(cost=cost, limits=LIMITS), traffic, n_requests=3000, seed=5)
    assert res.stable and sim.stable
    # TPOT p90 at rate 16: 12.5 analytic vs 14.7 ms simulated (-15.1%) with issue 31's decoder-count dispersion (the
    # simulator advances every decoder by the same floor(tau x steps) tokens, one source of the gap); held to the
    # 20% of issue 31's agreement grid, p50 to 15%
    for name, tpot_rel in (("p50", 0.15), ("p90", 0.2)):
        assert getattr(res.tpot_s, name) == pytest.approx(getattr(sim.tpot_s, name), rel=tpot_rel), name
        assert getattr(res.ttft_s, name) == pytest.approx(getattr(sim.ttft_s, name), rel=0.2), name
    assert res.mean_running_batch == pytest.approx(sim.mean_running_batch, rel=0.15)


def test_mtp_speeds_up_a_memory_bound_pool() -> None:
    # same pool, same traffic: k = 2 at a = 0.6 (tau = 1.96) cuts TPOT by about tau / (1 + verify extra + draft)
    traffic = Traffic(rate_per_s=20.0, prompt=LengthDist.constant(500), output=LengthDist.constant(300))
    plain = analyze(PoolSpec(cost=LinearStepCost(), limits=LIMITS), traffic)
    mtp = analyze(PoolSpec(cost=SpecLinear(k=2, a=0.6), limits=LIMITS), traffic)
    assert mtp.tpot_s.p50 < 0.75 * plain.tpot_s.p50
    assert mtp.output_tokens_per_s == pytest.approx(plain.output_tokens_per_s)


def test_deepseek_v3_mtp_pool_analytic_and_simulator_agree() -> None:
    # the real cost model: DeepSeek-V3 fp8 on 8 x H200 with MTP k = 2 at the catalog's acceptance 0.567
    from recommender.catalog import default_catalog
    from recommender.estimator import build_deployment
    from recommender.perf import speculative as spec
    from recommender.perf.step import StepCostModel
    from recommender.profiles import engine_profile
    from recommender.search.verify import verify_run_length

    cat = default_catalog()
    s = spec.SpecDecode(num_speculative_tokens=2, acceptance_rate=0.567)
    dep = build_deployment(model=cat.model("deepseek-v3"), gpu=cat.gpu("h200"), tp=8, weight_dtype="fp8", kv_dtype="fp8",
                           profile=engine_profile("vllm"), limits=LIMITS, max_model_len=8192, spec=s)
    cost = StepCostModel.build(dep)
    assert speculation(cost) == (3, pytest.approx(1 + 0.567 + 0.567**2))
    traffic = Traffic(rate_per_s=4.0, prompt=LengthDist.lognormal(1500, 800, 16, 6000),
                      output=LengthDist.lognormal(600, 300, 16, 2000))
    res = analyze(PoolSpec(cost=cost, limits=LIMITS), traffic)
    # run as `recommend` verifies a plan: the verifier's length and warm-up at the pool's utilisation (0.45: 3,295
    # requests, 659 left out); 1,500 requests from an empty engine read TTFT p90 0.238 s against 0.251 s at 8,000
    n, warm = verify_run_length(utilisation=res.utilisation, percentiles=("p90",), max_requests=20_000)
    sim = simulate(PoolSpec(cost=cost, limits=LIMITS), traffic, n_requests=n, seed=1, warmup_requests=warm)
    for name in ("p50", "p90"):
        assert getattr(res.tpot_s, name) == pytest.approx(getattr(sim.tpot_s, name), rel=0.15), name
        # TTFT p90: 0.296 analytic vs 0.259 simulated s (+14%) with SGLang's DeepSeek expert terms borrowed by the
        # vllm profile (2026-12-07), inside the 20% that issue 31's agreement grid allows at utilisation <= 0.8
        assert getattr(res.ttft_s, name) == pytest.approx(getattr(sim.ttft_s, name), rel=0.2), name
    # light load: TPOT near one sequence's (verify step + drafts) / tau from the perf model itself
    one = cost.decode_step_s(1, 2100)
    assert res.tpot_s.p50 > one
