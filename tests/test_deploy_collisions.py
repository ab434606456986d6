"""The deploy writer never removes or replaces what it did not write (issue 30).

``write_file_set`` swaps a whole folder in, so everything in the old folder is deleted afterwards. Each case
below puts something the user owns where an output would go (a folder named ``k8s.yaml`` holding notes, a
symlink, a FIFO, a socket, a file no manifest records, a forged or special manifest); ``recommend deploy
--out`` must exit non-zero with one line, write nothing, and leave every pre-existing byte, link target and
file type as it was (checked by a full ``lstat`` walk of the folder and the files outside it). A file the
manifest records but the user edited since (its SHA-256 differs) is the user's too.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

import recommender.cli  # noqa: F401  (registers every command on the app)
from recommender.cli.app import app
from recommender.deploy import writer
from recommender.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "examples" / "plans" / "chat.plan.json"


def snapshot(root: Path) -> dict[str, Any]:
    """Every path under ``root`` (not following links): type, bytes, mode, link target."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(st.st_mode))
            else:
                out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
    return out


def deploy(out: Path) -> Any:
    return CliRunner().invoke(app, ["deploy", str(PLAN), "--format", "all", "--out", str(out)])


def one_line_error(res: Any) -> str:
    assert res.exit_code != 0, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


def earlier_set(out: Path) -> None:
    assert deploy(out).exit_code == 0


def _sock(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


# name -> (setup(out, outside), words the one-line error must contain)
CASES: dict[str, tuple[Callable[[Path, Path], None], tuple[str, ...]]] = {
    "folder named like an output, with a user's notes": (
        lambda o, x: ((o / "k8s.yaml").mkdir(parents=True), (o / "k8s.yaml" / "notes.txt").write_text("precious\n")),
        ("k8s.yaml (a directory)",)),
    "empty folder named like a script": (lambda o, x: (o / "vllm-serve.sh").mkdir(parents=True), ("vllm-serve.sh (a directory)",)),
    "symlink to a user's file": (lambda o, x: (o.mkdir(), (o / "k8s.yaml").symlink_to(x / "precious.txt")), ("k8s.yaml (a symlink)",)),
    "symlink to a user's folder": (lambda o, x: (o.mkdir(), (o / "helm-values.yaml").symlink_to(x / "userdir")),
                                   ("helm-values.yaml (a symlink)",)),
    "dangling symlink": (lambda o, x: (o.mkdir(), (o / "vllm-serve.sh").symlink_to(x / "nowhere")), ("vllm-serve.sh (a symlink)",)),
    "FIFO named like an output": (lambda o, x: (o.mkdir(), os.mkfifo(o / "helm-values.yaml")), ("helm-values.yaml (a FIFO)",)),
    "socket named like an output": (lambda o, x: (o.mkdir(), _sock(o / "k8s.yaml")), ("k8s.yaml (a socket)",)),
    "user's file named like an output, no manifest": (lambda o, x: (o.mkdir(), (o / "k8s.yaml").write_text("mine\n")),
                                                      ("k8s.yaml (a file no recommender manifest",)),
    "user's plan.json (no manifest)": (lambda o, x: (o.mkdir(), (o / "plan.json").write_text("{}\n")), ("plan.json",)),
    "earlier set whose k8s.yaml became a user folder": (
        lambda o, x: (earlier_set(o), (o / "k8s.yaml").unlink(), (o / "k8s.yaml").mkdir(),
                      (o / "k8s.yaml" / "notes.txt").write_text("precious\n")), ("k8s.yaml (a directory)",)),
    "earlier set whose script became a symlink": (
        lambda o, x: (earlier_set(o), (o / "vllm-serve.sh").unlink(), (o / "vllm-serve.sh").symlink_to(x / "precious.txt")),
        ("vllm-serve.sh (a symlink)",)),
    "earlier set whose k8s.yaml the user edited": (
        lambda o, x: (earlier_set(o), (o / "k8s.yaml").write_text((o / "k8s.yaml").read_text() + "# my change\n")),
        ("k8s.yaml (edited since recommender wrote it)",)),
    "earlier set plus a user's file": (lambda o, x: (earlier_set(o), (o / "notes.txt").write_text("mine\n")), ("notes.txt",)),
    "manifest is a symlink": (
        lambda o, x: (o.mkdir(), (x / "forged.json").write_text(json.dumps({"written_by": "recommender", "files": ["k8s.yaml"]})),
                      (o / writer.SET_MANIFEST).symlink_to(x / "forged.json"), (o / "k8s.yaml").write_text("mine\n")),
        ("a symlink named .recommender-files.json",)),
    "manifest is a folder": (lambda o, x: ((o / writer.SET_MANIFEST).mkdir(parents=True), (o / writer.SET_MANIFEST / "a").write_text("a")),
                             ("a directory named .recommender-files.json",)),
    "manifest not written by recommender": (
        lambda o, x: (o.mkdir(), (o / writer.SET_MANIFEST).write_text(json.dumps({"files": ["notes.txt"]})),
                      (o / "notes.txt").write_text("mine\n")), ("did not write",)),
    "manifest is not JSON": (lambda o, x: (o.mkdir(), (o / writer.SET_MANIFEST).write_text("my notes\n")), ("unreadable",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_collisions_are_refused_in_one_line_and_every_byte_stays(case: str, tmp_path: Path) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("precious outside\n")
    (outside / "userdir").mkdir()
    (outside / "userdir" / "keep.txt").write_text("keep\n")
    setup, words = CASES[case]
    setup(out, outside)
    before = snapshot(tmp_path)
    line = one_line_error(deploy(out))
    for w in words:
        assert w in line, line
    assert "nothing was written" in line
    assert snapshot(tmp_path) == before  # the folder, the link targets, and no temp folder left beside it


def test_a_fifo_manifest_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO to read it would wait forever for a writer; the writer looks before it reads (run in a
    thread so a regression fails the test instead of hanging it)."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / writer.SET_MANIFEST)
    before = snapshot(tmp_path)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(deploy(out)), daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the writer blocked on the FIFO manifest"
    assert "a FIFO named .recommender-files.json" in one_line_error(result[0])
    assert snapshot(tmp_path) == before


def test_own_sets_are_still_replaced(tmp_path: Path) -> None:
    """What the writer may replace: a missing folder, an empty one, and a set it wrote (manifest-recorded files)."""
    out = tmp_path / "out"
    assert deploy(out).exit_code == 0
    first = snapshot(out)
    res = CliRunner().invoke(app, ["deploy", str(PLAN), "--format", "cmd", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [writer.SET_MANIFEST, "vllm-serve.sh"]
    assert snapshot(out)["vllm-serve.sh"] == first["vllm-serve.sh"]
    (tmp_path / "empty").mkdir()
    assert deploy(tmp_path / "empty").exit_code == 0
    # a manifest from before the hashes (names only) still lets its own files be replaced
    manifest = json.loads((out / writer.SET_MANIFEST).read_text())
    assert set(manifest["sha256"]) == set(manifest["files"])
    (out / writer.SET_MANIFEST).write_text(json.dumps({k: v for k, v in manifest.items() if k != "sha256"}))
    assert deploy(out).exit_code == 0


def test_an_entry_arriving_after_the_check_puts_the_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swapped-out folder is checked again before it is deleted: a file that arrived between the first
    check and the swap makes the writer swap back and refuse."""
    out = tmp_path / "out"
    writer.write_file_set(out, {"a.txt": "old a\n"})
    real = writer._replaceable
    calls = []

    def late_arrival(folder: Path, named: Path | None = None) -> None:
        real(folder, named)
        calls.append(folder)
        if len(calls) == 1:
            (out / "late.txt").write_text("arrived late\n")

    monkeypatch.setattr(writer, "_replaceable", late_arrival)
    with pytest.raises(ConfigError, match="late.txt") as e:
        writer.write_file_set(out, {"a.txt": "new a\n"})
    assert str(e.value).startswith(f"output folder {out} holds late.txt")  # the user's path, not the temp one
    assert (out / "late.txt").read_text() == "arrived late\n" and (out / "a.txt").read_text() == "old a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the new set's temp folder is gone
