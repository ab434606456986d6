"""``benchmarks/bench_inferencex_disagg.py``: InferenceX's disaggregated rows as P/D deployments (layout, closed loop).

Rows: ``tests/data/measurements/inferencex-dsr1.csv`` (SemiAnalysis InferenceX, see that folder's README); the
expected layouts are read off the rows' own columns by hand.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from bench_module import benchmark

bd = benchmark("bench_inferencex_disagg")


def _row(**kw: str) -> dict[str, str]:
    base = {"prefill_tp": "4", "prefill_ep": "1", "prefill_dp_attention": "false", "prefill_workers": "1",
            "num_prefill_gpu": "4", "decode_tp": "8", "decode_ep": "8", "decode_dp_attention": "true",
            "decode_workers": "2", "num_decode_gpu": "16"}
    return {**base, **kw}


def test_a_sides_layout_is_its_workers_gpus_as_tp_or_as_attention_dp() -> None:
    r = _row()
    # 1 prefill worker of 4 GPUs without DP attention: TP 4; 2 decode workers of 16 / 2 = 8 GPUs with it: DP 8 + EP
    assert bd.side_of(r, "prefill") == bd.Side(workers=1, tp=4, dp=1, ep=False)
    assert bd.side_of(r, "decode") == bd.Side(workers=2, tp=1, dp=8, ep=True)
    assert bd.Side(workers=2, tp=1, dp=8, ep=True).gpus == 16
    # a GPU count that is not a whole number of workers (the 72-GPU rows with 0 workers) is no layout
    assert bd.side_of(_row(decode_workers="0", num_decode_gpu="72"), "decode") is None
    assert bd.side_of(_row(decode_workers="3", num_decode_gpu="16"), "decode") is None


def test_the_closed_loop_is_the_rate_whose_in_flight_requests_are_conc() -> None:
    """Little's law on a stand-in model whose E2E is ``1 / (c - R)`` (an M/M/1 with capacity ``c``): ``R / (c - R) =
    N`` gives ``R = N c / (1 + N)``; past ``c`` the model is unstable."""
    c = 10.0

    def at(rate: float) -> SimpleNamespace:
        stable = rate < c
        e2e = 1.0 / (c - rate) if stable else float("inf")
        return SimpleNamespace(stable=stable, e2e_s=SimpleNamespace(at=lambda _p, e=e2e: e))

    for n in (1, 4, 64):
        rate, _ = bd.closed_loop(at, n)
        assert rate == pytest.approx(n * c / (1 + n), rel=1e-6)


def test_every_disaggregated_row_is_read_and_the_covered_ones_predicted() -> None:
    cases = bd.disagg_cases(bd.bx.DEFAULT_CSV)
    assert len(cases) == 284   # disagg true in inferencex-dsr1.csv (280 multi-node + 4 single-node)
    pairs = bd.predict_all([c for c in cases if c.gpu == "h200"])
    assert len(pairs) == 20 and all(isinstance(p, dict) for _, p in pairs)   # H200: every layout fits one node
    gb300 = bd.predict(next(c for c in cases if c.gpu == "gb300"))   # catalogs/gpus/gb300.yaml: one NVL72 rack
    assert isinstance(gb300, dict) and gb300["tpot"] > 0
    wide = next(c for c in cases if c.gpu == "h100" and c.decode is not None and c.decode.gpus == 16)
    assert "exceeds h100-sxm's scale-up domain of 8 GPUs" in str(bd.predict(wide))   # 16-GPU engines span 2 nodes


def test_the_handoff_fit_is_the_median_excess_at_low_load_and_held_out_by_configuration() -> None:
    # stand-in predictions: the fit takes the median of measured - predicted TTFT over rows of <= 8 in flight only
    cases = [dataclasses.replace(c, conc=n) for c, n in zip(bd.disagg_cases(bd.bx.DEFAULT_CSV)[:5], (1, 4, 8, 64, 2))]
    pairs = [(c, {"ttft": c.measured["ttft"] - d, "tpot": 1.0, "tput": 1.0, "utilisation": 0.1})
             for c, d in zip(cases, (0.05, 0.09, 0.10, 2.0, 0.0))]
    assert all("ttft" in c.measured for c in cases)
    assert bd.fit_handoff(pairs) == pytest.approx(0.07)   # median of 0.05, 0.09, 0.10, 0.0 (the 64-deep row left out)
    assert bd.fit_handoff(pairs[3:4]) != bd.fit_handoff(pairs[3:4])   # none at low load: NaN


@pytest.mark.slow
def test_the_shipped_handoff_is_what_the_pd_rows_measure() -> None:
    # policies/search.yaml kv_handoff_s (recommender.load.link.KV_HANDOFF_S): fitted on InferenceX's P/D rows of <= 8
    # in flight (benchmarks/results/inferencex-disagg.md: 60 ms pooled; MoRI SGLang 70, Dynamo SGLang 40, Dynamo
    # TensorRT-LLM -3: the stacks differ, the SGLang ones pay one)
    from recommender.load.link import KV_HANDOFF_S
    from recommender.search.policy import load_search_policy

    cases = bd.disagg_cases(bd.bx.DEFAULT_CSV)
    pairs0 = bd.predict_all(cases, 0.0)
    fitted = bd.fit_handoff(pairs0)
    assert load_search_policy().kv_handoff_s == KV_HANDOFF_S == pytest.approx(fitted, abs=0.005)
    own = {fw: bd.fit_handoff([(c, p) for c, p in pairs0 if c.framework == fw])
           for fw in ("dynamo-sglang", "dynamo-trt", "mori-sglang")}
    assert 0.03 <= own["dynamo-sglang"] <= 0.05 and 0.06 <= own["mori-sglang"] <= 0.08 and abs(own["dynamo-trt"]) <= 0.01
