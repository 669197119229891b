"""The HTTP transport to the coordinator daemons: one keep-alive connection per thread on a
raw socket, TLS, timeouts, failover to the deployment's other daemons, and following a
`421 wrong_node` to the daemon that owns the transaction. JSON in, JSON out; API errors
become CoordinatorError, an unreachable daemon CoordinatorUnavailable.

The lowest layer of the client: it imports nothing of the package but its errors.
"""
from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.parse

from .errors import CoordinatorError, CoordinatorUnavailable, CotxError
from .retry_rules import RETRY_REQUEST, daemon_action, phase_of


def _q(s: str) -> str:
    """One path segment of an API URL (a gtid, a branch id, a state)."""
    return urllib.parse.quote(s, safe="")


class _Http:
    """JSON over HTTP/1.1 with one keep-alive connection per thread.

    A deliberately small client on a raw socket: http.client spends ~0.2 ms per request
    on loopback (header parsing through the email package), this ~0.05 ms, and a global
    transaction makes several calls. It speaks only to our daemon (Content-Length bodies;
    chunked is understood for safety)."""

    def __init__(self, url: str, token: str | None, timeout: float, cafile: str | None = None):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"coordinator url must be http(s)://host:port, got {url!r}")
        self.host, self.port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
        # TLS: the daemon's certificate is checked against cafile (or the system's CAs).
        self.cafile = cafile
        self._tls = ssl.create_default_context(cafile=cafile) if u.scheme == "https" else None
        self.base = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._local = threading.local()
        self.alternates: list[str] = []
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._fixed = f"Host: {self.host}:{self.port}\r\n{auth}Content-Type: application/json\r\n".encode()

    def _conn(self, timeout: float):
        c = getattr(self._local, "conn", None)
        if c is None:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            c = (sock, sock.makefile("rb"))
            self._local.conn = c
            self._local.fresh = True
        else:
            self._local.fresh = False
        c[0].settimeout(timeout)
        return c

    def _head(self, method: str, path: str, data: bytes, traceparent: str | None) -> bytes:
        trace = f"traceparent: {traceparent}\r\n" if traceparent else ""
        return f"{method} {self.base}{path} HTTP/1.1\r\n".encode() + self._fixed + \
            f"{trace}Content-Length: {len(data)}\r\n\r\n".encode()

    def _on_alternates(self, method, path, body, timeout, traceparent) -> tuple[bool, dict | None]:
        """The same request to the deployment's other daemons, in order: (True, answer) from
        the first that answers it, (False, None) when none does."""
        for url in self.alternates:
            try:
                return True, self._peer(url).request(method, path, body, timeout, _followed=True,
                                                     traceparent=traceparent)
            except CotxError:
                continue
        return False, None

    def send_nowait(self, method: str, path: str, body: dict | None = None, traceparent: str | None = None) -> None:
        """Sends a request whose answer nobody waits for (acknowledgements): its response
        is read and dropped before the next request on this thread's connection."""
        data = json.dumps(body).encode() if body is not None else b""
        head = self._head(method, path, data, traceparent)
        self._drain()
        try:
            sock, _ = self._conn(self.timeout)
            sock.sendall(head + data)
            self._local.pending = getattr(self._local, "pending", 0) + 1
        except OSError:
            self.close()

    def _drain(self) -> None:
        n = getattr(self._local, "pending", 0)
        if not n:
            return
        self._local.pending = 0
        c = getattr(self._local, "conn", None)
        if c is None:
            return
        try:
            for _ in range(n):
                if self._read_response(c[1])[2]:
                    self.close()
                    return
        except (OSError, ValueError, IndexError):
            self.close()

    def close(self) -> None:
        self._local.pending = 0
        c = getattr(self._local, "conn", None)
        if c is not None:
            try:
                c[1].close()
                c[0].close()
            except OSError:
                pass
            self._local.conn = None

    @staticmethod
    def _read_response(f) -> tuple[int, bytes, bool, float | None]:
        status_line = f.readline()
        if not status_line:
            raise ConnectionError("connection closed by the coordinator")
        parts = status_line.split(None, 2)
        status = int(parts[1])
        length, chunked, close, retry_after = None, False, False, None
        while True:
            h = f.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v.strip())
            elif k == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
            elif k == b"connection" and b"close" in v.lower():
                close = True
            elif k == b"retry-after" and v.strip().isdigit():
                retry_after = float(v.strip())  # seconds; the daemon never sends an HTTP date
        if chunked:
            body = b""
            while True:
                n = int(f.readline().split(b";")[0].strip(), 16)
                if n == 0:
                    f.readline()
                    break
                body += f.read(n)
                f.readline()
        elif length is not None:
            body = f.read(length)
        else:
            body = f.read()
            close = True
        return status, body, close, retry_after

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
                _followed: bool = False, traceparent: str | None = None) -> dict:
        """traceparent: the W3C trace context header to send (cotx.trace); the same value
        goes with a followed 421 or a retry at another daemon: one operation, one span parent."""
        data = json.dumps(body).encode() if body is not None else b""
        head = self._head(method, path, data, traceparent)
        phase = phase_of(method, path, body)
        self._drain()
        for attempt in range(2):
            fresh = True
            try:
                # Connecting inside the try: a refused or reset connection is the daemon
                # being unreachable (CoordinatorUnavailable), never a bare OSError.
                sock, f = self._conn(timeout or self.timeout)
                fresh = self._local.fresh
                sock.sendall(head + data)
                status, raw, close, retry_after = self._read_response(f)
                if close:
                    self.close()
                break
            except (OSError, ValueError, IndexError) as e:
                self.close()
                # Only a stale keep-alive connection is retried (the daemon closed it before
                # reading our request); a fresh one failing means the daemon is unreachable.
                if fresh or attempt == 1:
                    if not _followed:
                        # Other daemons of the deployment answer for any gtid (decisions
                        # from the shared store); only their success is taken: a refusal
                        # from a non-owner says nothing about the outcome.
                        found, answer = self._on_alternates(method, path, body, timeout, traceparent)
                        if found:
                            return answer
                    raise CoordinatorUnavailable(f"{method} {path}: {e}", phase) from e
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"raw": raw.decode(errors="replace")}
        if status >= 400:
            err = payload.get("error", {}) if isinstance(payload, dict) else {}
            if status == 421 and err.get("owner_url") and not _followed:
                # Another daemon owns this transaction: ask it (same token, same request).
                return self._peer(err["owner_url"]).request(method, path, body, timeout, _followed=True,
                                                            traceparent=traceparent)
            refused = CoordinatorError(status, err.get("code", "unknown"), err.get("message", str(payload)), phase,
                                       retry_after)
            if phase == "begin" and not _followed and daemon_action(phase, status, refused.code) == RETRY_REQUEST:
                # "Not now" from this daemon (its lease unconfirmed, overloaded, restarting a
                # resource): a begin may go to any daemon of the deployment; the caller waits
                # only if none of them takes it.
                found, answer = self._on_alternates(method, path, body, timeout, traceparent)
                if found:
                    return answer
            raise refused
        return payload

    def _peer(self, url: str) -> "_Http":
        peers = self.__dict__.setdefault("_peers", {})
        if url not in peers:
            peers[url] = _Http(url, self.token, self.timeout, self.cafile)
        return peers[url]
