"""``recommend calibrate`` on rows of one GPU family and several configurations writes that family's block.

Before, such a fit was written as the profile's engine-level values and the family's block was dropped: a fit of
H100 rows became the values of every family without a block of its own (vLLM's B200), and the block's per-model
overrides and release epochs were lost. Rows: tests/data/measurements/published.csv (TRT017 = TensorRT-LLM 0.17
trtllm-bench on H100 SXM, NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md; AMDVLLM = vLLM ROCm on
8 x MI300X, amd-mi300x.csv; VLLMFP8KV = vLLM on B200).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.calibrate.api import fit_user_rows
from recommender.calibrate.measurements import Measurement, predict
from recommender.calibrate.readers import read_published_csv
from recommender.calibrate.report import PROFILE_PARAMETERS, render_text
from recommender.profiles import ModelFit, engine_profile

DATA = Path(__file__).resolve().parent / "data" / "measurements"
CONFIGS = ("llama-2-70b/h100-sxm/tp2", "llama-2-70b/h100-sxm/tp4", "llama-2-7b/h100-sxm/tp1")


@pytest.fixture(scope="module")
def rows() -> tuple[list[Measurement], list[Measurement], list[Measurement]]:
    pub = read_published_csv(DATA / "published.csv").measurements
    amd = read_published_csv(DATA / "amd-mi300x.csv").measurements
    h100 = [m for m in pub if m.engine == "trtllm" and m.group("config") in CONFIGS]
    b200 = [m for m in pub if m.gpu == "b200"]
    assert len(h100) == 8 and b200 and amd
    return h100, b200, list(amd)


def _with_overrides():
    """vLLM's shipped profile with hopper overrides for a measured model and for one the rows do not hold."""
    start = engine_profile("vllm")
    fams = []
    for f in start.families:
        if f.family == "hopper":
            f = f.__class__(**{**f.__dict__, "models": (
                ModelFit("llama-2-70b", 9, (("hbm_bandwidth_efficiency", 0.5), ("step_overhead_s", 0.004)), "a run"),
                ModelFit("mistral-7b", 9, (("hbm_bandwidth_efficiency", 0.6),), "another run"))})
        fams.append(f)
    return start.replace(families=tuple(fams))


def test_the_fit_is_the_familys_and_other_families_keep_the_start(rows):
    h100, b200, amd = rows
    start = engine_profile("vllm")
    uf = fit_user_rows(h100, start)
    res = uf.result
    assert uf.kept and res.fitted and res.scope_gpu == "h100-sxm" and res.scope_model == ""
    # engine-level values: the start's (before, these were the H100 fit, which B200 has no block to shadow)
    for n in res.fitted:
        assert getattr(res.profile, n) == getattr(start, n)
    hop = res.profile.family_fit("h100-sxm")
    assert hop is not None and hop.rows == 8 and "3 configurations" in hop.source
    assert {n: dict(hop.parameters)[n] for n in res.fitted} == {n: getattr(res.values, n) for n in res.fitted}
    assert res.values.family == "hopper"
    # the measured rows get the fit's predictions; B200 and MI300X rows exactly the start's
    after = sorted(abs(predict(m, res.profile) / m.value - 1) * 100 for m in h100)
    assert after[len(after) // 2 - 1:len(after) // 2 + 1] == pytest.approx(
        sorted(abs(a / m - 1) * 100 for _, m, _, a in res.predictions)[3:5])
    assert [predict(m, res.profile) for m in b200 + amd] == [predict(m, start) for m in b200 + amd]
    assert "hopper family's parameters" in render_text(res)


def test_a_measured_models_override_goes_and_other_models_keep_theirs(rows):
    h100, _, _ = rows
    start = _with_overrides()
    res = fit_user_rows(h100, start).result
    hop = res.profile.family_fit("h100-sxm")
    assert hop is not None and res.fitted
    # rows of two models: the fit saw llama-2-70b without its override, so the override goes
    assert hop.model_fit("llama-2-70b") is None
    assert hop.model_fit("mistral-7b") == start.family_fit("h100-sxm").model_fit("mistral-7b")


def test_rows_of_one_model_keep_the_parameters_of_its_override_that_were_not_fitted(rows):
    h100, _, _ = rows
    start = _with_overrides()
    seventy = [m for m in h100 if m.model == "llama-2-70b"]
    uf = fit_user_rows(seventy, start, check=False)
    res = uf.result
    assert res.fitted and "step_overhead_s" not in res.fitted and "hbm_bandwidth_efficiency" in res.fitted
    kept = res.profile.family_fit("h100-sxm").model_fit("llama-2-70b")
    assert kept is not None and dict(kept.parameters) == {"step_overhead_s": 0.004}
    seen = res.profile.for_gpu("h100-sxm", "llama-2-70b")
    assert seen.step_overhead_s == 0.004
    assert seen.hbm_bandwidth_efficiency == dict(res.profile.family_fit("h100-sxm").parameters)["hbm_bandwidth_efficiency"]
    assert [predict(m, res.profile) for m in seventy] == pytest.approx([a for _, _, _, a in res.predictions])


def test_a_rejected_fit_writes_the_start_as_it_was(rows):
    h100, _, _ = rows
    start = _with_overrides()
    bad = [m for m in read_published_csv(DATA / "published.csv").measurements
           if m.engine == "trtllm" and m.group("config") in (*CONFIGS, "llama-3.1-70b/h100-sxm/tp1")]
    uf = fit_user_rows(bad, start)
    assert not uf.kept
    assert uf.result.profile.to_dict()["families"] == start.to_dict()["families"]
    assert {n: getattr(uf.result.profile, n) for n in PROFILE_PARAMETERS} == {
        n: getattr(start, n) for n in PROFILE_PARAMETERS}
