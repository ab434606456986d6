"""`recommend estimate` states its error: the p10-p90 band of its evidence class (recommender/search/estimate_bands.py).

The class's rows and held-out sigma are data (catalogs/evidence.yaml, written by benchmarks/bench_bands.py); the
expected bands below are computed by hand from that file with the shrinkage formula of docs/bands.md
(``sigma^2 = (n sigma_fit^2 + 5 max(s0, sigma_fit)^2) / (n + 5)``, p10-p90 at ``z = -/+ 1.2816``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recommender.cli import app

EVIDENCE = Path(__file__).resolve().parent.parent / "catalogs" / "evidence.yaml"
Z90 = 1.2816  # standard normal 90th percentile
CONFIG = ("--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--weight-dtype", "fp8",
          "--prompt-tokens", "2048", "--output-tokens", "256")


def run_json(*args: str) -> dict:
    res = CliRunner().invoke(app, ["estimate", *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def by_hand(engine: str, family: str, dtype: str, model_class: str, kind: str) -> float:
    """The shrunk log-sd of a class and metric kind, from catalogs/evidence.yaml by the documented formula."""
    doc = yaml.safe_load(EVIDENCE.read_text())
    s0 = max(0.5, float(doc["prior"]["sigma"][model_class][kind]))
    n0 = float(doc["prior"]["rows"])
    entry = next((c for c in doc["classes"] if (c["engine"], c["family"], c["dtype"], c["model_class"])
                  == (engine, family, dtype, model_class)), {})
    k = entry.get(kind) or {}
    n, s = int(k.get("rows") or 0), k.get("sigma")
    if n == 0 or not s:
        return s0
    return math.sqrt((n * s ** 2 + n0 * max(s0, s) ** 2) / (n + n0))


def test_a_closed_loop_band_is_the_classes_held_out_error_around_the_estimate() -> None:
    """TensorRT-LLM on Hopper at fp8, dense: 133 decode rows, held-out sigma 0.1102 (evidence.yaml) -> 0.1441."""
    d = run_json(*CONFIG, "--concurrency", "16", "--engine", "trtllm")
    b = d["bands"]
    sigma = by_hand("trtllm", "hopper", "fp8", "dense", "decode")
    sigma_ttft = by_hand("trtllm", "hopper", "fp8", "dense", "ttft")
    assert b["class"] == "trtllm/hopper/fp8/dense" and b["class_rows"] == 133
    assert b["sigma"] == pytest.approx(sigma, abs=1e-4) and sigma == pytest.approx(0.1441, abs=1e-4)
    assert sigma_ttft == 0.5  # no TTFT row of the class: the prior
    lo, hi = math.exp(-Z90 * sigma), math.exp(Z90 * sigma)
    for k in ("tpot_s", "e2e_s"):
        assert b[k] == pytest.approx([d[k] * lo, d[k] * hi], rel=1e-4)
    assert b["ttft_s"] == pytest.approx([d["ttft_s"] * math.exp(-Z90 * 0.5), d["ttft_s"] * math.exp(Z90 * 0.5)], rel=1e-4)
    assert b["output_tokens_per_s"] == pytest.approx([d["output_tokens_per_s"] / hi, d["output_tokens_per_s"] / lo], rel=1e-4)


def test_a_class_without_rows_says_so_and_takes_the_wide_prior() -> None:
    """vLLM's measurements hold no fp8-weight row (issue 22): x0.527 - x1.898 (exp(-/+ 1.2816 x 0.5)) around the estimate (sigma 0.5)."""
    d = run_json(*CONFIG, "--batch", "8")
    b = d["bands"]
    assert b["class"] == "vllm/hopper/fp8/dense" and b["class_rows"] == 0 and b["sigma"] == 0.5
    assert b["tpot_s"][0] / d["tpot_s"] == pytest.approx(0.5269, abs=1e-4)
    assert b["tpot_s"][1] / d["tpot_s"] == pytest.approx(1.8980, abs=1e-4)
    text = CliRunner().invoke(app, ["estimate", *CONFIG, "--batch", "8"]).output
    assert "Expected error: p10-p90 of the held-out errors of class vllm/hopper/fp8/dense (no measured rows" in text


def test_an_open_loop_band_is_the_model_at_g_times_the_rate() -> None:
    """Time rescaling: each end is ``g x TPOT(g R)`` (TTFT's own factor instead), checked against the estimate at
    that rate; past saturation the slow end has no value and the text says so."""
    rate = 3.0
    d = run_json(*CONFIG, "--rate", str(rate), "--engine", "trtllm")
    b = d["bands"]
    sigma, sigma_ttft = by_hand("trtllm", "hopper", "fp8", "dense", "decode"), 0.5  # JSON rounds them to 4 digits
    for z, end in ((-Z90, 0), (Z90, 1)):
        g = math.exp(sigma * z)
        at = run_json(*CONFIG, "--rate", repr(rate * g), "--engine", "trtllm")
        assert at["stable"]
        assert b["tpot_s"][end] == pytest.approx(g * at["tpot_s"], rel=1e-4)
        assert b["tpot_p99_s"][end] == pytest.approx(g * at["tpot_p99_s"], rel=1e-4)
        assert b["ttft_p90_s"][end] == pytest.approx(math.exp(sigma_ttft * z) * at["ttft_p90_s"], rel=1e-4)
    # vLLM's class has no rows (sigma 0.5): at 5 req/s the pool is 56% busy; with every step g = 1.90 times as long
    # and g x the rate it would be 0.56 x 1.90^2 = 2.0 times over capacity, so the slow end saturates
    near = run_json(*CONFIG, "--rate", "5")
    assert near["stable"] and near["utilisation"] * 1.898 ** 2 > 1.0
    assert near["bands"]["tpot_s"][0] is not None and near["bands"]["tpot_s"][1] is None
    text = CliRunner().invoke(app, ["estimate", *CONFIG, "--rate", "5"]).output
    assert "saturates" in text.split("Expected error")[1]


def test_a_configuration_that_does_not_fit_states_no_band() -> None:
    res = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-405b", "--gpu", "l4", "--tp", "1",
                                   "--batch", "1", "--format", "json"])
    assert res.exit_code == 3 and "bands" not in json.loads(res.stdout)


def bench_json(*args: str) -> dict:
    return run_json("--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--weight-dtype", "fp8",
                    "--engine", "trtllm", "--bench", "--num-prompts", "100", *args)


def test_a_bench_run_band_is_the_run_at_g_times_the_request_rate() -> None:
    """``vllm bench serve --request-rate 4``: each end is the predicted run at g x 4 req/s (same seed), latencies
    x g (TTFT x its own factor), the duration x g, the throughputs / g; all at once: the run's own values x factor."""
    d = bench_json("--request-rate", "4")
    b = d["bands"]
    sigma, sigma_ttft = by_hand("trtllm", "hopper", "fp8", "dense", "decode"), 0.5  # JSON rounds them to 4 digits
    for z, end in ((-Z90, 0), (Z90, 1)):
        g = math.exp(sigma * z)
        at = bench_json("--request-rate", repr(4.0 * g))
        assert b["p99_tpot_ms"][end] == pytest.approx(g * at["p99_tpot_ms"], rel=1e-4)
        assert b["duration"][end] == pytest.approx(g * at["duration"], rel=1e-4)
        assert b["median_ttft_ms"][end] == pytest.approx(math.exp(sigma_ttft * z) * at["median_ttft_ms"], rel=1e-4)
        assert b["output_throughput"][1 - end] == pytest.approx(at["output_throughput"] / g, rel=1e-4)
    burst = bench_json()
    lo, hi = math.exp(-Z90 * sigma), math.exp(Z90 * sigma)
    assert burst["bands"]["mean_e2el_ms"] == pytest.approx([burst["mean_e2el_ms"] * lo, burst["mean_e2el_ms"] * hi], rel=1e-4)


def test_a_calibrated_profile_states_the_error_of_its_own_check(tmp_path: Path) -> None:
    """``recommend calibrate`` on 9 rows of Llama-3.1-8B on one H100 (tests/data/bench: three `vllm bench serve`
    results) writes the class its rows measured with the median of the held-out errors its report prints (each
    results file predicted by a fit that did not see it); an estimate of that model with the profile takes its band
    from it, shrunk toward the prior (5 rows of 0.5); another model keeps the shipped class (the calibration is that
    model's override only)."""
    from recommender.calibrate.api import CalibrateRequest, calibrate

    files = tuple(str(p) for p in sorted((Path(__file__).resolve().parent / "data" / "bench").glob("vllm-8b-*.json")))
    run = calibrate(CalibrateRequest(results=files, out=str(tmp_path / "p.yaml")))
    doc = yaml.safe_load(Path(run.out).read_text())
    assert doc["fit"]["generalisation_check"]["kept"]
    shown = doc["fit"]["held_out"][-1]
    assert shown["by"] == "source" and shown["held_out"]["all"]["n"] == 9
    [cls] = doc["fit"]["classes"]
    assert cls == {"engine": "vllm", "family": "hopper", "dtype": "bf16", "model_class": "dense", "rows": 9,
                   "held_out": {"median_ape_pct": shown["held_out"]["all"]["median_ape_pct"], "by": "source"}}
    fit_sigma = cls["held_out"]["median_ape_pct"] / 100 / 0.6745   # median |ln g| of a lognormal = 0.6745 sigma
    sigma = math.sqrt((9 * fit_sigma ** 2 + 5 * 0.5 ** 2) / (9 + 5))
    args = ("--gpu", "h100-sxm", "--concurrency", "16", "--prompt-tokens", "2048", "--output-tokens", "256",
            "--profile", run.out)
    # the calibrate report says so: log-sd and the p10-p90 factors exp(-/+ 1.2816 sigma)
    from recommender.calibrate.report import classes_text

    text = classes_text(run.classes, "llama-3.1-8b")
    assert "(llama-3.1-8b only: rows of one configuration)" in text
    assert f"{sigma:.3f} | x{math.exp(-Z90 * sigma):.2f} - x{math.exp(Z90 * sigma):.2f}" in text
    b = run_json("--model", "llama-3.1-8b", *args)["bands"]
    assert b["class_rows"] == 9 and b["sigma"] == pytest.approx(sigma, abs=1e-4) and b["sigma_ttft"] == b["sigma"]
    other = run_json("--model", "llama-3.1-70b", "--tp", "4", *args)["bands"]
    shipped = run_json("--model", "llama-3.1-70b", "--tp", "4", *args[:-2])["bands"]
    assert other == shipped and other["sigma"] == pytest.approx(by_hand("vllm", "hopper", "bf16", "dense", "decode"), abs=1e-4)


@pytest.mark.parametrize("fit, says", [
    ({"classes": [{"family": "hopper", "dtype": "bf16", "model_class": "dense", "rows": "many"}]},
     "fit.classes[0].rows 'many' is not a whole number"),
    ({"classes": [{"family": "hopper", "dtype": "bf16", "model_class": "dense", "rows": 9, "held_out": "x"}]},
     "fit.classes[0].held_out.median_ape_pct 'x' is not a percentage"),
    ({"classes": [{"family": "hopper", "dtype": "bf16", "model_class": "dense", "rows": 9,
                   "held_out": {"median_ape_pct": -3}}]}, "is not a percentage >= 0"),
    ({"classes": [{"family": 7, "dtype": "bf16", "model_class": "dense"}]}, "needs family, dtype and model_class"),
    ({"classes": "nope"}, "fit.classes must be a list of mappings"),
    (["not", "a", "mapping"], "fit must be a mapping"),
])
def test_a_profile_with_a_malformed_evidence_table_is_refused_in_one_line(tmp_path: Path, fit: object, says: str) -> None:
    """A hand-edited profile (``--profile``): one line naming the field and what to do, exit 2, no traceback."""
    doc = {"engine": "vllm", "parameters": {"hbm_bandwidth_efficiency": 0.8}, "fit": fit}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["estimate", *CONFIG, "--batch", "4", "--profile", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0] and "delete" in lines[0]
