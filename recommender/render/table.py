"""Tables that fit the terminal: drop the least important columns until the widest line fits.

``terminal_width()`` is the width to fit: ``$COLUMNS`` when set, the terminal's width when stdout is a
terminal, otherwise None (no limit: files and pipes get every column, so scripts see a stable layout).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import tabulate as _tabulate_mod
from tabulate import tabulate


def terminal_width() -> int | None:
    """Columns to fit tables into, or None when output goes to a file or a pipe."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def fit_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, width: int | None,
              drop_order: Sequence[str] = ()) -> tuple[str, list[str]]:
    """(table text, dropped headers): columns in ``drop_order`` go first to last until every line <= width.

    A table that does not fit first loses tabulate's extra header padding (2 spaces per column), then columns.
    """
    keep = list(range(len(headers)))
    dropped: list[str] = []
    queue = [h for h in drop_order if h in headers]
    padding = _tabulate_mod.MIN_PADDING
    while True:
        text = _render(headers, rows, keep, padding)
        if width is not None and _widest(text) > width and padding:
            padding = 0
            text = _render(headers, rows, keep, padding)
        if width is None or _widest(text) <= width or not queue:
            return text, dropped
        h = queue.pop(0)
        keep.remove(list(headers).index(h))
        dropped.append(h)


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


def _render(headers: Sequence[str], rows: Sequence[Sequence[Any]], keep: list[int], padding: int) -> str:
    saved = _tabulate_mod.MIN_PADDING
    _tabulate_mod.MIN_PADDING = padding  # tabulate's only knob for header padding (module-level)
    try:
        return tabulate([[r[i] for i in keep] for r in rows], headers=[headers[i] for i in keep],
                        tablefmt="simple", disable_numparse=True)
    finally:
        _tabulate_mod.MIN_PADDING = saved


def wrap_text(text: str, width: int | None) -> str:
    """Wrap each line of prose to ``width`` columns (unchanged when width is None)."""
    if width is None:
        return text
    import textwrap

    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) if line else "" for line in text.split("\n"))
