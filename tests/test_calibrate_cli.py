"""`recommend calibrate` end to end: three benchmark files -> a profile that lowers the error, usable with
--profile; bad inputs -> one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recommender.cli import app
from recommender.profiles import load_profile

BENCH = Path(__file__).resolve().parent / "data" / "bench"
RUNS = ["vllm-8b-c1-in1024-out128.json", "vllm-8b-c16-in2048-out256.json", "vllm-8b-rate4-in512-out512.json"]


def calibrate(*args: str):
    res = CliRunner().invoke(app, ["calibrate", *args])
    assert "Traceback" not in res.output
    return res


@pytest.fixture()
def bench(tmp_path: Path) -> Path:
    for name in RUNS + ["vllm-8b-c16-in2048-out256.json.yaml"]:
        shutil.copy(BENCH / name, tmp_path / name)
    return tmp_path


@pytest.mark.slow
def test_three_benchmark_files_give_a_profile_and_the_error_drops(bench: Path):
    out = bench / "profiles" / "mine.yaml"
    res = calibrate(*(str(bench / r) for r in RUNS), "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "Held-out error (leave one source out, 3 folds)" in res.stdout and f"wrote {out}" in res.stdout
    doc = yaml.safe_load(out.read_text())
    fit = doc["fit"]
    assert fit["n_rows"] == 9 and len(fit["data"]) == 3                   # 3 files x (throughput, TTFT, TPOT)
    before, after = fit["error_before"]["all"]["median_ape_pct"], fit["error_after"]["all"]["median_ape_pct"]
    # the synthetic cluster (hbm 0.62, compute 0.40, 2.5 ms overhead) is ~25 % slower than the shipped profile
    assert before > 10 and after < 5 and after < before / 3
    held = fit["held_out"][0]
    assert held["by"] == "source" and held["held_out"]["all"]["median_ape_pct"] < held["start"]["all"]["median_ape_pct"]
    prof = load_profile(out)
    # the files were made by the round-2 model (hbm 0.62, compute 0.40, 2.5 ms overhead); today's model splits
    # the same times differently (GEMM curve, attention ratio), so the check is what the profile predicts below
    assert prof.engine == "vllm" and prof.source.startswith("recommend calibrate")
    # every command takes --profile: the calibrated file drives estimate
    est = CliRunner().invoke(app, ["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--concurrency", "16",
                                   "--prompt-tokens", "2048", "--output-tokens", "256", "--profile", str(out),
                                   "--format", "json"])
    assert est.exit_code == 0, est.output
    tpot = json.loads(est.stdout)["tpot_s"]
    measured = json.loads((bench / RUNS[1]).read_text())["median_tpot_ms"] * 1e-3
    # 20%: the synthetic run was made with the round-2 closed loop (one average step); today's prices prefill and
    # decode steps apart, so its concurrency-16 TPOT is not one the current model can hit exactly (15.1 vs 12.9 ms)
    assert tpot == pytest.approx(measured, rel=0.2)


def test_json_report(bench: Path):
    out = bench / "p.yaml"
    res = calibrate(str(bench / RUNS[0]), str(bench / RUNS[1]), "--out", str(out), "--format", "json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["engine"] == "vllm" and d["out"] == str(out) and len(d["rows"]) == 6
    assert set(d["parameters"]) >= {"hbm_bandwidth_efficiency", "step_overhead_s"}
    assert all(set(r) == {"id", "measured", "before", "after"} for r in d["rows"])


def test_flags_fill_missing_metadata(bench: Path):
    (bench / "vllm-8b-c16-in2048-out256.json.yaml").unlink()
    res = calibrate(str(bench / RUNS[1]), "--out", str(bench / "p.yaml"))
    assert res.exit_code == 2
    assert "vllm-8b-c16-in2048-out256.json: missing field 'gpu'" in res.output and "--gpu" in res.output
    res = calibrate(str(bench / RUNS[1]), "--out", str(bench / "p.yaml"), "--gpu", "H100", "--tp", "1")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("content, needle", [
    ('{"completed": 3,', "not valid JSON"),
    ('{"date": "x"}', "missing field"),
])
def test_bad_files_one_line_error(tmp_path: Path, content: str, needle: str):
    p = tmp_path / "bad.json"
    p.write_text(content)
    res = calibrate(str(p), "--out", str(tmp_path / "p.yaml"))
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and str(p) in lines[0] and needle in lines[0]
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("args, needle", [
    (["/nonexistent/run.json"], "does not exist"),
    ([str(Path(__file__).resolve().parent / "data" / "measurements" / "published.csv"), "--engine", "sglang"],
     "no measurements of engine 'sglang'"),
    ([str(BENCH / RUNS[0]), "--parameters", "magic"], "cannot be fitted"),
    ([str(BENCH / RUNS[0]), "--held-out-by", "weather"], "--held-out-by"),
    ([str(BENCH / RUNS[0]), "--engine", "nosuch"], "unknown engine"),
])
def test_bad_requests(tmp_path: Path, args: list[str], needle: str):
    res = calibrate(*args, "--out", str(tmp_path / "p.yaml"))
    assert res.exit_code != 0 and needle in res.output and res.output.count("\n") == 1


@pytest.mark.slow
def test_published_csv_for_one_engine(tmp_path: Path):
    csv = Path(__file__).resolve().parent / "data" / "measurements" / "published.csv"
    out = tmp_path / "gptfast.yaml"
    res = calibrate(str(csv), "--engine", "gpt-fast", "--out", str(out), "--held-out-by", "model")
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["n_rows"] == 31                          # 33 GPTFAST rows minus the 2 on an MI250X
    assert "engine 'lmdeploy' is not the one calibrated ('gpt-fast')" in doc["fit"]["skipped"]


def test_a_calibrated_profile_records_what_its_rows_cover_and_plans_on_it_are_measured(bench: Path):
    """Issue 27 item 4: two H100 SXM runs of llama-3.1-8b (bf16 weights and KV, tests/data/bench/README.md), 3
    metrics each = 6 rows, all hopper. A plan on H100 then rests on the user's rows, one on A100 does not."""
    import dataclasses

    from recommender.search import SearchSettings, recommend
    from recommender.workload import workload_from_flags

    out = bench / "mine.yaml"
    res = calibrate(str(bench / RUNS[0]), str(bench / RUNS[2]), "--out", str(out), "-q",
                    "--parameters", "hbm_bandwidth_efficiency,compute_efficiency")
    assert res.exit_code == 0, res.output
    cov = yaml.safe_load(out.read_text())["fit"]["coverage"]
    assert cov == {"families": {"hopper": 6}, "gpus": {"h100-sxm": 6}, "models": {"llama-3.1-8b": 6},
                   "dtypes": {"bf16/bf16": 6}}
    w = workload_from_flags(None, model="llama-3.1-8b", rate_per_s=5, prompt_tokens=1000, output_tokens=200)
    plan = recommend(dataclasses.replace(w, gpus=("h100-sxm", "a100-80gb")), profile=load_profile(out),
                     settings=SearchSettings(trials=60, verify=0, top=8))
    by_gpu = {r.pools[0].gpu: r.evidence for r in plan.rows}
    assert by_gpu["h100-sxm"] is not None and by_gpu["h100-sxm"].measured
    assert by_gpu["h100-sxm"].pools[0].measured_rows == 6 and by_gpu["h100-sxm"].unmeasured_families() == []
    if "a100-80gb" in by_gpu:
        assert by_gpu["a100-80gb"] is not None and by_gpu["a100-80gb"].unmeasured_families() == ["ampere"]
