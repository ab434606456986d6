"""The README's per-profile evidence table and a plan's evidence note count the same rows (issue 22).

The row counts are derived here from the measurement files themselves (tests/data/measurements/, copied from
../shared/reference/measurements/), not from the profiles that record them.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from recommender.profiles import engine_profile
from recommender.search.recommend_rows import measured_rows

ROOT = Path(__file__).resolve().parents[1]
MEAS = ROOT / "tests" / "data" / "measurements"


def _inferencex_rows(framework: str, gpus: tuple[str, ...]) -> int:
    """Single-node InferenceX rows of a framework on some GPUs, less the flagged inconsistent one (README there)."""
    with (MEAS / "inferencex-dsr1.csv").open() as f:
        return sum(1 for r in csv.DictReader(f)
                   if r["framework"] == framework and r["gpu"] in gpus and r["is_multinode"] == "false"
                   and r["disagg"] == "false" and "closed_loop_check_ratio" not in r["quality_flags"])


def test_the_readme_carries_the_table_as_the_profiles_record_it() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import profile_evidence

    readme = (ROOT / "README.md").read_text()
    lines = profile_evidence.table()
    assert len(lines) > 10
    for line in lines:
        assert line in readme, line


def test_a_moe_plan_counts_the_inferencex_rows_of_its_family() -> None:
    # Blackwell = B200 + B300 (catalog arch); SGLang rows on them, counted in the CSV
    n = _inferencex_rows("sglang", ("b200", "b300"))
    assert n == 174
    assert measured_rows(engine_profile("sglang"), "b200", moe=True) == ("blackwell", n)
    assert dict(engine_profile("sglang").family_fit("b300").held_out_inferencex)["rows"] == n  # type: ignore[union-attr]
    # ATOM has its own profile: its MI355X rows only
    assert measured_rows(engine_profile("atom"), "mi355x", moe=True) == ("cdna4", _inferencex_rows("atom", ("mi355x",)))
    # SGLang on MI355X: both release epochs count (61 + 86 in benchmarks/results/inferencex-fit.md)
    assert measured_rows(engine_profile("sglang"), "mi355x", moe=True)[1] == _inferencex_rows("sglang", ("mi355x",)) == 147


def test_a_dense_plan_counts_the_dense_rows_not_the_moe_ones() -> None:
    # TensorRT-LLM on Hopper: the published.csv rows (H100 / H200 / GH200 ...) behind the dense fit, not the 41
    # InferenceX DeepSeek-R1 rows its family block was written from
    fam, n = measured_rows(engine_profile("trtllm"), "h100-sxm", moe=False)
    held = engine_profile("trtllm").held_out_evidence("h100-sxm")
    assert fam == "hopper" and n > 41 and held is not None and n == held.rows  # the README's dense column
    assert measured_rows(engine_profile("trtllm"), "h100-sxm", moe=True) == ("hopper", _inferencex_rows("trt", ("h200",)))


def test_a_vllm_moe_plan_has_no_measured_rows_of_its_own() -> None:
    # InferenceX has no vLLM rows (its frameworks: sglang, trt, atom and their P/D forms), and the dense rows behind
    # vLLM's hopper family fit say nothing of the routed experts; the terms it borrows from SGLang are not its rows
    with (MEAS / "inferencex-dsr1.csv").open() as f:
        assert not any("vllm" in r["framework"] for r in csv.DictReader(f))
    vllm = engine_profile("vllm")
    assert vllm.borrowed_fit("h200", "deepseek-v3") is not None
    assert measured_rows(vllm, "h200", moe=True, model_id="deepseek-v3") == ("hopper", 0)
    assert measured_rows(vllm, "b200", moe=True, model_id="qwen3-30b-a3b") == ("blackwell", 0)
    assert measured_rows(vllm, "h200", moe=False, model_id="llama-3.1-70b")[1] > 0  # its dense rows still count


def test_a_calibration_counts_for_a_moe_plan_only_where_it_covers_that_model() -> None:
    from recommender.profiles import EngineProfile

    fit = {"coverage": {"families": {"hopper": 30}, "models": {"deepseek-v3": 12, "llama-3.1-8b": 18}}}
    prof = EngineProfile(engine="vllm", source="calibrated", fit=fit)
    assert measured_rows(prof, "h100-sxm", moe=True, model_id="deepseek-v3") == ("hopper", 12)
    assert measured_rows(prof, "h100-sxm", moe=True, model_id="qwen3-30b-a3b") == ("hopper", 0)
    assert measured_rows(prof, "b200", moe=True, model_id="deepseek-v3") == ("blackwell", 0)  # not on that family
    assert measured_rows(prof, "h100-sxm", moe=False, model_id="llama-3.1-8b") == ("hopper", 30)


def test_a_vllm_moe_plan_counts_its_error_band_class_rows() -> None:
    # vLLM's 9 gpt-oss-20b rows on H100 (published.csv, engine vllm; a MoE model in mxfp4): the rows of the class
    # vllm/hopper/mxfp4/moe, which the P(SLO) column counts, are the plan's measured rows too
    with (MEAS / "published.csv").open() as f:
        n = sum(1 for r in csv.DictReader(f) if r["engine"] == "vllm" and r["model"] == "gpt-oss-20b")
    assert n == 9
    vllm = engine_profile("vllm")
    assert measured_rows(vllm, "h100-sxm", moe=True, model_id="gpt-oss-120b", dtype="mxfp4") == ("hopper", n)
    assert measured_rows(vllm, "h200", moe=True, model_id="deepseek-v3", dtype="fp8") == ("hopper", 0)
