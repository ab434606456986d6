"""Command-line interface. Each command lives in its own module and registers on ``app``.

Modules in this package are imported automatically, so a new command is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil

from recommender.cli.app import app

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod != "app":
        importlib.import_module(f"{__name__}.{_mod}")


def main() -> None:
    """Console-script entry point (``recommend``)."""
    app()
