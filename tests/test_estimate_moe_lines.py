"""`recommend estimate` on MoE / MTP / data-parallel-attention configurations: the weights line names each term
(the MTP module, the routed experts on the other ranks' GPUs, K/V replication) with its sign, the KV cache is per
attention rank and per replica, the decode step with MTP is the verify step its terms add up to, and the JSON holds
the Experts and MTP sections and the per-rank batch.

Numbers are derived by hand from the catalog's published architecture values (catalogs/models/*.yaml, the
checkpoints' config.json): DeepSeek-V3/R1 hidden 7168, 61 layers (3 dense, 58 MoE), 256 routed experts of
moe_intermediate_size 2048, top-8, one shared expert, MLA (q_lora_rank 1536, kv_lora_rank 512, qk_rope 64,
qk_nope 128, v_head 128, 128 heads), one MTP layer (num_nextn_predict_layers 1); fp8 weights are 1 B a parameter.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.estimator import EstimateRequest, estimate_request
from test_estimate_walkthrough import _check_line

MTP2 = '{"method": "mtp", "num_speculative_tokens": 2}'
LOAD = ("--concurrency", "8", "--prompt-tokens", "1000", "--output-tokens", "200")

# DeepSeek-V3 by hand (config.json values above), in parameters
H = 7168
EXPERT = 3 * H * 2048                                    # gate, up, down: 44,040,192
ROUTED = 58 * 256 * EXPERT                               # all routed experts: 653,908,770,816
MLA_ATTN = (H * 1536 + 1536 * 128 * (128 + 64)           # q_a, q_b
            + H * (512 + 64) + 512 * 128 * (128 + 128)   # kv_a (with the rope key), kv_b
            + 128 * 128 * H)                             # o_proj: 187,105,280
# the MTP module: a MoE decoder layer (attention, shared expert, router, 256 routed experts) + eh_proj (2H -> H)
# + its norms; embedding and LM head are the main model's (README_WEIGHTS: 11.5B unique parameters)
MTP_REST = MLA_ATTN + EXPERT + 256 * H + 2 * H * H + 3 * H   # 335,762,432
MTP_EXPERTS = 256 * EXPERT                                    # 11,274,289,152
assert MTP_REST + MTP_EXPERTS == 11_610_051_584               # the brief's "about 11.6e9 params"


def text(*args: str) -> str:
    res = CliRunner().invoke(app, ["estimate", "--gpu", "h200", *args])
    assert res.exit_code == 0, res.output
    return res.output.split("\nExpected error")[0]  # the walkthrough, without the bands section


def as_json(*args: str) -> dict:
    res = CliRunner().invoke(app, ["estimate", "--gpu", "h200", *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def line(out: str, label: str) -> str:
    found = [ln for ln in out.splitlines() if ln.startswith(f"  {label:<18} ")]
    assert len(found) == 1, (label, out)
    return found[0]


def value(ln: str) -> str:
    return ln.rsplit(" = ", 1)[1]


def seconds(s: str) -> float:
    num, unit = re.match(r"([\d.,]+) (ms|µs|s)", s).groups()  # type: ignore[union-attr]
    return float(num.replace(",", "")) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


def all_lines_hold(out: str) -> int:
    """Every ``label  formula = value`` line of the walkthrough evaluates to its value (the walkthrough test's check)."""
    return sum(_check_line(ln) for ln in out.splitlines())


# ============================================================ 1. the weights line names its terms
def test_the_mtp_module_is_its_own_weights_term_not_kv_replication() -> None:
    args = ("--model", "deepseek-r1", "--tp", "8", *LOAD)
    out = text(*args, "-sc", MTP2)
    w = line(out, "weights")
    # MLA has no K/V projections to replicate; the term was printed "- -1.4513e9 B; K/V projections ..."
    assert "K/V" not in w and "- -" not in w
    # 1 MTP x (335.8e6 + 11,274.3e6 experts) params x 1 B / TP 8 = 1.4513e9 B
    assert "+ 1 MTP x (0.3358e9 + 11.2743e9 experts) params x 1 B / TP 8" in w
    assert "MTP module" in w
    assert _check_line(w)
    with_mtp = as_json(*args, "-sc", MTP2)["weights_bytes_per_gpu"]
    without = as_json(*args)["weights_bytes_per_gpu"]
    assert with_mtp - without == pytest.approx((MTP_REST + MTP_EXPERTS) * 1 / 8, rel=1e-5)   # 1,451,256,448 B
    assert all_lines_hold(out) >= 30


def test_dp_attention_weights_subtract_the_experts_on_the_other_ranks() -> None:
    """TP 1 x DP 8 with EP: each GPU holds all the non-expert weights and 1/8 of the routed experts."""
    tp8 = as_json("--model", "deepseek-r1", "--tp", "8", *LOAD)["weights_bytes_per_gpu"]   # MLA: total / 8, no K/V term
    total = 8 * tp8
    out = text("--model", "deepseek-r1", "--tp", "1", "-dp", "8", "-ep", *LOAD)
    w = line(out, "weights")
    assert "K/V" not in w and "- -" not in w and "MTP" not in w
    assert "- 653.9088e9 B routed experts x (DP 8 - 1) / DP 8 / TP 1" in w          # 58 x 256 x 44,040,192 x 1 B
    assert _check_line(w)
    d = as_json("--model", "deepseek-r1", "--tp", "1", "-dp", "8", "-ep", *LOAD)
    assert d["weights_bytes_per_gpu"] == pytest.approx(total - ROUTED * 7 / 8, rel=1e-9)
    # TP 4 x DP 2 with MTP: total / 4 - routed / 2 / 4, plus the MTP module (its experts over the 8 GPUs too)
    out = text("--model", "deepseek-r1", "--tp", "4", "-dp", "2", "-ep", *LOAD, "-sc", MTP2)
    w = line(out, "weights")
    assert "- 653.9088e9 B routed experts x (DP 2 - 1) / DP 2 / TP 4" in w
    assert "+ 1 MTP x (0.3358e9 + 11.2743e9 experts / DP 2) params x 1 B / TP 4" in w
    assert "K/V" not in w and "- -" not in w and _check_line(w)
    d = as_json("--model", "deepseek-r1", "--tp", "4", "-dp", "2", "-ep", *LOAD, "-sc", MTP2)
    assert d["weights_bytes_per_gpu"] == pytest.approx(total / 4 - ROUTED / 8 + (MTP_REST + MTP_EXPERTS / 2) / 4, rel=1e-5)


def test_kv_replication_is_a_positive_term_where_it_exists() -> None:
    """Qwen3-30B-A3B (config.json: hidden 2048, 48 layers, 4 KV heads of head_dim 128, bf16) on TP 8: each K/V
    projection pair is 2 x 2048 x 512 params a layer, 201,326,592 B in all; held by 4 ranks instead of 8 each GPU
    keeps 1/4 - 1/8 = 1/8 of it more: 25,165,824 B. It was printed '- -0.0252e9 B'."""
    res = CliRunner().invoke(app, ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--tp", "8", "--batch", "8",
                                   "--context", "2048"])
    assert res.exit_code == 0, res.output
    w = line(res.output, "weights")
    kv = 2 * 48 * 2048 * 4 * 128 * 2
    assert kv == 201_326_592
    assert f"+ {kv / 8 / 1e9:.4f}e9 B replicated KV projections" in w and "K/V projections replicated where TP > KV heads" in w
    assert "- -" not in w and _check_line(w)
    # and the KV cache: each of the 8 ranks holds one of the 4 KV heads, 2 copies of each: 2 x 48 x 4 x 128 x 2 B x 2
    kv_line = line(res.output, "KV per token")
    assert " x 8/4 copies;" in kv_line and value(kv_line).startswith(f"{2 * 48 * 4 * 128 * 2 * 2:,} B") and _check_line(kv_line)


# ============================================================ 2. KV cache per attention rank and per replica
def test_kv_cache_is_per_attention_rank_with_the_engines_total_and_the_mtp_share() -> None:
    args = ("--model", "deepseek-r1", "--tp", "4", "-dp", "2", "-ep", *LOAD, "-sc", MTP2)
    out = text(*args)
    kv_line = line(out, "KV cache")
    assert "per replica" not in kv_line and value(kv_line).endswith(" per GPU")
    rank = line(out, "KV per attn rank")
    # the main model's 61 layers of the 62 that keep KV with the MTP layer (num_nextn_predict_layers 1)
    assert " x TP 4 x 61/62;" in rank and value(rank).endswith(" per attention rank")
    engine = line(out, "KV per replica")
    assert " x DP 2;" in engine and value(engine).endswith("per replica (8 GPUs)")
    assert _check_line(rank) and _check_line(engine)
    assert "sequences per attention rank" in line(out, "max sequences")
    dep, _, est = estimate_request(EstimateRequest(model="deepseek-r1", gpu="h200", tp=4, dp=2, ep=True,
                                                   speculative_config=MTP2, concurrency="8", prompt_tokens=1000,
                                                   output_tokens=200))
    per_gpu = dep.memory().kv_cache_bytes_per_gpu
    assert est.kv_cache_capacity_bytes == pytest.approx(per_gpu * 4 * 61 / 62, rel=1e-12)
    d = as_json(*args)
    assert d["kv_cache_capacity_bytes_per_replica"] == pytest.approx(per_gpu * 4 * 61 / 62 * 2, rel=1e-12)
    # TP 8 with MTP, one rank: per replica, x 61/62 shown
    out = text("--model", "deepseek-r1", "--tp", "8", *LOAD, "-sc", MTP2)
    rep = line(out, "KV per replica")
    assert " x TP 8 x 61/62;" in rep and _check_line(rep)


def test_gpt_oss_dp4_engine_holds_four_ranks_of_kv() -> None:
    """gpt-oss-120b TP 1 x DP 4 on H100: one GPU's cache is its rank's; the 4-GPU engine holds four of them."""
    res = CliRunner().invoke(app, ["estimate", "--model", "gpt-oss-120b", "--gpu", "h100-sxm", "--tp", "1", "-dp", "4", "-ep",
                                   "--concurrency", "64", "--prompt-tokens", "1000", "--output-tokens", "200"])
    assert res.exit_code == 0, res.output
    per_gpu = value(line(res.output, "KV cache")).removesuffix(" per GPU")
    rank = line(res.output, "KV per attn rank")
    assert f" {per_gpu} x TP 1;" in rank and value(rank) == f"{per_gpu} per attention rank" and _check_line(rank)
    assert "61/62" not in rank                         # no MTP layer
    engine = line(res.output, "KV per replica")
    assert " x DP 4;" in engine and "per replica (4 GPUs)" in engine and _check_line(engine)
    num = float(per_gpu.split()[0])
    assert float(value(engine).split()[0]) == pytest.approx(4 * num, abs=0.05 * 4)   # 51.7 GB x 4 = 207 GB


def test_one_rank_without_mtp_keeps_the_one_line() -> None:
    res = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8", "--batch", "64",
                                   "--context", "2048", "--price", "2.5"])
    kv = line(res.output, "KV cache")
    assert value(kv) == "53.8 GB per GPU, 430 GB per replica"          # docs/usage.md's example, unchanged
    assert "KV per replica" not in res.output


# ============================================================ 3. the decode step with MTP is the verify step
def test_mtp_decode_step_is_the_verify_step_its_terms_add_up_to() -> None:
    """k = 2, acceptance 0.6: tokens per step 1 + 0.6 + 0.36 = 1.96. The decode section is the verify step over
    8 x 3 = 24 query tokens with the KV read once: the same KV bytes as the one-token step, 3 x its attention FLOPs."""
    args = ("--model", "deepseek-r1", "--tp", "8", *LOAD)
    out = text(*args, "-sc", MTP2, "--acceptance-rate", "0.6")
    plain = text(*args)
    assert "8 x 3 = 24 query tokens" in out
    step = line(out, "decode step")
    assert _check_line(step)                                       # the terms sum to the value
    terms = sum(seconds(t.strip()) for t in step[21:].split(";")[0].split(" + "))
    verify = seconds(value(line(out, "verify step")))
    assert seconds(value(step)) == pytest.approx(verify, rel=1e-3)
    assert terms == pytest.approx(verify, rel=2e-3)
    # TPOT (MTP) = (verify + drafts) / 1.96, in its printed numbers and the JSON's
    tpot = line(out, "TPOT (MTP)")
    assert tpot.split(" = ")[0].rstrip().endswith("/ 1.9600") and _check_line(tpot)
    draft = seconds(value(line(out, "draft passes")))
    assert seconds(value(tpot)) == pytest.approx((verify + draft) / 1.96, rel=2e-3)
    assert _check_line(line(out, "draft passes")) and _check_line(line(out, "verify step"))
    # KV read once, attention FLOPs x (k + 1)
    att, att0 = line(out, "attention"), line(plain, "attention")
    kv_of = lambda ln: ln.split("max(")[1].split(" / ")[0]  # noqa: E731
    fl_of = lambda ln: float(ln.split(", ")[1].split(" FLOPs")[0])  # noqa: E731
    assert kv_of(att) == kv_of(att0)
    assert fl_of(att) == pytest.approx(3 * fl_of(att0), rel=1e-3)
    # the Experts section is the verify step's: 24 tokens routed
    assert "256 x (1 - (1 - 8/256)^24)" in out
    touched = 256 * (1 - (1 - 8 / 256) ** 24)
    assert f"= {touched:.2f} per layer" in line(out, "experts touched")
    assert all_lines_hold(out) >= 35
    d = as_json(*args, "-sc", MTP2, "--acceptance-rate", "0.6")
    s = d["speculative"]
    assert s["tokens_per_step"] == pytest.approx(1.96, rel=1e-12)
    assert s["verify_query_tokens_per_rank"] == 24
    assert d["decode_step_s"] == pytest.approx((s["verify_step_s"] + s["draft_passes_s"]) / 1.96, rel=1e-9)
    assert s["step_s_per_output_token"] == pytest.approx(d["decode_step_s"], rel=1e-9)
    assert s["verify_step_s"] == pytest.approx(verify, rel=5e-3) and s["draft_passes_s"] == pytest.approx(draft, rel=5e-3)
    assert s["draft_pass_s"] == pytest.approx(s["draft_passes_s"] / 2, rel=1e-12)


@pytest.mark.parametrize("layout", [("--tp", "4", "-dp", "2", "-ep"), ("--tp", "1", "-dp", "8", "-ep"), ("--tp", "1", "-dp", "8")])
def test_every_line_of_dp_and_mtp_walkthroughs_holds(layout: tuple[str, ...]) -> None:
    for extra in ((), ("-sc", MTP2)):
        out = text("--model", "deepseek-r1", *layout, *LOAD, *extra)
        assert all_lines_hold(out) >= 35
        coll = line(out, "collectives")
        assert "(Experts, below)" in coll and _check_line(coll)


# ============================================================ 4. the JSON has what the text shows
def test_json_has_the_experts_block_and_the_per_rank_batch() -> None:
    """TP 1 x DP 8 with EP, concurrency 64: 8 sequences per rank, 64 tokens routed a step over 8 GPUs of 32 experts."""
    args = ("--model", "deepseek-r1", "--tp", "1", "-dp", "8", "-ep", "--concurrency", "64", "--prompt-tokens", "1000",
            "--output-tokens", "200")
    d = as_json(*args)
    out = text(*args)
    assert d["batch"] == 64 and d["batch_per_attention_rank"] == 8
    assert "Decode step at batch 8 per attention rank" in out
    e = d["experts"]
    assert (e["num_experts"], e["top_k"], e["moe_layers"], e["gpus"], e["expert_parallel"]) == (256, 8, 58, 8, True)
    assert e["tokens_per_step"] == 64 and e["tokens_per_step_per_rank"] == 8
    p = 1 - (1 - 8 / 256) ** 64                               # an expert is touched by one of 64 tokens' top-8
    assert e["experts_touched_per_layer"] == pytest.approx(256 * p, rel=1e-12)
    z8 = 1.42360                                              # E[max of 8 standard normals] (Tippett's table)
    busiest = min(32, 32 * p + z8 * math.sqrt(32 * p * (1 - p)))
    assert e["busiest_ep_rank_experts"] == pytest.approx(busiest, rel=1e-4)
    assert e["expert_bytes"] == EXPERT * 1                   # fp8
    assert e["expert_bytes_per_gpu"] == pytest.approx(58 * busiest * EXPERT, rel=1e-4)
    assert e["remote_ranks_per_token"] == pytest.approx(7 * (1 - (7 / 8) ** 8), rel=1e-12)
    # the text's numbers, the JSON's values
    assert seconds(value(line(out, "all-to-all"))) == pytest.approx(e["all_to_all_s"], rel=5e-3)
    assert seconds(value(line(out, "dense FFN gather"))) == pytest.approx(e["dense_ffn_gather_s"], rel=5e-3)
    assert value(line(out, "busiest EP rank")) == f"{e['busiest_ep_rank_experts']:.2f} experts"
    assert d["speculative"] is None


def test_json_of_tp_only_moe_and_dense_models() -> None:
    d = as_json("--model", "deepseek-r1", "--tp", "8", "--batch", "16", "--context", "2000")
    e = d["experts"]
    assert d["batch_per_attention_rank"] == d["batch"] == 16
    assert e["busiest_ep_rank_experts"] is None and e["all_to_all_s"] is None and e["remote_ranks_per_token"] is None
    assert e["expert_bytes_per_gpu"] == pytest.approx(58 * 256 * (1 - (1 - 8 / 256) ** 16) / 8 * EXPERT, rel=1e-12)
    res = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "32",
                                   "--prompt-tokens", "1000", "--output-tokens", "100", "--format", "json"])
    d = json.loads(res.stdout)
    assert d["experts"] is None and d["batch_per_attention_rank"] == 32
    assert d["kv_cache_capacity_bytes_per_replica"] == d["kv_cache_capacity_bytes"]
