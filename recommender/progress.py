"""The one progress-bar module: a bar on stderr for work that lasts more than about two seconds.

    with progress.bar("search", total=trials, unit="trial") as bar:
        for ...:
            bar.update(1)

The bar (tqdm) appears only after ``DELAY_S`` seconds, only when stderr is a terminal, and never after
``configure(quiet=True)`` (the CLI's ``--quiet``). It writes to stderr only: stdout never changes. When it is
off, ``bar`` yields a no-op object with the same ``update`` / ``set_postfix_str`` / ``total`` interface.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DELAY_S = 2.0

_quiet = False


def configure(*, quiet: bool) -> None:
    """Turn bars off (``quiet=True``) or back on for this process."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    """Whether a bar may show: not quiet, and stderr is a terminal."""
    return not _quiet and bool(getattr(sys.stderr, "isatty", lambda: False)())


class _Silent:
    """What ``bar`` yields when bars are off."""

    total: float | None = None
    n: float = 0

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def refresh(self) -> None:
        pass


@contextmanager
def bar(description: str, *, total: float | None = None, unit: str = "it") -> Iterator[Any]:
    """A progress bar for one piece of work (``total`` units, or unknown); see the module docstring."""
    if not enabled():
        yield _Silent()
        return
    from tqdm import tqdm

    b = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, delay=DELAY_S, leave=False,
             dynamic_ncols=True, mininterval=0.2)
    try:
        yield b
    finally:
        b.close()


def optuna_callback(b: Any) -> Any:
    """An Optuna ``study.optimize`` callback that advances ``b`` by one per finished trial."""

    def callback(study: Any, trial: Any) -> None:
        b.update(1)

    return callback
