"""``recommend estimate --checkpoint``: which checkpoint vLLM loads, so a command line rebuilt from a plan pool
(``render.pool_estimate.estimate_command``, printed by the report and ``estimate --plan``) reruns the pool it explains.

Worked by hand from Qwen/Qwen3-235B-A22B's config.json (huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json):
moe_intermediate_size 1536, and Qwen/Qwen3-235B-A22B-FP8 stores its fp8 weights in 128x128 blocks
(quantization_config.weight_block_size). At TP 8 without expert parallelism each GPU holds 1536 / 8 = 192 columns of
every expert's FFN, 1.5 blocks, which vLLM refuses at load; the bf16 repo quantized to fp8 at load (online, per-tensor
scales, no blocks) loads at TP 8. The model catalog names the FP8 repo for fp8 weights, so ``estimate`` refuses TP 8
by default and an online-fp8 pool's command must say ``--checkpoint none``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import recommender
from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.errors import ConfigError
from recommender.estimator import EstimateRequest, checkpoint_flag, estimate_request
from recommender.plan import Plan, PlanRow, Pool, PoolRole, WorkloadEcho, dump_plan
from recommender.render.pool_estimate import estimate_command, pool_request

FP8_REPO = "Qwen/Qwen3-235B-A22B-FP8"
Q235 = ["--model", "qwen3-235b-a22b", "--gpu", "h200", "--tp", "8", "--weight-dtype", "fp8", "--context", "1000"]


def _plan(tp: int = 8, checkpoint: str = "", ep: bool = False) -> tuple[Plan, PlanRow, Pool]:
    pool = Pool(role=PoolRole.BOTH, gpu="h200", tp=tp, replicas=2, weight_dtype="fp8", kv_dtype="fp8",
                max_num_seqs=256, max_num_batched_tokens=8192, enable_expert_parallel=ep, checkpoint=checkpoint)
    row = PlanRow(rank=1, id="q235", pools=(pool,), max_model_len=4000)
    return Plan(workload=WorkloadEcho(model="qwen3-235b-a22b"), rows=(row,)), row, pool


def _json(argv: list[str]) -> dict:
    res = CliRunner().invoke(app, [*argv, "-f", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_arithmetic_behind_the_refusal():
    model = default_catalog().model("qwen3-235b-a22b")
    assert model.moe is not None and model.moe.expert_intermediate_size == 1536
    assert 1536 / 8 == 192 and 192 % 128 and (1536 // 4) % 128 == 0       # TP 8 splits a block, TP 4 does not
    assert default_catalog().default_checkpoint(model, "fp8") == FP8_REPO  # what estimate loads by default
    assert default_catalog().default_checkpoint(model, "bf16") == ""       # its own repo


def test_tp8_is_refused_with_the_fp8_checkpoint_and_loads_quantized_online():
    runner = CliRunner()
    for extra in ([], ["--checkpoint", FP8_REPO]):
        res = runner.invoke(app, ["estimate", *Q235, *extra])
        assert res.exit_code == 2, res.output
        (line,) = res.stderr.splitlines()
        assert f"{FP8_REPO} stores fp8 weights in 128x128 blocks" in line and "192 wide" in line
    for spelling in ("none", "None", ""):  # the model's own (bf16) repo, quantized to fp8 at load
        res = runner.invoke(app, ["estimate", *Q235, "--checkpoint", spelling])
        assert res.exit_code == 0, res.output
        assert ("weights: bf16 checkpoint Qwen/Qwen3-235B-A22B quantized to FP8 at load (--quantization fp8, online "
                "dynamic)") in res.stdout
    # the numbers are those of the library's request; the checkpoint only decides whether the layout loads
    got = _json(["estimate", *Q235, "--checkpoint", "none"])
    _, _, est = estimate_request(EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="fp8",
                                                 context_tokens=1000, checkpoint=""))
    assert got["tpot_s"] == pytest.approx(est.tpot_s, rel=1e-12)
    assert any(c.startswith("weights: bf16 checkpoint") for c in got["conditions"])
    # TP 4 keeps whole blocks (384 = 3 x 128): the FP8 checkpoint loads, and the line names its blocks
    res = runner.invoke(app, ["estimate", *Q235[:5], "4", *Q235[6:], "--checkpoint", FP8_REPO])
    assert res.exit_code == 0, res.output
    assert f"weights: pre-quantized fp8 checkpoint {FP8_REPO}" in res.stdout and "128x128 blocks" in res.stdout


def test_without_the_flag_the_output_names_no_checkpoint():
    res = CliRunner().invoke(app, ["estimate", *Q235[:5], "4", *Q235[6:]])
    assert res.exit_code == 0, res.output
    assert "weights:" not in res.stdout


@pytest.mark.parametrize("bad", ["bad repo; rm -rf /", "$(HF_TOKEN)", "org/name\nsecond line", "a" * 5000, " ",
                                 "../etc/passwd", "org--x/name"])
def test_a_malformed_repo_is_one_bounded_line_with_exit_2(bad):
    res = CliRunner().invoke(app, ["estimate", *Q235, "--checkpoint", bad])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: --checkpoint ") and "is not a Hugging Face repo id" in line
    assert "--checkpoint none" in line and len(line) < 400
    assert res.stdout == ""


def test_the_python_api_takes_the_checkpoint():
    kw = dict(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="fp8", context_tokens=1000)
    assert recommender.estimate(**kw, checkpoint="").fits
    with pytest.raises(ConfigError, match="192 wide"):
        recommender.estimate(**kw)
    with pytest.raises(ConfigError, match="is not a Hugging Face repo id"):
        recommender.estimate(**kw, checkpoint="not a repo")


def test_the_command_says_the_checkpoint_only_where_the_default_is_another():
    plan, row, pool = _plan(tp=8, checkpoint="")                # online fp8: estimate would load the FP8 repo
    req = pool_request(plan, row, pool, prompt_tokens=1000, output_tokens=200)
    argv = shlex.split(estimate_command(req))
    assert argv[argv.index("--checkpoint") + 1] == "none"
    plan, row, pool = _plan(tp=4, checkpoint=FP8_REPO)          # the catalog's own pick: left out
    assert "--checkpoint" not in estimate_command(pool_request(plan, row, pool, prompt_tokens=1000, output_tokens=200))
    plan, row, pool = _plan(tp=4, checkpoint=FP8_REPO.lower())  # any case: the same repo
    assert "--checkpoint" not in estimate_command(pool_request(plan, row, pool, prompt_tokens=1000, output_tokens=200))
    other = "RedHatAI/Qwen3-235B-A22B-FP8-dynamic"
    plan, row, pool = _plan(tp=8, checkpoint=other)             # another repo: named
    argv = shlex.split(estimate_command(pool_request(plan, row, pool, prompt_tokens=1000, output_tokens=200)))
    assert argv[argv.index("--checkpoint") + 1] == other
    # bf16 weights from the model's own repo: the default
    bf16 = EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="bf16", context_tokens=1, checkpoint="")
    assert checkpoint_flag(bf16) is None and checkpoint_flag(dataclasses.replace(bf16, checkpoint=None)) is None


@pytest.mark.parametrize(("tp", "checkpoint"), [(8, ""), (4, FP8_REPO), (8, "RedHatAI/Qwen3-235B-A22B-FP8-dynamic")])
def test_a_pools_printed_command_reruns_to_the_same_numbers(tp, checkpoint):
    plan, row, pool = _plan(tp=tp, checkpoint=checkpoint)
    req = pool_request(plan, row, pool, prompt_tokens=1000, output_tokens=200, usd_per_gpu_hour=3.5)
    argv = shlex.split(estimate_command(req))
    assert argv[:2] == ["recommend", "estimate"]
    got = _json(argv[1:])
    _, _, est = estimate_request(req)
    assert est.fits and got["fits"]
    for key in ("tpot_s", "ttft_s", "output_tokens_per_s"):
        assert got[key] == pytest.approx(getattr(est, key), rel=1e-9), key
    assert got["usd_per_hour"] == pytest.approx(3.5 * tp * 2)
    # without --checkpoint the online-fp8 pool at TP 8 is refused when rerun: the flag is what makes it reproducible
    if checkpoint == "":
        i = argv.index("--checkpoint")
        res = CliRunner().invoke(app, argv[1:i] + argv[i + 2:])
        assert res.exit_code == 2 and "192 wide" in res.stderr


def test_estimate_plan_prints_the_flag_and_its_command_reruns(tmp_path: Path):
    plan, row, pool = _plan(tp=8, checkpoint="")
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    res = CliRunner().invoke(app, ["estimate", "--plan", str(path), "--context", "1000"])
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert ", as: recommend estimate " in first and "--checkpoint none" in first
    assert "weights: bf16 checkpoint Qwen/Qwen3-235B-A22B quantized to FP8 at load" in res.stdout
    argv = shlex.split(first.split(", as: ", 1)[1])
    from_plan = _json(["estimate", "--plan", str(path), "--context", "1000"])
    again = _json(argv[1:])
    assert again["tpot_s"] == pytest.approx(from_plan["tpot_s"], rel=1e-12)
    # --checkpoint overrides the plan's pool (as deploy's does): the FP8 repo at TP 8 is refused
    res = CliRunner().invoke(app, ["estimate", "--plan", str(path), "--context", "1000", "--checkpoint", FP8_REPO])
    assert res.exit_code == 2 and "192 wide" in res.stderr


@pytest.mark.parametrize("extra, serve", [
    ((), f"vllm serve {FP8_REPO} --tensor-parallel-size 4 --data-parallel-size 2 --enable-expert-parallel"),
    (("--checkpoint", "none"), "vllm serve Qwen/Qwen3-235B-A22B --quantization fp8 --tensor-parallel-size 4 "
                               "--data-parallel-size 2 --enable-expert-parallel"),
])
def test_the_serve_line_loads_the_checkpoint_the_estimate_prices(extra: tuple[str, ...], serve: str) -> None:
    # deploy's policy (recommender.dtypes.resolve_weights): the catalog's FP8 release as is (it carries its own
    # quantization config), or the bf16 repo with --quantization fp8 (online). The line had named the bf16 repo
    # without the flag either way: a copied command would have loaded 16-bit weights.
    res = CliRunner().invoke(app, ["estimate", "--model", "qwen3-235b-a22b", "--gpu", "h200", "--tp", "4", "-dp", "2",
                                   "-ep", "--weight-dtype", "fp8", "--context", "1000", *extra])
    assert res.exit_code == 0, res.output
    (line,) = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("vllm serve ")]
    assert line.startswith(serve + " (")
