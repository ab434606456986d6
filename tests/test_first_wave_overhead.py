"""A benchmark run's cold start (``first_wave_overhead_s``, issue 22 stage E).

The requests a closed-loop client sends at once when a run starts wait ``c`` seconds on a cold server before the
engine serves them at its steady speed. A run of ``M`` requests at concurrency ``N`` (InferenceX: ``M = 10 N``) then
reads a mean TTFT ``N c / M`` higher, the same median, and a duration ``c`` longer: every figure here is that hand
calculation on two predictions that differ only in ``c``. The shipped values come from InferenceX's rows that publish
both a mean and a median TTFT: SGLang on MI300X at concurrency 4, 1k prompts, 2026-02-27 reads a 4.3 s excess of the
first wave over the median per first-wave request ((mean - median) x M / N, ``inferencex-dsr1.csv``), where the
prefills of four 1k prompts take about 0.1 s.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from recommender.estimator import EstimateRequest, bench_run, estimate_request, finite_run
from recommender.perf.steady import Load
from recommender.profiles import BOUNDS, engine_profile

ROOT = Path(__file__).resolve().parents[1]


def _dep(cold_s: float, engine: str = "sglang", gpu: str = "mi300x"):  # type: ignore[no-untyped-def]
    prof = engine_profile(engine).for_gpu(gpu).replace(first_wave_overhead_s=cold_s, families=())
    req = EstimateRequest(model="llama-3.1-8b", gpu=gpu, engine=engine, concurrency="4", prompt_tokens=1000,
                          output_tokens=100)
    return estimate_request(req, profile=prof)[0]


def test_a_closed_loop_run_reads_n_over_m_of_it_in_its_mean_ttft_and_none_in_its_median() -> None:
    load = Load.finite(requests=40, prompt_tokens=1000, output_tokens=100, concurrency=4)
    r0, r1 = finite_run(_dep(0.0), load), finite_run(_dep(3.0), load)
    assert r0.in_flight == pytest.approx(4.0)
    assert r1.ttft_s - r0.ttft_s == pytest.approx(4 / 40 * 3.0, abs=1e-9)      # N c / M = 0.3 s
    assert r1.e2e_s - r0.e2e_s == pytest.approx(0.3, abs=1e-9)
    assert r1.percentiles["ttft"]["p50"] == pytest.approx(r0.percentiles["ttft"]["p50"], rel=1e-12)
    assert r1.duration_s - r0.duration_s == pytest.approx(3.0, abs=1e-9)     # the whole run starts 3 s later
    assert r1.tpot_s == pytest.approx(r0.tpot_s, rel=1e-12)


def test_the_bench_figures_follow() -> None:
    load = Load.finite(requests=40, prompt_tokens=1000, output_tokens=100, concurrency=4)
    b0, b1 = bench_run(_dep(0.0), load), bench_run(_dep(3.0), load)
    assert float(b1["mean_ttft_ms"]) - float(b0["mean_ttft_ms"]) == pytest.approx(300.0, abs=1e-6)  # type: ignore[arg-type]
    assert b1["median_ttft_ms"] == pytest.approx(b0["median_ttft_ms"], rel=1e-12)
    assert float(b1["duration"]) - float(b0["duration"]) == pytest.approx(3.0, abs=1e-9)  # type: ignore[arg-type]


def test_a_burst_waits_it_once() -> None:
    # every request sent at once, no client cap: each waits c, the run lasts c longer
    load = Load.finite(requests=3000, prompt_tokens=1000, output_tokens=100)
    r0, r1 = finite_run(_dep(0.0, gpu="b200"), load), finite_run(_dep(2.0, gpu="b200"), load)
    assert r0.method == "analytic burst"
    assert r1.ttft_s - r0.ttft_s == pytest.approx(2.0, abs=1e-9)
    assert r1.duration_s - r0.duration_s == pytest.approx(2.0, abs=1e-9)


def test_the_simulated_run_starts_serving_at_it() -> None:
    # uncapped: simulated request by request, nothing served before t = c. One request: exactly c later
    one = Load.finite(requests=1, prompt_tokens=1000, output_tokens=100)
    s0, s1 = bench_run(_dep(0.0), one), bench_run(_dep(2.0), one)
    assert s0["method"] == s1["method"] == "simulated"
    for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_e2el_ms"):
        assert float(s1[k]) - float(s0[k]) == pytest.approx(2000.0, abs=1e-4), k  # type: ignore[arg-type]  # the first arrival is ns after 0
    assert float(s1["mean_tpot_ms"]) == pytest.approx(float(s0["mean_tpot_ms"]), rel=1e-9)  # type: ignore[arg-type]
    # eight sent at once (1 ns apart): all queue until c and are admitted together, so each waits c and at most
    # the batch's prefill (well under 0.1 s for 8 x 1k tokens of an 8B model) more than without it
    eight = Load.finite(requests=8, prompt_tokens=1000, output_tokens=100)
    e0, e1 = bench_run(_dep(0.0), eight), bench_run(_dep(2.0), eight)
    assert 2000.0 <= float(e1["mean_ttft_ms"]) - float(e0["mean_ttft_ms"]) <= 2100.0  # type: ignore[arg-type]


def test_a_steady_plan_never_sees_it() -> None:
    # the planner's steady closed loop (no finite run): identical figures
    d0, d1 = _dep(0.0), _dep(5.0)
    req = EstimateRequest(model="llama-3.1-8b", gpu="mi300x", engine="sglang", concurrency="4", prompt_tokens=1000,
                          output_tokens=100)
    e0 = estimate_request(req, profile=d0.profile)[2]
    e1 = estimate_request(req, profile=d1.profile)[2]
    assert (e1.ttft_s, e1.tpot_s) == (e0.ttft_s, e0.tpot_s)


def test_shipped_values_are_bounded_and_vllm_has_none() -> None:
    lo, hi = BOUNDS["first_wave_overhead_s"]
    sg = engine_profile("sglang")
    vals = {f.family: dict(f.parameters).get("first_wave_overhead_s") for f in sg.families}
    assert vals.get("cdna3") is not None and all(v is None or lo <= v <= hi for v in vals.values())
    assert engine_profile("vllm").first_wave_overhead_s == 0.0
    assert all("first_wave_overhead_s" not in dict(f.parameters) for f in engine_profile("vllm").families)


def test_the_fit_reads_the_excess_of_the_mean_over_the_median() -> None:
    # the MI300X row of the module docstring: (mean - median) x M / N, with M = 10 N, is seconds, not the ~0.1 s the
    # prefills of the first wave take; stage E fits on exactly these rows (those that publish both statistics)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_inferencex as bx
    import fit_inferencex as fx

    rows = [r for r in csv.DictReader((ROOT / "tests/data/measurements/inferencex-dsr1.csv").open())
            if r["gpu"] == "mi300x" and r["framework"] == "sglang" and r["date"] == "2026-02-27"
            and r["isl"] == "1024" and r["concurrency"] == "4" and r["ttft_mean_ms"]]
    assert len(rows) == 1
    mean_ms, med_ms = float(rows[0]["ttft_mean_ms"]), float(rows[0]["ttft_median_ms"])
    assert (mean_ms - med_ms) * 10 / 1e3 == pytest.approx(4.31, abs=0.01)
    cases = fx.scored(bx.single_node_cases(bx.DEFAULT_CSV))
    mc = fx.mean_rows(cases)
    assert all(c.ttft_statistic == "mean" for c in mc) and len(mc) == sum(c.ttft_statistic == "mean" for c in cases)
    c = next(c for c in mc if c.gpu == "mi300x" and c.row["date"] == "2026-02-27" and c.conc == 4
             and c.row["isl"] == "1024")
    assert fx.as_median(c).ttft_statistic == "median" and fx.as_median(c).measured == c.measured
    assert fx.fit_stage_e([x for x in cases if x.ttft_statistic == "median"][:3], {}) == {}


def test_estimate_bench_says_so() -> None:
    # the shipped SGLang CDNA3 value (catalogs/profiles/sglang.yaml) is printed where it applies, and vLLM's 0 is not
    from typer.testing import CliRunner

    from recommender.cli import app

    args = ["estimate", "-m", "llama-3.1-8b", "--bench", "--num-prompts", "40", "--max-concurrency", "4"]
    sg = CliRunner().invoke(app, [*args, "-g", "mi300x", "--engine", "sglang"])
    assert sg.exit_code == 0, sg.output
    c = dict(engine_profile("sglang").for_gpu("mi300x").to_dict())["first_wave_overhead_s"]
    assert c > 0 and f"wait {c:.2f} s before the engine serves them" in sg.output
    vl = CliRunner().invoke(app, [*args, "-g", "h100-sxm"])
    assert vl.exit_code == 0 and "cold start" not in vl.output
