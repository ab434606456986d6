"""A normal install carries the catalogs and policies (issue 27 item 1).

``catalogs/`` and ``policies/`` stay at the top of the repository; ``setup.py``'s build step copies them
whole into the package (``recommender/_shipped/``) and ``recommender.shipped.shipped_dir`` finds them through
``importlib.resources``. The slow test builds the wheel from a copy of the source (``pip wheel --no-deps``),
installs it into a fresh venv and, from an unrelated folder, runs ``recommend models`` and the main job on a
copy of examples/rag.yaml.

The venv reaches the already-installed dependencies through a ``.pth`` line naming the system
site-packages (what ``--system-site-packages`` does, minus running that folder's ``.pth`` files): the
development install of this repository there is an editable one whose import hook would otherwise shadow
the wheel under test.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from recommender import shipped

ROOT = Path(__file__).resolve().parent.parent
#: what a source distribution holds (MANIFEST.in): the package, the data folders, the build files
SOURCE = ("recommender", "catalogs", "policies", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def test_setup_copies_the_folders_the_package_reads() -> None:
    """setup.py cannot import the package it builds, so it names the folders itself: the two lists agree."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = [ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "SHIPPED_FOLDERS" for t in n.targets)]
    assert found == [shipped.SHIPPED_FOLDERS]
    manifest = (ROOT / "MANIFEST.in").read_text().split()
    for name in shipped.SHIPPED_FOLDERS:
        assert (ROOT / name).is_dir() and f"{name}" in manifest


def test_a_source_checkout_reads_its_own_folders() -> None:
    """Without an installed copy (this checkout, editable installs) the top-level folders are used."""
    for name in shipped.SHIPPED_FOLDERS:
        assert shipped.shipped_dir(name) == ROOT / name
    with pytest.raises(ValueError):
        shipped.shipped_dir("examples")


def _build_wheel(src: Path, dist: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(src), "-w", str(dist)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:  # no index for the isolated build environment: build with what is installed
        proc = subprocess.run(cmd + ["--no-build-isolation"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = dist.glob("recommender-*.whl")
    return wheel


@pytest.mark.slow  # builds a wheel and runs a search in a fresh venv: ~30-60 s
def test_wheel_in_a_fresh_venv_lists_the_catalog_and_plans_from_another_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCE:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    wheel = _build_wheel(src, tmp_path / "dist")
    shutil.rmtree(src)  # nothing of the source may be left to fall back on

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "system-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = ["install", "--no-deps", "--no-index", "--quiet", str(wheel)]
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), *install], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0 and "no such option" in proc.stderr:  # pip < 22.3 has no --python: give the venv a pip
        subprocess.run([str(py), "-m", "ensurepip", "--default-pip"], check=True, capture_output=True, timeout=600)
        proc = subprocess.run([str(py), "-m", "pip", *install], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(ROOT / "examples" / "rag.yaml", elsewhere / "rag.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "RECOMMENDER_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)

    where = run(str(py), "-c", "import recommender, recommender.shipped as s, recommender.cli.replan as r; "
                "print(recommender.__file__); print(s.shipped_dir('catalogs')); print(r.default_policy())")
    assert where.returncode == 0, where.stderr
    pkg, catalogs, policy = (Path(line) for line in where.stdout.split())
    assert pkg.is_relative_to(venv), pkg  # the wheel, not this checkout
    assert catalogs == pkg.parent / "_shipped" / "catalogs" and policy.is_file()
    # the whole folders travel: every file of the checkout's catalogs/ and policies/ is in the install
    for name in shipped.SHIPPED_FOLDERS:
        rel = [p.relative_to(ROOT / name) for p in (ROOT / name).rglob("*") if p.is_file()]
        want = sorted(str(r) for r in rel if "__pycache__" not in r.parts and r.suffix != ".pyc"
                      and not any(part.startswith(".") for part in r.parts))  # what setup.py leaves out
        got = sorted(str(p.relative_to(pkg.parent / "_shipped" / name)) for p in (pkg.parent / "_shipped" / name).rglob("*")
                     if p.is_file())
        assert got == want, name

    models = run(str(venv / "bin" / "recommend"), "models")
    assert models.returncode == 0, models.stderr
    for model in ("llama-3.1-8b", "llama-3.1-70b"):  # catalogs/models/llama-3.1-{8b,70b}.yaml
        assert model in models.stdout, models.stdout

    plan = run(str(venv / "bin" / "recommend"), "--workload", "rag.yaml", "--format", "json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    doc = json.loads(plan.stdout)
    assert doc["workload"]["model"] == "llama-3.1-70b" and doc["plans"][0]["rank"] == 1
