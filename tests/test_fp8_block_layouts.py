"""Block-quantized fp8 checkpoints are never planned, estimated or deployed in a layout vLLM 0.33 refuses at load.

vLLM needs each GPU's shard of a block-quantized layer to be whole blocks (``Fp8MoEMethod.create_weights``: "The
output_size of gate's and up's weight = 192 is not divisible by weight quantization block_n = 128"; vllm issues
#17569, #52997). The numbers below are worked by hand from the checkpoints' published config.json values:

- Qwen/Qwen3-235B-A22B-FP8 (huggingface.co/Qwen/Qwen3-235B-A22B-FP8/blob/main/config.json): moe_intermediate_size
  1536, quantization_config.weight_block_size [128, 128]; 64 heads x head_dim 128, 4 KV heads, all 94 layers MoE.
  TP 8: 1536 / 8 = 192 = 1.5 x 128 -> refused; TP 4: 384 = 3 x 128 -> loads; TP 8 with EP: whole 1536 -> loads.
- Qwen/Qwen3-30B-A3B-FP8 (huggingface.co/Qwen/Qwen3-30B-A3B-FP8/blob/main/config.json): moe_intermediate_size 768,
  [128, 128]. TP 2: 384 -> loads; TP 4: 192, TP 8: 96 -> refused.
- deepseek-ai/DeepSeek-V3 (and R1; huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json): fp8 [128, 128],
  moe_intermediate_size 2048 (1 shared expert of the same width), intermediate_size 18432 (3 dense layers), 128
  heads, qk_nope 128 + qk_rope 64, v_head_dim 128. TP 8 x DP 4 without EP splits each expert 32 ways: 2048 / 32 =
  64 -> refused; TP 8: experts 256, dense 18432 / 8 = 2304 = 18 x 128, q_b 128 x 192 / 8 = 3072, kv_b 128 x 256 / 8
  = 4096, o_proj 128 x 128 / 8 = 2048 -> loads; TP 32 (an NVL72 rack): dense 18432 / 32 = 576 = 4.5 x 128 -> refused.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from recommender.catalog import default_catalog
from recommender.deploy.spec import build_spec
from recommender.errors import ConfigError, DeployError
from recommender.estimator import EstimateRequest, build
from recommender.perf.blocks import block_split_error, split_shards
from recommender.perf.moe import check_layout
from recommender.search.evaluate import evaluate
from recommender.search.planner import build_context, space_choices
from recommender.search.policy import load_search_policy
from recommender.search.shapes import shapes
from recommender.search.space import layout_valid
from recommender.sizing import Candidate
from recommender.workload import load_workload

CAT = default_catalog()
Q235 = CAT.model("qwen3-235b-a22b")
Q30 = CAT.model("qwen3-30b-a3b")
DSV3 = CAT.model("deepseek-v3")
BLOCK = (128, 128)
EXAMPLE_PLAN = Path(__file__).parent.parent / "examples" / "plans" / "moe-chat.plan.json"


def test_the_catalog_records_the_block_size_of_each_block_quantized_checkpoint():
    assert CAT.weight_block_for(Q235, "fp8") == ("Qwen/Qwen3-235B-A22B-FP8", BLOCK)
    assert CAT.weight_block_for(Q30, "fp8") == ("Qwen/Qwen3-30B-A3B-FP8", BLOCK)
    assert CAT.weight_block_for(DSV3, "fp8") == ("deepseek-ai/DeepSeek-V3", BLOCK)  # its own checkpoint is fp8
    assert CAT.weight_block_for(CAT.model("deepseek-r1"), "fp8") == ("deepseek-ai/DeepSeek-R1", BLOCK)
    assert CAT.checkpoint_block("qwen/qwen3-235b-a22b-fp8") == BLOCK  # any case
    # not block-quantized: bf16 weights, fp8 quantized online from the bf16 checkpoint (per tensor), RedHatAI's FP8
    assert CAT.weight_block_for(Q235, "bf16") is None
    assert CAT.weight_block_for(Q235, "fp8", "") is None
    assert CAT.weight_block_for(CAT.model("llama-3.1-70b"), "fp8") is None


def test_the_shards_are_worked_from_the_config_values():
    shards = {(what, side): width for what, width, side in split_shards(Q235, tp=8)}
    assert shards[("each routed expert's FFN", "out")] == 192            # 1536 / 8
    assert shards[("attention's q_proj", "out")] == 1024                  # 64 x 128 / 8
    assert shards[("attention's k/v_proj", "out")] == 128                 # 4 KV heads < TP 8: one 128-wide head each
    assert not any("dense" in what for what, _ in shards)                 # every Qwen3-235B layer is MoE
    assert {w for (what, _), w in shards.items() if "routed" in what} == {192}
    assert {w for what, w, _ in split_shards(Q235, tp=8, ep=True) if "routed" in what} == {1536}
    ds = {(what, side): width for what, width, side in split_shards(DSV3, tp=8)}
    assert ds[("the dense FFN", "out")] == 2304 and ds[("the dense FFN", "in")] == 2304   # 18432 / 8
    assert ds[("MLA's q_b_proj", "out")] == 3072                          # 128 x (128 + 64) / 8
    assert ds[("MLA's kv_b_proj", "out")] == 4096                         # 128 x (128 + 128) / 8
    assert ds[("attention's o_proj", "in")] == 2048                       # 128 x 128 / 8
    assert ds[("the shared experts' FFN", "out")] == 256                  # 2048 / 8
    assert {w for what, w, _ in split_shards(DSV3, tp=8, dp=4) if "routed" in what} == {64}  # 2048 / 32


@pytest.mark.parametrize(("model", "tp", "dp", "ep", "bad"), [
    (Q235, 1, 1, False, None), (Q235, 2, 1, False, None), (Q235, 4, 1, False, None),
    (Q235, 8, 1, False, "each routed expert's FFN 192 wide"), (Q235, 8, 1, True, None),
    (Q30, 2, 1, False, None), (Q30, 4, 1, False, "each routed expert's FFN 192 wide"),
    (Q30, 8, 1, False, "each routed expert's FFN 96 wide"), (Q30, 8, 1, True, None),
    (DSV3, 8, 1, False, None), (DSV3, 8, 4, False, "each routed expert's FFN 64 wide"), (DSV3, 8, 4, True, None),
    (DSV3, 16, 1, False, None),                                     # dense 1152 = 9 x 128, experts 128
    (DSV3, 32, 1, False, "the dense FFN 576 wide"),
])
def test_block_rule(model, tp, dp, ep, bad):
    why = block_split_error(model, BLOCK, tp=tp, dp=dp, ep=ep)
    assert (why is None) == (bad is None), why
    if bad:
        assert bad in why and "not a multiple of 128" in why and "vLLM refuses it at load" in why


def test_the_message_says_what_why_and_what_to_try():
    why = block_split_error(Q235, BLOCK, tp=8, checkpoint="Qwen/Qwen3-235B-A22B-FP8")
    assert why == ("Qwen/Qwen3-235B-A22B-FP8 stores fp8 weights in 128x128 blocks and TP 8 leaves each routed expert's "
                   "FFN 192 wide (output per GPU), not a multiple of 128: vLLM refuses it at load (weight_block_size); "
                   "use TP 4, expert parallelism or the bf16 checkpoint quantized at load (--checkpoint none)")
    # DeepSeek's own checkpoint is fp8: no 16-bit one to suggest; fewer DP ranks (2048 / 16 = 128) or EP load
    why = block_split_error(DSV3, BLOCK, tp=8, dp=4, checkpoint="deepseek-ai/DeepSeek-R1")
    assert why is not None and why.endswith("use DP 2 or expert parallelism") and "bf16" not in why
    assert "--checkpoint" not in why                                       # nothing to load instead


def test_layout_validity_refuses_block_splits_plain_tp_included():
    h200, gb200 = CAT.gpu("h200"), CAT.gpu("gb200")
    assert "192 wide" in (layout_valid(Q235, h200, 8, 1, False, weight_block=BLOCK) or "")
    assert layout_valid(Q235, h200, 8, 1, True, weight_block=BLOCK) is None
    assert layout_valid(Q235, h200, 4, 1, False, weight_block=BLOCK) is None
    assert layout_valid(Q235, h200, 8, 1, False) is None                  # bf16 / online fp8: no blocks
    assert "64 wide" in (layout_valid(DSV3, gb200, 8, 4, False, weight_block=BLOCK) or "")
    # with EP the experts stay whole: perf.moe.check_layout (what estimate runs) takes it; the search itself keeps
    # to engines that pack the 72-GPU rack, which 32 GPUs do not
    check_layout(DSV3, "gb200", 72, tp=8, dp=4, ep=True, weight_block=BLOCK)
    with pytest.raises(ConfigError, match="64 wide"):
        check_layout(DSV3, "gb200", 72, tp=8, dp=4, ep=False, weight_block=BLOCK)


def _q235_context(tmp_path: Path):
    w = tmp_path / "q235.yaml"
    w.write_text("name: q235\nmodel: qwen3-235b-a22b\ntraffic: {arrival_rate: 4}\ngpus: [h100-sxm, h200]\n"
                 "prompt_tokens: {dist: lognormal, mean: 1200, std: 800, min: 32, max: 8192}\n"
                 "output_tokens: {dist: lognormal, mean: 350, std: 200, min: 8, max: 2048}\n"
                 "slo: [ttft=2s@p90, tpot=50ms@p90]\n")
    from recommender.profiles import engine_profile
    return build_context(load_workload(w), load_search_policy(), engine_profile("vllm"), CAT)


def test_the_search_never_plans_the_fp8_checkpoint_at_tp8_but_keeps_its_other_layouts(tmp_path):
    ctx = _q235_context(tmp_path)
    assert ctx.weight_blocks["fp8"] == ("Qwen/Qwen3-235B-A22B-FP8", BLOCK)
    ch = space_choices(ctx)
    assert "fp8" in ch.weight_dtypes and "bf16" in ch.weight_dtypes
    shaped = {(c.gpu, c.tp, c.weight_dtype, c.dp, c.ep, c.disaggregated, c.decode_tp) for c in shapes(ctx, ch)}
    fp8_tp8 = {s for s in shaped if s[2] == "fp8" and (s[1] == 8 or s[6] == 8)}
    assert fp8_tp8 and all(s[4] for s in fp8_tp8), fp8_tp8            # fp8 at TP 8 only with expert parallelism
    assert ("h200", 4, "fp8", 1, False, False, 0) in shaped            # fp8 at TP 4 stays (1536 / 4 = 384)
    assert ("h200", 8, "bf16", 1, False, False, 0) in shaped           # the bf16 checkpoint at TP 8 stays
    e = evaluate(ctx, Candidate("h200", 8, "fp8", "fp8", 64, 8192))
    assert not e.feasible and e.binding == "invalid" and "192 wide" in e.reason
    e = evaluate(ctx, Candidate("h200", 8, "fp8", "fp8", 64, 8192, True, "h200", 8))   # P/D pools too
    assert not e.feasible and e.binding == "invalid" and "192 wide" in e.reason


def test_estimate_refuses_in_one_line_and_takes_the_layouts_that_load():
    with pytest.raises(ConfigError) as e:
        build(EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="fp8", context_tokens=1000))
    msg = str(e.value)
    assert "\n" not in msg and "TP 8 leaves each routed expert's FFN 192 wide" in msg
    assert msg.endswith("use TP 4, expert parallelism or the bf16 checkpoint quantized at load (--checkpoint none)")
    with pytest.raises(ConfigError, match="64 wide"):
        build(EstimateRequest(model="deepseek-r1", gpu="gb200", tp=8, dp=4, context_tokens=1000))
    for req in (EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, ep=True, weight_dtype="fp8", context_tokens=1000),
                EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=4, weight_dtype="fp8", context_tokens=1000),
                EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="bf16", context_tokens=1000),
                # a plan pool with no checkpoint: fp8 quantized online (per tensor) from the bf16 checkpoint
                EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="fp8", context_tokens=1000,
                                checkpoint="")):
        build(req)


def _example_at_tp(tp: int, checkpoint: str | None = None) -> dict:
    """examples/plans/moe-chat.plan.json (Qwen3-30B-A3B, checkpoint Qwen/Qwen3-30B-A3B-FP8), rank 5's h100-sxm pool
    rewritten to ``tp`` GPUs on one instance, as an old plan file could hold it."""
    doc = copy.deepcopy(json.loads(EXAMPLE_PLAN.read_text()))
    row = next(r for r in doc["plans"] if r["rank"] == 5)
    pool = row["pools"][0]
    assert row["checkpoint"] == "Qwen/Qwen3-30B-A3B-FP8" and pool["gpu"] == "h100-sxm"
    pool.update(tp=tp, replicas=1)
    pool["rental"].update(gpus_per_instance=tp, usd_per_instance_hour=2.69 * tp, usd_per_hour=2.69 * tp)
    row.update(tp=tp, replicas=1, gpus_total=tp, usd_per_hour=2.69 * tp)
    if checkpoint is not None:
        row["checkpoint"] = checkpoint
    return doc


def test_deploy_refuses_an_old_plan_that_splits_the_blocks_with_the_same_message():
    with pytest.raises(DeployError) as e:
        build_spec(_example_at_tp(4), 5)
    want = block_split_error(Q30, BLOCK, tp=4, checkpoint="Qwen/Qwen3-30B-A3B-FP8")
    assert want is not None and str(e.value).endswith(": " + want)
    assert "768" not in str(e.value) and "192 wide" in str(e.value)       # 768 / 4
    with pytest.raises(DeployError, match="192 wide"):
        build_spec(_example_at_tp(4, checkpoint=""), 5, checkpoint="Qwen/Qwen3-30B-A3B-FP8")  # --checkpoint too
    assert build_spec(_example_at_tp(2), 5).pools[0].tp == 2              # 768 / 2 = 384 = 3 x 128
    online = build_spec(_example_at_tp(4, checkpoint=""), 5).pools[0]     # online fp8: per-tensor scales, no blocks
    assert online.weights.quantization == "fp8"
    # what the refusal suggests: --checkpoint none drops the plan's FP8 checkpoint for the bf16 repo, quantized at load
    assert str(e.value).endswith("(--checkpoint none)")
    for none in ("none", "None"):
        pool = build_spec(_example_at_tp(4), 5, checkpoint=none).pools[0]
        assert (pool.weights.model, pool.weights.quantization, pool.tp) == ("Qwen/Qwen3-30B-A3B", "fp8", 4)


def _write_example_at_tp(tmp_path: Path, tp: int, checkpoint: str | None = None) -> Path:
    path = tmp_path / f"moe-chat-tp{tp}{'' if checkpoint is None else '-' + (checkpoint.split('/')[-1] or 'online')}.json"
    path.write_text(json.dumps(_example_at_tp(tp, checkpoint)))
    return path


def test_simulate_plan_refuses_the_row_estimate_plan_and_deploy_refuse_with_the_same_line(tmp_path):
    """``simulate --plan`` rebuilt the pools of a row vLLM refuses to load and simulated it; now it refuses it with
    ``estimate --plan``'s line (deploy's, after its 'plan ... pool ...:' prefix), and runs what the line suggests."""
    from typer.testing import CliRunner

    from recommender.cli import app

    def invoke(*argv: str):  # type: ignore[no-untyped-def]
        return CliRunner().invoke(app, list(argv))

    path = str(_write_example_at_tp(tmp_path, 4))
    est = invoke("estimate", "--plan", path, "--rank", "5")
    sim = invoke("simulate", "--plan", path, "--rank", "5", "-n", "200", "-q")
    dep = invoke("deploy", path, "--rank", "5", "--format", "cmd")
    want = block_split_error(Q30, BLOCK, tp=4, checkpoint="Qwen/Qwen3-30B-A3B-FP8")
    assert want is not None
    for res in (est, sim, dep):
        assert res.exit_code == 2, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)   # no traceback
        (line,) = res.stderr.splitlines()
        assert line.endswith(want) and res.stdout == ""
    assert sim.stderr == est.stderr == f"error: {want}\n"
    # the flag the line names runs the row: the bf16 repo quantized to fp8 at load (per tensor: no blocks)
    res = invoke("simulate", "--plan", path, "--rank", "5", "-n", "200", "-q", "--checkpoint", "none", "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests"] == 200
    # TP 2 keeps whole blocks (768 / 2 = 384 = 3 x 128); a row that names no checkpoint loads the bf16 repo
    for ok in (_write_example_at_tp(tmp_path, 2), _write_example_at_tp(tmp_path, 4, checkpoint="")):
        res = invoke("simulate", "--plan", str(ok), "--rank", "5", "-n", "200", "-q")
        assert res.exit_code == 0, res.output
    # --checkpoint names the FP8 repo for every pool of that row: refused again
    res = invoke("simulate", "--plan", str(_write_example_at_tp(tmp_path, 4, checkpoint="")), "--rank", "5", "-n", "200",
                 "-q", "--checkpoint", "Qwen/Qwen3-30B-A3B-FP8")
    assert res.exit_code == 2 and res.stderr == f"error: {want}\n", res.output


def test_replan_still_predicts_a_running_row_whose_plan_names_a_checkpoint_it_cannot_load():
    """The re-planner predicts the row that is deployed; a layout vLLM refuses with the plan's FP8 checkpoint can only
    be running with another (``deploy --checkpoint none``), and the step costs do not depend on which: the
    prediction stands, as before (refusing would send every run to a search because of a file's checkpoint field)."""
    from recommender.plan import load_plan
    from recommender.replan.observe import base_workload_from_plan
    from recommender.replan.plans import select_rank
    from recommender.replan.predict import predict_plan

    current = select_rank(load_plan(_example_at_tp(4)), 5, "moe-chat-tp4.json")
    workload = base_workload_from_plan(current)
    pred = predict_plan(current, workload)
    assert pred.replicas == (1,) and pred.latencies["tpot"]["p90"] > 0
    online = select_rank(load_plan(_example_at_tp(4, checkpoint="")), 5, "moe-chat-tp4-online.json")
    assert predict_plan(online, workload) == pred   # what `deploy --checkpoint none` runs: the same prediction
