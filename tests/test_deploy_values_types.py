"""`recommend deploy --values FILE`: every value of its YAML type, refused in one line naming the field (exit 2,
nothing written), and options that none of the chosen formats reads are named on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import recommender.cli  # noqa: F401  (registers every command on the app)
from recommender.cli.app import app

RAG = Path(__file__).resolve().parents[1] / "examples" / "plans" / "rag.plan.json"


def _deploy(tmp_path: Path, values: str, *flags: str) -> tuple[Any, Path]:
    f = tmp_path / "v.yaml"
    f.write_text(values, encoding="utf-8")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["deploy", str(RAG), "--format", "k8s", "--values", str(f), "--out", str(out),
                                   *flags])
    return res, out


@pytest.mark.parametrize(("values", "needles"), [
    ("namespace: [a, b]\n", ("namespace must be a string", "a list")),
    ("namespace: 123\n", ("namespace must be a string", "a number: 123", "'123'")),
    ("image: 5\n", ("image must be a string", "image reference")),
    ("router_image: {a: b}\n", ("router_image must be a string", "a mapping")),
    ("storage_class: true\n", ("storage_class must be a string", "a boolean: true")),
    ("gpu_label: [gfd]\n", ("gpu_label must be a string", "auto, gfd, gke, eks or none")),
    ("node_selector: {a: true}\n", ("node_selector a must be a string", "a boolean: true", "'true'")),
    ("node_selector: {zone: 3}\n", ("node_selector zone must be a string", "'3'")),
    ("node_selector: {1: a}\n", ("node_selector key 1 must be a string",)),
    ("node_selector: [a]\n", ("node_selector must be a mapping",)),
    ("node_selector: []\n", ("node_selector must be a mapping", "a list")),
    ("node_selector: {a: }\n", ("node_selector a must be a string", "got null")),
    ("tolerations: ''\n", ("tolerations must be a list", "a string")),
    ("tolerations: [{key: gpu, value: true}]\n", ("toleration value must be a string", "'true'")),
    ("tolerations: gpu\n", ("tolerations must be a list",)),
    ("node_selector: {a: 'b$(id)'}\n", ("node_selector a='b$(id)'", "label key/value")),
])
def test_a_value_of_the_wrong_type_is_one_line_naming_the_field(tmp_path: Path, values: str,
                                                                 needles: tuple[str, ...]) -> None:
    res, out = _deploy(tmp_path, values)
    assert res.exit_code == 2, res.output                               # a user mistake, not an internal error
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0], res.stderr
    assert f"values file {tmp_path / 'v.yaml'}:" in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists()                                             # nothing written


def test_quoted_strings_reach_the_manifest_as_written(tmp_path: Path) -> None:
    """The quoted spellings the refusals ask for work: 'true' stays the string true (not Python's True)."""
    res, out = _deploy(tmp_path, "namespace: '123'\nnode_selector: {a: 'true', zone: '3'}\n"
                                 "tolerations: [{key: gpu, operator: Equal, value: 'true', effect: NoSchedule}]\n")
    assert res.exit_code == 0, res.output
    text = (out / "k8s.yaml").read_text(encoding="utf-8")
    assert "True" not in text
    (dep,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    assert dep["metadata"]["namespace"] == "123"
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"a": "true", "zone": "3"}
    assert {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in pod["tolerations"]


def test_an_unreadable_values_file_says_file_once(tmp_path: Path) -> None:
    res, out = _deploy(tmp_path, "namespace: a\nnamespace: b\n")
    assert res.exit_code == 2 and "file file" not in res.stderr and "deploy values file" in res.stderr, res.stderr
    assert not out.exists()


# -- options no chosen format reads --------------------------------------------------------------------------------
def _run(*args: str) -> Any:
    return CliRunner().invoke(app, ["deploy", str(RAG), *args])


def test_schedule_with_cmd_alone_is_named_on_stderr(tmp_path: Path) -> None:
    res = _run("--format", "cmd", "--schedule", "*/7 * * * *", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    notes = res.stderr.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: --schedule not used:"), res.stderr
    assert "replan-cronjob" in notes[0] and notes[0].endswith("this run writes cmd")
    assert (tmp_path / "o" / "vllm-serve.sh").exists()                 # the asked-for output is still written


@pytest.mark.parametrize(("args", "flags"), [
    (("--format", "cmd", "--apply", "--traffic", "http://p:9090", "--replan-image", "r:1"),
     ["--traffic", "--apply", "--replan-image"]),
    (("--format", "all", "--history-secret", "h", "--selector", 'model_name="x"'), ["--selector", "--history-secret"]),
    (("--format", "cmd,bench", "--namespace", "llm", "--toleration", "gpu"), ["--namespace", "--toleration"]),
])
def test_each_unused_option_gets_one_note(args: tuple[str, ...], flags: list[str]) -> None:
    res = _run(*args)
    assert res.exit_code == 0, res.output
    noted = [ln.split()[1] for ln in res.stderr.splitlines() if ln.startswith("note: ")]
    assert noted == flags, res.stderr


@pytest.mark.parametrize("args", [
    ("--format", "cmd,replan-cronjob", "--schedule", "*/7 * * * *"),
    ("--format", "k8s", "--namespace", "llm"),
    ("--format", "cmd",),                                               # defaults are never "given"
])
def test_options_a_chosen_format_reads_get_no_note(args: tuple[str, ...]) -> None:
    res = _run(*args)
    assert res.exit_code == 0, res.output
    assert "note:" not in res.stderr, res.stderr
