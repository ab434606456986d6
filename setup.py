"""Build step: copy the top-level data folders (catalogs/, policies/) whole into the package.

The folders stay at the top of the repository; ``build_py`` copies every file under them (no list of names,
so files other changes add are shipped too) to ``recommender/_shipped/<folder>/`` in the build, so wheels and
``pip install .`` carry them. ``recommender.shipped.shipped_dir`` finds the installed copy through
``importlib.resources`` and falls back to the source checkout. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_FOLDERS = ("catalogs", "policies")  # = recommender.shipped.SHIPPED_FOLDERS (a test holds them equal)


class BuildWithData(build_py):
    """``build_py`` that also copies the shipped data folders into ``<build_lib>/recommender/_shipped/``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the source checkout's folders directly
            return
        target = Path(self.build_lib) / "recommender" / "_shipped"
        for name in SHIPPED_FOLDERS:
            src = ROOT / name
            if not src.is_dir():
                raise SystemExit(f"setup.py: {src} is missing; the package cannot be built without it")
            dst = target / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


setup(cmdclass={"build_py": BuildWithData})
