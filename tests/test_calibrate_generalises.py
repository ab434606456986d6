"""``calibrate`` generalises: fitted on part of a user's results, it lowers the error on the rest (issue 22).

The rows are published measurements (tests/data/measurements/published.csv, copied from
reference/measurements/published.csv; LMD = LMDeploy TurboMind v0.1 on A100-80G FP16, InternLM/lmdeploy@3e391df
docs/en/benchmark/a100_fp16.md; TRT017 = TensorRT-LLM 0.17 perf overview). The split is by whole
configuration (model / GPU / TP): a point held out beside its neighbours would be no test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.calibrate.api import fit_user_rows, user_base
from recommender.calibrate.fit import ape, error_stats
from recommender.calibrate.measurements import Measurement, predict
from recommender.calibrate.readers import read_published_csv
from recommender.profiles import engine_profile

DATA = Path(__file__).resolve().parent / "data" / "measurements"


@pytest.fixture(scope="module")
def published() -> list[Measurement]:
    return list(read_published_csv(DATA / "published.csv").measurements)


@pytest.mark.slow  # over 20 s on 2 cores (2026-12-03 --durations)
def test_lmdeploy_rows_fitted_without_a_configuration_predict_it_no_worse(published: list[Measurement]) -> None:
    # a user of LMDeploy starts from the shipped vLLM profile (it never saw these rows) and calibrates on two
    # of the three configurations (Llama-2-7B TP1, 13B TP1, 70B TP4 on A100-80GB), leaving one out each time
    ms = [m for m in published if m.engine == "lmdeploy"]
    configs = sorted({m.group("config") for m in ms})
    assert len(configs) == 3
    start = engine_profile("vllm")
    before: list[float] = []
    after: list[float] = []
    kept = 0
    for held in configs:
        train = [m for m in ms if m.group("config") != held]
        test = [m for m in ms if m.group("config") == held]
        uf = fit_user_rows(train, start)
        assert uf.check is not None and uf.check.by == "config"
        b = [ape(predict(m, start), m.value) for m in test]
        a = [ape(predict(m, uf.result.profile), m.value) for m in test]
        if uf.kept:   # a fit the k-fold check kept lowers the held-out configuration's error
            kept += 1
            assert error_stats(a).median_ape < error_stats(b).median_ape, held
        else:         # a rejected one changes nothing
            assert a == b
        before += b
        after += a
    assert kept >= 1
    # the pooled median within 2% of the start's (2026-12-06: 10.95 -> 11.11%, the start refitted from two starts;
    # 11.1 = 11.1% before), the p90 lower (44.2 -> 40.5%): the gate promises the kept fits above, not the pool
    assert error_stats(after).median_ape <= error_stats(before).median_ape * 1.02
    assert error_stats(after).p90_ape < error_stats(before).p90_ape


def test_a_fit_that_does_not_generalise_keeps_the_start_profile(published: list[Measurement]) -> None:
    # one configuration of 3 rows (k-fold over rows): whatever the fit does, the decision is made held out,
    # and a rejected fit leaves the start profile's values in place
    ms = [m for m in published if m.engine == "vllm" and m.model == "llama-3.1-8b" and m.quantity == "ttft_s"][:3]
    uf = fit_user_rows(ms, engine_profile("vllm"))
    if not uf.kept:
        for n in ("hbm_bandwidth_efficiency", "compute_efficiency", "step_overhead_s"):
            assert getattr(uf.result.profile, n) == getattr(uf.base, n)
    assert uf.base.hbm_bandwidth_efficiency == engine_profile("vllm").for_gpu("h100-sxm").hbm_bandwidth_efficiency


def test_rows_of_one_family_start_from_that_familys_parameters() -> None:
    amd = list(read_published_csv(DATA / "amd-mi300x.csv").measurements)
    prof = engine_profile("vllm")
    base = user_base(amd, prof)
    fam = prof.family_fit("mi300x")
    assert fam is not None
    for n, v in fam.parameters:
        assert getattr(base, n) == v
    assert all(f.family != "cdna3" for f in base.families)


def test_profiles_record_rows_and_held_out_error_per_family() -> None:
    # benchmarks/fit_profiles.py writes fit.held_out_by_config; the row counts are those of the measurement files
    amd = list(read_published_csv(DATA / "amd-mi300x.csv").measurements)
    ev = engine_profile("vllm").held_out_evidence("mi300x")
    assert ev is not None and ev.family == "cdna3" and ev.rows == len(amd) == 16 and ev.configurations == 1
    assert 0.0 < ev.median_ape_pct <= ev.p90_ape_pct
    pub = list(read_published_csv(DATA / "published.csv").measurements)
    hopper = [m for m in pub if m.engine == "trtllm" and m.gpu in ("h100-sxm", "h200")]
    tr = engine_profile("trtllm").held_out_evidence("h200")
    assert tr is not None and tr.rows == len(hopper) and tr.configurations == len({m.group("config") for m in hopper})
    assert engine_profile("trtllm").held_out_evidence("b200") is None     # no TensorRT-LLM row on Blackwell
