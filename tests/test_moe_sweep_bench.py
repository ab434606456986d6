"""MoE sweep: `recommend estimate --bench` with MTP predicts the ITL `vllm bench serve` reports.

`vllm bench serve` appends one inter-token latency per streamed chunk (``vllm/benchmarks/serve.py``), and the
engine streams one chunk per step. Without speculative decoding a step emits one token, so ITL = TPOT. With MTP a
verify step emits ``tokens_per_step = 1 + a + ... + a^k`` tokens on average in one chunk, so the chunk gap is
TPOT x tokens_per_step (SGLang's bench_serving had to divide its ITL by the accept length for the same reason:
sgl-project/sglang#12064). `--bench` used to print ``mean_itl_ms`` = ``mean_tpot_ms`` with ``--speculative-config``.

Expected factor by hand, at an acceptance given on the command line (the catalog's default is refitted now and
then): a = 0.6, k = 2: 1 + 0.6 + 0.36 = 1.96.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TAU_K2 = 1.96  # 1 + 0.6 + 0.6^2


def _bench(*extra: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "recommender", "estimate", "--model", "deepseek-r1", "--gpu", "b200", "--tp", "8",
           "--bench", "--random-input-len", "1000", "--random-output-len", "200", "--format", "json", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


MTP2 = ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}', "--acceptance-rate", "0.6")


@pytest.mark.parametrize("run", [
    ("--num-prompts", "200", "--max-concurrency", "32"),  # capped: the analytic finite run
    ("--num-prompts", "60"),                              # uncapped: simulated request by request
], ids=["analytic", "simulated"])
def test_mtp_itl_is_one_verify_step_per_chunk(run: tuple[str, ...]) -> None:
    res = _bench(*run, *MTP2)
    assert res["mean_itl_ms"] == pytest.approx(res["mean_tpot_ms"] * TAU_K2, rel=1e-9)
    assert res["median_itl_ms"] == pytest.approx(res["median_tpot_ms"] * TAU_K2, rel=1e-9)
    if "p99_itl_ms" in res:
        assert res["p99_itl_ms"] == pytest.approx(res["p99_tpot_ms"] * TAU_K2, rel=1e-9)


def test_without_mtp_itl_is_tpot() -> None:
    res = _bench("--num-prompts", "200", "--max-concurrency", "32")
    assert res["mean_itl_ms"] == pytest.approx(res["mean_tpot_ms"], rel=1e-12)
