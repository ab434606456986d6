"""Tables that fit the terminal: drop the least important columns until the widest line fits.

``terminal_width()`` is the width to fit: ``$COLUMNS`` when set, the terminal's width when stdout is a
terminal, otherwise None (no limit: files and pipes get every column, so scripts see a stable layout).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Sequence

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
    """(table text, dropped headers): columns in ``drop_order`` go first to last until every line <= width."""
    keep = list(range(len(headers)))
    dropped: list[str] = []
    queue = [h for h in drop_order if h in headers]
    while True:
        text = tabulate([[r[i] for i in keep] for r in rows], headers=[headers[i] for i in keep],
                        tablefmt="simple", disable_numparse=True)
        if width is None or max(map(len, text.splitlines()), default=0) <= width or not queue:
            return text, dropped
        h = queue.pop(0)
        keep.remove(list(headers).index(h))
        dropped.append(h)


def wrap_text(text: str, width: int | None) -> str:
    """Wrap each line of prose to ``width`` columns (unchanged when width is None)."""
    if width is None:
        return text
    import textwrap

    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) if line else "" for line in text.split("\n"))
