"""Every `$ recommend ...` line in the README and docs/ is a command line the CLI accepts (round-3 #27 item 9:
the reference pages are kept true by tests; the outputs shown are real runs, regenerated when they move).

Each line is parsed by the real command parser (click, under typer) without running it: option names, values
and subcommands must exist. Shell redirections and pipes end the command's words.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from recommender.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _command_lines() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\$ (?:[A-Z_]+=\S+ )*recommend(?: (.*))?$", line.strip())
            if m:
                out.append((page.name, m.group(1) or ""))
    return out


CASES = _command_lines()


def test_the_pages_show_commands() -> None:
    assert len(CASES) >= 10, CASES
    assert {p for p, _ in CASES} >= {"README.md", "usage.md"}


@pytest.mark.parametrize(("page", "line"), CASES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CASES)])
def test_every_documented_command_parses(page: str, line: str) -> None:
    words: list[str] = []
    for w in shlex.split(line.replace("\\", " "), comments=False):
        if w in (">", ">>", "|", "2>", "&&", ";", "2>&1") or w.startswith((">", "|")):
            break
        words.append(w)
    cmd: Any = typer.main.get_command(app)  # typer's own (vendored) click Group
    with cmd.make_context("recommend", list(words), resilient_parsing=False) as ctx:
        rest = list(getattr(ctx, "_protected_args", getattr(ctx, "protected_args", []))) + list(ctx.args)
        if rest:
            name, sub, args = cmd.resolve_command(ctx, rest)
            assert sub is not None, (page, line)
            sub.make_context(name or "", args, parent=ctx).close()
