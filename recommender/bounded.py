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
from pathlib import Path
from typing import Any, Mapping

from recommender.errors import ConfigError
from recommender.httpread import BodyTooLargeError, ReadDeadlineError, http_get, printable

__all__ = ["InputTooLargeError", "NotAFileError", "ReadDeadlineError", "check_regular_file", "check_replaceable",
           "fetch_url_bytes", "load_json_text", "max_read_bytes", "read_file_bytes", "read_file_text"]

MAX_READ_ENV = "RECOMMENDER_MAX_READ_BYTES"
DEFAULT_MAX_READ_BYTES = 256 * 1024**2
CHUNK_BYTES = 1 << 16


class InputTooLargeError(ConfigError):
    """A file or response exceeded the read limit."""


class NotAFileError(ConfigError):
    """A path that should be a regular file is a device, FIFO, socket or directory."""


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
        with open(p, "rb") as f:  # in pieces: read(cap + 1) would allocate the whole limit up front
            pieces: list[bytes] = []
            total = 0
            while total <= cap:
                piece = f.read(min(CHUNK_BYTES, cap + 1 - total))
                if not piece:
                    break
                pieces.append(piece)
                total += len(piece)
            data = b"".join(pieces)  # the file may have grown since stat: total > cap is refused below
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
    """GET ``url`` (:func:`recommender.httpread.http_get`): the whole exchange ends within ``deadline_s``,
    the body within the read limit, redirects stay on the same origin.

    Every failure is a one-line ``ConfigError``: :class:`ReadDeadlineError`, :class:`InputTooLargeError`,
    ``httpread.HttpStatusError`` (with ``code``), ``HttpProtocolError``, ``RedirectRefusedError``,
    ``UnreachableError``.
    """
    cap = max_read_bytes() if limit is None else limit
    try:
        return http_get(url, deadline_s, what, limit=cap, headers=headers)
    except BodyTooLargeError:
        raise _too_large(f"{what} {printable(url)}", cap) from None


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


def check_replaceable(path: str | Path, what: str) -> Path:
    """``path`` if it is absent or a regular file (not followed through a symlink): what the atomic writer may
    replace. A device node (``/dev/null``), FIFO, socket, directory or symlink is a one-line NotAFileError, so
    a write never swaps a special file for a regular one (as root, ``--out /dev/null`` would replace it)."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise ConfigError(f"{what} '{printable(str(p))}' cannot be checked ({e.strerror or e})") from None
    if stat.S_ISREG(st.st_mode):
        return p
    kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode)
            else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device node")
    raise NotAFileError(f"{what} '{printable(str(p))}' is {kind}, not a regular file; it is not replaced: give a "
                        f"new file name or a regular file")


MAX_REQUESTS_ENV = "RECOMMENDER_MAX_REQUESTS"
#: requests one simulated run may hold (``simulate --requests``, ``estimate --bench --num-prompts``): each
#: costs memory in the simulator, so a typo such as 1000000000 is refused up front instead of filling RAM
DEFAULT_MAX_REQUESTS = 2_000_000


def max_requests() -> int:
    """The request-count limit: ``$RECOMMENDER_MAX_REQUESTS`` (a positive integer), default 2,000,000."""
    raw = os.environ.get(MAX_REQUESTS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_REQUESTS
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{MAX_REQUESTS_ENV}={raw!r}: give a positive whole number of requests")
    return int(raw)


def check_request_count(n: int, flag: str) -> int:
    """``n`` if 1 <= n <= :func:`max_requests`, else one line naming ``flag`` and the limit."""
    cap = max_requests()
    if not 1 <= n <= cap:
        raise ConfigError(f"{flag} {n}: give between 1 and {cap:,} requests (raise the limit with "
                          f"{MAX_REQUESTS_ENV}=<n> if you mean it)")
    return n


#: the main job's argument bounds, shared by the CLI's flags and the Python API: seeds NumPy and Optuna take,
#: plans the simulator verifies
MAX_SEED = 2**32 - 1
MAX_VERIFY = 1000


#: Linux's NAME_MAX and PATH_MAX (bytes): what a file system takes for one name and a whole path
MAX_FILE_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def _longest_name_bytes(path: str) -> int:
    """Bytes of the longest component of ``path`` (UTF-8)."""
    return max((len(part.encode("utf-8", "replace")) for part in path.replace("\\", "/").split("/")), default=0)


def check_storage(storage: str | None, flag: str = "--storage", *, label: str | None = None) -> None:
    """An Optuna / history storage: a URL, or a file that is absent or a regular file (a FIFO or device would
    hang or be clobbered by SQLite / the journal writer). Messages start with ``label`` (default ``flag storage``)."""
    if storage is None:
        return
    if not storage.strip() or not storage.isprintable():
        raise ConfigError(f"{label or f'{flag} {storage!r}'}: give a file name or a database URL (one printable line, "
                          "not blank)")
    if "://" in storage:
        path = storage.split(":///", 1)[1] if storage.startswith("sqlite:///") else None
    else:
        path = storage
    if path:
        too_long = _longest_name_bytes(path) > MAX_FILE_NAME_BYTES or len(path.encode("utf-8", "replace")) > MAX_PATH_BYTES
        if too_long:  # SQLite / the journal would fail deep in the search with "file name too long"
            raise ConfigError(f"{label or f'{flag} {storage[:60]}...'}: the file name is too long (at most "
                              f"{MAX_FILE_NAME_BYTES} bytes a name, {MAX_PATH_BYTES} a path); give a shorter one")
        try:
            special = Path(path).exists() and not Path(path).is_file()  # a link to a regular file is fine
        except OSError:  # a name the file system cannot hold: the storage reports it when it opens the file
            special = False
        if special:
            raise NotAFileError(f"{label or f'{flag} {storage}'}: is not a regular file (a folder, device, FIFO or "
                                "socket); give a database or journal file")
