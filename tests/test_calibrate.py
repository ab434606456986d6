"""Calibration: readers map rows to the right loads and SI values, the fit recovers known parameters,
reports what the data cannot constrain, and generalises across sources of published.csv."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from recommender.calibrate.fit import FitOptions, fit_profile, held_out, split_error, summarize
from recommender.calibrate.measurements import (Measurement, closed_at, deployment, in_flight, parse_metric, predict,
                                                resolve_gpu, resolve_model)
from recommender.calibrate.readers import read_bench_json, read_published_csv, read_results
from recommender.calibrate.report import profile_document, write_profile
from recommender.errors import CalibrationError
from recommender.perf.steady import Load
from recommender.perf.step import EngineLimits
from recommender.profiles import BOUNDS, EngineProfile, load_profile

DATA = Path(__file__).resolve().parent / "data"
CSV = DATA / "measurements" / "published.csv"
REF_JSON = DATA / "bench" / "reference-example.json"
PROFILES = Path(__file__).resolve().parent.parent / "catalogs" / "profiles"


@pytest.fixture(scope="module")
def published():
    return read_published_csv(CSV)


def by_id(read, rid: str) -> Measurement:
    return next(m for m in read.measurements if m.id == rid)


# =========================================================================== names and metrics
@pytest.mark.parametrize("name, quantity, unit, scale", [
    ("output_tok_s_total", "output_tokens_per_s", 1.0, "replica"),
    ("output_tok_s_per_gpu", "output_tokens_per_s", 1.0, "gpu"),
    ("output_tok_s_per_user", "output_tokens_per_s", 1.0, "user"),
    ("ttft_ms_median", "ttft_s", 1e-3, "replica"),
    ("ttft_s_mean", "ttft_s", 1.0, "replica"),
    ("token_latency_s_p50", "tpot_s", 1.0, "replica"),
    ("itl_ms_median", "tpot_s", 1e-3, "replica"),
    ("tpot_ns_mean", "tpot_s", 1e-9, "replica"),
    ("itl_ms_fit_intercept", "itl_intercept_s", 1e-3, "replica"),
    ("itl_ms_per_input_token_fit_slope", "itl_slope_s_per_token", 1e-3, "replica"),
])
def test_metric_names_give_quantity_and_unit(name, quantity, unit, scale):
    assert parse_metric(name, "t") == (quantity, unit, scale)


def test_metric_without_unit_or_unknown_is_an_error():
    with pytest.raises(CalibrationError, match="time unit"):
        parse_metric("ttft_median", "f.csv row X")
    with pytest.raises(CalibrationError, match="not one the model predicts"):
        parse_metric("gpu_power_w", "f.csv row X")


@pytest.mark.parametrize("text, gid", [
    ("H200 141GB HBM3", "h200"), ("H100 80GB HBM3", "h100-sxm"), ("H100 SXM 80GB", "h100-sxm"), ("H100", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("A100-SXM4-80GB", "a100-80gb"), ("A100-SXM-80GB (330W power limit)", "a100-80gb"),
    ("A100 40GB", "a100-40gb"), ("L40S", "l40s"), ("B200", "b200"), ("GH200 480GB", None), ("AMD MI250X (one GCD)", None),
    ("l40", None),
])
def test_gpu_names(text, gid):
    assert resolve_gpu(text) == gid


@pytest.mark.parametrize("text, mid", [
    ("Llama-2-7B (doc: \"LLaMA 7B\")", "llama-2-7b"), ("Llama-2-13B (blog: llama_13b)", "llama-2-13b"),
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Llama-3.1-405B", "llama-3.1-405b"), ("gpt-oss-20b", "gpt-oss-20b"), ("GPT-J-6B", None), ("fake-model", None),
])
def test_model_names(text, mid):
    assert resolve_model(text) == mid


# =========================================================================== published CSV
def test_published_rows_used_and_skipped_with_reasons(published):
    with CSV.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 644                                        # README: 644 rows
    gh200 = sum("GH200" in r["gpu"] for r in rows)
    gptj = sum(r["model"] == "GPT-J-6B" for r in rows)
    mi250 = sum("MI250X" in r["gpu"] for r in rows)
    tp_unknown = sum(r["tp"].startswith("unknown") for r in rows)
    no_len = sum(r["isl"].startswith("ShareGPT") for r in rows)
    assert (gh200, gptj, mi250, tp_unknown, no_len) == (35, 8, 2, 3, 6)
    assert len(published.skipped) == gh200 + gptj + mi250 + tp_unknown + no_len
    assert len(published.measurements) == 644 - 54
    reasons = " ".join(s.reason for s in published.skipped)
    assert "GH200" in reasons and "GPT-J-6B" in reasons


def test_published_rows_become_loads_in_si_units(published):
    m = by_id(published, "TRT061-005")                 # 2657 out tok/s per GPU at TP 2, static batch 1024
    assert (m.engine, m.model, m.gpu, m.tp, m.weight_dtype, m.kv_dtype) == ("trtllm", "llama-2-70b", "h100-sxm", 2, "fp8", "fp8")
    assert m.load == Load("static", 1024, 0, 128, 128) and m.value == pytest.approx(2657 * 2)
    m = by_id(published, "LMD-003")                    # median token latency 0.009 s, batch 1, 1 in / 128 out, fp16
    assert (m.quantity, m.value, m.load, m.weight_dtype, m.kv_dtype) == ("tpot_s", 0.009, Load("static", 1, 0, 1, 128), "fp16", "bf16")
    m = by_id(published, "VLLMFP8KV-001")              # median TTFT 763.6 ms at concurrency 8, ~20k / ~2k
    assert m.quantity == "ttft_s" and m.value == pytest.approx(0.7636) and m.load == Load("closed", 8, 0, 20000, 2000)
    m = by_id(published, "VLLMFP8KV-017")              # slope 4.37e-5 ms per input token
    assert m.quantity == "itl_slope_s_per_token" and m.value == pytest.approx(4.37e-8)
    m = by_id(published, "GPTFAST-001")                # bf16 base, batch 1, 5-token prompt, generate.py's 200 tokens
    assert (m.engine, m.weight_dtype, m.load) == ("gpt-fast", "bf16", Load("static", 1, 0, 5, 200))
    assert by_id(published, "GPTFAST-002").weight_dtype == "int8" and by_id(published, "GPTFAST-003").weight_dtype == "int4"
    assert by_id(published, "VLLMFP8KV-007").weight_dtype == "mxfp4"   # gpt-oss checkpoint default


def test_trtllm_bench_engine_settings(published):
    # trtllm-bench build: KV = 0.95 x (memory - weights); requests of ISL+OSL tokens that fit, clamped to 64..4096;
    # tokens = batch x (1 + ISL/OSL) clamped to 2048..32768. Llama-3.1-8B FP8 on H200: fp8 KV per token
    # 2 x 32 layers x 8 heads x 128 x 1 B = 65,536 B; weights ~9 GB; memory as the driver reports it, 143,771 MiB
    # (catalogs/gpus/h200.yaml device_memory, from nvidia-smi)
    kv_free = 0.95 * (143771 * 2**20 - 9e9)
    m = by_id(published, "TRT017-001")                 # 128 / 128: 256 tokens -> ~7,500 requests -> clamp 4096
    assert kv_free / (256 * 65536) > 4096
    assert m.load.mode == "max" and m.limits == EngineLimits(4096, 8192, engine_timer=True)  # trtllm-bench: its own timer
    m = by_id(published, "TRT017-041")                 # 20000 / 2000: 22,000 tokens -> ~87 requests
    reqs = kv_free / (22000 * 65536)
    assert abs(m.limits.max_num_seqs - reqs) <= 2 and m.limits.max_num_batched_tokens == 2048


def test_csv_errors_name_file_and_field(tmp_path):
    bad = tmp_path / "mine.csv"
    bad.write_text("id,model,gpu,tp\nA-1,Llama-2-7B,H100,1\n")
    with pytest.raises(CalibrationError, match=r"mine\.csv.*lacks column\(s\).*metric"):
        read_published_csv(bad)
    lines = CSV.read_text().splitlines()
    header, row = lines[0], lines[2]                   # LMD-002, value 0.011
    bad.write_text(header + "\n" + row.replace(",ttft_s_mean,0.011,", ",ttft_s_mean,fast,") + "\n")
    # one bad row is skipped with its reason (file and field named), not fatal to the file
    r = read_published_csv(bad)
    assert not r.measurements and len(r.skipped) == 1
    assert r.skipped[0].id == "LMD-002" and re.search(r"mine\.csv row LMD-002: field 'value'", r.skipped[0].reason)
    with pytest.raises(CalibrationError, match=r"no usable measurements.*field 'value'"):
        read_results([bad])
    good = tmp_path / "good.csv"
    good.write_text(header + "\n" + row + "\n" + lines[3] + "\n")
    both = read_results([good, bad, good, tmp_path / "." / "good.csv"])  # the same file given thrice counts once
    assert len(both.measurements) == len(read_published_csv(good).measurements) and len(both.skipped) == 1
    with pytest.raises(CalibrationError, match="does not exist"):
        read_published_csv(tmp_path / "nope.csv")


# =========================================================================== bench-serve JSON
def test_reference_bench_file(tmp_path):
    r = read_bench_json(REF_JSON)
    assert len(r.measurements) == 3
    m = r.measurements[0]
    # metadata tp="1", gpu="H100"; model_id "fake-model" is unknown, tokenizer_id names Llama-3.1-8B-Instruct
    assert (m.model, m.gpu, m.tp, m.weight_dtype, m.kv_dtype) == ("llama-3.1-8b", "h100-sxm", 1, "bf16", "bf16")
    # 1280 input / 320 output tokens over 20 completed requests; rate 50/s, max_concurrency 8
    assert m.load == Load("closed", 8, 0, 64, 16) and m.rate_per_s == 50.0 and m.requests == 20
    vals = {x.quantity: x.value for x in r.measurements}
    assert vals["output_tokens_per_s"] == pytest.approx(627.6982479630512)
    assert vals["ttft_s"] == pytest.approx(22.473290550004776e-3)           # mean (as predicted), ms -> s
    assert vals["tpot_s"] == pytest.approx(5.664402459998806e-3)


def _write(tmp_path: Path, doc, name="run.json") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("output_throughput"), "'output_throughput'"),
    (lambda d: d.pop("gpu"), "'gpu'"),
    (lambda d: d.pop("tp"), "'tp'"),
    (lambda d: d.update(tp="two"), "'tp'"),
    (lambda d: d.update(gpu="Voodoo 5"), "'gpu'"),
    (lambda d: d.update(model="llama-9000"), "'model'"),
    (lambda d: d.update(tokenizer_id="acme/unknown-lm"), "'model'"),
    (lambda d: d.update(completed=0), "'completed'"),
    (lambda d: d.update(total_input_tokens="many"), "'total_input_tokens'"),
    (lambda d: d.pop("median_tpot_ms") and d.pop("mean_tpot_ms"), "'mean_tpot_ms'"),
    (lambda d: d.update(max_concurrency=-3), "'max_concurrency'"),
])
def test_bad_bench_files_name_file_and_field(tmp_path, edit, field):
    doc = json.loads(REF_JSON.read_text())
    edit(doc)
    p = _write(tmp_path, doc)
    with pytest.raises(CalibrationError) as e:
        read_bench_json(p)
    assert str(p) in str(e.value) and field in str(e.value)


def test_malformed_json_and_wrong_shapes(tmp_path):
    p = _write(tmp_path, '{"date": "2026", "completed": 3,')
    with pytest.raises(CalibrationError, match=rf"{p}: not valid JSON"):
        read_bench_json(p)
    p = _write(tmp_path, "[1, 2, 3]", "list.json")
    with pytest.raises(CalibrationError, match="expected a JSON object"):
        read_bench_json(p)
    with pytest.raises(CalibrationError, match="sidecar"):
        read_results([tmp_path / "x.yaml"])


def test_sidecar_and_flags_fill_what_the_file_lacks(tmp_path):
    doc = json.loads(REF_JSON.read_text())
    del doc["gpu"], doc["tp"]
    p = _write(tmp_path, doc)
    with pytest.raises(CalibrationError, match="'gpu'.*--gpu"):
        read_bench_json(p)
    m = read_bench_json(p, {"gpu": "a100", "tp": 2}).measurements[0]          # flags
    assert (m.gpu, m.tp) == ("a100-80gb", 2)
    (tmp_path / "run.json.yaml").write_text("gpu: H200\ntp: 1\nkv_dtype: fp8\n")  # sidecar beats flags
    m = read_bench_json(p, {"gpu": "a100", "tp": 2}).measurements[0]
    assert (m.gpu, m.tp, m.kv_dtype) == ("h200", 1, "fp8")
    doc["gpu"], doc["tp"] = "H100", "1"                                        # the file beats both
    p.write_text(json.dumps(doc))
    assert read_bench_json(p, {"gpu": "a100"}).measurements[0].gpu == "h100-sxm"


@pytest.mark.parametrize(("sidecar", "words"), [
    ("tp: 1\ntp: 2\ngpu: h100\n", "duplicate key 'tp'"),          # the last one had silently won (TP 2)
    ("gpu: h100\ntp: 1\nnum_nodes: 2\n", "unknown key(s) 'num_nodes'"),  # ignored before
])
def test_a_sidecar_key_given_twice_or_unknown_is_refused(tmp_path, sidecar, words):
    doc = json.loads(REF_JSON.read_text())
    del doc["gpu"], doc["tp"]
    p = _write(tmp_path, doc)
    (tmp_path / "run.json.yaml").write_text(sidecar)
    with pytest.raises(CalibrationError, match="sidecar") as e:
        read_bench_json(p)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_sidecar_states_the_data_parallel_layout(tmp_path):
    """``data_parallel_size`` was an unknown sidecar key (refused) until calibrate read DP runs (2026-12-07)."""
    doc = json.loads(REF_JSON.read_text())
    del doc["gpu"], doc["tp"]
    p = _write(tmp_path, doc)
    (tmp_path / "run.json.yaml").write_text("gpu: h100\ntp: 1\ndata_parallel_size: 2\n")
    assert {m.dp for m in read_bench_json(p).measurements} == {2}


def test_append_result_json_lines(tmp_path):
    doc = json.loads(REF_JSON.read_text())
    p = _write(tmp_path, json.dumps(doc) + "\n" + json.dumps(dict(doc, max_concurrency=4)) + "\n", "runs.jsonl")
    r = read_bench_json(p)
    assert len(r.measurements) == 6 and {m.load.batch for m in r.measurements} == {8, 4}


# =========================================================================== predictions
def test_itl_fit_rows_predict_the_batch1_step_by_hand():
    # Llama-3.1-8B bf16 on H100 at 100 % bandwidth, no overhead: weights 8,030,261,248 x 2 B / 3.35 TB/s = 4.794 ms;
    # slope = KV bytes per token (131,072 B, hardware-and-models.md 2b) / 3.35 TB/s = 3.913e-8 s per token.
    ideal = EngineProfile(hbm_bandwidth_efficiency=1.0, step_overhead_s=0.0)
    base = dict(id="x", source="x", file="x", engine="vllm", model="llama-3.1-8b", gpu="h100-sxm", tp=1,
                weight_dtype="bf16", kv_dtype="bf16", load=Load("context", 1, 1), value=1.0, raw_metric="x")
    icpt = predict(Measurement(quantity="itl_intercept_s", **base), ideal)
    slope = predict(Measurement(quantity="itl_slope_s_per_token", **base), ideal)
    assert icpt == pytest.approx(8_030_261_248 * 2 / 3.35e12, rel=0.01)
    assert slope == pytest.approx(131_072 / 3.35e12, rel=0.01)


def _bench_measurement(rate, n_requests, quantity="output_tokens_per_s", cap=64):
    return Measurement(id="b", source="b", file="b", engine="vllm", model="llama-3.1-8b", gpu="h100-sxm", tp=1,
                       weight_dtype="bf16", kv_dtype="bf16", load=Load("closed", cap, 0, 512, 128), quantity=quantity,
                       value=1.0, raw_metric="x", limits=EngineLimits(1024, 8192), rate_per_s=rate, requests=n_requests)


def test_finite_open_loop_run_throughput():
    # 10 requests at 0.1 request/s: the last one arrives after 90 s and finishes one latency later, so the run
    # delivers 10 x 128 tokens in 90 s + e2e, far below the steady-state capacity.
    prof = EngineProfile()
    m = _bench_measurement(0.1, 10)
    dep = deployment(m, prof)
    assert in_flight(dep, m) == 1.0                    # 0.1/s x ~1.3 s e2e < 1 request in flight
    e2e = closed_at(dep, 1.0, 512, 128)[2]
    assert predict(m, prof) == pytest.approx(10 * 128 / (90 + e2e))


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=0.05, max_value=200.0))
def test_little_law_holds_for_in_flight_requests(rate):
    prof = EngineProfile()
    m = _bench_measurement(rate, 1000)
    dep = deployment(m, prof)
    n = in_flight(dep, m)
    e2e = closed_at(dep, n, 512, 128)[2]
    if n == 64:                                        # saturated at the concurrency cap
        assert rate * e2e >= 64 - 1e-6
    elif n == 1.0:
        assert rate * closed_at(dep, 1.0, 512, 128)[2] <= 1.0 + 1e-6
    else:
        assert n == pytest.approx(rate * e2e, rel=1e-3)


# =========================================================================== the fit
TRUE = EngineProfile(hbm_bandwidth_efficiency=0.70, compute_efficiency=0.45, allreduce_latency_s=25e-6,
                     allreduce_bandwidth_efficiency=0.55, step_overhead_s=1.8e-3)
RECOVERABLE = ("hbm_bandwidth_efficiency", "compute_efficiency", "allreduce_latency_s",
               "allreduce_bandwidth_efficiency", "step_overhead_s")


def synthetic(profile: EngineProfile) -> list[Measurement]:
    """TTFT / TPOT / throughput of small and large static batches and a closed loop, TP 1 to 8, made by the model."""
    confs = [("llama-3.1-8b", "h100-sxm", 1, "bf16"), ("llama-3.1-70b", "h100-sxm", 4, "fp8"),
             # B200: its catalog entry has no measured all-reduce bus bandwidth, so the profile's
             # allreduce_bandwidth_efficiency sets its collectives (H100/H200/A100 use the measured busbw)
             ("llama-3.1-70b", "b200", 8, "bf16"), ("mistral-7b", "a100-80gb", 1, "bf16"),
             ("qwen3-32b", "h200", 2, "bf16")]
    loads = [Load("static", 1, 0, 4096, 128), Load("static", 64, 0, 1024, 256), Load("closed", 16, 0, 2048, 256)]
    out = []
    for model, gpu, tp, wd in confs:
        for ld in loads:
            for q in ("ttft_s", "tpot_s", "output_tokens_per_s"):
                m = Measurement(id=f"{model}/{gpu}/{tp}/{ld.mode}{ld.batch}/{q}", source=f"{model}", file="synthetic",
                                engine="vllm", model=model, gpu=gpu, tp=tp, weight_dtype=wd, kv_dtype="bf16", load=ld,
                                quantity=q, value=1.0, raw_metric=q)
                out.append(Measurement(**{**m.__dict__, "value": predict(m, profile)}))
    return out


def test_parameters_used_to_generate_data_are_recovered():
    ms = synthetic(TRUE)
    res = fit_profile(ms, EngineProfile(), FitOptions(parameters=RECOVERABLE))   # start: provisional profile
    assert set(res.fitted) == set(RECOVERABLE) and not res.unconstrained
    for n in RECOVERABLE:
        assert getattr(res.profile, n) == pytest.approx(getattr(TRUE, n), rel=0.03), n
    assert res.after["all"].p90_ape < 0.5 and res.before["all"].median_ape > 5


@pytest.mark.slow
def test_step_latencies_only_seen_amortised_are_reported_not_invented(published):
    # TRT017 runs at the largest batch the KV cache holds: a fixed cost per step is spread over hundreds of
    # sequences, so step_overhead_s / allreduce latencies must keep their start values and say why.
    ms = [m for m in published.measurements if m.source == "TRT017"][::6]
    start = EngineProfile(engine="trtllm")
    res = fit_profile(ms, start)
    for n in ("step_overhead_s", "allreduce_latency_s"):
        assert n in res.unconstrained and "amortised" in res.unconstrained_reasons[n]
        assert getattr(res.profile, n) == getattr(start, n)
    assert res.profile.allreduce_latency_pcie_s == start.allreduce_latency_pcie_s
    assert "no effect" in res.unconstrained_reasons["layer_launch_overhead_s"]   # CUDA graphs on everywhere
    assert "hbm_bandwidth_efficiency" in res.fitted


def test_one_configuration_cannot_separate_bandwidth_from_overhead():
    # batch-1 decode of one model on one GPU: step = weights / (bw x eff) + overhead; eff and overhead trade off
    ms = [m for m in synthetic(TRUE) if m.model == "llama-3.1-8b" and m.load.batch == 1 and m.quantity == "tpot_s"]
    res = fit_profile(ms, EngineProfile(), FitOptions(parameters=("hbm_bandwidth_efficiency", "step_overhead_s")))
    assert len(res.fitted) <= 1 and len(res.unconstrained) >= 1
    assert res.after["all"].median_ape < 1.0          # still fits the one number


@pytest.mark.slow
def test_calibrating_on_some_sources_lowers_error_on_the_others(published):
    # trtllm: fit on (every third) TRT017 row, predict the TRT061 and TRTBLOG tables it never saw.
    train = [m for m in published.measurements if m.source == "TRT017"][::3]
    test = [m for m in published.measurements if m.source in ("TRT061", "TRTBLOG")]
    assert len(test) == 18
    _, h = split_error(train, test, EngineProfile(engine="trtllm"))
    assert h.after["all"].median_ape < h.before["all"].median_ape
    assert h.after["all"].p90_ape < h.before["all"].p90_ape


@pytest.mark.slow
def test_leave_one_model_out_on_gpt_fast(published):
    ms = [m for m in published.measurements if m.engine == "gpt-fast"]
    h = held_out(ms, EngineProfile(engine="gpt-fast"), by="model")
    assert h.folds == len({m.model for m in ms}) and h.after["all"].n == len(ms)
    assert h.after["all"].median_ape < h.before["all"].median_ape


def test_summaries():
    ms = synthetic(TRUE)[:3]
    s = summarize(ms, [m.value * 1.1 for m in ms])
    assert s["all"].n == 3 and s["all"].median_ape == pytest.approx(10.0) and s["all"].p90_ape == pytest.approx(10.0)


# =========================================================================== profiles
def test_profile_yaml_round_trip_is_atomic(tmp_path):
    prof = TRUE.replace(engine="mine", source="test")
    out = write_profile(tmp_path / "p" / "mine.yaml", profile_document(prof, {"n_rows": 3}), "header line")
    back = load_profile(out)
    for n in RECOVERABLE:
        assert getattr(back, n) == pytest.approx(getattr(prof, n), rel=1e-3)
    assert back.engine == "mine" and back.fit["n_rows"] == 3
    assert [p.name for p in out.parent.iterdir()] == ["mine.yaml"]            # no temporary file left behind
    assert out.read_text().startswith("# header line\n")


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "lmdeploy", "gpt-fast", "sglang", "atom"])
def test_shipped_profiles_load_inside_bounds(engine):
    doc = yaml.safe_load((PROFILES / f"{engine}.yaml").read_text())
    prof = load_profile(PROFILES / f"{engine}.yaml")
    assert prof.engine == engine
    for n, (lo, hi) in BOUNDS.items():
        assert lo <= getattr(prof, n) <= hi
    if engine in ("sglang", "atom"):
        # no published rows of their own: the engine level is vLLM's, the families are InferenceX fits
        assert "vLLM's fitted values" in prof.source and "fit_inferencex" in prof.source
        assert any(f.held_out_inferencex for f in prof.families)
    else:
        assert "fitted" in prof.source and doc["fit"]["n_rows"] > 0
        assert doc["fit"]["error_after"]["all"]["median_ape_pct"] <= doc["fit"]["error_before"]["all"]["median_ape_pct"]


def test_shipped_trtllm_profile_counts_its_rows():
    # trtllm rows in published.csv: 394 + 8 = 402, minus GH200 (35), GPT-J (8) and unknown-TP (3) rows = 356
    doc = yaml.safe_load((PROFILES / "trtllm.yaml").read_text())
    assert doc["fit"]["n_rows"] == 402 - 35 - 8 - 3


def test_predictions_are_finite_for_every_published_row(published):
    prof = EngineProfile()
    bad = [m.id for m in published.measurements if not (math.isfinite(predict(m, prof)) and predict(m, prof) > 0)]
    assert bad == []


def test_fit_profiles_writes_its_report_outside_the_tree_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # benchmarks/fit_profiles.py wrote benchmarks/results/fit_profiles.md (tracked) on every run; like
    # bench_search.py it now defaults to $TMPDIR/recommender-benchmarks/ and takes --out
    import importlib.util
    import tempfile

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what $TMPDIR sets, read once by gettempdir()
    spec = importlib.util.spec_from_file_location("fit_profiles_under_test", root / "benchmarks" / "fit_profiles.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    default = mod.parser().parse_args([]).out
    assert default == tmp_path / "recommender-benchmarks" / "fit_profiles.md"
    assert not default.resolve().is_relative_to(root)
    assert mod.parser().parse_args(["--out", "elsewhere/report.md"]).out == Path("elsewhere/report.md")
