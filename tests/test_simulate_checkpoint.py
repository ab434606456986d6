"""``recommend simulate --checkpoint`` loads what ``estimate --checkpoint`` loads, and the fp8 block-split refusal's
``--checkpoint none`` is a flag every command that raises it takes.

Qwen3-235B-A22B at TP 8 with fp8 weights (worked in tests/test_estimate_checkpoint.py from the published config.json):
the catalog's fp8 checkpoint, Qwen/Qwen3-235B-A22B-FP8, stores 128x128 blocks and TP 8 cuts each expert's 1536-wide
FFN into 192 columns, which vLLM refuses at load; the bf16 repo quantized to fp8 at load (``--checkpoint none``,
per-tensor scales) loads at TP 8.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.estimator import EstimateRequest, estimate_request
from recommender.perf.step import StepCostModel
from recommender.plan import LengthSummary, Plan, PlanRow, Pool, PoolRole, WorkloadEcho, dump_plan

FP8_REPO = "Qwen/Qwen3-235B-A22B-FP8"
CONFIG = ["--model", "qwen3-235b-a22b", "--gpu", "h200", "--tp", "8", "--weight-dtype", "fp8"]
LOAD = ["--prompt-tokens", "1000", "--output-tokens", "100", "--rate", "0.5"]
SIM = ["simulate", *CONFIG, *LOAD, "-n", "200", "-q"]
HINT = "or the bf16 checkpoint quantized at load (--checkpoint none)"
CHAT_PLAN = Path(__file__).resolve().parents[1] / "examples" / "plans" / "chat.plan.json"


def invoke(*argv: str):
    return CliRunner().invoke(app, list(argv))


def _q235_plan(tmp_path: Path, checkpoint: str = FP8_REPO, name: str = "q235") -> Path:
    """A one-pool plan of Qwen3-235B-A22B at fp8 on 2 x 8 H200 loading ``checkpoint`` (as a plan written before the
    search knew the FP8 checkpoint's blocks could hold it), for ``LOAD`` (1000 + 100 tokens at 0.5 req/s)."""
    pool = Pool(role=PoolRole.BOTH, gpu="h200", tp=8, replicas=2, weight_dtype="fp8", kv_dtype="fp8",
                max_num_seqs=256, max_num_batched_tokens=8192, checkpoint=checkpoint)
    echo = WorkloadEcho(model="qwen3-235b-a22b", arrival_rate_per_s=0.5,
                        prompt_tokens=LengthSummary("constant", 1000.0, min=1000, max=1000),
                        output_tokens=LengthSummary("constant", 100.0, min=100, max=100))
    plan = Plan(workload=echo,
                rows=(PlanRow(rank=1, id="q235", pools=(pool,), max_model_len=4000),))
    path = tmp_path / f"{name}.plan.json"
    path.write_text(dump_plan(plan))
    return path


def test_simulate_takes_the_flag():
    res = invoke("simulate", "--help")
    assert res.exit_code == 0
    assert "--checkpoint" in res.stdout and "none" in res.stdout


def test_simulate_refuses_the_fp8_checkpoint_at_tp8_and_runs_the_bf16_repo_quantized_at_load():
    for extra in ([], ["--checkpoint", FP8_REPO]):  # the catalog's default, and the same repo named
        res = invoke(*SIM, *extra)
        assert res.exit_code == 2, res.output
        (line,) = res.stderr.splitlines()
        assert f"{FP8_REPO} stores fp8 weights in 128x128 blocks" in line and "192 wide" in line
        assert line.endswith(HINT) and res.stdout == ""
    for spelling in ("none", "NONE", ""):
        res = invoke(*SIM, "--checkpoint", spelling, "-f", "json")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert doc["requests"] == 200 and doc["analytic"]["stable"] is True
    # TP 4 keeps whole blocks (1536 / 4 = 384 = 3 x 128): the FP8 checkpoint loads there
    res = invoke("simulate", *CONFIG[:5], "4", *CONFIG[6:], *LOAD, "-n", "200", "-q", "--checkpoint", FP8_REPO)
    assert res.exit_code == 0, res.output


def test_simulate_refuses_a_malformed_repo_as_estimate_does():
    res = invoke(*SIM, "--checkpoint", "$(HF_TOKEN)")
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: --checkpoint ") and "is not a Hugging Face repo id" in line
    assert "--checkpoint none" in line


def test_simulate_plan_checkpoint_is_every_pools_as_in_deploy(tmp_path):
    """With ``--plan``, ``--checkpoint`` replaces the checkpoint every pool loads (``deploy --checkpoint``, ``estimate
    --plan --checkpoint``): the fp8 block-split refusal's ``--checkpoint none`` is a flag ``simulate --plan`` takes."""
    res = invoke("simulate", "--plan", str(CHAT_PLAN), "--checkpoint", "none", "-n", "100", "-q", "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests"] == 100
    path = str(_q235_plan(tmp_path, checkpoint=""))   # fp8 quantized at load from the bf16 repo: TP 8 loads
    ok = invoke("simulate", "--plan", path, "-n", "100", "-q", "-f", "json")
    assert ok.exit_code == 0, ok.output
    res = invoke("simulate", "--plan", path, "-n", "100", "-q", "--checkpoint", FP8_REPO)
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert f"{FP8_REPO} stores fp8 weights in 128x128 blocks" in line and "192 wide" in line and line.endswith(HINT)
    # a malformed repo is refused as the flags' path refuses it, before the plan is read
    res = invoke("simulate", "--plan", path, "-n", "100", "-q", "--checkpoint", "$(HF_TOKEN)")
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: --checkpoint ") and "is not a Hugging Face repo id" in line and res.stdout == ""


def test_simulate_models_the_deployment_estimate_models(monkeypatch):
    """The same flags, the same request, the same Deployment: the step times and the analytic model beside the
    simulator are estimate's (``estimate --rate`` runs the same load model)."""
    import recommender.estimator as estimator

    seen: list[EstimateRequest] = []
    real = estimator.estimate_request

    def spy(req, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append(req)
        return real(req, *a, **kw)

    monkeypatch.setattr(estimator, "estimate_request", spy)
    res = invoke(*SIM, "--checkpoint", "none", "-f", "json")
    assert res.exit_code == 0, res.output
    sim = json.loads(res.stdout)
    (req,) = seen
    assert req.checkpoint == ""  # --checkpoint none, read as estimate reads it
    want = EstimateRequest(model="qwen3-235b-a22b", gpu="h200", tp=8, weight_dtype="fp8", prompt_tokens=1000,
                           output_tokens=100, checkpoint="")
    dep_sim, dep_est = estimate_request(req)[0], estimate_request(want)[0]
    assert dep_sim == dep_est
    a, b = StepCostModel.build(dep_sim), StepCostModel.build(dep_est)
    for batch, context in ((1, 1000), (64, 1100)):
        assert a.step_s(batch, *a.decode_seq_cost(context)) == b.step_s(batch, *b.decode_seq_cost(context))
    assert a.step_s(1000, *a.prefill_chunk_cost(1000, 0), prefill=True) == \
        b.step_s(1000, *b.prefill_chunk_cost(1000, 0), prefill=True)
    monkeypatch.undo()
    res = invoke("estimate", *CONFIG, *LOAD, "--checkpoint", "none", "-f", "json")
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)
    lat = sim["latency_s"]
    for m in ("ttft", "tpot"):
        assert lat[m]["analytic"]["mean"] == est[f"{m}_s"]
        for p in ("p50", "p90", "p99"):
            assert lat[m]["analytic"][p] == est[f"{m}_{p}_s"]


@pytest.mark.parametrize("command", ["estimate", "simulate", "deploy", "estimate --plan", "simulate --plan"])
def test_the_refusals_hint_is_a_flag_the_command_takes(command, tmp_path):
    """estimate and simulate (the flags, or a plan's row) and deploy (a plan pool loading the FP8 checkpoint at TP 8)
    refuse the layout naming ``--checkpoint none``; the same command with it runs."""
    if command == "deploy":
        argv = ["deploy", str(_q235_plan(tmp_path)), "--format", "cmd"]
    elif command == "estimate":
        argv = ["estimate", *CONFIG, "--context", "1000"]
    elif command == "estimate --plan":
        argv = ["estimate", "--plan", str(_q235_plan(tmp_path)), "--context", "1000"]
    elif command == "simulate --plan":
        argv = ["simulate", "--plan", str(_q235_plan(tmp_path)), "-n", "200", "-q"]
    else:
        argv = SIM
    res = invoke(*argv)
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert "192 wide" in line and line.endswith(HINT)
    flag = re.search(r"\((--checkpoint \S+)\)$", line)
    assert flag is not None
    res = invoke(*argv, *flag.group(1).split())
    assert res.exit_code == 0, res.output
    if command == "deploy":
        assert "exec vllm serve Qwen/Qwen3-235B-A22B \\" in res.stdout and "--quantization fp8" in res.stdout
        assert "# Weights (both): bf16 checkpoint Qwen/Qwen3-235B-A22B quantized to FP8 at load" in res.stdout


def test_deploy_checkpoint_none_drops_the_plans_checkpoint(tmp_path):
    """``deploy --checkpoint none`` serves the model's own repo (before, it served a repo named 'none')."""
    path = _q235_plan(tmp_path)
    for spelling in ("none", "None"):
        res = invoke("deploy", str(path), "--format", "cmd", "--checkpoint", spelling)
        assert res.exit_code == 0, res.output
        assert "vllm serve none" not in res.stdout and FP8_REPO not in res.stdout
    # a pool with no checkpoint already loads the bf16 repo quantized at load: none changes nothing
    plain = _q235_plan(tmp_path, checkpoint="", name="online")
    a = invoke("deploy", str(plain), "--format", "cmd")
    b = invoke("deploy", str(plain), "--format", "cmd", "--checkpoint", "none")
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout
    # an empty one stays refused in deploy (an unset variable in a script, more likely than a choice)
    res = invoke("deploy", str(path), "--format", "cmd", "--checkpoint", "")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and "empty" in res.stderr
    help_text = invoke("deploy", "--help").stdout
    assert "'none'" in help_text
