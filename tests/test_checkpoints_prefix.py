"""Files that start as planned: fp8 plans load the catalog's pre-quantized checkpoint by default (online
quantization only where none is listed, and the plan says so); multi-turn or shared-prefix workloads run with
prefix caching."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.deploy import render_deploy

FAST = ["--trials", "40", "--verify", "0", "--seed", "3", "--format", "json"]


def _plan(*args: str) -> dict:  # type: ignore[type-arg]
    res = CliRunner().invoke(app, [*args, *FAST])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_fp8_rows_load_the_pre_quantized_checkpoint() -> None:
    # catalogs/models/llama-3.1-8b.yaml quantized_checkpoints.fp8 (RedHatAI's FP8 release)
    want = default_catalog().model_meta["llama-3.1-8b"]["quantized_checkpoints"]["fp8"]
    assert want == "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8"
    doc = _plan("--workload", str(Path(__file__).resolve().parents[1] / "examples" / "chat.yaml"))  # llama-3.1-8b
    fp8 = [r for r in doc["plans"] if r["weight_dtype"] == "fp8"]
    assert fp8 and all(r["checkpoint"] == want and "online" not in r["quality_note"] for r in fp8)
    rank = fp8[0]["rank"]
    script = render_deploy(doc, rank=rank, formats="cmd")["vllm-serve.sh"]
    assert f"vllm serve {want}" in script and "--quantization" not in script


def test_fp8_without_a_checkpoint_is_quantized_online_and_the_plan_says_so() -> None:
    assert "fp8" not in (default_catalog().model_meta["qwen2.5-7b"].get("quantized_checkpoints") or {})
    doc = _plan("--model", "qwen2.5-7b", "--gpus", "h100", "--rate", "5", "--prompt-tokens", "1000",
                "--output-tokens", "200")
    fp8 = [r for r in doc["plans"] if r["weight_dtype"] == "fp8"]
    assert fp8 and all(not r["checkpoint"] and "fp8 quantized online" in r["quality_note"] for r in fp8)
    assert "--quantization fp8" in render_deploy(doc, rank=fp8[0]["rank"], formats="cmd")["vllm-serve.sh"]


def test_multi_turn_chat_runs_with_prefix_caching(tmp_path: Path) -> None:
    chat = Path(__file__).resolve().parents[1] / "examples" / "chat.yaml"
    assert "multi_turn: true" in chat.read_text()
    doc = _plan("--workload", str(chat))
    assert all(p["enable_prefix_caching"] for r in doc["plans"] for p in r["pools"])
    assert "--enable-prefix-caching" in render_deploy(doc, rank=1, formats="cmd")["vllm-serve.sh"]
    off = tmp_path / "single-turn.yaml"
    off.write_text(chat.read_text().replace("multi_turn: true", "multi_turn: false"))
    doc = _plan("--workload", str(off))
    assert not any(p["enable_prefix_caching"] for r in doc["plans"] for p in r["pools"])
