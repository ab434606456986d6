"""MoE sweep: the ``vllm serve`` line of an MTP plan captures its decode steps in CUDA graphs.

vLLM 0.33's CUDA-graph capture sizes count tokens, not sequences: with ``--speculative-config`` of ``k`` MTP draft
tokens a decode step of ``B`` sequences carries ``B x (1 + k)`` query tokens (vLLM's own default cap is
``min(max_num_seqs x (1 + k) x 2, 512)``, 1024 for 512 on datacenter Blackwell, ``vllm/config/vllm.py::_set_cudagraph_sizes``). The plan models CUDA
graphs on for every batch up to ``max_num_seqs``, so the emitted ``--max-cudagraph-capture-size`` must cover
``max_num_seqs x (1 + k)`` tokens (up to vLLM's default cap: 512, 1024 on datacenter Blackwell); it used to be ``min(max_num_seqs, 512)``, which left every
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


def _on_gpu(doc: dict[str, Any], gpu: str) -> dict[str, Any]:
    """The fixture plan with rank 1's pools on ``gpu`` (same TP x DP; the rental's provider is left as it is)."""
    for row in doc["plans"]:
        if row["rank"] == 1:
            row["gpu"] = gpu
            for pool in row["pools"]:
                pool["gpu"] = gpu
    return doc


@pytest.mark.parametrize(("gpu", "max_num_seqs", "k", "expected"), [
    # vLLM 0.33's default cap is 1024 on datacenter Blackwell (B200, B300, GB200, GB300), 512 elsewhere
    # (shared/reference/vllm/README.md, --max-cudagraph-capture-size "default cap 512, 1024 on datacenter Blackwell")
    ("b200", 512, 1, 1024),    # 512 sequences x 2 tokens = 1024: the whole step, at the Blackwell cap
    ("b200", 512, 2, 1023),    # 1,536 tokens over the 1024 cap: the largest multiple of 3 under it (341 x 3)
    ("b300", 1024, 0, 1024),   # no MTP: 1024 sequences, one token each
    ("gb200", 256, 3, 1024),   # 256 x 4 = 1024, a multiple of 4
    ("h200", 512, 1, 512),     # Hopper keeps 512: 1024 tokens capped, 512 a multiple of 2
    ("h200", 256, 2, 510),     # 768 tokens over 512: 170 x 3
])
def test_the_capture_cap_follows_the_gpu(gpu: str, max_num_seqs: int, k: int, expected: int) -> None:
    argv = _serve_argv(_on_gpu(_doc(max_num_seqs, k), gpu))
    check_serve_args(argv)
    assert argv[argv.index("--max-cudagraph-capture-size") + 1] == str(expected)


def test_the_blackwell_architecture_is_the_datacenter_parts_only() -> None:
    """The 1024 cap goes by the catalog architecture ``blackwell`` (compute capability 10.0 / 10.3); an RTX Blackwell
    or GB10 entry (12.x, 512 cap) would have to get its own architecture row, not join this one."""
    from recommender.catalog import default_catalog
    from recommender.deploy.vllm_cmd import max_cudagraph_capture_cap

    blackwell = {g.id for g in default_catalog().gpus.values() if max_cudagraph_capture_cap(g.arch) == 1024}
    assert blackwell == {"b200", "b300", "gb200", "gb300"}
