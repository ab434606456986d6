"""Tables that fit the terminal: drop the least important columns until the widest line fits.

``terminal_width()`` is the width to fit: ``$COLUMNS`` when set, the terminal's width when stdout is a
terminal, otherwise None (no limit: files and pipes get every column, so scripts see a stable layout).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
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


# -- any command's text output, fitted after the fact ---------------------------------------------------------
#: ``  label              formula ... = value`` (the estimate walkthrough's line shape)
_FORMULA_LINE = re.compile(r"^(\s+)(\S(?:[^=]{0,30}?\S)?)\s{2,}(\S.*?)\s+= (\S.*)$")
_SIMPLE_RULE = re.compile(r"^\s*-+(?: +-+)*\s*$")
_PIPE_RULE = re.compile(r"^\|(?:[-:]+\|)+\s*$")


def fit_text(text: str, width: int | None) -> str:
    """Every line of ``text`` at most ``width`` columns (unchanged when width is None).

    - tabulate tables (``simple`` and ``github`` formats) that are too wide are rebuilt by :func:`fit_rows`
      (prose columns wrapped, then the rightmost columns dropped);
    - ``label  formula = value`` lines become ``label = value`` with the formula on the next line;
    - other prose wraps with a hanging indent under its second column (or four spaces in).
    """
    if width is None:
        return text
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        block = _table_block(lines, i)
        if block:
            rows = lines[i:block]
            out += rows if _widest("\n".join(rows)) <= width else _refit_table(rows, width).split("\n")
            i = block
            continue
        out += _fit_line(lines[i], width)
        i += 1
    return "\n".join(out)


def _table_block(lines: Sequence[str], i: int) -> int:
    """End index of the table that starts at line ``i`` (header line, rule, rows), else 0."""
    if i + 1 >= len(lines) or not lines[i].strip():
        return 0
    if lines[i].startswith("|") and _PIPE_RULE.match(lines[i + 1]):
        j = i + 2
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        return j
    if _SIMPLE_RULE.match(lines[i + 1]) and "-" in lines[i + 1]:
        rule = lines[i + 1]
        gaps = [c for c in range(len(rule.rstrip())) if rule[c] == " "]
        j = i + 2
        while j < len(lines) and lines[j].strip() and all(c >= len(lines[j]) or lines[j][c] == " " for c in gaps):
            j += 1
        return j
    return 0


def _cells(rows: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(headers, body) of a rendered simple or github table."""
    if rows[0].startswith("|"):
        split = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
        return split[0], split[2:]
    spans = [m.span() for m in re.finditer(r"-+", rows[1])]
    parsed = []
    for k, r in enumerate(rows):
        if k == 1:
            continue
        cells = [r[a:b + 1].strip() if n + 1 < len(spans) else r[a:].strip() for n, (a, b) in enumerate(spans)]
        parsed.append(cells)
    return parsed[0], parsed[1:]


def _refit_table(rows: Sequence[str], width: int) -> str:
    headers, body = _cells(rows)
    return fit_rows(headers, body, width=width, tablefmt="github" if rows[0].startswith("|") else "simple")[0]


def fit_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, width: int | None,
             drop_order: Sequence[str] = (), tablefmt: str = "simple",
             max_widths: Mapping[str, int] | None = None) -> tuple[str, list[str]]:
    """(table, dropped headers) at most ``width`` wide: prose columns (a cell over 24 characters with spaces)
    wrap to no less than 20 characters, the roomiest first; then columns go, ``drop_order`` first, then from
    the right. ``max_widths`` caps named columns whatever the width (their cells wrap)."""
    n = len(headers)
    body = [[str(c) for c in (list(r) + [""] * n)[:n]] for r in rows]
    initial = {list(headers).index(h): w for h, w in (max_widths or {}).items() if h in headers}
    caps = dict(initial)
    keep = list(range(n))
    queue = [list(headers).index(h) for h in drop_order if h in headers]
    dropped: list[str] = []
    while True:
        saved = _tabulate_mod.MIN_PADDING
        _tabulate_mod.MIN_PADDING = 0 if width is not None else saved  # no extra header padding when fitting
        try:
            text = tabulate([[r[k] for k in keep] for r in body], headers=[headers[k] for k in keep],
                            tablefmt=tablefmt, disable_numparse=True, maxcolwidths=[caps.get(k) for k in keep])
        finally:
            _tabulate_mod.MIN_PADDING = saved
        over = _widest(text) - width if width is not None else 0
        if over <= 0 or len(keep) == 1:
            return text, dropped
        room: dict[int, int] = {}
        for k in keep:
            cells = [r[k] for r in body]
            longest = caps.get(k, max((len(c) for c in cells), default=0))
            prose = any(len(c) > 24 and " " in c for c in cells)
            word = max((len(w) for c in cells for w in c.split()), default=0)
            room[k] = longest - max(20, word, len(headers[k])) if prose else 0
        k = max(keep, key=lambda c: room[c])
        if room[k] > 0:
            caps[k] = caps.get(k, max(len(r[k]) for r in body)) - min(room[k], over)
            continue
        gone = next((q for q in queue if q in keep), keep[-1])
        keep.remove(gone)
        dropped.append(headers[gone])
        caps = dict(initial)  # the columns left may unwrap again


def _fit_line(line: str, width: int) -> list[str]:
    import textwrap

    if len(line) <= width:
        return [line]
    m = _FORMULA_LINE.match(line)
    if m:
        indent, label, formula, value = m.groups()
        under = " " * (len(indent) + 4)
        column = line.index(formula, len(indent) + len(label)) - len(indent)
        label = label.ljust(column - 1) if column - 1 + len(indent) + len(value) + 3 <= width else label
        head = textwrap.wrap(f"{indent}{label} = {value}", width, subsequent_indent=under, break_on_hyphens=False)
        return head + textwrap.wrap(formula, width, initial_indent=under, subsequent_indent=under + "  ",
                                    break_on_hyphens=False)
    lead = len(line) - len(line.lstrip())
    gap = re.match(r"^(\s*\S+(?: \S+)*\s{2,})\S", line)
    hang = len(gap.group(1)) if gap and len(gap.group(1)) <= width // 2 else lead + 4
    return textwrap.wrap(line, width, subsequent_indent=" " * hang, break_on_hyphens=False,
                         drop_whitespace=True) or [line[:width]]
