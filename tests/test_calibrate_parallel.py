"""`recommend calibrate` reads data- and expert-parallel `vllm bench serve` runs (``--metadata data_parallel_size=8
enable_expert_parallel=true``) and MTP runs (``speculative_config`` and the ``spec_decode_*`` counters), and predicts
them as `recommend estimate --bench` predicts that layout; a layout vLLM would not run is skipped with
`perf.moe.check_layout`'s reason, and pipeline-parallel runs stay skipped.

The bench file below is synthetic (the key set of `vllm bench serve --save-result`, as tests/data/bench/README.md
describes): DeepSeek-V3 on 8 x H200 as one engine of TP 1 x DP 8 with expert parallelism, 160 prompts of 1,000
tokens with 200 out, at most 16 in flight.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recommender.calibrate.api import row_conditions
from recommender.calibrate.measurements import predict
from recommender.calibrate.readers import read_bench_json, read_results
from recommender.cli import app
from recommender.errors import CalibrationError
from recommender.profiles import engine_profile

RUN: dict[str, Any] = {
    "backend": "vllm", "model_id": "deepseek-ai/DeepSeek-V3", "tokenizer_id": "deepseek-ai/DeepSeek-V3",
    "num_prompts": 160, "max_concurrency": 16, "completed": 160, "total_input_tokens": 160_000,
    "total_output_tokens": 32_000, "output_throughput": 900.0, "median_ttft_ms": 300.0, "median_tpot_ms": 17.0,
    "gpu": "H200", "tp": "1", "data_parallel_size": "8", "enable_expert_parallel": "true",
}


def _file(tmp_path: Path, name: str, **changes: Any) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({**RUN, **changes}))
    return p


def _estimate_bench(*flags: str) -> dict[str, Any]:
    """`recommend estimate --bench --format json` of RUN's layout and run (TP 1 x DP 8 with EP on 8 x H200)."""
    res = CliRunner().invoke(app, ["estimate", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "1", "-dp", "8", "-ep",
                                   *flags, "--bench", "--num-prompts", "160", "--max-concurrency", "16",
                                   "--random-input-len", "1000", "--random-output-len", "200", "--format", "json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.output)
    return out


def test_a_dp_ep_run_is_read_with_its_layout(tmp_path: Path) -> None:
    read = read_bench_json(_file(tmp_path, "dp8ep.json"))
    assert read.skipped == ()
    assert {(m.tp, m.dp, m.ep) for m in read.measurements} == {(1, 8, True)}
    # a configuration is its layout too: the k-fold check holds TP 8 and TP 1 x DP 8 EP apart
    assert {m.group("config") for m in read.measurements} == {"deepseek-v3/h200/tp1-dp8-ep"}
    assert row_conditions(list(read.measurements))[0].startswith("vllm on 8 x h200 (tp 1 x dp 8, expert parallel):")


def test_a_dp_ep_run_is_predicted_as_estimate_bench_predicts_that_layout(tmp_path: Path) -> None:
    """The same layout and run through `recommend estimate --bench` (the JSON `vllm bench serve` writes): calibrate
    fits against the figures a user reads there (the run's means: this file states medians only, which calibrate
    reads where a file has no mean)."""
    read = read_bench_json(_file(tmp_path, "dp8ep.json"))
    est = _estimate_bench()
    pred = {m.raw_metric: predict(m, engine_profile("vllm")) for m in read.measurements}
    assert pred["output_throughput"] == pytest.approx(est["output_throughput"], rel=1e-9)
    assert pred["median_ttft_ms"] * 1e3 == pytest.approx(est["mean_ttft_ms"], rel=1e-9)
    assert pred["median_tpot_ms"] * 1e3 == pytest.approx(est["median_tpot_ms"], rel=1e-9)
    # and it is not the TP 8 engine's prediction (before, the run was skipped: "calibrate predicts the experts
    # tensor-parallel")
    tp8 = read_bench_json(_file(tmp_path, "tp8.json", tp="8", data_parallel_size="1", enable_expert_parallel="false"))
    tp8_tput = next(predict(m, engine_profile("vllm")) for m in tp8.measurements if m.raw_metric == "output_throughput")
    assert abs(tp8_tput / pred["output_throughput"] - 1.0) > 0.05


def test_a_layout_vllm_would_not_run_is_skipped_with_its_reason(tmp_path: Path) -> None:
    # 256 experts do not split over 6 EP ranks (check_layout's line); the good file next to it is still read
    bad = _file(tmp_path, "dp6ep.json", data_parallel_size="6")
    good = _file(tmp_path, "dp8ep.json")
    read = read_results([bad, good])
    assert len(read.measurements) == 3
    assert len(read.skipped) == 1
    assert "256 experts do not split evenly" in read.skipped[0].reason


def test_expert_parallel_on_a_dense_model_is_read_as_off(tmp_path: Path) -> None:
    # vLLM has no experts to place on a dense model; the run is the plain TP one
    read = read_bench_json(_file(tmp_path, "llama.json", model_id="meta-llama/Llama-3.1-8B-Instruct",
                                 tokenizer_id="meta-llama/Llama-3.1-8B-Instruct", data_parallel_size="1"))
    assert {(m.model, m.dp, m.ep) for m in read.measurements} == {("llama-3.1-8b", 1, False)}


def test_a_pipeline_parallel_run_is_still_skipped(tmp_path: Path) -> None:
    read = read_bench_json(_file(tmp_path, "pp2.json", pipeline_parallel_size="2"))
    assert read.measurements == ()
    assert "pipeline parallel serving" in read.skipped[0].reason


MTP = {"speculative_config": '{"method": "mtp", "num_speculative_tokens": 2}', "spec_decode_num_drafts": 1000,
       "spec_decode_draft_tokens": 2000, "spec_decode_accepted_tokens": 960}


def test_an_mtp_run_is_read_at_the_acceptance_its_counters_give(tmp_path: Path) -> None:
    """960 tokens accepted over 1,000 drafts of k = 2: a + a^2 = 0.96, so the per-position acceptance is 0.6 (hand
    solution of the quadratic); the run is predicted as `estimate --bench -sc ... --acceptance-rate 0.6` predicts it
    (it used to be skipped: "the calibrated model has no draft/verify steps")."""
    read = read_bench_json(_file(tmp_path, "mtp.json", **MTP))
    assert read.skipped == ()
    assert {(m.spec_tokens, round(m.acceptance_rate, 9)) for m in read.measurements} == {(2, 0.6)}
    assert {m.group("config") for m in read.measurements} == {"deepseek-v3/h200/tp1-dp8-ep-mtp2"}
    est = _estimate_bench("-sc", '{"method": "mtp", "num_speculative_tokens": 2}', "--acceptance-rate", "0.6")
    pred = {m.raw_metric: predict(m, engine_profile("vllm")) for m in read.measurements}
    assert pred["output_throughput"] == pytest.approx(est["output_throughput"], rel=1e-6)
    assert pred["median_tpot_ms"] * 1e3 == pytest.approx(est["median_tpot_ms"], rel=1e-6)


@pytest.mark.parametrize(("changes", "words"), [
    ({"spec_decode_accepted_tokens": None}, "acceptance is unknown"),                         # no counters
    ({"spec_decode_accepted_tokens": 2500}, "acceptance is unknown"),                         # more than k per draft
    ({"speculative_config": '{"method": "eagle", "model": "x/y"}'}, "only the model's own MTP heads"),
    ({"speculative_config": None}, "without its speculative config"),                       # counters alone
])
def test_a_speculative_run_calibrate_cannot_read_is_skipped_with_its_reason(tmp_path: Path, changes: dict[str, Any],
                                                                             words: str) -> None:
    read = read_bench_json(_file(tmp_path, "spec.json", **{**MTP, **changes}))
    assert read.measurements == ()
    assert words in read.skipped[0].reason and "\n" not in read.skipped[0].reason


def test_the_layout_flags_state_what_the_files_do_not(tmp_path: Path) -> None:
    p = _file(tmp_path, "bare.json")
    doc = json.loads(p.read_text())
    for k in ("tp", "data_parallel_size", "enable_expert_parallel"):
        del doc[k]
    p.write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["calibrate", str(p), "--tp", "1", "-dp", "8", "-ep", "-q", "--out",
                                   str(tmp_path / "out.yaml")])
    assert res.exit_code == 0, res.output
    assert "vllm on 8 x h200 (tp 1 x dp 8, expert parallel):" in res.output
    res = CliRunner().invoke(app, ["calibrate", str(p), "--tp", "1", "-dp", "6", "-ep", "-q", "--out",
                                   str(tmp_path / "bad.yaml")])
    assert res.exit_code != 0 and "256 experts do not split evenly" in res.output
    assert not (tmp_path / "bad.yaml").exists()


@pytest.mark.parametrize(("value", "ep"), [("true", True), ("F", False), ("n", False), ("off", False), (1, True),
                                           (False, False)])
def test_expert_parallel_reads_true_and_false_words(tmp_path: Path, value: object, ep: bool) -> None:
    read = read_bench_json(_file(tmp_path, "ep.json", enable_expert_parallel=value))
    assert {m.ep for m in read.measurements} == {ep}


@pytest.mark.parametrize("value", ["maybe", "nan", -1, [], [0], 2])
def test_expert_parallel_refuses_a_value_that_is_not_true_or_false(tmp_path: Path, value: object) -> None:
    """Read as true, "maybe" fitted the run as expert-parallel (hostile-input sweep, 2026-12-07)."""
    with pytest.raises(CalibrationError, match="is not true or false") as e:
        read_bench_json(_file(tmp_path, "ep.json", enable_expert_parallel=value))
    assert "\n" not in str(e.value)


def test_two_spellings_of_a_field_with_two_values_are_refused(tmp_path: Path) -> None:
    # dp 2 beside data_parallel_size 8 was fitted as dp 2, silently
    with pytest.raises(CalibrationError, match="two values; keep one") as e:
        read_bench_json(_file(tmp_path, "dp.json", dp=2))
    assert "'dp'" in str(e.value) and "\n" not in str(e.value)
    # the same value twice is one value
    assert {m.dp for m in read_bench_json(_file(tmp_path, "same.json", dp="8")).measurements} == {8}


def test_rows_of_several_moe_models_fit_the_request_overhead_alone(tmp_path: Path) -> None:
    """DeepSeek-V3 and Qwen3-30B-A3B rows together wrote Hopper's bandwidth for every dense model (the sweep's
    llama-3.1-8b TTFT 26 -> 84 ms); their experts' terms are each model's, their dense ones no dense model's."""
    from recommender.calibrate.api import parameters_for
    from recommender.catalog import default_catalog

    ds = read_bench_json(_file(tmp_path, "ds.json")).measurements
    qw = read_bench_json(_file(tmp_path, "qw.json", model_id="Qwen/Qwen3-30B-A3B", tokenizer_id="Qwen/Qwen3-30B-A3B",
                               data_parallel_size="4")).measurements
    assert {m.model for m in qw} == {"qwen3-30b-a3b"}
    assert parameters_for([*ds, *qw], None, default_catalog()) == ("request_overhead_s",)


def test_a_run_the_memory_model_cannot_hold_is_skipped(tmp_path: Path) -> None:
    """DeepSeek-V3 (fp8: 673 GB of weights) stated as one H200 (151 GB) was fitted, its figures
    predicted as nan (hostile-input sweep, 2026-12-07); it is skipped with the shortfall, the good run is used."""
    bad = _file(tmp_path, "one.json", data_parallel_size="1", enable_expert_parallel="false")
    good = _file(tmp_path, "dp8ep.json")
    res = CliRunner().invoke(app, ["calibrate", str(bad), str(good), "-q", "--out", str(tmp_path / "out.yaml")])
    assert res.exit_code == 0, res.output
    assert "skipped 1 result file (" in res.output and "one.json)" in res.output
    assert "deepseek-v3 (fp8) does not fit 1 x h200: its weights take" in " ".join(res.output.split())
