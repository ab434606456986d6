"""POSIX shell text for the generated scripts: the one place that quotes what goes into them.

Every word and every user-facing message a generated script contains goes through :func:`quote`
(``shlex.quote``: one single-quoted word, a ``'`` written as ``'"'"'``), so an apostrophe in a message, a
``$`` in a model name or a space in a path is data to the shell, never syntax. Messages are printed with
``printf '%s\\n' WORD >&2`` (:func:`say`), never inside ``"${VAR:?message}"``, whose message word is parsed
by the shell's quoting rules (an apostrophe there left every P/D script unparsable: issue 30).

The output is plain POSIX sh (``dash -n`` and ``bash -n`` accept it; tests run both).
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

__all__ = ["ENV_NAME", "command_lines", "export", "quote", "require_env", "say"]

#: a portable environment variable name (POSIX: letters, digits, underscore; not starting with a digit)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote(word: str) -> str:
    """``word`` as one shell word that expands to exactly ``word`` (``shlex.quote``)."""
    return shlex.quote(str(word))


def _env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"bad environment variable name {name!r}")
    return name


def say(message: str) -> str:
    """A line that prints ``message`` (any text, one line) on stderr."""
    if "\n" in message or "\r" in message:
        raise ValueError("a script message is one line")
    return f"printf '%s\\n' {quote(message)} >&2"


def require_env(name: str, message: str, *, exit_code: int = 2) -> list[str]:
    """Lines that stop the script with ``message`` on stderr and ``exit_code`` when ``$name`` is unset or
    empty (``set -u`` safe: ``${name:-}``)."""
    n = _env_name(name)
    return [f'if [ -z "${{{n}:-}}" ]; then', f"  {say(message)}", f"  exit {int(exit_code)}", "fi"]


def export(name: str, value: str | None = None) -> str:
    """``export NAME`` (keeps the caller's value) or ``export NAME=value`` (value quoted)."""
    n = _env_name(name)
    return f"export {n}" if value is None else f"export {n}={quote(value)}"


def command_lines(groups: Sequence[Sequence[str]], *, prefix: str = "exec") -> str:
    """``prefix`` followed by every word of ``groups``, one group per line joined with `` \\``.

    ``prefix`` is shell syntax written by this package (``exec vllm serve``), not data; every word of the
    groups is quoted."""
    body = [" ".join([prefix, *(quote(a) for a in groups[0])]) if groups else prefix]
    body += ["  " + " ".join(quote(a) for a in g) for g in groups[1:]]
    return " \\\n".join(body)
