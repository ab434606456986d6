"""EP, DP attention and MTP speculative decoding (recommender/perf/moe.py, perf/speculative.py) against hand
calculations, and the estimate command's vocabulary and one-line refusals for them.

DeepSeek-V3 figures come from its catalog config (61 layers, 58 MoE layers, 256 routed experts top-8, MLA
kv_lora_rank 512 + rope 64, one MTP layer) and the parameter counts in ``hf_config.count_params``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli.app import app
from recommender.errors import ConfigError
from recommender.estimator import EstimateRequest, build, build_deployment, estimate_request, parse_speculative_config
from recommender.perf import moe
from recommender.perf import speculative as spec
from recommender.perf.step import StepCostModel
from recommender.profiles import engine_profile

CAT = default_catalog()
DSV3 = CAT.model("deepseek-v3")
RUN = CliRunner()


def _dep(gpu: str = "h200", *, tp: int = 8, dp: int = 1, ep: bool = False, s: spec.SpecDecode | None = None,
         kv: str = "bf16"):
    return build_deployment(model=DSV3, gpu=CAT.gpu(gpu), tp=tp, weight_dtype="fp8", kv_dtype=kv,
                            profile=engine_profile("sglang"), max_model_len=2048, dp=dp, ep=ep, spec=s)


# -- expected experts touched ---------------------------------------------------------------------------
def test_experts_touched_by_hand() -> None:
    # one token touches exactly its top-8; two tokens: 256 x (1 - (248/256)^2) = 256 x 0.0615234375 = 15.75
    assert moe.expected_experts_touched(256, 8, 1) == pytest.approx(8.0)
    assert moe.expected_experts_touched(256, 8, 2) == pytest.approx(15.75)
    assert moe.expected_experts_touched(256, 8, 0) == 0.0


def test_busiest_rank_by_hand() -> None:
    # 32 tokens over 8 EP ranks of 32 experts: 0.96875^32 = exp(32 ln 0.96875) = 0.362062, p = 0.637938;
    # mean 32 p = 20.414, sd sqrt(32 p (1-p)) = 2.7187, z(8) = E[max of 8 standard normals] = 1.42360 (Harter's
    # tables of normal order statistics, 1961) -> 20.414 + 3.870 = 24.284
    assert moe.extreme_z(8) == pytest.approx(1.42360, abs=1e-5)
    assert moe.busiest_rank_experts(256, 8, 32, 8) == pytest.approx(24.284, abs=0.01)
    # a prefill-sized step touches every expert of every rank
    assert moe.busiest_rank_experts(256, 8, 4096, 8) == pytest.approx(32.0)
    # one rank: no imbalance, the expectation itself
    assert moe.busiest_rank_experts(256, 8, 2, 1) == pytest.approx(15.75)


def test_extreme_z_is_the_expected_maximum_of_normal_draws() -> None:
    # closed forms: E[max of 2] = 1 / sqrt(pi), E[max of 3] = 3 / (2 sqrt(pi)); 4 and 16 from Harter (1961): 1.02938,
    # 1.76599; the sqrt(2 ln G) asymptote it replaced is 43% high at G = 8 and still 33% high at G = 16
    assert moe.extreme_z(1) == 0.0
    assert moe.extreme_z(2) == pytest.approx(1.0 / math.sqrt(math.pi), abs=1e-9)
    assert moe.extreme_z(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-9)
    assert moe.extreme_z(4) == pytest.approx(1.02938, abs=1e-5)
    assert moe.extreme_z(16) == pytest.approx(1.76599, abs=1e-5)
    assert math.sqrt(2 * math.log(16)) / moe.extreme_z(16) == pytest.approx(1.333, abs=1e-3)


def test_remote_ranks_and_imbalance_by_hand() -> None:
    # a token's 8 experts over 8 ranks: 7 x (1 - (7/8)^8) = 7 x (1 - 0.343609) = 4.59474 other ranks
    assert moe.remote_ranks_per_token(8, 8) == pytest.approx(4.59474, abs=1e-5)
    # 1000 tokens x 8 over 8 ranks: mean 1000, sd sqrt(8000 x 1/8 x 7/8) = 29.58; busiest 1000 + 1.4236 x 29.58
    assert moe.routed_imbalance(1000, 8, 8) == pytest.approx(1.0 + 1.42360 * 29.5804 / 1000, rel=1e-4)
    assert moe.routed_imbalance(1000, 8, 1) == 1.0


# -- weights and KV per GPU ------------------------------------------------------------------------------
def test_prefill_reads_every_expert_84_gb_per_gpu() -> None:
    # R1 fp8 on 8 GPUs: 669,065,734,144 linear params x 1 B + 1,960,685,056 other params x 2 B = 672,987,104,256 B
    # over 8 GPUs = 84,123,388,032 B; a 1k-token prefill step touches all 256 experts of every layer
    cost = StepCostModel.build(_dep())
    assert cost.weight_bytes_read_per_gpu(1024) == pytest.approx(84_123_388_032, rel=1e-6)
    # and its GEMM time is at least that read at the achieved bandwidth, whatever its FLOPs
    p = cost.parts(1024, 0.0, 0.0)
    assert p["gemm_s"] >= 84_123_388_032 / cost.hbm_bytes_per_s * (1 - 1e-9)


def test_dpa_weights_and_kv_per_rank() -> None:
    # experts: 653,908,770,816 B / 8 GPUs = 81,738,596,352; the rest (19,078,333,440 B) whole on each TP-1 rank
    dpa = _dep(tp=1, dp=8, ep=True).memory()
    assert dpa.weights_bytes_per_gpu == pytest.approx(81_738_596_352 + 19_078_333_440, rel=1e-9)
    # MLA latent: 61 layers x (512 + 64) x 2 B = 70,272 B per token on the one GPU of a DPA rank ...
    assert dpa.kv_cache_bytes_per_token == pytest.approx(70_272)
    # ... against 8 replicated copies (562,176 B) on TP 8
    assert _dep(tp=8).memory().kv_cache_bytes_per_token == pytest.approx(562_176)


def test_dpa_holds_more_sequences_than_tp8() -> None:
    # KV tokens per rank x 8 ranks against TP 8's one replicated cache: the latent is no longer copied 8 times
    tp8 = _dep(tp=8).memory().kv_capacity_tokens
    dpa = _dep(tp=1, dp=8, ep=True).memory().kv_capacity_tokens * 8
    assert dpa > 3 * tp8


def test_tp_only_deployment_unchanged() -> None:
    from recommender.perf import memory as mem

    d = _dep(tp=8)
    direct = mem.memory_breakdown(DSV3, d.gpu, 8, "fp8", "bf16", d.profile, d.gpu_memory_utilization,
                                  d.limits.max_num_batched_tokens, d.limits.max_num_seqs, True, 2048)
    assert d.memory() == direct


def test_dpa_step_has_all_to_all_and_ep_reads_busiest_rank() -> None:
    dpa = StepCostModel.build(_dep(tp=1, dp=8, ep=True))
    assert dpa.moe is not None
    # tp 1: no attention all-reduce; 58 MoE layers of all-to-all + 3 dense layers of all-gather/reduce-scatter
    t = 16
    expect = 58 * dpa.moe.all_to_all_s(t) + 3 * dpa.moe.dense_ffn_collective_s(t)
    assert dpa.allreduce_s(t) == pytest.approx(expect)
    wire = t * 4.594744 * 7168 * 2.0
    assert dpa.moe.all_to_all_s(t) == pytest.approx(2 * (dpa.moe.link_latency_s + wire / dpa.moe.link_bytes_per_s), rel=1e-5)
    # 16 tokens per rank = 128 routed: each GPU reads its busiest rank's experts, whole
    busiest = moe.busiest_rank_experts(256, 8, 128, 8)
    assert dpa.weight_bytes_read_per_gpu(t) == pytest.approx(dpa.dense_weight_bytes_per_gpu + 58 * busiest * DSV3.params.expert_one)


# -- MTP ----------------------------------------------------------------------------------------------------
def test_tokens_per_step_by_hand() -> None:
    assert spec.tokens_per_step(1, 0.8) == pytest.approx(1.8)
    assert spec.tokens_per_step(3, 0.5) == pytest.approx(1.875)    # 1 + 0.5 + 0.25 + 0.125
    assert spec.tokens_per_step(2, 1.0) == pytest.approx(3.0)


def test_mtp_module_params_match_readme() -> None:
    # DeepSeek-V3 README_WEIGHTS: the MTP module holds 11.5B unique parameters; ours 11,610,053,888 (one layer's
    # attention 187,107,328 + 256 experts x 44,040,192 + shared 44,040,192 + router 1,835,264 + eh_proj 2 x 7168^2)
    rest, experts = spec.mtp_layer_params(DSV3)
    assert rest + experts == pytest.approx(11_610_053_888, rel=1e-6)
    assert rest + experts == pytest.approx(11.5e9, rel=0.02)
    assert DSV3.mtp_layers == 1


def test_mtp_verify_cost_and_tpot() -> None:
    s = spec.SpecDecode(num_speculative_tokens=1, acceptance_rate=1.0)
    d = _dep(s=s)
    cost = StepCostModel.build(d)
    kv, fl = cost.decode_seq_cost(1000)
    # every position accepted: 2 tokens per step; the verify step carries 2 query tokens per sequence
    verify = cost.step_s(2 * 4, 4 * kv, 4 * fl * 2)
    assert cost.decode_step_s(4, 1000) == pytest.approx((verify + cost.draft_s(4, 1000)) / 2.0)
    plain = StepCostModel.build(_dep())
    assert cost.decode_step_s(4, 1000) < plain.decode_step_s(4, 1000)
    # nothing accepted: one token per step for a dearer step
    bad = StepCostModel.build(_dep(s=spec.SpecDecode(num_speculative_tokens=3, acceptance_rate=0.01)))
    assert bad.decode_step_s(4, 1000) > plain.decode_step_s(4, 1000)


def test_mtp_memory_holds_draft_weights_and_kv() -> None:
    s = spec.SpecDecode(num_speculative_tokens=1, acceptance_rate=0.8)
    with_mtp, without = _dep(s=s).memory(), _dep().memory()
    # 11,610,053,888 params: 187,107,328 + 44,040,192 + 1,835,264 + 102,760,448 + 21,504 = 335,764,736 non-expert
    # (fp8, 1 B) over TP 8 + 11,274,289,152 expert bytes over 8 GPUs
    assert with_mtp.weights_bytes_per_gpu - without.weights_bytes_per_gpu == pytest.approx(11_610_053_888 / 8, rel=1e-6)
    assert with_mtp.kv_cache_capacity_bytes < without.kv_cache_capacity_bytes


def test_speculative_config_parsing() -> None:
    s = parse_speculative_config('{"method": "mtp"}', DSV3)
    assert s is not None and s.num_speculative_tokens == 1          # vLLM's default: the model's MTP layers
    s2 = parse_speculative_config('{"method": "deepseek_mtp", "num_speculative_tokens": 3}', DSV3, acceptance_rate=0.6)
    assert s2 is not None and (s2.num_speculative_tokens, s2.acceptance_rate) == (3, 0.6)
    assert parse_speculative_config(None, DSV3) is None


@pytest.mark.parametrize("args, words", [
    (["--model", "llama-3.1-8b", "--enable-expert-parallel"], "dense model"),
    (["--model", "deepseek-v3", "--tp", "2", "--data-parallel-size", "3"], "does not divide"),
    (["--model", "deepseek-v3", "--tp", "8", "--data-parallel-size", "2"], "exceeds"),
    (["--model", "llama-3.1-8b", "--speculative-config", '{"method": "mtp"}'], "no MTP heads"),
    (["--model", "deepseek-v3", "--tp", "8", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 0}'], "1 to 8"),
    (["--model", "deepseek-v3", "--tp", "8", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 9}'], "1 to 8"),
    (["--model", "deepseek-v3", "--tp", "8", "--speculative-config", '{"method": "mtp"}', "--acceptance-rate", "0"], "(0, 1]"),
    (["--model", "deepseek-v3", "--tp", "8", "--speculative-config", '{"method": "mtp"}', "--acceptance-rate", "1.5"], "(0, 1]"),
    (["--model", "deepseek-v3", "--tp", "8", "--speculative-config", '{"method": "ngram"}'], "only the model's own MTP"),
    (["--model", "deepseek-v3", "--tp", "8", "--speculative-config", "{mtp"], "not JSON"),
])
def test_bad_input_gets_one_line(args: list[str], words: str) -> None:
    r = RUN.invoke(app, ["estimate", "--gpu", "h200", *args, "--concurrency", "4", "--prompt-tokens", "1000",
                         "--output-tokens", "100"])
    assert r.exit_code != 0
    err = r.output.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_estimate_json_dpa_ep_mtp() -> None:
    r = RUN.invoke(app, ["estimate", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "1", "--data-parallel-size", "8",
                         "--enable-expert-parallel", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}',
                         "--concurrency", "64", "--prompt-tokens", "1000", "--output-tokens", "1000", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["kv_cache_bytes_per_token"] == pytest.approx(70_272)
    assert d["gpus_total"] == 8 and d["batch"] == 64
    assert d["data_parallel_size"] == 8 and d["enable_expert_parallel"] is True
    assert d["speculative"]["num_speculative_tokens"] == 2


def test_estimate_bench_mtp_takes_vllm_flags() -> None:
    r = RUN.invoke(app, ["estimate", "--model", "deepseek-v3", "--gpu", "b200", "--tp", "8", "--enable-expert-parallel",
                         "--speculative-config", '{"method": "mtp"}', "--bench", "--max-concurrency", "8",
                         "--num-prompts", "80", "--random-input-len", "1024", "--random-output-len", "1024",
                         "--format", "json", "--weight-dtype", "fp4", "--kv-dtype", "fp8"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["mean_tpot_ms"] > 0 and d["method"] == "analytic"
    # an uncapped run goes through the simulator, which prices MTP verify steps (recommender.load): MTP k = 1
    # (the model's one MTP layer) makes TPOT shorter than the same run without it
    def uncapped(*extra: str) -> dict:
        r2 = RUN.invoke(app, ["estimate", "--model", "deepseek-v3", "--gpu", "b200", "--tp", "8", *extra, "--bench",
                              "--num-prompts", "8", "--random-input-len", "1024", "--random-output-len", "256",
                              "--format", "json", "--weight-dtype", "fp8", "--kv-dtype", "fp8"])
        assert r2.exit_code == 0, r2.output
        return json.loads(r2.output)

    with_mtp, without = uncapped("--speculative-config", '{"method": "mtp"}'), uncapped()
    assert 0 < with_mtp["mean_tpot_ms"] < without["mean_tpot_ms"]


def test_walkthrough_prints_new_terms() -> None:
    r = RUN.invoke(app, ["estimate", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "1", "--data-parallel-size", "8",
                         "--enable-expert-parallel", "--speculative-config", '{"method": "mtp"}',
                         "--concurrency", "64", "--prompt-tokens", "1000", "--output-tokens", "1000"])
    assert r.exit_code == 0, r.output
    for words in ("experts touched", "all-to-all", "tokens per step", "KV per token"):
        assert words in r.output


def test_dp_on_dense_model_is_independent_ranks() -> None:
    one = build(EstimateRequest(model="llama-3.1-8b", gpu="h200", concurrency="16", prompt_tokens=1000, output_tokens=100))[0]
    two = build(EstimateRequest(model="llama-3.1-8b", gpu="h200", dp=2, concurrency="16", prompt_tokens=1000, output_tokens=100))[0]
    assert StepCostModel.build(one).decode_step_s(8, 1000) == StepCostModel.build(two).decode_step_s(8, 1000)


def test_bad_layout_refused_in_library() -> None:
    with pytest.raises(ConfigError):
        moe.check_layout(DSV3, "h200", 8, tp=1, dp=0, ep=True)
    moe.check_layout(DSV3, "h200", 8, tp=1, dp=8, ep=True)


def test_wide_ep_in_one_nvl72_rack_is_a_layout() -> None:
    # InferenceX's disaggregated GB200 rows (tests/data/measurements/inferencex-dsr1.csv) run Dynamo decode workers
    # of DP 16 and 32 attention ranks with EP over the whole worker: 16 and 32 do not divide the 72-GPU rack, but
    # they lie inside it; EP 24 does not split 256 experts (24 x 10 = 240, 24 x 11 = 264), EP 128 leaves the rack
    for dp in (16, 32, 64):
        moe.check_layout(DSV3, "gb200", 72, tp=1, dp=dp, ep=True)
    with pytest.raises(ConfigError, match="256 experts"):
        moe.check_layout(DSV3, "gb200", 72, tp=1, dp=24, ep=True)
    with pytest.raises(ConfigError, match="scale-up domain of 72"):
        moe.check_layout(DSV3, "gb200", 72, tp=1, dp=128, ep=True)
    # DP without EP shards each expert's 2048-wide FFN over tp x dp GPUs: 6 does not divide 2048 (2048 = 2^11)
    with pytest.raises(ConfigError, match="2048-wide FFN over 6 GPUs"):
        moe.check_layout(DSV3, "h200", 8, tp=2, dp=3, ep=False)


def test_a_dp16_engine_on_gb200_rents_four_trays() -> None:
    # 16 GPUs of a rack sold as 4-GPU trays (catalogs/gpus/gb200.yaml, CoreWeave $42.00 per tray-hour) = 4 trays
    dep, _, est = estimate_request(EstimateRequest(model="deepseek-v3", gpu="gb200", tp=1, dp=16, ep=True,
                                                   weight_dtype="fp4", kv_dtype="fp8", engine="sglang",
                                                   concurrency="256", prompt_tokens=1000, output_tokens=1000))
    assert dep.tp * dep.dp == 16
    assert est.gpus_total == 16
    assert est.usd_per_hour == pytest.approx(4 * 42.0)


def test_inferencex_rows_all_expressible() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_inferencex.py"
    sp = importlib.util.spec_from_file_location("bench_inferencex", path)
    assert sp is not None and sp.loader is not None
    import sys

    mod = importlib.util.module_from_spec(sp)
    sys.modules["bench_inferencex"] = mod
    sp.loader.exec_module(mod)
    cases = mod.single_node_cases(mod.DEFAULT_CSV)
    assert len(cases) == 741           # the README's 1,025 rows less the multi-node / disaggregated ones
    kinds = {(c.parallel, bool(c.mtp), c.weight_dtype) for c in cases}
    assert ("EP+DPA", True, "fp4") in kinds and ("TP", False, "mxfp4") in kinds
    sample = [c for i, c in enumerate(cases) if i % 37 == 0]
    preds = [mod.predict(c) for c in sample]
    assert all(isinstance(p, dict) and p["tpot"] > 0 for p in preds), [p for p in preds if isinstance(p, str)]
    assert not math.isnan(sum(p["ttft"] for p in preds if isinstance(p, dict)))
    assert dataclasses.is_dataclass(sample[0])


# -- properties over layouts (hypothesis) ------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MOE_MODELS = sorted(m for m in CAT.models if CAT.models[m].moe is not None)
LAYOUTS = [(8, 1, False), (8, 1, True), (4, 2, True), (2, 4, False), (1, 8, True), (1, 8, False)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MOE_MODELS), layout=st.sampled_from(LAYOUTS), gpu=st.sampled_from(["h200", "b200", "mi300x"]),
       b=st.integers(1, 512), ctx=st.integers(1, 32768), k=st.integers(0, 3), a=st.floats(0.05, 1.0))
def test_moe_steps_are_monotone_and_above_the_floor(model: str, layout: tuple[int, int, bool], gpu: str, b: int, ctx: int,
                                                      k: int, a: float) -> None:
    m = CAT.models[model]
    tp, dp, ep = layout
    if m.num_heads % tp or (ep and m.moe is not None and m.moe.num_experts % (tp * dp)):
        return
    s = spec.SpecDecode(num_speculative_tokens=k, acceptance_rate=a) if k and m.mtp_layers else None
    d = build_deployment(model=m, gpu=CAT.gpu(gpu), tp=tp, weight_dtype="fp8", kv_dtype="fp8",
                         profile=engine_profile("sglang"), max_model_len=ctx + 1, dp=dp, ep=ep, spec=s)
    cost = StepCostModel.build(d)
    # a larger batch or a longer context never makes the per-token decode step faster ...
    assert cost.decode_step_s(b + 1, ctx) >= cost.decode_step_s(b, ctx) * (1 - 1e-9)
    assert cost.decode_step_s(b, ctx + 512) >= cost.decode_step_s(b, ctx) * (1 - 1e-9)
    # ... the real step is never below the datasheet floor ...
    kv, fl = cost.decode_seq_cost(ctx)
    p = cost.parts(b, b * kv, b * fl, floor=True)
    assert cost.step_s(b, b * kv, b * fl) >= max(p["memory_s"], p["compute_s"]) * (1 - 1e-9)
    # ... and a GPU never streams more experts than it holds, nor fewer than the TP share of the touched ones
    if cost.moe is not None:
        held = m.moe.num_experts / (tp * dp)   # whole experts under EP, expert-equivalents of slices without
        per_layer = cost.moe.experts_read_per_gpu(b)
        assert per_layer <= held + 1e-9
        assert per_layer >= moe.expected_experts_touched(m.moe.num_experts, m.moe.top_k, b * dp) / (tp * dp) - 1e-9
    # more acceptance never slows MTP decoding
    if s is not None:
        better = StepCostModel.build(dataclasses.replace(d, spec=dataclasses.replace(s, acceptance_rate=min(1.0, a + 0.1))))
        assert better.decode_step_s(b, ctx) <= cost.decode_step_s(b, ctx) * (1 + 1e-9)


def _evaluate(formula: str) -> float:
    """Evaluate a printed formula such as ``256 x (1 - (1 - 8/256)^64)`` (x -> *, ^ -> **)."""
    expr = formula.replace(" x ", " * ").replace("^", "**").replace("sqrt", "math.sqrt").replace("min(", "min(")
    return float(eval(expr, {"math": math, "__builtins__": {"min": min}}))  # noqa: S307 - our own printed text


def test_walkthrough_formulas_evaluate_to_their_values() -> None:
    r = RUN.invoke(app, ["estimate", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "1", "--data-parallel-size", "8",
                         "--enable-expert-parallel", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}',
                         "--acceptance-rate", "0.6", "--concurrency", "64", "--prompt-tokens", "1000", "--output-tokens", "1000"])
    assert r.exit_code == 0, r.output
    lines = {ln.split("  ")[1].strip(): ln for ln in r.output.splitlines() if ln.startswith("  ") and " = " in ln}
    for label in ("experts touched", "busiest EP rank", "remote ranks", "tokens per step"):
        line = lines[label]
        formula = line[2 + 19:].rsplit(" = ", 1)[0].strip()
        value = float(line.rsplit(" = ", 1)[1].split()[0])
        assert _evaluate(formula) == pytest.approx(value, rel=1e-3), line
    # TPOT (MTP) = (verify + drafts) / tokens per step, in the printed milliseconds
    t = lines["TPOT (MTP)"]
    nums = [float(x) for x in t.replace("(", " ").replace(")", " ").replace("/", " ").split() if x.replace(".", "").isdigit()]
    verify, draft, tps, value = nums[0], nums[1], nums[2], nums[3]
    assert (verify + draft) / tps == pytest.approx(value, rel=2e-3)


def test_vllm_serve_flags_pass_vllms_parser() -> None:
    from recommender.deploy.vllm_flags import check_serve_args
    from recommender.render.estimate import parallel_flags

    d = _dep(tp=1, dp=8, ep=True, s=spec.SpecDecode(num_speculative_tokens=2, acceptance_rate=0.6))
    parsed = check_serve_args([DSV3.hf_repo, *parallel_flags(d)])
    assert (parsed["tensor_parallel_size"], parsed["data_parallel_size"], parsed["enable_expert_parallel"]) == (1, 8, True)
    assert parsed["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    # GPUs per engine = tp x dp: the 8 of one H200 instance
    assert d.gpus == 8


def test_balance_wait_by_hand() -> None:
    # 4 ranks, 2 prompts/s per rank, no effective timeout: the round R waits for the last of 3 other ranks,
    # E[R] = H_3 / 2 = (1 + 1/2 + 1/3) / 2 = 0.916667 s, E[R^2] = 2 / 2^2 x (3 - 3/4 + 1/9) = 1.180556 s^2; prompts
    # arrive at 4 x 2 = 8/s: the opener waits R, the others the rest of it:
    # (0.916667 + 8 x 1.180556 / 2) / (1 + 8 x 0.916667) = 5.638889 / 8.333333 = 0.676667 s
    assert moe.balance_wait_s(ranks=4, rate_per_rank_per_s=2.0, timeout_s=1e3) == pytest.approx(0.676667, rel=1e-5)
    # 2 ranks, r = 1, T = 1: E[R] = 1 - e^-1 = 0.632121, E[R^2] = 2 (1 - 2 e^-1) = 0.528482, lambda = 2:
    # (0.632121 + 0.528482) / (1 + 1.264241) = 0.512579
    assert moe.balance_wait_s(ranks=2, rate_per_rank_per_s=1.0, timeout_s=1.0) == pytest.approx(0.512579, rel=1e-5)
    # rare prompts wait the whole timeout
    assert moe.balance_wait_s(ranks=8, rate_per_rank_per_s=1e-9, timeout_s=2.0) == pytest.approx(2.0, rel=1e-6)
    assert moe.balance_wait_s(ranks=1, rate_per_rank_per_s=1.0, timeout_s=1.0) == 0.0
    assert moe.balance_wait_s(ranks=8, rate_per_rank_per_s=1.0, timeout_s=0.0) == 0.0


def test_trtllm_dpa_ttft_carries_the_balance_wait() -> None:
    base = dict(model="deepseek-v3", gpu="b200", tp=1, dp=4, ep=True, weight_dtype="fp4", kv_dtype="fp8",
                concurrency="256", prompt_tokens=900, output_tokens=900)
    from recommender.estimator import estimate_request

    trt = estimate_request(EstimateRequest(engine="trtllm", **base))[2]
    no_wait = estimate_request(EstimateRequest(engine="trtllm", **base),
                               profile=engine_profile("trtllm").replace(dp_balance_timeout_steps=0.0))[2]
    assert trt.ttft_s > no_wait.ttft_s and any("prefill balancing" in n for n in trt.notes)
    assert trt.tpot_s == pytest.approx(no_wait.tpot_s)


def test_acceptance_for_inverts_the_accepted_tokens_per_step() -> None:
    """Hand solutions: a + a^2 = 0.96 at k = 2 is a = 0.6; at k = 1 the accepted share is a itself; k = 3 at a = 0.5
    accepts 0.5 + 0.25 + 0.125 = 0.875."""
    from recommender.perf.speculative import acceptance_for

    assert acceptance_for(2, 0.96) == pytest.approx(0.6, abs=1e-12)
    assert acceptance_for(1, 0.7) == pytest.approx(0.7, abs=1e-12)
    assert acceptance_for(3, 0.875) == pytest.approx(0.5, abs=1e-12)
