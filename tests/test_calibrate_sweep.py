"""`recommend calibrate` on results it cannot describe or that need care: speculative decoding other than MTP, pipeline
parallelism (data / expert parallelism and MTP are read: test_calibrate_parallel.py), failed requests, a copy of a run under another name, a GPU name as nvidia-smi prints it, a
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
    # Llama-3.1-8B has no MTP heads: its speculative run (a draft model or n-gram) is not one the model prices
    read = read_bench_json(_variant(tmp_path, "mtp-meta.json", speculative_config='{"method": "mtp"}',
                                    spec_decode_num_drafts=100, spec_decode_accepted_tokens=60))
    assert read.measurements == () and "has no MTP heads" in read.skipped[0].reason
    read = read_bench_json(_variant(tmp_path, "hint.json", spec_method="eagle"))
    assert read.measurements == () and "without its speculative config" in read.skipped[0].reason
    # a server without speculative decoding can report the counters as 0 / null: not a speculative run
    read = read_bench_json(_variant(tmp_path, "zero.json", spec_decode_num_drafts=0, spec_decode_acceptance_rate=None))
    assert len(read.measurements) == 3 and {m.spec_tokens for m in read.measurements} == {0}


@pytest.mark.parametrize("key", ["pp", "pipeline_parallel_size"])
def test_a_pipeline_parallel_run_is_skipped(tmp_path: Path, key: str):
    """Calibrate predicts one instance's engine; a PP 2 server spans two."""
    read = read_bench_json(_variant(tmp_path, f"{key}.json", **{key: "2"}))
    assert read.measurements == () and "parallel serving" in read.skipped[0].reason
    # stated as 1 it is the layout the model predicts
    assert len(read_bench_json(_variant(tmp_path, f"{key}-1.json", **{key: "1"})).measurements) == 3


@pytest.mark.parametrize("key", ["dp", "data_parallel_size"])
def test_a_data_parallel_run_is_read_as_its_ranks(tmp_path: Path, key: str):
    """A DP 2 server's output_throughput is its two ranks' (estimate --data-parallel-size 2); it used to be skipped."""
    read = read_bench_json(_variant(tmp_path, f"{key}.json", **{key: "2"}))
    assert read.skipped == () and {m.dp for m in read.measurements} == {2}
    assert {m.group("config") for m in read.measurements} == {"llama-3.1-8b/h100-sxm/tp1-dp2"}


def test_speculative_and_failed_runs_are_the_unmodelled_ones():
    assert unmodelled_run({"enable_expert_parallel": "true"}) is None   # read as the layout (test_calibrate_parallel)
    assert unmodelled_run({"data_parallel_size": "4"}) is None
    assert unmodelled_run({"pipeline_parallel_size": "2"}) is not None


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


# -- the written profile and the report on what was used and skipped ---------------------------------------------

def _unusable_csv(tmp_path: Path) -> Path:
    """Three rows, none usable by a vllm fit: two lmdeploy rows (another engine) and one of a model the catalog lacks."""
    import csv

    with (BENCH.parent / "measurements" / "published.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r["id"] in ("LMD-001", "LMD-002")]
        fields = list(reader.fieldnames or [])
    assert len(rows) == 2 and all(r["engine"].startswith("lmdeploy") for r in rows)
    rows.append({**rows[0], "id": "BAD-001", "model": "No-Such-Model-7B"})
    p = tmp_path / "bad.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return p


def test_per_model_overrides_are_rounded_as_the_family_parameters():
    """The written family's parameters had 4 significant digits, its per-model override 0.3964509990179386."""
    import dataclasses

    from recommender.calibrate.report import profile_document
    from recommender.profiles import EngineProfile, FamilyFit, ModelFit

    fam = FamilyFit("hopper", 9, (("hbm_bandwidth_efficiency", 0.61234567),),
                    models=(ModelFit("llama-3.1-8b", 9, (("hbm_bandwidth_efficiency", 0.3964509990179386),
                                                         ("request_overhead_s", 0.00123456789))),))
    doc = profile_document(dataclasses.replace(EngineProfile(), families=(fam,)))
    hopper = doc["families"]["hopper"]
    assert hopper["parameters"] == {"hbm_bandwidth_efficiency": 0.6123}
    assert hopper["models"]["llama-3.1-8b"]["parameters"] == {"hbm_bandwidth_efficiency": 0.3965,
                                                             "request_overhead_s": 0.001235}


def test_skips_are_counted_in_rows_of_a_csv_and_results_of_a_bench_file(tmp_path: Path):
    """A CSV's skips are its rows, a bench file's one result (all its figures); both name the file read."""
    from recommender.calibrate.report import skipped_counts, skipped_text

    plain, mtp, bad = (_variant(tmp_path, "plain.json"), _variant(tmp_path, "mtp.json", spec_decode_acceptance_length=2.4),
                       _unusable_csv(tmp_path))
    read = read_results([plain, mtp, bad])
    # the lmdeploy rows are read (a vllm fit leaves them out later), the unknown model is not
    assert [(s.file, s.unit) for s in read.skipped] == [(str(mtp), "result"), (str(bad), "row")]
    counts = skipped_counts(read.skipped, [str(plain), str(bad)])
    assert counts == {"skipped_rows": {str(bad): 1}, "skipped_results": {str(mtp): 1}, "skipped_files": [str(mtp)]}
    assert skipped_text(read.skipped, [str(plain), str(bad)]) == f"1 row of {bad} and 1 result file ({mtp})"


@pytest.fixture(scope="module")
def mixed_calibration(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three example runs plus a speculative-decoding run, a run of another engine and a CSV of 3 unusable rows,
    calibrated once for vllm: --format json and the text report, and the profile written."""
    tmp = tmp_path_factory.mktemp("mixed")
    for r in RUNS + ["vllm-8b-c16-in2048-out256.json.yaml"]:
        shutil.copy(BENCH / r, tmp / r)
    mtp = _variant(tmp, "mtp.json", spec_decode_acceptance_length=2.4)
    other = tmp / "other-engine.json"
    doc = json.loads((BENCH / RUNS[2]).read_text())
    doc["engine"] = "sglang"
    other.write_text(json.dumps(doc))
    bad = _unusable_csv(tmp)
    args = [*(str(tmp / r) for r in RUNS), str(mtp), str(other), str(bad)]
    res = calibrate(*args, "--out", str(tmp / "j.yaml"), "-q", "-f", "json")
    assert res.exit_code == 0, res.output
    text = calibrate(*args, "--out", str(tmp / "p.yaml"), "-q", "--wide")
    assert text.exit_code == 0, text.output
    return {"runs": [str(tmp / r) for r in RUNS], "mtp": str(mtp), "other": str(other), "bad": str(bad),
            "json": json.loads(res.stdout), "text": text.stdout, "written": yaml.safe_load((tmp / "p.yaml").read_text())}


@pytest.mark.slow
def test_written_model_override_is_rounded(mixed_calibration: dict[str, Any]):
    """One configuration's rows: the fit is written as the hopper family's override for llama-3.1-8b (usage.md)."""
    fams = mixed_calibration["written"]["families"]
    params = fams["hopper"]["models"]["llama-3.1-8b"]["parameters"]
    assert params and all(v == float(f"{v:.4g}") for v in params.values())


@pytest.mark.slow
def test_report_counts_skipped_rows_and_result_files(mixed_calibration: dict[str, Any]):
    """It said '5 skipped': 3 CSV rows and 2 bench results (the speculative run; the sglang run's 3 figures as 1)."""
    m = mixed_calibration
    first = m["text"].splitlines()[0]
    assert first.endswith(f"in 3 file(s); skipped all 3 rows of {m['bad']} and 2 result files ({m['mtp']}, {m['other']})")
    assert "  skipped 2 rows: engine 'lmdeploy' is not the one calibrated ('vllm')" in m["text"]
    assert "  skipped 1 result: engine 'sglang' is not the one calibrated ('vllm')" in m["text"]
    for fit in (m["json"]["fit"], m["written"]["fit"]):
        assert fit["skipped_rows"] == {m["bad"]: 3}
        assert fit["skipped_results"] == {m["mtp"]: 1, m["other"]: 1}
        assert "n_skipped" not in fit


@pytest.mark.slow
def test_fit_data_lists_only_the_files_that_gave_rows(mixed_calibration: dict[str, Any]):
    m = mixed_calibration
    for fit in (m["json"]["fit"], m["written"]["fit"]):
        assert fit["data"] == m["runs"]
        assert sorted(fit["skipped_files"]) == sorted([m["mtp"], m["other"], m["bad"]])
        assert fit["n_rows"] == 9   # three figures of each of the three runs
    src = m["written"]["source"]   # "recommend calibrate: 9 measurements from <the files' names>"
    assert all(Path(r).name in src for r in m["runs"])
    assert not any(name in src for name in ("mtp.json", "other-engine.json", "bad.csv"))
