"""The serving front end's fixed cost per request (``server_request_overhead_s``, issue 22 stage B).

It is a constant added once to every client-timed TTFT, so a closed-loop estimate with it minus the same estimate
without it must be exactly the parameter, and an engine's own timer (``EngineLimits.engine_timer``: trtllm-bench,
the published TensorRT-LLM rows the rest of the profile was fitted on) must not see it.
"""

from __future__ import annotations

import dataclasses

import pytest

from recommender.estimator import EstimateRequest, estimate_request
from recommender.perf.conditions import engine_conditions
from recommender.perf.step import StepCostModel
from recommender.profiles import BOUNDS, engine_profile, load_profile


def _dep(engine: str, gpu: str, server_s: float | None = None):  # type: ignore[no-untyped-def]
    prof = engine_profile(engine).for_gpu(gpu)
    if server_s is not None:
        prof = prof.replace(server_request_overhead_s=server_s, families=())  # for_gpu would put the family value back
    req = EstimateRequest(model="llama-3.1-8b", gpu=gpu, engine=engine, concurrency="4", prompt_tokens=1000,
                          output_tokens=100)
    return estimate_request(req, profile=prof)


def test_ttft_grows_by_exactly_the_front_end_cost() -> None:
    # 0.05 s is an arbitrary trial value: the difference of two TTFTs must be it, to rounding
    dep0, _, e0 = _dep("sglang", "b200", 0.0)
    dep1, _, e1 = _dep("sglang", "b200", 0.05)
    assert e1.ttft_s - e0.ttft_s == pytest.approx(0.05, abs=1e-9)
    assert e1.tpot_s == pytest.approx(e0.tpot_s, rel=1e-12)   # a per-request cost, not a per-step one
    assert StepCostModel.build(dep1).request_overhead_s == pytest.approx(dep1.profile.request_overhead_s + 0.05)


def test_an_engine_timer_does_not_see_it() -> None:
    dep, _, _ = _dep("trtllm", "b200", 0.05)
    timed = dataclasses.replace(dep, limits=dataclasses.replace(dep.limits, engine_timer=True))
    assert StepCostModel.build(timed).request_overhead_s == pytest.approx(dep.profile.request_overhead_s)
    # trtllm-bench's conditions (the published rows) are an engine timer; the OpenAI server's are not
    cat_dep = dep
    c = engine_conditions("trtllm", model=cat_dep.model, gpu=cat_dep.gpu, tp=1, weight_dtype="bf16", kv_dtype="bf16",
                          prompt_tokens=128, output_tokens=128, profile=dep.profile)
    assert c.limits.engine_timer and c.request_overhead_s == dep.profile.request_overhead_s
    s = engine_conditions("sglang", model=cat_dep.model, gpu=cat_dep.gpu, tp=1, weight_dtype="bf16", kv_dtype="bf16",
                          prompt_tokens=128, output_tokens=128, profile=dep.profile.replace(request_overhead_s=0.0))
    assert not s.limits.engine_timer and s.request_overhead_s == pytest.approx(0.05)


def test_shipped_values_are_per_family_and_bounded() -> None:
    # fitted by benchmarks/fit_inferencex.py (stage B); a family without one falls back to 0 (vLLM: none at all)
    lo, hi = BOUNDS["server_request_overhead_s"]
    sg = engine_profile("sglang")
    vals = {f.family: dict(f.parameters).get("server_request_overhead_s") for f in sg.families}
    assert vals.get("blackwell") is not None and all(v is None or lo <= v <= hi for v in vals.values())
    assert engine_profile("vllm").server_request_overhead_s == 0.0
    assert all("server_request_overhead_s" not in dict(f.parameters) for f in engine_profile("vllm").families)


def test_a_profile_file_outside_the_bound_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from recommender.errors import ConfigError

    p = tmp_path / "p.yaml"
    p.write_text("engine: sglang\nparameters:\n  server_request_overhead_s: 5.0\n")
    with pytest.raises(ConfigError, match="server_request_overhead_s"):
        load_profile(p)


@pytest.mark.slow
def test_bench_inferencex_reports_held_out_by_configuration_per_group(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "ix.md"
    subprocess.run([sys.executable, "benchmarks/bench_inferencex.py", "--held-out", "--folds", "2", "--out", str(out)],
                   cwd=root, check=True, capture_output=True, timeout=900)
    text = out.read_text()
    assert "held out TTFT / TPOT / tput %" in text and "--held-out" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(("| GPU ", "| framework ", "| parallelism ", "| all | 740 | "))]
    # every group row of the summary carries a held-out cell (three numbers), and the six GPUs are there
    summary = [ln for ln in rows if ln.count("|") == 8 and "| rows |" not in ln and "%" not in ln.split("|")[3]]
    assert len([ln for ln in summary if ln.startswith("| GPU ")]) == 6
    assert all(ln.split("|")[6].count("/") == 2 for ln in summary)


def test_a_burst_run_pays_it_once_per_request_not_once_per_wave() -> None:
    # 3,000 requests sent at once: the engine admits at most max_num_seqs (1,024 on a B200: vLLM's default for
    # >= 160 GiB) and runs them as ceil(3000 / r) >= 3 synchronised waves; the front end's cost is in each request's
    # TTFT once, and in the run's duration once (the last request's), not once per wave
    from recommender.estimator import finite_run
    from recommender.perf.steady import Load

    load = Load.finite(requests=3000, prompt_tokens=1000, output_tokens=100)
    d0, _, _ = _dep("sglang", "b200", 0.0)
    d1, _, _ = _dep("sglang", "b200", 0.05)
    r0, r1 = finite_run(d0, load), finite_run(d1, load)
    assert r0.method == "analytic burst" and r0.duration_s > 3 * 0.05
    assert r1.ttft_s - r0.ttft_s == pytest.approx(0.05, abs=1e-9)
    assert r1.duration_s - r0.duration_s == pytest.approx(0.05, abs=1e-9)
