"""Command-line interface. Each command lives in its own module and registers on ``app``.

Modules in this package are imported automatically, so a new command is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil

from recommender.cli.app import app

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod not in ("app", "metavars"):
        importlib.import_module(f"{__name__}.{_mod}")

from recommender.cli.metavars import name_metavars, plain_argument_names  # noqa: E402  (after the commands)

name_metavars(app)
plain_argument_names()


def main() -> None:
    """Console-script entry point (``recommend``); ``--debug`` anywhere turns on tracebacks."""
    import os
    import sys

    from recommender.cli.app import DEBUG_ENV

    if "--debug" in sys.argv[1:]:
        sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if a != "--debug"]
        os.environ[DEBUG_ENV] = "1"
    app()
