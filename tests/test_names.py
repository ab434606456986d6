"""One resolver for the names users have: Hugging Face repo ids, catalog ids and aliases for models;
catalog ids, datasheet names, nvidia-smi names and short aliases for GPUs. And the catalog listings
(`recommend models`, `recommend gpus`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recommender.catalog import catalog_dir, default_catalog, load_catalog
from recommender.cli import app
from recommender.errors import CatalogError


@pytest.mark.parametrize("name, gpu_id", [
    ("h100", "h100-sxm"),
    ("H100", "h100-sxm"),
    ("H100 80GB HBM3", "h100-sxm"),            # nvidia-smi --query-gpu=name on an HGX H100
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("h100-sxm", "h100-sxm"),
    ("NVIDIA H100 SXM5 80GB", "h100-sxm"),     # the catalog's datasheet name
    ("MI300X", "mi300x"),
    ("AMD Instinct MI300X", "mi300x"),         # rocm-smi product name
    ("h200", "h200"),
    ("NVIDIA L4", "l4"),
    ("A100-SXM4-80GB", "a100-80gb"),
])
def test_gpu_names_resolve_to_catalog_ids(name: str, gpu_id: str) -> None:
    assert default_catalog().gpu(name).id == gpu_id


@pytest.mark.parametrize("name, model_id", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/llama-3.1-70b-instruct", "llama-3.1-70b"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),   # the repo's earlier name (alias)
    ("LLAMA-3.1-8B", "llama-3.1-8b"),
    ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
])
def test_model_names_resolve_to_catalog_ids(name: str, model_id: str) -> None:
    assert default_catalog().model(name).id == model_id


def test_every_hf_repo_in_the_catalog_resolves_to_its_entry() -> None:
    cat = default_catalog()
    for mid, arch in cat.models.items():
        assert cat.model(arch.hf_repo).id == mid


def test_unknown_names_say_what_is_close_and_where_to_look() -> None:
    cat = default_catalog()
    with pytest.raises(CatalogError) as e:
        cat.gpu("h10")
    assert "did you mean h100-sxm" in str(e.value) and "recommend gpus" in str(e.value)
    with pytest.raises(CatalogError) as e:
        cat.model("someorg/not-a-model")
    assert "not in the catalog" in str(e.value) and "config.json" in str(e.value)


def test_an_alias_two_entries_share_is_ambiguous_but_ids_still_work(tmp_path: Path) -> None:
    doc = yaml.safe_load((catalog_dir() / "gpus" / "h100-sxm.yaml").read_text())
    doc["id"] = "my-h100"                      # keeps the aliases 'h100', 'H100 80GB HBM3', ...
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "my-h100.yaml").write_text(yaml.safe_dump(doc))
    cat = load_catalog(extra_dirs=[tmp_path])
    assert cat.gpu("my-h100").id == "my-h100" and cat.gpu("h100-sxm").id == "h100-sxm"
    with pytest.raises(CatalogError, match="ambiguous: it names h100-sxm, my-h100"):
        cat.gpu("h100")


def test_local_config_json_still_works(tmp_path: Path) -> None:
    cfg = dict(yaml.safe_load((catalog_dir() / "models" / "llama-3.1-8b.yaml").read_text())["config"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = default_catalog().model(str(tmp_path / "config.json"))
    assert arch.total_params == default_catalog().model("llama-3.1-8b").total_params


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_recommend_gpus_json_lists_every_gpu_with_figures() -> None:
    r = run("gpus", "--format", "json")
    assert r.exit_code == 0, r.output
    recs = {g["id"]: g for g in json.loads(r.stdout)}
    assert set(recs) == set(default_catalog().gpus)
    h100 = recs["h100-sxm"]
    # catalogs/gpus/h100-sxm.yaml: 80 GB, 3.35 TB/s, 989 / 1979 dense TFLOP/s, NVLink4 450 GB/s; cheapest offer
    # RunPod community $2.69/GPU-h (hardware-and-models.md 1b, [P1] read 2026-11-09)
    assert h100["memory_bytes"] == 80e9 and h100["hbm_bandwidth_bytes_per_s"] == 3.35e12
    assert h100["dense_flops_per_s"]["bf16"] == 989e12 and h100["dense_flops_per_s"]["fp8"] == 1979e12
    assert h100["interconnect"]["bandwidth_bytes_per_s"] == 450e9 and h100["usd_per_gpu_hour"] == 2.69
    assert h100["cheapest_offer"]["provider"] == "runpod"
    assert "h100" in h100["aliases"]


def test_recommend_models_json_lists_hf_repos_params_and_context() -> None:
    r = run("models", "--format", "json")
    assert r.exit_code == 0, r.output
    recs = {m["id"]: m for m in json.loads(r.stdout)}
    m = recs["llama-3.1-8b"]
    # catalogs/models/llama-3.1-8b.yaml: reference_computed total_params 8030261248; config max_position_embeddings 131072
    assert m["hf_repo"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert m["total_params"] == 8030261248 and m["max_context_tokens"] == 131072


@pytest.mark.parametrize("cmd", ["models", "gpus"])
def test_catalog_tables_fit_80_columns(cmd: str) -> None:
    r = run(cmd, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert "h100-sxm" in r.stdout or "meta-llama/Llama-3.1-8B-Instruct" in r.stdout


def test_estimate_takes_the_names_users_have() -> None:
    r = run("estimate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100 80GB HBM3",
            "--batch", "8", "--context", "1024", "--format", "json")
    assert r.exit_code == 0, r.output
    ref = run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "8", "--context", "1024",
              "--format", "json")
    assert json.loads(r.stdout) == json.loads(ref.stdout)


def test_a_workload_file_takes_gpu_aliases_and_hf_ids(tmp_path: Path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text("model: meta-llama/Llama-3.1-8B-Instruct\ntraffic: {arrival_rate: 2}\nprompt_tokens: 500\n"
                 "output_tokens: 100\ngpus: [h100, NVIDIA L4]\nprices: {H100: 2.0}\nslo: [tpot=50ms]\n")
    r = run("--workload", str(p), "--trials", "40", "--verify", "0", "--format", "json")
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)["plans"]
    assert {p["gpu"] for p in plans} <= {"h100-sxm", "l4"}
    # prices: {H100: 2.0} is the h100-sxm price: $2 per GPU-hour
    assert all(p["usd_per_hour"] == 2.0 * p["gpus_total"] for p in plans if p["gpu"] == "h100-sxm")
    assert any(p["gpu"] == "h100-sxm" for p in plans)


def test_the_engine_option_names_every_shipped_profile() -> None:
    """`--engine`'s help lists the profiles a user can pick: every file of catalogs/profiles (ATOM was missing)."""
    from recommender.cli.options import Engine

    help_text = Engine.__metadata__[0].help
    listed = set(help_text.split(": ", 1)[1].split(" ", 1)[0].split("|"))
    assert listed == {p.stem for p in (catalog_dir() / "profiles").glob("*.yaml")}
