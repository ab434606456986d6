"""A scripted, hostile HTTP server for tests: 127.0.0.1 only, bounded in connections and time.

``HostileServer(script)`` listens on an ephemeral port of 127.0.0.1. For every connection it reads the request
head (at most 64 KiB, 5 s), records ``(path, headers)`` in ``requests`` and sends what ``script(path, port)``
returns: a list of ``(bytes, delay_s)`` steps (the delay comes before the bytes). At most ``max_connections``
connections are served (later ones are closed at once), and every connection ends after ``max_s`` seconds.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Sequence

Script = Callable[[str, int], Sequence[tuple[bytes, float]]]


class HostileServer:
    def __init__(self, script: Script, *, max_connections: int = 64, max_s: float = 10.0) -> None:
        self.script = script
        self.max_connections = max_connections
        self.max_s = max_s
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._served = 0
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._loop, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "HostileServer":
        self._accept.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accept.join(2)
        self._sock.close()
        for t in self._threads:
            t.join(2)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self._served += 1
            if self._served > self.max_connections:
                conn.close()
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.max_s
        try:
            conn.settimeout(5.0)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else ""
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            self.requests.append((path, headers))
            for data, delay in self.script(path, self.port):
                if delay:
                    time.sleep(min(delay, max(0.0, end - time.monotonic())))
                if self._stop.is_set() or time.monotonic() >= end:
                    return
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()


def answer(status: str = "200 OK", body: bytes = b"", headers: Sequence[str] = ()) -> list[tuple[bytes, float]]:
    """One plain response with Content-Length."""
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{h}\r\n" for h in headers) + f"Content-Length: {len(body)}\r\n\r\n"
    return [(head.encode("latin-1") + body, 0.0)]


def trickle(data: bytes, every_s: float) -> list[tuple[bytes, float]]:
    """``data`` one byte at a time, ``every_s`` apart."""
    return [(data[i:i + 1], every_s) for i in range(len(data))]
