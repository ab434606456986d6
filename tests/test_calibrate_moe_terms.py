"""`recommend calibrate` fits the routed experts' terms (``MOE_PARAMETERS``) on rows of one MoE model and writes them
as that model's (``families.<family>.models.<model>``), never as the family's: other MoE models of the family keep
theirs, dense models are untouched by them.

Recovery test: runs of DeepSeek-V3 on H200 (TP 8, and TP 1 x DP 8 with expert parallelism; closed loops of 10 x
concurrency prompts, as `vllm bench serve` runs them) "measured" with a known truth, the vllm profile whose MoE layer
costs twice its borrowed per-layer time; the start is the vllm profile without the borrowing rule (no experts' terms:
its state before 2026-12-07).
"""

from __future__ import annotations

import dataclasses

import pytest

from recommender.calibrate.api import fit_user_rows, parameters_for
from recommender.calibrate.measurements import Measurement, predict
from recommender.catalog import default_catalog
from recommender.errors import CalibrationError
from recommender.perf.steady import Load
from recommender.profiles import FIT_PARAMETERS, MOE_PARAMETERS, ModelFit, engine_profile

CAT = default_catalog()
SHIPPED = engine_profile("vllm")
START = dataclasses.replace(SHIPPED, borrow_model_terms=None)


def _truth():
    """The shipped vllm profile with deepseek-v3's borrowed terms written as its own hopper fit, the per-layer time
    doubled."""
    lent = SHIPPED.borrowed_fit("h200", "deepseek-v3")
    assert lent is not None
    terms = dict(lent.parameters) | {"moe_layer_overhead_s": 2.0 * dict(lent.parameters)["moe_layer_overhead_s"]}
    fams = []
    for f in SHIPPED.families:
        if f.family == "hopper":
            f = dataclasses.replace(f, models=(*f.models, ModelFit("deepseek-v3", 1, tuple(sorted(terms.items())), "truth")))
        fams.append(f)
    return dataclasses.replace(SHIPPED, families=tuple(fams), borrow_model_terms=None), terms


def _rows(truth) -> list[Measurement]:
    out = []
    for tp, dp, ep in ((8, 1, False), (1, 8, True)):
        for conc in (1, 4, 16, 64):
            for isl, osl in ((1000, 1000), (8000, 1000)):
                base = dict(source=f"tp{tp}dp{dp}", file="synthetic.json", engine="vllm", model="deepseek-v3", gpu="h200",
                            tp=tp, dp=dp, ep=ep, weight_dtype="fp8", kv_dtype="fp8",
                            load=Load.closed(concurrency=conc, prompt_tokens=isl, output_tokens=osl),
                            requests=10 * conc)
                for q, raw in (("tpot_s", "mean_tpot_ms"), ("ttft_s", "mean_ttft_ms"),
                               ("output_tokens_per_s", "output_throughput")):
                    m = Measurement(id=f"{tp}-{dp}-{conc}-{isl}#{q}", quantity=q, value=1.0, raw_metric=raw, **base)
                    out.append(dataclasses.replace(m, value=predict(m, truth)))
    return out


def test_default_parameters_add_the_experts_terms_for_rows_of_one_moe_model() -> None:
    rows = _rows(_truth()[0])
    # the experts' decode terms and the user's request overhead: the engine's dense physics stays the start's, and
    # expert_compute_efficiency waits to be asked for (benchmarks/calibrate_moe.py)
    assert parameters_for(rows, None, CAT) == ("moe_layer_overhead_s", "expert_bandwidth_efficiency", "request_overhead_s")
    assert parameters_for(rows, MOE_PARAMETERS, CAT) == MOE_PARAMETERS
    dense = [dataclasses.replace(m, model="llama-3.1-70b", dp=1, ep=False) for m in rows[:3]]
    assert parameters_for(dense, None, CAT) == FIT_PARAMETERS
    with pytest.raises(CalibrationError, match="one MoE model's terms") as e:
        parameters_for([*rows[:3], *dense], ("moe_layer_overhead_s",), CAT)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_experts_terms_are_recovered_and_written_as_the_models() -> None:
    truth, terms = _truth()
    rows = _rows(truth)
    uf = fit_user_rows(rows, START, parameters_for(rows, None, CAT), CAT)
    assert uf.kept and "moe_layer_overhead_s" in uf.result.fitted
    assert uf.result.experts_model == "deepseek-v3"
    fitted = uf.result.values.moe_layer_overhead_s   # as the rows see the profile: the model's block applied
    assert fitted == pytest.approx(terms["moe_layer_overhead_s"], rel=0.15)  # truth: 2 x SGLang's hopper fit
    prof = uf.result.profile
    hopper = next(f for f in prof.families if f.family == "hopper")
    mf = hopper.model_fit("deepseek-v3")
    assert mf is not None and dict(mf.parameters)["moe_layer_overhead_s"] == pytest.approx(fitted)
    assert not set(MOE_PARAMETERS) & set(dict(hopper.parameters))   # not the family's
    # the start predicted these rows without the experts' terms; the calibrated profile predicts them as the truth
    before = [abs(predict(m, START) / m.value - 1) for m in rows]
    after = [abs(predict(m, prof) / m.value - 1) for m in rows]
    assert max(after) < 0.05 < max(before)
