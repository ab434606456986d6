"""The model's context bounds every plan: a prompt + output above it is refused before the search, and no
emitted file asks vLLM for ``--max-model-len`` above it (vLLM 0.33 refuses to start then)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.deploy import render_deploy
from recommender.errors import DeployError

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "examples" / "plans").glob("*.plan.json")) + sorted((ROOT / "tests" / "data" / "plans").glob("*.json"))


@pytest.mark.parametrize("prompt", ["200k", "20M"])
def test_a_prompt_longer_than_the_context_is_refused_in_one_line(prompt: str) -> None:
    # Llama 3.1 8B's config.json: max_position_embeddings 131072 (catalogs/models/llama-3.1-8b.yaml)
    res = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--prompt-tokens", prompt, "--rate", "1",
                                   "--output-tokens", "100"])
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert "\n" not in err and "context of 131,072 tokens" in err and "Traceback" not in res.output


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_no_emitted_file_asks_for_more_than_the_models_context(path: Path) -> None:
    doc = json.loads(path.read_text())
    context = default_catalog().model(doc["workload"]["model"]).max_position_embeddings
    for rank in range(1, len(doc["plans"]) + 1):
        files = render_deploy(doc, rank=rank, formats="all")
        lens = [int(n) for text in files.values() for n in re.findall(r"--max-model-len[\"'\s,=]+\"?(\d+)", text)]
        assert lens and max(lens) <= context, (path.name, rank, lens)


def test_deploy_refuses_a_plan_whose_max_model_len_exceeds_the_context() -> None:
    doc = json.loads((ROOT / "examples" / "plans" / "chat.plan.json").read_text())
    doc["workload"]["max_model_len"] = 200_100
    doc["plans"] = doc["plans"][:1]
    for row in doc["plans"]:
        row["max_model_len"] = 200_100
        for pool in row["pools"]:  # a chunked row, so the token budget may stay below the model length
            pool["chunked_prefill"] = True
            pool["max_num_batched_tokens"] = min(pool["max_num_batched_tokens"], 8192)
    assert doc["plans"]
    with pytest.raises(DeployError, match="above llama-3.1-8b's context of 131,072 tokens"):
        render_deploy(doc, rank=1, formats="cmd")
