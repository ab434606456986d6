"""Hostile HTTP servers on 127.0.0.1 against the one network reader (recommender.httpread via bounded).

Every case: a body or one one-line ConfigError, within the deadline (plus scheduling slack), and credentials
never sent to another origin.
"""

from __future__ import annotations

import time

import pytest
from hostile_http import HostileServer, answer, trickle

from recommender import bounded
from recommender.errors import ConfigError
from recommender.httpread import (
    MAX_HEADERS,
    HttpProtocolError,
    HttpStatusError,
    RedirectRefusedError,
    UnreachableError,
    parse_http_url,
    printable,
)

AUTH = {"Authorization": "Bearer s3cret"}


def get(url: str, deadline_s: float = 2.0, **kw: object) -> bytes:
    return bounded.fetch_url_bytes(url, deadline_s, "metrics endpoint", **kw)  # type: ignore[arg-type]


def one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and "\r" not in text and "s3cret" not in text
    return text


@pytest.mark.parametrize("what, data", [
    ("status line", b"HTTP/1.1 200 OK\r\n"),
    ("headers", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: aaaaaaaaaaaaaaaaaaaa\r\n"),
])
def test_a_server_trickling_its_head_hits_the_one_deadline(what: str, data: bytes) -> None:
    # one byte every 0.1 s: each recv succeeds, so only an overall deadline ends it (urllib's timeout is per read)
    with HostileServer(lambda path, port: trickle(data * 20, 0.1)) as srv:
        start = time.monotonic()
        with pytest.raises(bounded.ReadDeadlineError, match="within 1 s") as e:
            get(srv.base + "/metrics", 1.0)
        assert time.monotonic() - start < 2.0, what
        one_line(e.value)


@pytest.mark.parametrize("reply, match", [
    ([(b"HELLO WORLD\r\n\r\n", 0.0)], "status line 'HELLO WORLD'"),
    ([(b"HTTP/1.1 2000 OK\r\n\r\n", 0.0)], "status line"),
    ([(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n", 0.0)],
     f"more than {MAX_HEADERS} header lines"),
    ([(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 0.0)], "8,192-byte limit"),
    ([(b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", 0.0)], "is not 'Name: value'"),
    ([(b"HTTP/1.1 200 OK\r\nContent-Length: 12, 13\r\n\r\nabc", 0.0)], "Content-Length"),
    ([(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", 0.0)], "closed 97 bytes before"),
    ([(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0.0)], "not hexadecimal"),
    ([(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 0.0)], "not 'chunked'"),
    ([(b"HTTP/1.1 200 OK\r\n", 0.0)], "closed inside the header line"),
    ([(b"", 0.0)], "closed inside the status line"),
    ([(b"HTTP/1.1 200 OK\x1b]0;pwned\x07\r\n\r\n", 0.0)], "status line"),
])
def test_malformed_answers_are_one_line(reply: list[tuple[bytes, float]], match: str) -> None:
    with HostileServer(lambda path, port: reply) as srv:
        with pytest.raises(HttpProtocolError, match=match) as e:
            get(srv.base + "/metrics")
        assert "\x1b" not in one_line(e.value)


def test_well_formed_bodies_are_read_whole() -> None:
    chunked = [(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n", 0.0),
               (b"3;ext=1\r\nefg\r\n0\r\nX-Trailer: 1\r\n\r\n", 0.05)]
    until_close = [(b"HTTP/1.0 200 OK\r\n\r\nhello ", 0.0), (b"world", 0.05)]
    continued = [(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0.0)]
    for reply, body in ((chunked, b"abcdefg"), (until_close, b"hello world"), (continued, b"ok"),
                        (answer(body=b"x" * 200_000), b"x" * 200_000)):
        with HostileServer(lambda path, port, r=reply: r) as srv:  # type: ignore[misc]
            assert get(srv.base + "/metrics") == body


def test_bodies_stop_at_the_read_limit_without_allocating_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bounded.MAX_READ_ENV, "1000")
    big = [(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"a" * 1024 + b"\r\n", 0.0)]
    for reply in (answer(body=b"x" * 5000), big, [(b"HTTP/1.0 200 OK\r\n\r\n" + b"y" * 5000, 0.0)]):
        with HostileServer(lambda path, port, r=reply: r) as srv:  # type: ignore[misc]
            with pytest.raises(bounded.InputTooLargeError, match="1,000-byte read limit"):
                get(srv.base + "/metrics")


def test_a_redirect_to_another_origin_is_refused_and_the_token_stays_home() -> None:
    with HostileServer(lambda path, port: answer(body=b"stolen")) as other:
        target = f"http://127.0.0.1:{other.port}/metrics"
        with HostileServer(lambda path, port: answer("302 Found", headers=[f"Location: {target}"])) as srv:
            with pytest.raises(RedirectRefusedError, match="another origin") as e:
                get(srv.base + "/redirect-other", headers=AUTH)
            one_line(e.value)
            assert srv.requests[0][1]["authorization"] == "Bearer s3cret"
        assert other.requests == []  # never contacted, so never saw the header


@pytest.mark.parametrize("location", ["https://127.0.0.1:{port}/x", "http://localhost:{port}/x", "file:///etc/passwd",
                                      "http://user:pw@127.0.0.1:{port}/x", "http://127.0.0.1:{other}/x",
                                      "//evil.example/x"])
def test_redirects_that_change_scheme_host_or_port_are_refused(location: str) -> None:
    def script(path: str, port: int) -> list[tuple[bytes, float]]:
        return answer("307 Temporary Redirect", headers=[f"Location: {location.format(port=port, other=port + 1)}"])

    with HostileServer(script) as srv:
        with pytest.raises(RedirectRefusedError):
            get(srv.base + "/metrics", headers=AUTH)
        assert len(srv.requests) == 1


def test_a_same_origin_redirect_is_followed_with_the_credentials_and_loops_end() -> None:
    def script(path: str, port: int) -> list[tuple[bytes, float]]:
        if path == "/old":
            return answer("301 Moved Permanently", headers=["Location: /metrics"])
        if path == "/loop":
            return answer("302 Found", headers=["Location: /loop"])
        return answer(body=b"fine")

    with HostileServer(script) as srv:
        assert get(srv.base + "/old", headers=AUTH) == b"fine"
        assert [p for p, _ in srv.requests] == ["/old", "/metrics"]
        assert srv.requests[1][1]["authorization"] == "Bearer s3cret"
        with pytest.raises(RedirectRefusedError, match="more than 5 times"):
            get(srv.base + "/loop")


def test_status_errors_carry_the_code_and_never_the_credentials() -> None:
    with HostileServer(lambda path, port: answer("401 Unauthorized\x1b[31m")) as srv:
        with pytest.raises(ConfigError) as e:
            get(srv.base + "/metrics", headers=AUTH)
        # an ESC inside the reason makes the status line malformed; a plain 401 carries its code
    assert "\x1b" not in one_line(e.value)
    with HostileServer(lambda path, port: answer("401 Unauthorized")) as srv:
        with pytest.raises(HttpStatusError) as s:
            get(srv.base + "/metrics", headers=AUTH)
    assert s.value.code == 401 and "401 Unauthorized" in one_line(s.value)


def test_a_closed_port_is_unreachable_in_one_line() -> None:
    with HostileServer(lambda path, port: answer()) as srv:
        port = srv.port
    with pytest.raises(UnreachableError, match="unreachable"):
        get(f"http://127.0.0.1:{port}/metrics")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://x/y", "http://", "http://a b/", "http://x/\n",
                                 "http://u:p@host/", "http://host:99999/", "", "   ", "http://host:0/"])
def test_urls_are_validated_before_any_connection(url: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_http_url(url, "metrics endpoint")
    one_line(e.value)


def test_printable_escapes_terminal_controls() -> None:
    assert printable("a\x1b]0;x\x07b\x00\u202e") == "a\\x1b]0;x\\x07b\\x00\\u202e"
    assert printable("x" * 300, 10) == "x" * 10 + "..."


# ------------------------------------------------------------------------------------------ generated servers

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FAST = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
DEADLINE_S = 0.6


@st.composite
def hostile_replies(draw: st.DrawFn) -> tuple[list[tuple[bytes, float]], str]:
    """A reply script for the hostile server and its kind."""
    kind = draw(st.sampled_from(["status", "headers", "long-line", "trickle", "body", "chunked", "redirect", "random"]))
    status = draw(st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 200", b"HTTP/1.1 404 Not Found", b"HTTP/2 200",
                                   b"HTTP/1.1 200 OK\x1b[2J", b"ICY 200 OK", b"HTTP/1.1 99 X", b"", b"HTTP/1.1 500 E"]))
    if kind == "status":
        return [(status + b"\r\nContent-Length: 2\r\n\r\nok", 0.0)], kind
    if kind == "headers":
        n = draw(st.integers(0, 300))
        return [(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(n)) + b"Content-Length: 2\r\n\r\nok",
                 0.0)], kind
    if kind == "long-line":
        size = draw(st.sampled_from([100, 8000, 8300, 70_000]))
        return [(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * size + b"\r\nContent-Length: 2\r\n\r\nok", 0.0)], kind
    if kind == "trickle":
        data = b"HTTP/1.1 200 OK\r\nX-A: b\r\nContent-Length: 2\r\n\r\nok"
        every = draw(st.sampled_from([0.0, 0.01, 0.05]))
        return [(data[i:i + 1], every) for i in range(len(data))], kind
    if kind == "body":
        length = draw(st.sampled_from([b"5", b"-1", b"99999999999999999999", b"x", b"2, 3", b"2"]))
        return [(b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\n\r\nok", 0.0)], kind
    if kind == "chunked":
        body = draw(st.sampled_from([b"2\r\nok\r\n0\r\n\r\n", b"zz\r\n", b"2\r\nokk\r\n0\r\n\r\n", b"ffffffffffffffffff\r\n",
                                     b"2;x=y\r\nok\r\n0\r\nT: 1\r\n\r\n", b"2\r\nok"]))
        return [(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, 0.0)], kind
    if kind == "redirect":
        loc = draw(st.sampled_from(["/ok", "http://127.0.0.1:{other}/x", "https://127.0.0.1:{port}/x", "file:///etc/passwd",
                                    "http://localhost:{port}/x", "", "/\r\nX: y", "//127.0.0.1:{other}/x"]))
        return [(f"HTTP/1.1 302 Found\r\nLocation: {loc}\r\nContent-Length: 0\r\n\r\n".encode(), 0.0)], kind
    return [(draw(st.binary(max_size=300)), 0.0)], kind


@pytest.mark.parametrize("n", [pytest.param(25, id="quick"), pytest.param(200, id="many", marks=pytest.mark.slow)])
def test_generated_hostile_servers(n: int) -> None:
    """Every generated answer: a body or one line within the deadline; the token never reaches the other server."""
    current: dict[str, list[tuple[bytes, float]]] = {"reply": []}

    def script(path: str, port: int) -> list[tuple[bytes, float]]:
        if path == "/ok":
            return answer(body=b"fine")
        return [(d.replace(b"{other}", str(other.port).encode()).replace(b"{port}", str(port).encode()), t)
                for d, t in current["reply"]]

    with HostileServer(lambda path, port: answer(body=b"stolen"), max_connections=10_000) as other, \
            HostileServer(script, max_connections=10_000) as srv:

        @settings(FAST, max_examples=n)
        @given(hostile_replies())
        def prop(case: tuple[list[tuple[bytes, float]], str]) -> None:
            current["reply"] = case[0]
            start = time.monotonic()
            try:
                body = get(srv.base + "/metrics", DEADLINE_S, headers=AUTH)
            except ConfigError as e:
                one_line(e)
                assert all(ch.isprintable() for ch in str(e))
            else:
                assert isinstance(body, bytes) and len(body) <= 100
            assert time.monotonic() - start < DEADLINE_S + 1.0
            assert other.requests == []

        prop()
