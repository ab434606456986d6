"""`recommend calibrate` on results it cannot describe or that need care: speculative decoding, data / pipeline /
expert parallelism, failed requests, a copy of a run under another name, a GPU name as nvidia-smi prints it, a
fractional max_concurrency; and the JSON report stating what the written profile states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from recommender.calibrate.measurements import resolve_gpu
from recommender.calibrate.readers import read_bench_json, read_results, unmodelled_run
from recommender.cli import app
from recommender.errors import CalibrationError

BENCH = Path(__file__).resolve().parent / "data" / "bench"
#: the real `vllm bench serve` file (20 prompts, concurrency 8, 64 in / 16 out, `--metadata tp=1 gpu=H100`,
#: tokenizer meta-llama/Llama-3.1-8B-Instruct); it gives three rows: output_throughput, median TTFT, median TPOT
REAL = BENCH / "reference-example.json"
RUNS = ["vllm-8b-c1-in1024-out128.json", "vllm-8b-c16-in2048-out256.json", "vllm-8b-rate4-in512-out512.json"]


def _variant(tmp_path: Path, name: str, **changes: Any) -> Path:
    doc = json.loads(REAL.read_text())
    doc.update(changes)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def calibrate(*args: str):
    res = CliRunner().invoke(app, ["calibrate", *args])
    assert "Traceback" not in res.output
    return res


def test_the_real_file_gives_three_rows(tmp_path: Path):
    """The control for the skips below: the unchanged real file is read as its three figures."""
    read = read_bench_json(_variant(tmp_path, "plain.json"))
    assert sorted(m.quantity for m in read.measurements) == ["output_tokens_per_s", "tpot_s", "ttft_s"]
    assert read.skipped == ()


def test_a_speculative_decoding_run_is_skipped_with_its_reason(tmp_path: Path):
    """vllm bench serve writes spec_decode_* keys for a run with --speculative-config: its TPOT is a verify step over
    several tokens, which the calibrated model has not, so the run is skipped (it was fitted as a plain run)."""
    p = _variant(tmp_path, "mtp.json", spec_decode_acceptance_rate=0.7, spec_decode_acceptance_length=2.4,
                 spec_decode_num_drafts=100, spec_decode_draft_tokens=300, spec_decode_accepted_tokens=140)
    read = read_bench_json(p)
    assert read.measurements == ()
    assert len(read.skipped) == 1 and "speculative decoding" in read.skipped[0].reason


def test_speculative_metadata_is_skipped_and_zero_counters_are_not(tmp_path: Path):
    assert unmodelled_run({"speculative_config": '{"method": "mtp"}'}, True) is not None
    # a server without speculative decoding can report the counters as 0 / null: not a speculative run
    assert unmodelled_run({"spec_decode_num_drafts": 0, "spec_decode_acceptance_rate": None}, False) is None


@pytest.mark.parametrize("key", ["dp", "data_parallel_size", "pp", "pipeline_parallel_size"])
def test_a_data_or_pipeline_parallel_run_is_skipped(tmp_path: Path, key: str):
    """The model predicts one TP group serving alone; a DP 2 server's output_throughput is two of them."""
    read = read_bench_json(_variant(tmp_path, f"{key}.json", **{key: "2"}))
    assert read.measurements == () and "parallel serving" in read.skipped[0].reason
    # stated as 1 it is the layout the model predicts
    assert len(read_bench_json(_variant(tmp_path, f"{key}-1.json", **{key: "1"})).measurements) == 3


def test_expert_parallel_is_skipped_for_a_moe_model_only():
    assert unmodelled_run({"enable_expert_parallel": "true"}, True) is not None
    assert unmodelled_run({"enable_expert_parallel": "true"}, False) is None   # vLLM has no experts to place
    assert unmodelled_run({"enable_expert_parallel": "false"}, True) is None


def test_a_run_with_failed_requests_is_skipped(tmp_path: Path):
    """Half the prompts failed: throughput and latencies describe the 10 that finished, not the load that was sent."""
    read = read_bench_json(_variant(tmp_path, "failed.json", completed=10, failed=10))
    assert read.measurements == ()
    assert "10 of 20 requests failed" in read.skipped[0].reason


def test_only_unusable_runs_is_one_line_exit_2(tmp_path: Path):
    p = _variant(tmp_path, "mtp.json", spec_decode_acceptance_length=2.4)
    res = calibrate(str(p), "--out", str(tmp_path / "out.yaml"), "-q")
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "speculative decoding" in lines[0] and lines[0].startswith("error:")
    assert not (tmp_path / "out.yaml").exists()


def test_a_copy_of_a_run_under_another_name_counts_once(tmp_path: Path):
    """Held out by source, a copy would be predicted by a fit that saw its twin (0.6% 'held-out' error)."""
    a = _variant(tmp_path, "a.json")
    b = tmp_path / "b.json"
    shutil.copy(a, b)
    read = read_results([a, b])
    assert len(read.measurements) == 3   # one run's three figures
    assert len(read.skipped) == 1 and "the same results as" in read.skipped[0].reason
    # a different run of the same configuration is not a copy
    c = _variant(tmp_path, "c.json", output_throughput=600.0)
    assert len(read_results([a, c]).measurements) == 6


def test_nvidia_smi_gb300_name_resolves():
    """`nvidia-smi` prints 'NVIDIA GB300'; the catalog has gb300 (its `valid:` list names it), calibrate refused it."""
    assert resolve_gpu("NVIDIA GB300") == "gb300"
    assert resolve_gpu("GH200 480GB") is None   # still no catalog entry


def test_a_fractional_max_concurrency_is_refused(tmp_path: Path):
    with pytest.raises(CalibrationError, match="max_concurrency"):
        read_bench_json(_variant(tmp_path, "frac.json", max_concurrency=1.5))


@pytest.mark.slow
def test_json_report_states_the_written_profiles_fit_block(tmp_path: Path):
    """--format json had left out whether the fit was kept (generalisation_check), where it was written (scope),
    the coverage and the error band classes, which the text report and the written file state."""
    for r in RUNS + ["vllm-8b-c16-in2048-out256.json.yaml"]:
        shutil.copy(BENCH / r, tmp_path / r)
    out = tmp_path / "p.yaml"
    res = calibrate(*(str(tmp_path / r) for r in RUNS), "--out", str(out), "-q", "-f", "json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    written = yaml.safe_load(out.read_text())
    assert set(written["fit"]) <= set(report["fit"])
    # rows of one configuration (llama-3.1-8b, h100-sxm, TP 1): the hopper family's override for the model (usage.md)
    assert report["fit"]["scope"] == {"family": "hopper", "model": "llama-3.1-8b"}
    assert report["fit"]["generalisation_check"] == written["fit"]["generalisation_check"]


@pytest.mark.slow
def test_per_family_fit_does_not_show_unchanged_engine_values_as_fitted(tmp_path: Path):
    """Rows on two GPU families are fitted per family; the engine-level values stay the start's, so the report must
    not print them as 'fitted' (it printed start 0.8217, fitted 0.8217, 'fitted')."""
    paths = []
    for r in RUNS[:1] + RUNS[2:]:
        for gpu in ("H100", "MI300X"):
            doc = json.loads((BENCH / r).read_text())
            doc["gpu"] = gpu
            p = tmp_path / f"{gpu}-{r}"
            p.write_text(json.dumps(doc))
            paths.append(str(p))
    res = calibrate(*paths, "--out", str(tmp_path / "p.yaml"), "-q", "--wide")
    assert res.exit_code == 0, res.output
    assert "fitted per GPU family" in res.stdout
    assert not any(ln.startswith("| hbm_bandwidth_efficiency") for ln in res.stdout.splitlines())
    assert "unconstrained: kept" not in res.stdout
    fam_rows = [ln for ln in res.stdout.splitlines() if ln.startswith(("| cdna3", "| hopper"))]
    assert len(fam_rows) == 2
