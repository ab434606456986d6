"""The one HTTP(S) GET of the package: a small HTTP/1.1 client over a socket, with hard limits.

``http_get(url, deadline_s, what, limit=..., headers=...)`` returns the body of a 2xx answer. Everything a
server controls is bounded:

* one overall deadline ``deadline_s`` over connect, TLS handshake, the status line, the headers and the body
  (every ``recv`` waits at most the time left; a watchdog closes a handshake that trickles), so a server
  that sends one byte a second still ends at the deadline; the name is resolved in a thread bounded by the
  same deadline.
* the head: a status line ``HTTP/1.x NNN reason``, at most ``MAX_HEADERS`` (100) header lines of at most
  ``MAX_HEADER_LINE_BYTES`` (8 KiB) each and ``MAX_HEAD_BYTES`` (64 KiB) in all; anything else is one
  :class:`HttpProtocolError` line;
* the body: ``Content-Length``, chunked transfer coding or until close, never more than ``limit`` bytes
  (the package-wide read limit, :func:`recommender.bounded.max_read_bytes`), read in 64 KiB pieces
  (nothing is allocated up front);
* redirects (301, 302, 303, 307, 308, at most ``MAX_REDIRECTS``) are followed only to the same origin
  (scheme, host, port), so request headers (``Authorization: Bearer ...`` / ``Basic ...``) never reach
  another server; a redirect elsewhere is a :class:`RedirectRefusedError` naming the target.

Only ``http`` and ``https`` URLs without credentials in them (``user:pass@``), whitespace or control
characters are fetched. Errors are ``ConfigError`` subclasses, one line, naming the URL and the limit;
no message repeats a request header.
"""

from __future__ import annotations

import math
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Mapping

from recommender.errors import ConfigError

MAX_HEADERS = 100
MAX_HEADER_LINE_BYTES = 8 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_REDIRECTS = 5
CHUNK_BYTES = 1 << 16
REDIRECTS = (301, 302, 303, 307, 308)
_STATUS = re.compile(rb"^HTTP/1\.[01] ([1-5][0-9][0-9])(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?$")
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f]")


class HttpError(ConfigError):
    """A network read failed (base of the errors below)."""


class ReadDeadlineError(HttpError):
    """A network read did not finish within its overall deadline."""


class HttpProtocolError(HttpError):
    """The server's answer is not a well-formed HTTP/1.x response within the limits."""


class HttpStatusError(HttpError):
    """The server answered a non-2xx status (``code``, ``reason``)."""

    def __init__(self, message: str, code: int, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class RedirectRefusedError(HttpError):
    """A redirect to another origin (or too many redirects)."""


class UnreachableError(HttpError):
    """The host could not be resolved or connected to."""


class BodyTooLargeError(HttpError):
    """The body exceeded the read limit (``recommender.bounded`` re-raises it as ``InputTooLargeError``)."""


def printable(text: str, max_chars: int = 200) -> str:
    """``text`` with control characters (ESC, NUL, CR, LF, bidi overrides) shown as ``\\xNN`` / ``\\uNNNN``,
    cut to ``max_chars``: safe to put in a one-line message on a terminal."""
    out = []
    for ch in text[:max_chars]:
        o = ord(ch)
        if o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif 0x200B <= o <= 0x200F or 0x202A <= o <= 0x202E or 0x2066 <= o <= 0x2069 or o in (0x2028, 0x2029, 0xFEFF):
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out) + ("..." if len(text) > max_chars else "")


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def parse_http_url(url: str, what: str = "URL") -> tuple[Origin, str]:
    """(origin, request target) of an ``http(s)://`` URL, or a one-line ConfigError saying what is wrong."""
    shown = printable(url)
    if _BAD_URL_CHARS.search(url):
        raise ConfigError(f"{what} '{shown}' contains whitespace or control characters; give a plain http(s) URL")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"{what} '{shown}' is not a valid URL ({e})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ConfigError(f"{what} '{shown}': only http:// and https:// URLs are fetched")
    if not parts.hostname:
        raise ConfigError(f"{what} '{shown}' has no host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{what} '{shown}' carries credentials in the URL; pass them with --basic-auth-user / "
                          f"--basic-auth-password-file (or a bearer token) instead")
    if port == 0:
        raise ConfigError(f"{what} '{shown}': port 0 is not a port")
    origin = Origin(scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return origin, target


class _Conn:
    """One socket with the overall deadline applied to every receive."""

    def __init__(self, sock: socket.socket, end: float, fail: "_Fail") -> None:
        self.sock = sock
        self.end = end
        self.fail = fail
        self.buf = b""
        self.eof = False

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.fail.deadline()
        return left

    def fill(self) -> bool:
        """Receive more bytes into ``buf``; False at end of stream."""
        if self.eof:
            return False
        self.sock.settimeout(self.left())
        try:
            data = self.sock.recv(CHUNK_BYTES)
        except (TimeoutError, socket.timeout):
            raise self.fail.deadline() from None
        except ssl.SSLError as e:
            raise self.fail.protocol(f"TLS error while reading ({e.reason or e})") from None
        except OSError as e:
            if time.monotonic() >= self.end:
                raise self.fail.deadline() from None
            raise self.fail.protocol(f"connection failed while reading ({e.strerror or e})") from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def line(self, max_bytes: int, what: str) -> bytes:
        """One line without its CRLF (or LF), at most ``max_bytes``."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                if i > max_bytes:
                    break
                out, self.buf = self.buf[:i], self.buf[i + 1:]
                return out[:-1] if out.endswith(b"\r") else out
            if len(self.buf) > max_bytes:
                break
            if not self.fill():
                raise self.fail.protocol(f"the connection closed inside the {what}")
        raise self.fail.protocol(f"the {what} is longer than the {max_bytes:,}-byte limit")

    def take(self, n: int) -> bytes:
        """Exactly ``n`` bytes (``n`` already checked against the body limit)."""
        parts: list[bytes] = []
        need = n
        while need > 0:
            if not self.buf and not self.fill():
                raise self.fail.protocol(f"the connection closed {need:,} bytes before the announced end of the body")
            piece, self.buf = self.buf[:need], self.buf[need:]
            parts.append(piece)
            need -= len(piece)
        return b"".join(parts)


@dataclass(frozen=True)
class _Fail:
    """Builds the one-line errors for one request."""

    what: str
    url: str
    deadline_s: float

    def deadline(self) -> ReadDeadlineError:
        return ReadDeadlineError(f"{self.what} {printable(self.url)} did not answer completely within "
                                 f"{self.deadline_s:g} s (the deadline covers connect, headers and body); check "
                                 f"the server or raise the timeout")

    def protocol(self, why: str) -> HttpProtocolError:
        return HttpProtocolError(f"{self.what} {printable(self.url)} sent a malformed HTTP answer: {why}")


@dataclass(frozen=True)
class _Response:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


def _connect(origin: Origin, fail: _Fail, end: float) -> socket.socket:
    left = end - time.monotonic()
    if left <= 0:
        raise fail.deadline()
    try:
        sock = _connect_any(_resolve(origin, fail, end), fail, end)
    except (TimeoutError, socket.timeout):
        raise fail.deadline() from None
    except OSError as e:
        raise UnreachableError(f"{fail.what} {printable(fail.url)} is unreachable ({printable(str(e.strerror or e))}); "
                               f"check the URL and that the server is up") from None
    if origin.scheme != "https":
        return sock
    ctx = ssl.create_default_context()
    timer = threading.Timer(max(0.0, end - time.monotonic()), lambda: _shutdown(sock))
    timer.daemon = True
    timer.start()
    try:
        sock.settimeout(max(1e-3, end - time.monotonic()))
        return ctx.wrap_socket(sock, server_hostname=origin.host)
    except (TimeoutError, socket.timeout):
        sock.close()
        raise fail.deadline() from None
    except (ssl.SSLError, OSError) as e:
        sock.close()
        if time.monotonic() >= end:
            raise fail.deadline() from None
        raise UnreachableError(f"{fail.what} {printable(fail.url)}: TLS handshake failed "
                               f"({printable(str(getattr(e, 'reason', None) or e))})") from None
    finally:
        timer.cancel()


def _connect_any(infos: list[tuple[int, tuple[object, ...]]], fail: _Fail, end: float) -> socket.socket:
    """A TCP connection to the first of ``infos`` (family, address) that accepts, within the deadline."""
    last: OSError | None = None
    for family, address in infos:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            left = end - time.monotonic()
            if left <= 0:
                raise fail.deadline()
            sock.settimeout(left)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            if isinstance(e, (TimeoutError, socket.timeout)):
                raise
            last = e
    raise last or OSError("no address")


def _resolve(origin: Origin, fail: _Fail, end: float) -> list[tuple[int, tuple[object, ...]]]:
    """The addresses of ``origin.host``, looked up in a daemon thread so a slow resolver cannot outlast the
    deadline (``getaddrinfo`` itself takes no timeout)."""
    box: dict[str, object] = {}

    def look_up() -> None:
        try:
            box["infos"] = socket.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
        except OSError as e:
            box["error"] = e

    t = threading.Thread(target=look_up, daemon=True)
    t.start()
    t.join(max(0.0, end - time.monotonic()))
    if t.is_alive():
        raise fail.deadline()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]  # an OSError: worded as unreachable by the caller
    infos = box["infos"]
    assert isinstance(infos, list)
    return [(int(i[0]), tuple(i[4])) for i in infos]


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _request(origin: Origin, target: str, headers: Mapping[str, str], fail: _Fail, end: float,
             limit: int) -> _Response:
    host = origin.host if ":" not in origin.host else f"[{origin.host}]"
    default = 443 if origin.scheme == "https" else 80
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}" + ("" if origin.port == default else f":{origin.port}"),
             "User-Agent: recommender", "Accept: */*", "Accept-Encoding: identity", "Connection: close"]
    for k, v in headers.items():
        if not _TOKEN.match(k.encode("latin-1", "replace")) or any(c in v for c in "\r\n\x00"):
            raise ConfigError(f"{fail.what}: request header '{printable(k)}' has a name or value HTTP cannot carry")
        lines.append(f"{k}: {v}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    sock = _connect(origin, fail, end)
    try:
        sock.settimeout(max(1e-3, end - time.monotonic()))
        try:
            sock.sendall(raw)
        except (TimeoutError, socket.timeout):
            raise fail.deadline() from None
        except OSError as e:
            raise fail.protocol(f"the connection failed while sending ({e.strerror or e})") from None
        conn = _Conn(sock, end, fail)
        return _read_response(conn, fail, limit)
    finally:
        sock.close()


def _read_response(conn: _Conn, fail: _Fail, limit: int) -> _Response:
    while True:
        status_line = conn.line(MAX_HEADER_LINE_BYTES, "status line")
        m = _STATUS.match(status_line)
        if not m:
            raise fail.protocol(f"the status line '{printable(status_line.decode('latin-1'), 80)}' is not "
                                f"'HTTP/1.x NNN reason'")
        status = int(m.group(1))
        headers: dict[str, str] = {}
        head_bytes = len(status_line)
        count = 0
        while True:
            raw = conn.line(MAX_HEADER_LINE_BYTES, "header line")
            head_bytes += len(raw) + 2
            if head_bytes > MAX_HEAD_BYTES:
                raise fail.protocol(f"the headers are longer than the {MAX_HEAD_BYTES:,}-byte limit")
            if not raw:
                break
            count += 1
            if count > MAX_HEADERS:
                raise fail.protocol(f"more than {MAX_HEADERS} header lines")
            name, sep, value = raw.partition(b":")
            if not sep or not _TOKEN.match(name):
                raise fail.protocol(f"header line '{printable(raw.decode('latin-1'), 80)}' is not 'Name: value'")
            key = name.decode("ascii").lower()
            val = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers and key != "location" else val
        if 100 <= status < 200:  # 100 Continue and friends: a final answer follows
            continue
        break
    reason = (m.group(2) or b"").decode("latin-1")
    if status in REDIRECTS or not 200 <= status < 300:
        return _Response(status, reason, headers, b"")
    return _Response(status, reason, headers, _read_body(conn, headers, fail, limit))


def _read_body(conn: _Conn, headers: Mapping[str, str], fail: _Fail, limit: int) -> bytes:
    too_large = BodyTooLargeError(f"{fail.what} {printable(fail.url)} is larger than the {limit:,}-byte read limit")
    te = headers.get("transfer-encoding", "").lower()
    if te:
        if [t.strip() for t in te.split(",")] != ["chunked"]:
            raise fail.protocol(f"Transfer-Encoding '{printable(te, 60)}' is not 'chunked'")
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = conn.line(MAX_HEADER_LINE_BYTES, "chunk size line").split(b";", 1)[0].strip()
            if not size_line or len(size_line) > 16 or not re.fullmatch(rb"[0-9a-fA-F]+", size_line):
                raise fail.protocol(f"chunk size '{printable(size_line.decode('latin-1'), 40)}' is not hexadecimal")
            size = int(size_line, 16)
            if size == 0:
                for _ in range(MAX_HEADERS + 1):  # trailers, then the empty line
                    if not conn.line(MAX_HEADER_LINE_BYTES, "trailer"):
                        return b"".join(parts)
                raise fail.protocol(f"more than {MAX_HEADERS} trailer lines")
            total += size
            if total > limit:
                raise too_large
            parts.append(conn.take(size))
            if conn.line(2, "chunk end") != b"":
                raise fail.protocol("a chunk is longer than its announced size")
    length = headers.get("content-length")
    if length is not None:
        values = {v.strip() for v in length.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit() or len(next(iter(values))) > 19:
            raise fail.protocol(f"Content-Length '{printable(length, 40)}' is not one number")
        n = int(next(iter(values)))
        if n > limit:
            raise too_large
        return conn.take(n)
    out: list[bytes] = []
    total = len(conn.buf)
    if total > limit:
        raise too_large
    out.append(conn.buf)
    conn.buf = b""
    while conn.fill():
        total += len(conn.buf)
        if total > limit:
            raise too_large
        out.append(conn.buf)
        conn.buf = b""
    return b"".join(out)


def http_get(url: str, deadline_s: float, what: str = "URL", *, limit: int,
             headers: Mapping[str, str] | None = None) -> bytes:
    """The body of ``GET url`` (2xx), within ``deadline_s`` seconds overall and ``limit`` bytes."""
    if not (isinstance(deadline_s, (int, float)) and math.isfinite(deadline_s) and deadline_s > 0):
        raise ConfigError(f"{what} {printable(url)}: the read deadline must be a positive number of seconds, "
                          f"got {deadline_s!r}")
    end = time.monotonic() + float(deadline_s)
    origin, target = parse_http_url(url, what)
    first = origin
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        fail = _Fail(what, current, float(deadline_s))
        resp = _request(origin, target, dict(headers or {}), fail, end, limit)
        if resp.status not in REDIRECTS:
            if not 200 <= resp.status < 300:
                reason = printable(resp.reason, 60)
                raise HttpStatusError(f"{what} {printable(current)} answered HTTP {resp.status} {reason}".rstrip(),
                                      resp.status, reason)
            return resp.body
        location = resp.headers.get("location", "")
        if not location:
            raise fail.protocol(f"HTTP {resp.status} redirect without a Location header")
        nxt = urllib.parse.urljoin(current, location)
        try:
            n_origin, n_target = parse_http_url(nxt, f"{what} redirect target")
        except ConfigError as e:
            raise RedirectRefusedError(f"{what} {printable(url)} redirects to a URL that is not fetched: {e}") from None
        if n_origin != first:
            raise RedirectRefusedError(
                f"{what} {printable(url)} redirects to another origin ({n_origin}, not {first}); not followed, so "
                f"credentials stay with {first}; give the final URL if you trust it")
        origin, target, current = n_origin, n_target, nxt
    raise RedirectRefusedError(f"{what} {printable(url)} redirected more than {MAX_REDIRECTS} times; give the final URL")
