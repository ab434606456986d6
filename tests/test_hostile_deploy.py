"""Hostile strings through every deploy output format: nothing Kubernetes would expand, no label or name
outside its pattern, nothing a shell would run. Checks the rendered objects, not the text."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from typer.testing import CliRunner

from recommender.cli import app
from recommender import deploy as _deploy
from recommender.deploy.spec import k8s_escape
from recommender.errors import ConfigError, DeployError
from recommender.hf_config import is_model_repo, load_config_file
from recommender.plan import load_plan


def render_deploy(doc: dict[str, Any], **kw: Any) -> dict[str, str]:  # edited documents, read by the one loader
    return _deploy.render_deploy(load_plan(doc), **kw)

DATA = Path(__file__).parent / "data"
AGG = DATA / "plans" / "agg-llama70b-h100.json"
DISAGG = DATA / "plans" / "disagg-llama70b-h200.json"
TINY = str(DATA / "policies" / "tiny-search.yaml")

HOSTILE = ["$(HF_TOKEN)", "a$(HF_TOKEN)b", "$(HF_TOKEN", "$$(HF_TOKEN)", "${HF_TOKEN}", "$HF_TOKEN",
           "org/$(HF_TOKEN)", "x\n- --trust-remote-code", "'; touch PWNED; '", "`id`", "org/name; id",
           "--trust-remote-code", "org/na me", "../../etc/passwd", "org/\u202emodel", "a" * 300, ""]

# Kubernetes label values and DNS-1123 labels (object names)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def k8s_expansions(s: str) -> list[str]:
    """Variable names Kubernetes would substitute in a container arg / env value (``$$`` is a literal ``$``)."""
    names: list[str] = []
    i = 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                i += 2
                continue
            if s[i + 1] == "(":
                end = s.find(")", i + 2)
                if end > 0:
                    names.append(s[i + 2: end])
                    i = end + 1
                    continue
        i += 1
    return names


def test_the_expansion_model_matches_kubernetes_rules() -> None:
    # Kubernetes docs ("Define dependent environment variables"): $(VAR) expands, $$(VAR) escapes it
    assert k8s_expansions("$(HF_TOKEN)") == ["HF_TOKEN"]
    assert k8s_expansions("$$(HF_TOKEN)") == []
    assert k8s_expansions(k8s_escape("a$(B)c$$(D)")) == []
    assert k8s_expansions("$(POD_NAMESPACE)") == ["POD_NAMESPACE"]


def containers(objs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for o in objs:
        if o.get("kind") == "Deployment":
            yield from o["spec"]["template"]["spec"]["containers"]


def metadata(objs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for o in objs:
        yield o["metadata"]
        if o.get("kind") == "Deployment":
            yield o["spec"]["template"]["metadata"]


def check_rendered(files: dict[str, str], hostile: str) -> None:
    """Every format: no expansion but the router's namespace, labels and names in pattern, no shell text."""
    objs = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d]
    assert [o["kind"] for o in objs][:2] == ["PersistentVolumeClaim", "Deployment"]
    for c in containers(objs):
        allowed = ["POD_NAMESPACE"] if c["name"] == "router" else []
        for arg in c.get("args", []):
            assert k8s_expansions(arg) == allowed * len(k8s_expansions(arg)), arg
        for env in c.get("env", []):
            assert k8s_expansions(str(env.get("value", ""))) == []
    for meta in metadata(objs):
        assert DNS_LABEL.fullmatch(meta.get("name", "x")) and len(meta.get("name", "")) <= 63
        for value in meta["labels"].values():
            assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, value
    values = yaml.safe_load(files["helm-values.yaml"])
    for ms in values["servingEngineSpec"]["modelSpec"]:
        for text in [ms["modelURL"], *ms["vllmConfig"]["extraArgs"]]:
            assert k8s_expansions(str(text)) == []
        for value in ms["podLabels"].values():
            assert LABEL_VALUE.fullmatch(value) and len(value) <= 63
    for name, text in files.items():
        if name.endswith(".sh"):
            for line in text.splitlines():
                if not line.startswith("#") and hostile.strip():
                    # the hostile text appears in commands only as one shell word, quoted
                    for word in shlex.split(line.rstrip("\\"), comments=True):
                        assert word in (hostile, "org/model") or hostile not in word


def _doc(path: Path = AGG) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("field", ["hf_repo", "checkpoint"])
def test_hostile_model_repos_are_refused_with_one_line(hostile: str, field: str) -> None:
    doc = _doc()
    if field == "hf_repo":
        doc["workload"]["hf_repo"] = hostile
        call = dict(rank=1)
    else:
        call = dict(rank=1, checkpoint=hostile)
    with pytest.raises(DeployError) as e:
        render_deploy(doc, formats="all", **call)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("plan", [AGG, DISAGG])
def test_hostile_free_text_fields_render_safely_in_every_format(hostile: str, plan: Path) -> None:
    doc = _doc(plan)
    doc["workload"].update(model=hostile or "m", name=hostile, source=hostile, hf_repo="org/model")
    doc["plans"][0]["id"] = hostile or "id"
    try:
        files = render_deploy(doc, rank=1, formats="all", plan_name=hostile or None)
    except (DeployError, ConfigError) as e:  # control characters in a name are refused (plan reader or deploy): one line
        assert "control" in str(e) and "characters" in str(e) and "\n" not in str(e)
        return
    check_rendered(files, hostile)
    argv = next(containers([d for d in yaml.safe_load_all(files["k8s.yaml"]) if d]))["args"]
    assert argv[0] == "org/model" and hostile not in argv or hostile == "org/model"


def test_valid_repo_ids_and_local_paths_pass() -> None:
    for ok in ["meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-8B", "gpt2", "org/m.v0.3_x", "/models/llama-70b"]:
        assert is_model_repo(ok), ok
    for bad in HOSTILE + ["org/a--b", "org/a..b", "/models/../etc", "a/b/c", "-org/x", "org/x-"]:
        assert not is_model_repo(bad), bad


@pytest.mark.parametrize("folder_name", ["my-model", "$(HF_TOKEN)"])
def test_hostile_config_json_name_never_reaches_the_manifests(tmp_path: Path, folder_name: str) -> None:
    """config.json `_name_or_path` = $(HF_TOKEN) (and a folder of that name) through the main job's --emit."""
    cfg = json.loads((DATA / "hf_configs" / "Qwen3-8B" / "config.json").read_text())
    cfg["_name_or_path"] = "$(HF_TOKEN)"
    folder = tmp_path / folder_name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_config_file(folder / "config.json").hf_repo == ""
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "$(HF_TOKEN)", "model": str(folder / "config.json"), "gpus": ["h100-sxm"],
        "traffic": {"arrival_rate": 2}, "prompt_tokens": {"dist": "constant", "value": 500},
        "output_tokens": {"dist": "constant", "value": 100}, "slo": ["tpot=60ms@p90"]}))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["--workload", str(wl), "--policy", TINY, "--verify", "0", "--format", "json",
                                   "--emit", str(out)])
    if folder_name.startswith("$"):  # the folder name becomes the model id, and no repo: refused, nothing written
        assert res.exit_code == 2 and "not a Hugging Face repo id" in res.stderr and len(res.stderr.splitlines()) == 1
        assert not out.exists()
        return
    assert res.exit_code == 0, res.output
    files = {p.name: p.read_text() for p in out.iterdir()}
    check_rendered(files, "$(HF_TOKEN)")
    objs = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d]
    for c in containers(objs):
        assert not any("HF_TOKEN" in a for a in c["args"])
    ms = yaml.safe_load(files["helm-values.yaml"])["servingEngineSpec"]["modelSpec"][0]
    assert "HF_TOKEN" not in ms["modelURL"] and not any("HF_TOKEN" in a for a in ms["vllmConfig"]["extraArgs"])
