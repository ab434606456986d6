"""Where the shipped data folders (``catalogs/``, ``policies/``) are, in a source checkout and in a wheel.

The folders stay at the top of the repository (they are data a reviewer reads beside the code). The build
copies them whole into the package as ``recommender/_shipped/<folder>/`` (``setup.py``'s ``build_py`` step;
every file under the folder, whatever other changes add, not a list of names), so a wheel, ``pip install .``
or ``pip install git+...`` carries them. At run time :func:`shipped_dir` looks, in order:

1. ``importlib.resources.files("recommender") / "_shipped" / <folder>`` (an installed wheel);
2. ``<folder>`` beside the package (a source checkout, an editable install, ``python3 -m recommender``).

So the catalog is found from any working folder. ``$RECOMMENDER_CATALOGS`` still overrides the catalog
folder (``recommender.catalog.catalog_dir``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["SHIPPED_FOLDERS", "SHIPPED_PACKAGE_DIR", "shipped_dir"]

#: the top-level folders the build copies into the package
SHIPPED_FOLDERS = ("catalogs", "policies")
#: their folder inside the installed package
SHIPPED_PACKAGE_DIR = "_shipped"


def shipped_dir(name: str) -> Path:
    """The folder ``name`` (one of :data:`SHIPPED_FOLDERS`): the installed copy, else the source checkout's.

    Returns the source-checkout path even when it does not exist (the caller's "not found" names it)."""
    if name not in SHIPPED_FOLDERS:
        raise ValueError(f"not a shipped folder: {name!r}")
    try:
        installed = resources.files("recommender").joinpath(SHIPPED_PACKAGE_DIR).joinpath(name)
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - the package itself is always importable
        installed = None
    if isinstance(installed, Path) and installed.is_dir():
        return installed
    return Path(__file__).resolve().parent.parent / name
