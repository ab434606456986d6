"""MTP acceptance per engine (issue 22): ``speculative.by_engine`` of a model file, read by
``estimator.default_acceptance`` and written by ``benchmarks/fit_inferencex.py`` stage D."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from bench_module import benchmark
from recommender.catalog import default_catalog
from recommender.estimator import (FALLBACK_ACCEPTANCE_RATE, acceptance_by_engine, EstimateRequest, default_acceptance, estimate_request,
                                   parse_speculative_config)

ROOT = Path(__file__).resolve().parents[1]
MODEL_FILE = ROOT / "catalogs" / "models" / "deepseek-v3.yaml"


def _spec_doc() -> dict:
    return yaml.safe_load(MODEL_FILE.read_text())["speculative"]


def _fit_module():
    return benchmark("fit_inferencex")


def _with_meta(speculative: object):
    cat = default_catalog()
    meta = {**cat.model_meta, "deepseek-v3": {**cat.model_meta["deepseek-v3"], "speculative": speculative}}
    return dataclasses.replace(cat, model_meta=meta)


def test_the_shipped_trtllm_rate_is_its_own_and_vllm_keeps_the_shared_pair_fit():
    doc = _spec_doc()
    cat = default_catalog()
    model = cat.models["deepseek-v3"]
    trt = doc["by_engine"]["trtllm"]
    # the file's own figures: the engine's rate beat the shared one held out by configuration
    assert trt["held_out_tpot_mape_pct"] < trt["shared_rate_tpot_mape_pct"]
    assert 0.2 <= trt["acceptance_rate"] <= 1.0 and trt["acceptance_rate"] != doc["acceptance_rate"]
    assert {e: a for e, (a, _) in acceptance_by_engine(cat, model).items()} == {e: v["acceptance_rate"] for e, v in doc["by_engine"].items()}
    a, source = default_acceptance(cat, model, "trtllm")
    assert a == pytest.approx(trt["acceptance_rate"]) and "trtllm" in source
    for engine in (None, "vllm", "no-such-engine"):
        assert default_acceptance(cat, model, engine)[0] == pytest.approx(doc["acceptance_rate"])


def test_the_estimate_of_an_engine_runs_its_verifier_at_its_own_rate():
    """k = 3 drafts at the trtllm rate a: a verify step emits 1 + a + a^2 + a^3 tokens (speculative.py)."""
    a = _spec_doc()["by_engine"]["trtllm"]["acceptance_rate"]
    kw = dict(model="deepseek-v3", gpu="b200", tp=8, weight_dtype="fp8", kv_dtype="fp8", concurrency="8",
              prompt_tokens=1000, output_tokens=1000, speculative_config='{"method": "mtp", "num_speculative_tokens": 3}')
    dep, _, _ = estimate_request(EstimateRequest(engine="trtllm", **kw))
    assert dep.spec is not None and dep.spec.acceptance_rate == pytest.approx(a)
    assert dep.spec.tokens_per_step == pytest.approx(1 + a + a**2 + a**3)
    vdep, _, _ = estimate_request(EstimateRequest(engine="vllm", **kw))
    assert vdep.spec is not None and vdep.spec.acceptance_rate == pytest.approx(_spec_doc()["acceptance_rate"])
    # --acceptance-rate still wins over every catalog value
    odep, _, _ = estimate_request(EstimateRequest(engine="trtllm", acceptance_rate=0.5, **kw))
    assert odep.spec is not None and odep.spec.acceptance_rate == 0.5 and odep.spec.acceptance_source == "--acceptance-rate"


def test_lookup_falls_back_per_level():
    model = default_catalog().models["deepseek-v3"]
    only_shared = _with_meta({"acceptance_rate": 0.61, "source": "s"})
    assert default_acceptance(only_shared, model, "trtllm") == (0.61, "s")
    per = _with_meta({"acceptance_rate": 0.61, "by_engine": {"sglang": {"acceptance_rate": 0.5}}})
    assert default_acceptance(per, model, "sglang")[0] == 0.5 and default_acceptance(per, model, "trtllm")[0] == 0.61
    # malformed entries are skipped, never raised
    bad = _with_meta({"acceptance_rate": 0.61, "by_engine": {"sglang": "fast"}})
    assert default_acceptance(bad, model, "sglang")[0] == 0.61 and acceptance_by_engine(bad, model) == {}
    assert default_acceptance(_with_meta("x"), model, "sglang")[0] == FALLBACK_ACCEPTANCE_RATE
    spec = parse_speculative_config('{"method": "mtp"}', model, catalog=per, engine="sglang")
    assert spec is not None and spec.acceptance_rate == 0.5 and spec.num_speculative_tokens == model.mtp_layers


def test_the_fit_rewrites_the_block_in_place_and_drops_it_when_none_ships():
    fx = _fit_module()
    text = MODEL_FILE.read_text()
    without = fx.merge_by_engine(text, {})
    assert "by_engine" not in without and yaml.safe_load(without)["speculative"]["acceptance_rate"] == _spec_doc()["acceptance_rate"]
    row = {"acceptance_rate": 0.7, "rows": 17, "configurations": 8, "held_out_tpot_mape_pct": 11.3, "shared_tpot_mape_pct": 25.2}
    once = fx.merge_by_engine(without, {"atom": row})
    twice = fx.merge_by_engine(once, {"atom": row})
    assert once == twice
    doc = yaml.safe_load(twice)
    assert doc["speculative"]["by_engine"] == {"atom": {"acceptance_rate": 0.7, "rows": 17, "configurations": 8,
                                                         "held_out_tpot_mape_pct": 11.3, "shared_rate_tpot_mape_pct": 25.2,
                                                         "source": "fitted on InferenceX DeepSeek-R1 atom MTP rows "
                                                                   "(benchmarks/fit_inferencex.py stage D)"}}
    # every other key of the file is untouched
    assert {k: v for k, v in doc.items() if k != "speculative"} == {k: v for k, v in yaml.safe_load(text).items() if k != "speculative"}


def test_a_case_gets_its_engines_rate():
    fx = _fit_module()
    bx = fx.bx

    cases = bx.single_node_cases(bx.DEFAULT_CSV)
    trt = next(c for c in cases if c.framework == "trt" and c.mtp)
    sgl = next(c for c in cases if c.framework == "sglang" and c.mtp)
    acc = {"": 0.568, "trtllm": 0.7}
    assert fx.acceptance_for(acc, trt) == 0.7 and fx.acceptance_for(acc, sgl) == 0.568
    assert fx.acceptance_for(0.6, trt) == 0.6 and fx.acceptance_for(None, trt) is None


def test_held_out_folds_leave_whole_configurations_out():
    """``folds_of(k)`` deals configurations round-robin; ``k = 0`` is one fold per configuration (leave one out), and
    ``held_out_folds`` predicts every case from a fit that never saw its configuration."""
    fx = _fit_module()
    bx = fx.bx

    cases = [c for c in bx.single_node_cases(bx.DEFAULT_CSV) if c.gpu == "h200" and c.framework == "trt"]
    configs = {c.config for c in cases}
    loo = fx.folds_of(cases, 0)
    assert len(loo) == len(configs) and all(len(f) == 1 for f in loo) and set().union(*loo) == configs
    three = fx.folds_of(cases, 3)
    assert len(three) == 3 and set().union(*three) == configs and sum(len(f) for f in three) == len(configs)

    seen: list[tuple[set, set]] = []

    def predict(train, test):
        seen.append(({c.config for c in train}, {c.config for c in test}))
        return {j: {"tpot": 1.0} for j in range(len(test))}

    held = fx.held_out_folds(cases, 0, predict)
    assert sorted(held) == list(range(len(cases)))
    assert len(seen) == len(configs)
    for train, test in seen:
        assert len(test) == 1 and not (train & test) and train | test == configs


def test_held_out_rows_run_at_a_rate_fitted_without_their_configuration(monkeypatch):
    """An engine with its own acceptance refits it per fold on its MTP rows outside the fold (no stage A or B refit
    here: ``shipped_a`` / ``shipped_b`` empty), and the fold's rows are predicted at that rate."""
    fx = _fit_module()
    bx = fx.bx

    cases = fx.scored([c for c in bx.single_node_cases(bx.DEFAULT_CSV) if c.gpu == "h200" and c.framework == "trt"])
    calls: list[set] = []

    def fake_fit(rows, cat, params):
        calls.append({c.config for c in rows})
        return 0.5 + 0.01 * len(calls)

    used: list[tuple[float | None, object]] = []
    real = bx.predict

    def spy(c, **kw):
        used.append((kw.get("acceptance_rate"), c.config))
        return real(c, **kw)

    monkeypatch.setattr(fx, "fit_rate", fake_fit)
    monkeypatch.setattr(bx, "predict", spy)
    held = fx.held_out_predictions(cases, 0, None, None, {}, set())
    assert len(held) == len(cases)
    mtp_configs = {c.config for c in cases if c.mtp and c.conc <= fx.MTP_MAX_CONC}
    # H200 TensorRT-LLM has one such configuration: held out, its engine has no MTP row left and gets the shared rate
    assert len(mtp_configs) == 1
    folds = [next(iter(f)) for f in fx.folds_of(cases, 0)]
    refit = [cfg for cfg in folds if mtp_configs - {cfg}]
    assert len(calls) == len(refit) == len(folds) - 1
    for i, (config, trained) in enumerate(zip(refit, calls)):
        assert config not in trained and trained == mtp_configs - {config}
        # the fold's MTP rows ran at this fold's rate, 0.5 + 0.01 (i + 1)
        rates = {a for a, cfg in used if cfg == config and a is not None}
        if any(c.mtp for c in cases if c.config == config):
            assert len(rates) == 1 and rates.pop() == pytest.approx(0.5 + 0.01 * (i + 1))
    (alone,) = mtp_configs
    shared = default_acceptance(default_catalog(), default_catalog().models["deepseek-v3"])[0]
    assert {a for a, cfg in used if cfg == alone} == {shared}
