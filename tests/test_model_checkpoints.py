"""A model named by one of its catalog entry's checkpoints (a chat or reasoning release of the same architecture,
with or without the Hugging Face organisation) is planned on that entry and deployed as the checkpoint it names:
`--model deepseek-r1` serves deepseek-ai/DeepSeek-R1, never DeepSeek-V3's weights. The re-planner keeps it.

Sources of the aliases: DeepSeek-R1's config.json is DeepSeek-V3's ([M1] in catalogs/models/deepseek-v3.yaml;
../shared/reference/hardware-and-models.md, "identical to V3"); InferenceX's DeepSeek-R1-0528 is "DeepSeek-V3
architecture" (../shared/reference/measurements/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.plan.io import load_plan
from recommender.replan.observe import base_workload_from_plan

FAST = ["--trials", "40", "--verify", "0", "--seed", "3"]


@pytest.mark.parametrize("name, model_id, repo", [
    ("deepseek-r1", "deepseek-v3", "deepseek-ai/DeepSeek-R1"),
    ("DeepSeek-R1-0528", "deepseek-v3", "deepseek-ai/DeepSeek-R1-0528"),
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3", "deepseek-ai/DeepSeek-R1"),
    ("deepseek-v3", "deepseek-v3", "deepseek-ai/DeepSeek-V3"),                 # the catalog id: its default repo
    ("Llama-3.3-70B-Instruct", "llama-3.3-70b", "meta-llama/Llama-3.3-70B-Instruct"),  # no organisation
    ("Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
    ("llama-2-7b-chat-hf", "llama-2-7b", "meta-llama/Llama-2-7b-chat-hf"),
    ("llama-2-7b", "llama-2-7b", "meta-llama/Llama-2-7b-hf"),
])
def test_a_checkpoint_name_resolves_to_its_entry_and_keeps_its_repo(name: str, model_id: str, repo: str) -> None:
    m = default_catalog().model(name)
    assert (m.id, m.hf_repo) == (model_id, repo)


def test_every_catalog_repo_resolves_without_its_organisation() -> None:
    cat = default_catalog()
    for mid in cat.models:
        for repo in cat._repos(mid):
            short = repo.rsplit("/", 1)[-1]
            m = cat.model(short)
            assert m.id == mid, (short, m.id)
            assert m.hf_repo == repo or short.lower() == mid.lower(), (short, m.hf_repo)


def test_a_reasoning_release_is_what_the_plan_deploys_and_the_replanner_keeps(tmp_path: Path) -> None:
    out = tmp_path / "r1"
    res = CliRunner().invoke(app, ["--model", "deepseek-r1", "--gpus", "h200", "--rate", "2", "--prompt-tokens",
                                   "1000", "--output-tokens", "200", "--slo", "tpot=50ms", *FAST, "--emit", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "plan.json").read_text())
    assert (doc["workload"]["model"], doc["workload"]["hf_repo"]) == ("deepseek-v3", "deepseek-ai/DeepSeek-R1")
    serve = (out / "vllm-serve.sh").read_text()
    assert "vllm serve deepseek-ai/DeepSeek-R1 " in serve and "DeepSeek-V3" not in serve
    assert "deepseek-ai/DeepSeek-R1" in (out / "k8s.yaml").read_text()
    # the table names the checkpoint beside the catalog model; a model's own repo is not repeated
    from recommender.render.plan import render_table

    assert render_table(load_plan(out / "plan.json")).startswith("deepseek-v3 (deepseek-ai/DeepSeek-R1) | flags: ")
    assert render_table(load_plan(Path(__file__).parent / "data" / "plans" / "moe-dsv3-h200-dp8.json")).startswith(
        "deepseek-v3 | ")
    # the re-planner plans the next plan for the same checkpoint
    assert base_workload_from_plan(load_plan(out / "plan.json")).model == "deepseek-ai/DeepSeek-R1"
