"""MoE deploy sweep: data-parallel attention plans in the llm-d and KEDA outputs.

* llm-d: chart ``llm-d-modelservice`` v0.4.12's ``vllmServeModelCommand`` (``templates/_helpers.tpl`` at 3051935e)
  writes ``--data-parallel-size <parallelism.data>`` and ``--data-parallel-size-local <parallelism.dataLocal>``
  itself when they are above 1. The container's ``args`` used to repeat ``--data-parallel-size``, so the line the
  chart runs gave it twice, which the project's vLLM 0.33 flag check refuses (argparse silently keeps the last one:
  a later edit of ``parallelism.data`` would leave vLLM's DP size and the chart's GPU request apart).
* KEDA: the threshold is the per-replica requests in the engine at the modelled point, capped at what one replica
  can hold. A replica of a DP plan is one engine of ``data_parallel_size`` ranks, each running up to
  ``max_num_seqs`` sequences, and ``vllm:num_requests_running`` summed over the pod counts every rank: the cap is
  ``max_num_seqs x data_parallel_size``. It was ``max_num_seqs``: DeepSeek-V3 H200 TP1 x DP8 x2 at 20 req/s
  (17.07 s mean E2E) is modelled at 170.7 requests per replica, and a threshold of 128 scaled it out at its own
  planned operating point.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from recommender.deploy import render_deploy
from recommender.deploy.vllm_flags import check_serve_args
from recommender.plan import load_plan

PLAN = Path(__file__).parent / "data" / "plans" / "moe-dsv3-h200-dp8.json"


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(PLAN.read_text())
    return doc


def _chart_line(values: dict[str, Any]) -> list[str]:
    """The argv after ``vllm serve`` that llm-d-modelservice v0.4.12 writes for the decode role (vllmServe)."""
    role = values["decode"]
    par = role["parallelism"]
    tp, dp, dpl = par.get("tensor", 1), par.get("data", 1), par.get("dataLocal", par.get("data", 1))
    return [values["modelArtifacts"]["uri"].removeprefix("hf://"), "--port", str(values["routing"]["servicePort"]),
            *(["--tensor-parallel-size", str(tp)] if tp > 1 else []),
            *(["--data-parallel-size", str(dp)] if dp > 1 else []),
            *(["--data-parallel-size-local", str(dpl)] if dpl > 1 else []),
            "--served-model-name", values["modelArtifacts"]["name"], *role["containers"][0]["args"]]


def test_llmd_data_parallel_size_is_the_charts_and_given_once() -> None:
    values = yaml.safe_load(render_deploy(load_plan(_doc()), rank=1, formats="llm-d")["llm-d-values.yaml"])
    role = values["decode"]
    assert role["parallelism"] == {"tensor": 1, "data": 8, "dataLocal": 8}  # the chart requests 1 x 8 GPUs
    assert "--data-parallel-size" not in role["containers"][0]["args"]
    parsed = check_serve_args(_chart_line(values))  # refuses a flag given twice
    assert parsed["data_parallel_size"] == 8 and parsed["data_parallel_size_local"] == 8


def test_llmd_plain_tp_plan_gets_no_data_parallel_flags() -> None:
    values = yaml.safe_load(render_deploy(load_plan(_doc()), rank=2, formats="llm-d")["llm-d-values.yaml"])
    assert values["decode"]["parallelism"] == {"tensor": 8}
    parsed = check_serve_args(_chart_line(values))
    assert parsed.get("data_parallel_size") is None and parsed["tensor_parallel_size"] == 8


@pytest.mark.parametrize(("rank", "expected"), [
    (1, 20.0 / 2 * 17.07242968698712),   # TP1 x DP8: 170.72, below 8 ranks x 128 sequences
    (2, 20.0 / 3 * 14.90934465772469),   # TP8, no DP: 99.40, below 256
])
def test_keda_threshold_counts_every_rank_of_a_data_parallel_replica(rank: int, expected: float) -> None:
    files = render_deploy(load_plan(_doc()), rank=rank, formats="keda")
    obj = next(d for d in yaml.safe_load_all(files["keda.yaml"]) if d)
    assert float(obj["spec"]["triggers"][0]["metadata"]["threshold"]) == pytest.approx(expected, abs=0.005)


def test_keda_threshold_is_capped_at_the_ranks_sequences() -> None:
    doc = _doc()
    row = doc["plans"][0]
    row["max_num_seqs"] = 16
    for pool in row["pools"]:
        pool["max_num_seqs"] = 16  # 170.7 requests per replica now exceed 8 ranks x 16 = 128
    files = render_deploy(load_plan(doc), rank=1, formats="keda")
    obj = next(d for d in yaml.safe_load_all(files["keda.yaml"]) if d)
    assert obj["spec"]["triggers"][0]["metadata"]["threshold"] == "128.00"


def test_the_file_header_names_expert_parallelism_and_mtp() -> None:
    """Every file's ``# Pool`` line describes the engine the flags start: it named DP but left out EP and MTP, so
    an EP or MTP plan's header read like plain TP (the plan table says ``TP8 MTP2``, the id ``-ep-``)."""
    doc = _doc()
    pool = doc["plans"][0]["pools"][0]
    pool["enable_expert_parallel"] = True
    pool["num_speculative_tokens"] = 2
    for name, text in render_deploy(load_plan(doc), rank=1, formats="cmd,k8s,helm").items():
        line = next(x for x in text.splitlines() if x.startswith("# Pool both: "))
        assert "x DP8 (16 GPUs); expert parallel; MTP 2 draft tokens; weights fp8" in line, name
    plain = render_deploy(load_plan(_doc()), rank=2, formats="cmd")["vllm-serve.sh"]
    line = next(x for x in plain.splitlines() if x.startswith("# Pool both: "))
    assert "expert parallel" not in line and "MTP" not in line


def test_a_one_gpu_pool_header_says_1_gpu() -> None:
    # examples/plans/moe-chat.plan.json rank 1: one h100-pcie replica at TP 1
    from typer.testing import CliRunner

    from recommender.cli import app

    root = Path(__file__).resolve().parents[1]
    out = CliRunner().invoke(app, ["deploy", str(root / "examples" / "plans" / "moe-chat.plan.json"), "--format", "cmd"])
    assert out.exit_code == 0, out.output
    assert "# Pool both: 1 x h100-pcie TP1 (1 GPU); weights" in out.output
