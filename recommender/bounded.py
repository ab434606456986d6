"""Bounded reads: every file and network read of user input goes through here.

* ``read_file_bytes`` / ``read_file_text``: refuse what is not a regular file (``/dev/zero``, a FIFO, a
  directory) before opening it, and stop at ``max_read_bytes()`` bytes; so a hostile path cannot make us
  read forever or fill memory.
* ``fetch_url_text``: an HTTP(S) GET with one overall deadline (connect + headers + body, not per read, so a
  server sending one byte per second still ends in time) and the same size limit.
* ``load_json_text``: ``json.loads`` that turns nesting too deep for the parser and numbers that are not
  finite (``NaN``, ``Infinity``, ``1e999``) into ``ValueError`` instead of ``RecursionError`` / ``inf``.

The limit is ``RECOMMENDER_MAX_READ_BYTES`` (bytes, or a size such as ``512MB``; default 256 MiB). Errors
are :class:`InputTooLargeError` / :class:`NotAFileError` / :class:`ReadDeadlineError` (``ConfigError``, one
line naming the file or URL, the limit and how to raise it).
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping

from recommender.errors import ConfigError

MAX_READ_ENV = "RECOMMENDER_MAX_READ_BYTES"
DEFAULT_MAX_READ_BYTES = 256 * 1024**2
CHUNK_BYTES = 1 << 16


class InputTooLargeError(ConfigError):
    """A file or response exceeded the read limit."""


class NotAFileError(ConfigError):
    """A path that should be a regular file is a device, FIFO, socket or directory."""


class ReadDeadlineError(ConfigError):
    """A network read did not finish within its overall deadline."""


def max_read_bytes() -> int:
    """The read limit in bytes: ``$RECOMMENDER_MAX_READ_BYTES`` (``123456`` or ``512MB``), default 256 MiB."""
    raw = os.environ.get(MAX_READ_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_READ_BYTES
    from recommender.units import parse_bytes

    value = parse_bytes(raw, MAX_READ_ENV)
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"{MAX_READ_ENV}={raw!r}: give a positive size such as 536870912 or 512MB")
    return int(value)


def _too_large(what: str, limit: int) -> InputTooLargeError:
    return InputTooLargeError(f"{what} is larger than the {limit:,}-byte read limit; raise it with "
                              f"{MAX_READ_ENV}=<bytes> if the input is genuine")


def check_regular_file(path: str | Path, what: str) -> Path:
    """``path`` as a Path if it is a regular file (symlinks followed); else a one-line ConfigError."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(p)!r} does not exist") from None
    except PermissionError:
        raise ConfigError(f"{what} {str(p)!r} is not readable (permission denied)") from None
    except OSError as e:
        raise ConfigError(f"{what} {str(p)!r} cannot be read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise NotAFileError(f"{what} {str(p)!r} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise NotAFileError(f"{what} {str(p)!r} is not a regular file (a device, pipe or socket); give a file")
    return p


def read_file_bytes(path: str | Path, what: str = "input file", *, limit: int | None = None) -> bytes:
    """The bytes of a regular file, at most ``limit`` (default ``max_read_bytes()``)."""
    p = check_regular_file(path, what)
    cap = max_read_bytes() if limit is None else limit
    try:
        if os.stat(p).st_size > cap:
            raise _too_large(f"{what} {str(p)!r}", cap)
        with open(p, "rb") as f:
            data = f.read(cap + 1)  # the file may have grown since stat
    except PermissionError:
        raise ConfigError(f"{what} {str(p)!r} is not readable (permission denied)") from None
    except IsADirectoryError:
        raise NotAFileError(f"{what} {str(p)!r} is a directory; give a file") from None
    except OSError as e:
        raise ConfigError(f"{what} {str(p)!r} cannot be read ({e.strerror or e})") from None
    if len(data) > cap:
        raise _too_large(f"{what} {str(p)!r}", cap)
    return data


def read_file_text(path: str | Path, what: str = "input file", *, encoding: str = "utf-8-sig",
                   limit: int | None = None) -> str:
    """A regular text file, decoded (a UTF-8 BOM is dropped); undecodable bytes are a one-line ConfigError."""
    data = read_file_bytes(path, what, limit=limit)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {str(path)!r} is not a {encoding.removesuffix('-sig').upper()} text file") from None


def fetch_url_bytes(url: str, deadline_s: float, what: str = "URL", *, limit: int | None = None,
                    headers: Mapping[str, str] | None = None) -> bytes:
    """GET ``url``: the whole exchange ends within ``deadline_s`` and the body within the read limit.

    HTTP errors and unreachable hosts raise ``urllib.error.URLError`` / ``OSError`` as urllib does (callers
    word them); the deadline and the size limit raise :class:`ReadDeadlineError` / :class:`InputTooLargeError`.
    """
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ConfigError(f"{what} {url}: the read deadline must be a positive number of seconds, got {deadline_s!r}")
    cap = max_read_bytes() if limit is None else limit
    end = time.monotonic() + deadline_s

    def remaining() -> float:
        left = end - time.monotonic()
        if left <= 0:
            raise ReadDeadlineError(f"{what} {url} did not answer completely within {deadline_s:g} s; "
                                    f"check the server or raise the timeout")
        return left

    try:
        req = urllib.request.Request(url, headers=dict(headers or {}))  # e.g. Authorization (replan sources)
        resp = urllib.request.urlopen(req, timeout=remaining())  # noqa: S310 (user-given http(s) URL)
    except TimeoutError:
        raise ReadDeadlineError(f"{what} {url} did not answer within {deadline_s:g} s; check the server") from None
    with resp:
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > cap:
            raise _too_large(f"{what} {url}", cap)
        chunks: list[bytes] = []
        total = 0
        while True:
            sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
            if sock is not None:
                sock.settimeout(remaining())
            else:
                remaining()
            try:
                chunk = resp.read1(CHUNK_BYTES) if hasattr(resp, "read1") else resp.read(CHUNK_BYTES)
            except TimeoutError:
                raise ReadDeadlineError(f"{what} {url} did not answer completely within {deadline_s:g} s; "
                                        f"check the server or raise the timeout") from None
            if not chunk:
                break
            total += len(chunk)
            if total > cap:
                raise _too_large(f"{what} {url}", cap)
            chunks.append(chunk)
        remaining()
    return b"".join(chunks)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load_json_text(text: str, where: str = "JSON") -> Any:
    """``json.loads`` with finite numbers only; too-deep nesting and ``NaN`` / ``1e999`` are ``ValueError``.

    ``json.JSONDecodeError`` (a ``ValueError``) keeps its line number for callers that show it.
    """
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
