"""Engine-release overrides of a GPU family's parameters (``families.<f>.releases``, issue 22).

SGLang on MI355X ran two kernel generations in InferenceX: the September 2025 ROCm dev image (``sgl-dev-v0.5.2``)
and v0.5.5 onwards. One set of parameters predicted the first 26% fast and the second 16% slow (median measured /
predicted TPOT, ``benchmarks/fit_inferencex.py`` RELEASE_SPLITS); the family's parameters now describe the current
releases and a ``releases: [{before: '0.5.5'}]`` entry the older ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from recommender.errors import ConfigError
from recommender.profiles import engine_profile, load_profile, release_key

ROOT = Path(__file__).resolve().parents[1]

PROFILE = """engine: sglang
parameters:
  hbm_bandwidth_efficiency: 0.8
families:
  cdna4:
    rows: 10
    parameters:
      moe_layer_overhead_s: 1.0e-04
      expert_bandwidth_efficiency: 0.9
    releases:
    - before: '0.5.5'
      rows: 6
      parameters:
        expert_bandwidth_efficiency: 0.6
    - before: '0.5.0'
      rows: 2
      parameters:
        expert_bandwidth_efficiency: 0.5
"""


def test_release_key_orders_dotted_releases() -> None:
    assert release_key("0.5.2") == (0, 5, 2)
    assert release_key("v0.5.5.post3") == (0, 5, 5)  # the first dotted number: a post release is its release
    assert release_key("0.5.10") > release_key("0.5.9")  # type: ignore[operator]  # numeric, not text, order
    assert release_key("nightly") is None


def test_an_older_release_runs_its_override_over_the_family(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(PROFILE)
    prof = load_profile(p)
    # the family's current parameters at and after 0.5.5, and for a release the profile cannot read
    for rel in ("0.5.5", "0.5.12", "", "dev"):
        spec = prof.for_release("mi355x", rel)
        assert spec.expert_bandwidth_efficiency == 0.9 and spec.moe_layer_overhead_s == 1.0e-04
    # the lowest `before` above the release wins; parameters it does not name stay the family's
    old = prof.for_release("mi355x", "0.5.2")
    assert old.expert_bandwidth_efficiency == 0.6 and old.moe_layer_overhead_s == 1.0e-04
    assert prof.for_release("mi355x", "0.4.9").expert_bandwidth_efficiency == 0.5
    # fully specialised: the estimator's own for_gpu leaves it as it is
    assert old.families == () and old.for_gpu("mi355x") == old
    # another family has no override: the plain for_gpu
    assert prof.for_release("h200", "0.5.2") == prof.for_gpu("h200")


def test_a_release_entry_without_before_or_out_of_range_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(PROFILE.replace("before: '0.5.0'", "before: 'soon'"))
    with pytest.raises(ConfigError, match=r"releases\[1\] needs before"):
        load_profile(p)
    p.write_text(PROFILE.replace("expert_bandwidth_efficiency: 0.5", "expert_bandwidth_efficiency: 7"))
    with pytest.raises(ConfigError, match=r"releases\[1\]\.expert_bandwidth_efficiency"):
        load_profile(p)


def test_the_written_profile_keeps_its_releases(tmp_path: Path) -> None:
    from recommender.calibrate.report import profile_document, write_profile

    p = tmp_path / "p.yaml"
    p.write_text(PROFILE)
    out = write_profile(tmp_path / "q.yaml", profile_document(load_profile(p)))
    assert load_profile(out).for_release("mi355x", "0.5.2").expert_bandwidth_efficiency == 0.6


def test_the_shipped_sglang_profile_splits_mi355x_at_0_5_5() -> None:
    sg = engine_profile("sglang")
    f = sg.family_fit("mi355x")
    assert f is not None and [r.before for r in f.releases] == ["0.5.5"]
    old, new = sg.for_release("mi355x", "0.5.2", "deepseek-v3"), sg.for_release("mi355x", "0.5.9", "deepseek-v3")
    # the older kernels: a slower expert stream (the fit's direction, 26% slower steps than one set predicts)
    assert old.expert_bandwidth_efficiency < new.expert_bandwidth_efficiency
    assert new == sg.for_gpu("mi355x", "deepseek-v3").replace(families=())
    # the routed experts' terms are DeepSeek-R1's (its model override), not every MoE model's on the family
    assert sg.for_gpu("mi355x", "mixtral-8x7b").moe_layer_overhead_s == sg.moe_layer_overhead_s == 0.0
    assert new.moe_layer_overhead_s > 0.0


def test_inferencex_rows_name_their_release() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_inferencex as bx

    # image tags as the rows of tests/data/measurements/inferencex-dsr1.csv spell them
    assert bx.engine_release("sglang", "lmsysorg/sglang:v0.5.5-cu129-amd64") == "0.5.5"
    assert bx.engine_release("sglang", "rocm/7.0:rocm7.0_ubuntu_22.04_sgl-dev-v0.5.2-rocm7.0-mi35x-20250915") == "0.5.2"
    assert bx.engine_release("trt", "nvcr.io#nvidia/tensorrt-llm/release:1.1.0rc2.post2") == "1.1.0"
    assert bx.engine_release("atom", "rocm/atom:rocm7.1.1-ubuntu24.04-pytorch2.9-atom0.1.1-MI350x") == "0.1.1"
    assert bx.engine_release("sglang", "") == ""


def test_fit_inferencex_writes_and_rewrites_a_release_list(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_inferencex as fx

    text = "engine: sglang\nparameters:\n  hbm_bandwidth_efficiency: 0.8\nfamilies:\n"
    fam = {"cdna4": {"moe_layer_overhead_s": 1e-4, "expert_bandwidth_efficiency": 0.9}}
    rel = {"cdna4": [("0.5.5", 6, {"moe_layer_overhead_s": 2e-4, "expert_bandwidth_efficiency": 0.6})]}
    once = fx.merge_families(text, fam, {"cdna4": 10}, None, rel)
    twice = fx.merge_families(once, fam, {"cdna4": 10}, None, {"cdna4": [("0.5.5", 6, {"expert_bandwidth_efficiency": 0.5})]})
    p = tmp_path / "p.yaml"
    p.write_text(once)
    assert load_profile(p).for_release("mi355x", "0.5.2", fx.bx.MODEL).moe_layer_overhead_s == 2e-4
    p.write_text(twice)  # the second run replaces the list, it does not append a second one
    prof = load_profile(p)
    assert twice.count("releases:") == 1
    assert prof.for_release("mi355x", "0.5.2", fx.bx.MODEL).expert_bandwidth_efficiency == 0.5
    assert prof.for_release("mi355x", "0.5.2", fx.bx.MODEL).moe_layer_overhead_s == 1e-4
    # the current releases' expert terms are written as DeepSeek-R1's override, not the family's own
    f = prof.family_fit("mi355x")
    assert f is not None and "moe_layer_overhead_s" not in dict(f.parameters)
    assert dict(f.model_fit(fx.bx.MODEL).parameters) == {"moe_layer_overhead_s": 1e-4, "expert_bandwidth_efficiency": 0.9}
    assert twice.count("\n    models:\n") == 1


def test_sglang_blackwell_rows_poll_as_their_launch_scripts_say() -> None:
    # SemiAnalysisAI/InferenceX benchmarks/single_node/fixed_seq_len/ (unchanged 2025-11-21 d22bf9ca9 .. 843c6254):
    # dsr1_fp4_b200.sh / dsr1_fp4_b300.sh and the *_mtp.sh scripts: --scheduler-recv-interval 30 if CONC >= 16 else
    # 10, at any TP; dsr1_fp8_b200.sh / dsr1_fp8_b300.sh: 30 / 10 at TP 8, 10 at TP 4
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_inferencex as bx
    from recommender.perf.steady import poll_wait_s

    def case(gpu: str, dtype: str, tp: int, conc: int, mtp: int = 0, fw: str = "sglang") -> bx.Case:
        return bx.Case(row={}, gpu=gpu, framework=fw, tp=tp, dp=1, ep=tp > 1, mtp=mtp, weight_dtype=dtype,
                       kv_dtype="fp8", conc=conc, prompt_tokens=900, output_tokens=900, parallel="EP")

    assert bx.scheduler_poll_steps(case("b200", "fp4", 4, 128)) == 30   # was 10: the TP-8 rule of the fp8 script
    assert bx.scheduler_poll_steps(case("b300", "fp4", 4, 8)) == 10
    assert bx.scheduler_poll_steps(case("b200", "fp8", 8, 16)) == 30
    assert bx.scheduler_poll_steps(case("b300", "fp8", 4, 32)) == 10
    assert bx.scheduler_poll_steps(case("b200", "fp8", 8, 64, mtp=1)) == 30
    assert bx.scheduler_poll_steps(case("mi355x", "fp8", 8, 64)) == 4
    assert bx.scheduler_poll_steps(case("b200", "fp4", 4, 128, fw="trt")) == 1
    # a request arriving between two polls of every 30 steps of 26.7 ms waits (30 - 1) / 2 x 26.7 = 387 ms on average
    assert poll_wait_s(30, 0.0267) == pytest.approx(0.38715)


def test_sglang_rows_carry_the_kv_cache_dtype_their_launch_script_set_on_that_date() -> None:
    # SemiAnalysisAI/InferenceX benchmarks/**/dsr1_<precision>_<gpu>.sh history: --kv-cache-dtype fp8_e4m3 in the
    # B200 / B300 fp8 scripts from 425f74d51 (2025-09-12), MI300X from 32772c579 and MI325X from e9b6e0fde
    # (2026-01-23 UTC, "SGLang v0.5.7 ... fp8 KV cache"), MI355X fp8 from 9d39c92ee (2026-03-05), MI355X MXFP4 from
    # 332fec529 (2025-12-16); never in the H200 scripts; TensorRT-LLM (kv_cache_config dtype: fp8) and ATOM
    # (--kv_cache_dtype fp8) always
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_inferencex as bx

    kv = bx.kv_cache_dtype
    assert kv("sglang", "b200", "fp8", "2025-11-18") == "fp8"        # was bf16 before this rule
    assert kv("sglang", "b300", "fp4", "2026-04-17") == "fp8"
    assert kv("sglang", "h200", "fp8", "2026-05-20") == "bf16"
    assert kv("sglang", "mi300x", "fp8", "2026-01-05") == "bf16"
    assert kv("sglang", "mi325x", "fp8", "2026-01-23") == "fp8"
    assert kv("sglang", "mi355x", "fp8", "2026-02-27") == "bf16"
    assert kv("sglang", "mi355x", "fp8", "2026-03-05") == "fp8"
    assert kv("sglang", "mi355x", "mxfp4", "2025-12-15") == "bf16"   # was fp8: every fp4 row had been given fp8
    assert kv("sglang", "mi355x", "mxfp4", "2025-12-19") == "fp8"
    assert kv("trt", "h200", "fp8", "2025-11-02") == "fp8" and kv("atom", "mi355x", "mxfp4", "2026-01-14") == "fp8"
    rows = bx.single_node_cases(bx.DEFAULT_CSV)
    assert {c.kv_dtype for c in rows if c.framework == "sglang" and c.gpu == "b200"} == {"fp8"}


def test_stage_b_ships_the_candidate_with_the_lowest_held_out_ttft_plus_tpot_error() -> None:
    # benchmarks/results/inferencex-fit.md, SGLang on CDNA4 (86 rows): none 45.3% TTFT (loss 0.712); the front end's
    # cost alone 37.0% TTFT / 8.2% TPOT held out (loss 0.470); with the experts' rate 30.1 / 8.9 (loss 0.400): both
    # beat none, and 30.1 + 8.9 = 39.0 < 37.0 + 8.2 = 45.2 ships the second (the old rule, TPOT within half a point
    # of none's 8.2, had refused it)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_inferencex as fx

    one = fx.stage_b_candidate(held_ttft_loss=0.470, held_ttft_mape=37.0, held_tpot_mape=8.2, none_ttft_loss=0.712,
                               none_ttft_mape=45.3)
    two = fx.stage_b_candidate(held_ttft_loss=0.400, held_ttft_mape=30.1, held_tpot_mape=8.9, none_ttft_loss=0.712,
                               none_ttft_mape=45.3)
    assert one[0] and two[0] and two[1] < one[1]
    assert two[1] == pytest.approx(39.0)
    # SGLang before 0.5.5 on CDNA4, the second set: held-out TTFT loss 0.518 below none's 0.699, but its TTFT MAPE
    # 49.4 above none's 45.4, so it is no candidate
    assert not fx.stage_b_candidate(held_ttft_loss=0.518, held_ttft_mape=49.4, held_tpot_mape=21.7,
                                    none_ttft_loss=0.699, none_ttft_mape=45.4)[0]
