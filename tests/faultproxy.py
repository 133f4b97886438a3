"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 server, for tests of retries.

One request per connection (every answer says ``Connection: close``). A seeded RNG picks, for a
``rate`` fraction of the requests that ``match`` (by default: GETs of an object), one of ``modes``:

- ``reset``: the connection is reset (RST) before any answer;
- ``truncate``: the real status and headers (``Content-Length`` promising the whole body), half the
  body, then the connection is closed;
- ``error``: HTTP 500 with S3's XML error body (``InternalError``);
- ``flip``: the real answer, complete, with one byte of the body flipped (a lie retries must not hide).

Requests with a body (PUTs, multipart parts) work too: an ``Expect: 100-continue`` is answered by the
proxy itself, so a fault can also hit a write (after the upstream applied it, for ``truncate``).

``per_request`` caps the faults injected into one request (the same path and ``Range``), so that a
transient fault stays transient: a client trying more times than that always gets through.

``counts`` records requests, matched requests and each fault injected; ``seen`` counts each matched
(path, Range) so a test can tell how often one range was asked for.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)
MODES = ("reset", "truncate", "error")


def object_get(method: str, path: str, query: str) -> bool:
    """A GET of an object (``/bucket/key``), not a listing or a bucket request."""
    bucket, _, key = path.lstrip("/").partition("/")
    return method == "GET" and bool(bucket) and bool(key) and "list-type" not in query


def blob_get(method: str, path: str, query: str) -> bool:
    """A GET of a blob (``.../blobs/sha256/<hex>``)."""
    return object_get(method, path, query) and "/blobs/sha256/" in path


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _closing(head: bytes) -> bytes:
    lines = [
        line for line in head.split(b"\r\n") if not line.lower().startswith((b"connection:", b"keep-alive:"))
    ]
    return b"\r\n".join([*lines, b"Connection: close"])


class FaultProxy:
    """Forwards to ``upstream`` (``http://127.0.0.1:PORT``), injecting faults; a context manager."""

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.3,
        modes: tuple[str, ...] = MODES,
        seed: int = 0,
        match: Callable[[str, str, str], bool] = object_get,
        per_request: int | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rate, self.modes, self.match, self.per_request = rate, modes, match, per_request
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.seen: Counter[tuple[str, str]] = Counter()
        self._faulted: Counter[tuple[str, str]] = Counter()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop accepting connections (shutdown wakes the blocked ``accept``; close alone does not)."""
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5)

    @property
    def faults(self) -> int:
        """Faults injected so far."""
        return sum(self.counts[m] for m in ("reset", "truncate", "error", "flip"))

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _decide(self, method: str, target: str, headers: list[bytes]) -> str | None:
        path, _, query = target.partition("?")
        with self._lock:
            self.counts["requests"] += 1
            if not self.match(method, path, query):
                return None
            self.counts["matched"] += 1
            rng = next(
                (h.split(b":", 1)[1].strip().decode() for h in headers if h.lower().startswith(b"range:")), ""
            )
            self.seen[(path, rng)] += 1
            if self._rng.random() >= self.rate:
                return None
            if self.per_request is not None and self._faulted[(path, rng)] >= self.per_request:
                return None
            self._faulted[(path, rng)] += 1
            mode = self._rng.choice(self.modes)
            self.counts[mode] += 1
            return mode

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                head, rest = _read_head(conn)
                lines = head.split(b"\r\n")
                method, target, _ = lines[0].decode("latin-1").split(" ", 2)
                length = next(
                    (int(h.split(b":", 1)[1]) for h in lines[1:] if h.lower().startswith(b"content-length:")),
                    0,
                )
                if any(h.lower().replace(b" ", b"") == b"expect:100-continue" for h in lines[1:]):
                    # the client sends the body only after "100 Continue" (botocore's PUTs): say it here,
                    # and forward the request without the expectation
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    lines = [h for h in lines if not h.lower().startswith(b"expect:")]
                    head = b"\r\n".join(lines)
                while len(rest) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    rest += chunk
                mode = self._decide(method, target, lines[1:])
                if mode == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if mode == "error":
                    conn.sendall(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n"
                        + f"Content-Length: {len(ERROR_BODY)}\r\nConnection: close\r\n\r\n".encode()
                        + ERROR_BODY
                    )
                    return
                answer = self._forward(_closing(head) + b"\r\n\r\n" + rest)
                ahead, _, body = answer.partition(b"\r\n\r\n")
                ahead = _closing(ahead) + b"\r\n\r\n"
                if mode == "truncate" and body:
                    conn.sendall(ahead + body[: len(body) // 2])
                    return
                if mode == "flip" and body:
                    flipped = bytearray(body)
                    flipped[len(body) // 2] ^= 0x01
                    body = bytes(flipped)
                conn.sendall(ahead + body)
            except OSError:
                return

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self._upstream) as up:
            up.sendall(request)
            chunks = []
            while chunk := up.recv(1 << 20):
                chunks.append(chunk)
        return b"".join(chunks)
