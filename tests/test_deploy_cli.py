"""``recommend deploy`` and the atomic writer behind it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import recommender.cli  # noqa: F401  (registers every command on the app)
from recommender.cli.app import app
from recommender.deploy import normalise_formats
from recommender.deploy import writer
from recommender.errors import DeployError

from recommender import deploy as _deploy
from recommender.plan import load_plan


def render_deploy(doc, **kw):  # the tests edit plan documents, then read them through the one loader
    return _deploy.render_deploy(load_plan(doc), **kw)


def build_spec(doc, *args, **kw):
    return _deploy.build_spec(load_plan(doc), *args, **kw)


def write_deploy_files(doc, *args, **kw):
    return _deploy.write_deploy_files(load_plan(doc), *args, **kw)

PLANS = Path(__file__).parent / "data" / "plans"
AGG = PLANS / "agg-llama70b-h100.json"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["deploy", *args])


def test_writes_all_formats_and_prints_the_paths(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    result = invoke(str(AGG), "--out", str(out))
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [".recommender-files.json", "helm-values.yaml", "k8s.yaml", "vllm-serve.sh"]
    assert result.output.split() == [str(out / n) for n in ("vllm-serve.sh", "k8s.yaml", "helm-values.yaml")]
    assert os.stat(out / "vllm-serve.sh").st_mode & stat.S_IXUSR
    assert not os.stat(out / "k8s.yaml").st_mode & stat.S_IXUSR


def test_rank_and_format_select_what_is_written(tmp_path: Path) -> None:
    result = invoke(str(AGG), "--rank", "2", "--format", "k8s,cmd", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [".recommender-files.json", "k8s.yaml", "vllm-serve.sh"]
    assert "# Plan: h100-sxm-tp8-bf16-bf16-s256-b16384-r1 (rank 2 of 3)" in (tmp_path / "k8s.yaml").read_text()


def test_without_out_a_single_format_prints_pipeable_yaml() -> None:
    result = invoke(str(AGG), "--format", "k8s")
    assert result.exit_code == 0, result.output
    kinds = [o["kind"] for o in yaml.safe_load_all(result.output) if o]
    assert kinds == ["PersistentVolumeClaim", "Deployment", "Service"]


def test_json_output_lists_the_rendered_files() -> None:
    result = invoke(str(AGG), "--format", "cmd", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["rank"] == 1 and list(doc["files"]) == ["vllm-serve.sh"]


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), ('{"workload": {"model": "m"}, "plans": []}', "no plans"), ('{"version": 3, "workload": {}, "plans": []}', "plan version 3")],
)
def test_bad_plan_files_fail_with_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    result = invoke(str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_refused_plan_and_missing_rank_fail_cleanly(tmp_path: Path) -> None:
    plan = json.loads(AGG.read_text())
    del plan["plans"][2]["checkpoint"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = invoke(str(path), "--rank", "3")
    assert result.exit_code == 2 and "pre-quantized checkpoint" in result.output and "--checkpoint REPO" in result.output
    ok = invoke(str(path), "--rank", "3", "--format", "cmd", "--checkpoint", "someone/llama-70b-awq")
    assert ok.exit_code == 0 and "exec vllm serve someone/llama-70b-awq" in ok.output
    assert "no plan with rank 9" in invoke(str(AGG), "--rank", "9").output
    assert "unknown deploy format 'docker'" in invoke(str(AGG), "--format", "docker").output
    missing = invoke(str(tmp_path / "nope.json"))
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_normalise_formats() -> None:
    assert normalise_formats("all") == ("cmd", "k8s", "helm")
    assert normalise_formats("helm,cmd") == ("cmd", "helm")
    assert normalise_formats(["k8s"]) == ("k8s",)
    with pytest.raises(DeployError):
        normalise_formats("")


# ---------------------------------------------------------------- atomic writes


def test_atomic_write_replaces_in_one_step_and_fsyncs_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "k8s.yaml"
    target.write_text("old")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(writer.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(writer.os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    writer.atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert calls.index("fsync") < calls.index("replace")
    assert [p.name for p in tmp_path.iterdir()] == ["k8s.yaml"]


def test_crash_before_rename_keeps_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "k8s.yaml"
    target.write_text("old complete file")

    def crash(*_a: Any) -> None:
        raise KeyboardInterrupt  # e.g. Ctrl-C between write and rename

    monkeypatch.setattr(writer.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        writer.atomic_write_text(target, "new " * 100_000)
    assert target.read_text() == "old complete file"
    assert [p.name for p in tmp_path.iterdir()] == ["k8s.yaml"]


def test_crash_while_writing_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "vllm-serve.sh"
    target.write_text("old")
    monkeypatch.setattr(writer.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        writer.atomic_write_text(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["vllm-serve.sh"]


def test_write_deploy_files_returns_paths(tmp_path: Path) -> None:
    paths = write_deploy_files(json.loads(AGG.read_text()), tmp_path / "a" / "b", formats="helm")
    assert paths == [tmp_path / "a" / "b" / "helm-values.yaml"] and paths[0].read_text().startswith("# Generated")
