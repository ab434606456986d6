"""MoE sweep: the ``vllm serve`` line of an MTP plan captures its decode steps in CUDA graphs.

vLLM 0.33's CUDA-graph capture sizes count tokens, not sequences: with ``--speculative-config`` of ``k`` MTP draft
tokens a decode step of ``B`` sequences carries ``B x (1 + k)`` query tokens (vLLM's own default cap is
``min(max_num_seqs x (1 + k) x 2, 512)``, ``vllm/config/vllm.py::_set_cudagraph_sizes``). The plan models CUDA
graphs on for every batch up to ``max_num_seqs``, so the emitted ``--max-cudagraph-capture-size`` must cover
``max_num_seqs x (1 + k)`` tokens (up to the 512 cap); it used to be ``min(max_num_seqs, 512)``, which left every
decode step above ``max_num_seqs / (1 + k)`` sequences out of the graphs.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from recommender.deploy import render_deploy
from recommender.deploy.vllm_flags import check_serve_args

PLAN = Path(__file__).parent / "data" / "plans" / "moe-dsv3-h200-dp8.json"


def _doc(max_num_seqs: int, k: int) -> dict[str, Any]:
    """The DeepSeek-V3 TP1 x DP8 fixture plan, its rank 1 pool set to ``max_num_seqs`` and ``k`` MTP tokens."""
    doc = json.loads(PLAN.read_text())
    doc = copy.deepcopy(doc)
    row = next(r for r in doc["plans"] if r["rank"] == 1)
    row["max_num_seqs"] = max_num_seqs
    for pool in row["pools"]:
        pool["max_num_seqs"] = max_num_seqs
        if k:
            pool["num_speculative_tokens"] = k
        else:
            pool.pop("num_speculative_tokens", None)
    return doc


def _serve_argv(doc: dict[str, Any]) -> list[str]:
    script = render_deploy(doc, rank=1, formats="cmd")["vllm-serve.sh"]
    body = script[script.index("exec vllm serve"):].replace("\\\n", " ")
    return shlex.split(body.splitlines()[0])[3:]  # after exec vllm serve


@pytest.mark.parametrize(("max_num_seqs", "k", "expected"), [
    (128, 0, 128),   # no MTP: one token per sequence, 128 sequences
    (64, 1, 128),    # 64 sequences x 2 query tokens
    (128, 2, 384),   # 128 sequences x 3 query tokens
    (256, 2, 510),   # 768 tokens over vLLM's 512 cap: the largest multiple of 3 under it
    (512, 3, 512),   # 2,048 tokens over the cap; 512 is a multiple of 4
])
def test_mtp_plan_captures_its_largest_decode_step(max_num_seqs: int, k: int, expected: int) -> None:
    argv = _serve_argv(_doc(max_num_seqs, k))
    check_serve_args(argv)  # still a line vLLM 0.33 parses
    assert argv[argv.index("--max-cudagraph-capture-size") + 1] == str(expected)
    if k:
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec == {"method": "mtp", "num_speculative_tokens": k}
    else:
        assert "--speculative-config" not in argv
