"""``recommend calibrate`` on rows of one configuration writes a model's override, not engine-wide values.

One configuration cannot tell bandwidth, per-step overhead and collectives apart: a fit of LMDeploy's Llama-2-70B TP4
rows (raised all-reduce latency, lowered bandwidth) made its 7B and 13B rows worse when written engine-wide
(benchmarks/results/accuracy.md, the user's case). Rows: tests/data/measurements/published.csv (LMD = LMDeploy
TurboMind v0.1 on A100-80G FP16, InternLM/lmdeploy@3e391df docs/en/benchmark/a100_fp16.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recommender.calibrate.api import fit_user_rows
from recommender.calibrate.fit import ape, error_stats
from recommender.calibrate.measurements import Measurement, predict
from recommender.calibrate.readers import read_published_csv
from recommender.errors import ConfigError
from recommender.profiles import engine_profile, profile_from_doc

DATA = Path(__file__).resolve().parent / "data" / "measurements"


def _doc(models: object) -> dict:
    return {"engine": "vllm", "parameters": {"hbm_bandwidth_efficiency": 0.8},
            "families": {"hopper": {"rows": 10, "parameters": {"hbm_bandwidth_efficiency": 0.7}, "models": models}}}


def test_a_models_override_applies_to_that_model_on_that_family_only():
    prof = profile_from_doc(_doc({"llama-3.1-8b": {"rows": 9, "source": "one run",
                                                    "parameters": {"hbm_bandwidth_efficiency": 0.5}}}), "t")
    assert prof.for_gpu("h100-sxm", "llama-3.1-8b").hbm_bandwidth_efficiency == 0.5   # its override
    assert prof.for_gpu("h100-sxm", "llama-2-70b").hbm_bandwidth_efficiency == 0.7    # the family's
    assert prof.for_gpu("h100-sxm").hbm_bandwidth_efficiency == 0.7
    assert prof.for_gpu("a100-80gb", "llama-3.1-8b").hbm_bandwidth_efficiency == 0.8  # another family: the engine's
    # written back as it was read
    again = profile_from_doc(yaml.safe_load(yaml.safe_dump(prof.to_dict())), "t2")
    assert again.to_dict() == prof.to_dict()
    assert again.to_dict()["families"]["hopper"]["models"]["llama-3.1-8b"]["rows"] == 9


@pytest.mark.parametrize("models", [["llama-3.1-8b"], {"llama-3.1-8b": 0.5},
                                    {"llama-3.1-8b": {"parameters": {"hbm_bandwidth_efficiency": 3.0}}},
                                    {"llama-3.1-8b": {"parameters": {"no_such_parameter": 1.0}}}])
def test_a_malformed_models_block_is_refused(models: object):
    with pytest.raises(ConfigError):
        profile_from_doc(_doc(models), "t")


@pytest.fixture(scope="module")
def lmdeploy() -> list[Measurement]:
    return [m for m in read_published_csv(DATA / "published.csv").measurements if m.engine == "lmdeploy"]


def test_one_configurations_fit_helps_it_and_leaves_other_models_as_they_were(lmdeploy: list[Measurement]):
    start = engine_profile("vllm")
    train = [m for m in lmdeploy if m.group("config") == "llama-2-70b/a100-80gb/tp4"]
    other = [m for m in lmdeploy if m.model != "llama-2-70b"]
    assert len(train) == 60 and {m.model for m in other} == {"llama-2-7b", "llama-2-13b"}
    uf = fit_user_rows(train, start)
    res = uf.result
    assert uf.kept and res.scope_model == "llama-2-70b" and res.fitted
    # the measured configuration: the fit's values (24.5% -> 7.1% median when this was written)
    before = error_stats([ape(predict(m, start), m.value) for m in train]).median_ape
    after = error_stats([ape(predict(m, res.profile), m.value) for m in train]).median_ape
    assert after < 0.5 * before
    assert after == pytest.approx(res.after["all"].median_ape)
    # every other model: exactly the start profile's predictions (the engine-wide write made them worse)
    assert [predict(m, res.profile) for m in other] == [predict(m, start) for m in other]
    # the engine-level values are the start's; the fit sits in the ampere family's models block
    for n in res.fitted:
        assert getattr(res.profile, n) == getattr(start, n)
        assert getattr(res.values, n) != getattr(start.for_gpu("a100-80gb"), n)
    amp = res.profile.family_fit("a100-80gb")
    assert amp is not None and amp.model_fit("llama-2-70b") is not None
    assert dict(amp.model_fit("llama-2-70b").parameters) == {n: getattr(res.values, n) for n in res.fitted}


def test_several_configurations_still_fit_engine_wide(lmdeploy: list[Measurement]):
    # two configurations: the k-fold check is by configuration, so a kept fit is a claim about other ones
    train = [m for m in lmdeploy if m.model != "llama-2-70b"]
    uf = fit_user_rows(train, engine_profile("vllm"))
    assert uf.check is not None and uf.check.by == "config"
    assert uf.result.scope_model == ""
    fam = uf.result.profile.family_fit("a100-80gb")
    assert fam is None or not fam.models


@pytest.mark.slow  # two calibrations of 60 rows each
def test_calibrating_again_replaces_that_models_override_and_keeps_the_others(lmdeploy: list[Measurement]):
    start = engine_profile("vllm")
    big = [m for m in lmdeploy if m.group("config") == "llama-2-70b/a100-80gb/tp4"]
    small = [m for m in lmdeploy if m.group("config") == "llama-2-7b/a100-80gb/tp1"]
    first = fit_user_rows(big, start).result.profile
    second = fit_user_rows(small, first).result.profile
    again = fit_user_rows(big, second).result.profile
    amp = again.family_fit("a100-80gb")
    assert amp is not None and sorted(m.model for m in amp.models) == ["llama-2-70b", "llama-2-7b"]
    # the 7B override survives a second calibration of the 70B; the 70B one is replaced, not duplicated
    assert amp.model_fit("llama-2-7b") == second.family_fit("a100-80gb").model_fit("llama-2-7b")  # type: ignore[union-attr]
    assert amp.model_fit("llama-2-70b").rows == 60  # type: ignore[union-attr]
    # the second 70B fit starts from the first one's values (user_base applies the model's override) and ends there
    a, b = first.for_gpu("a100-80gb", "llama-2-70b"), again.for_gpu("a100-80gb", "llama-2-70b")
    assert b.hbm_bandwidth_efficiency == pytest.approx(a.hbm_bandwidth_efficiency, rel=0.05)


def test_a_rejected_fit_of_one_configuration_writes_the_start_profile_unchanged(lmdeploy: list[Measurement],
                                                                               monkeypatch: pytest.MonkeyPatch):
    """The k-fold check says no (forced here): the written profile is the start's, not the start lifted to the rows'
    family and model (which every other model of the family would then read)."""
    import types

    import recommender.calibrate.api as api

    def no_better(*_a, **_k):
        stats = types.SimpleNamespace(median_ape=10.0)
        return types.SimpleNamespace(before={"all": stats}, after={"all": stats}, folds=5, by="row")

    monkeypatch.setattr(api, "held_out", no_better)
    # a start with an ampere family and an earlier override for the 70B: lifted to the engine level, the 70B's
    # compute efficiency would reach the 7B and 13B too
    from recommender.profiles import FamilyFit, ModelFit

    vllm = engine_profile("vllm")
    amp = FamilyFit("ampere", 10, (("hbm_bandwidth_efficiency", 0.7),),
                    models=(ModelFit("llama-2-70b", 5, (("compute_efficiency", 0.6),)),))
    start = vllm.replace(families=(*vllm.families, amp))
    train = [m for m in lmdeploy if m.group("config") == "llama-2-70b/a100-80gb/tp4"]
    uf = api.fit_user_rows(train, start)
    assert not uf.kept and uf.result.fitted == ()
    assert uf.result.profile.replace(source="") == start.replace(source="")
    other = [m for m in lmdeploy if m.model != "llama-2-70b"][:20]
    assert [predict(m, uf.result.profile) for m in other] == [predict(m, start) for m in other]


def test_a_plan_of_another_model_does_not_claim_the_calibration(tmp_path: Path):
    """A profile calibrated on 9 rows of Llama-3.1-8B on one H100 (tests/data/bench) records where its fit was
    written (``fit.scope``); a plan of that model on Hopper keeps the fit's residual scale as its error band, a plan
    of Llama-3.1-70B or on B200 predicts with the start profile's values and says so, with the policy's band."""
    from types import SimpleNamespace

    from recommender.calibrate.api import CalibrateRequest, calibrate
    from recommender.catalog import default_catalog
    from recommender.profiles import load_profile
    from recommender.search.policy import SearchPolicy
    from recommender.search.recommend_rows import calibrated_elsewhere, evidence_band, measured_rows

    files = tuple(str(p) for p in sorted((Path(__file__).resolve().parent / "data" / "bench").glob("vllm-8b-*.json")))
    run = calibrate(CalibrateRequest(results=files, out=str(tmp_path / "p.yaml")))
    prof = load_profile(run.out)
    assert prof.fit["scope"] == {"family": "hopper", "model": "llama-3.1-8b"}
    policy, cat = SearchPolicy(), default_catalog()

    def ctx(model: str) -> SimpleNamespace:
        return SimpleNamespace(profile=prof, policy=policy, model=cat.model(model))

    assert calibrated_elsewhere(prof, "llama-3.1-8b", {"hopper"}) == ""
    assert evidence_band(ctx("llama-3.1-8b"), {"hopper"}) == pytest.approx(prof.fit["residual_scale"])
    assert calibrated_elsewhere(prof, "llama-3.1-70b", {"hopper"}) == "calibrated for llama-3.1-8b on hopper only"
    assert calibrated_elsewhere(prof, "llama-3.1-8b", {"blackwell"}) == "calibrated for llama-3.1-8b on hopper only"
    for model, fams in (("llama-3.1-70b", {"hopper"}), ("llama-3.1-8b", {"blackwell"})):
        assert evidence_band(ctx(model), fams) == policy.evidence_band != prof.fit["residual_scale"]
    # the families it left as they were keep the start profile's measured rows (a B200 plan is not 'unmeasured')
    shipped = engine_profile("vllm")
    for gpu in ("b200", "mi300x", "h100-sxm"):
        assert measured_rows(prof, gpu, model_id="llama-3.1-70b") == measured_rows(shipped, gpu, model_id="llama-3.1-70b")
        assert measured_rows(prof, gpu, model_id="llama-3.1-70b")[1] > 0
    assert measured_rows(prof, "h100-sxm", model_id="llama-3.1-8b") == ("hopper", 9)   # its own 9 rows


def test_the_estimate_header_names_a_models_own_override():
    """``recommend estimate`` says which parameters it used: the family's, or the model's own override on top."""
    from recommender.catalog import default_catalog
    from recommender.estimator import build_deployment
    from recommender.render.estimate import _fit_label

    prof = profile_from_doc(_doc({"llama-3.1-8b": {"rows": 9, "source": "one run",
                                                    "parameters": {"hbm_bandwidth_efficiency": 0.5}}}), "t")
    cat = default_catalog()

    def label(model: str, gpu: str) -> str:
        return _fit_label(build_deployment(model=cat.model(model), gpu=cat.gpu(gpu), tp=1, weight_dtype="bf16",
                                           kv_dtype="bf16", profile=prof))

    assert label("llama-3.1-8b", "h100-sxm") == " (hopper family fit, llama-3.1-8b's own: 9 rows)"
    assert label("llama-2-7b", "h100-sxm") == " (hopper family fit)"
    assert label("llama-3.1-8b", "a100-80gb") == ""
