"""Context-manager client of the cotx coordinator (see package docstring).

Branches run on the application's own connections: psycopg 3 (PostgreSQL) or PyMySQL
(MariaDB). The owner keeps its session until the decision and finishes its branch itself
(a MariaDB read-only branch is lost if its session closes first); the coordinator
finishes branches whose owner is gone.
"""
from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
import uuid

from .errors import (CoordinatorError, CoordinatorUnavailable, CotxError, OutcomeUnknown,
                     PrepareRefused, RetryableError, TransactionAborted)
from .propagation import HEADER as GTID_HEADER
from .propagation import gtid_from_headers, traceparent_from_headers
from .refusals import classify
from .trace import TraceContext

PG_NO_SUCH_PREPARED = "42704"
MY_XAER_NOTA = 1397


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
    def _read_response(f) -> tuple[int, bytes, bool]:
        status_line = f.readline()
        if not status_line:
            raise ConnectionError("connection closed by the coordinator")
        parts = status_line.split(None, 2)
        status = int(parts[1])
        length, chunked, close = None, False, False
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
        return status, body, close

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
                _followed: bool = False, traceparent: str | None = None) -> dict:
        """traceparent: the W3C trace context header to send (cotx.trace); the same value
        goes with a followed 421 or a retry at another daemon: one operation, one span parent."""
        data = json.dumps(body).encode() if body is not None else b""
        head = self._head(method, path, data, traceparent)
        self._drain()
        for attempt in range(2):
            fresh = True
            try:
                # Connecting inside the try: a refused or reset connection is the daemon
                # being unreachable (CoordinatorUnavailable), never a bare OSError.
                sock, f = self._conn(timeout or self.timeout)
                fresh = self._local.fresh
                sock.sendall(head + data)
                status, raw, close = self._read_response(f)
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
                        for url in self.alternates:
                            try:
                                return self._peer(url).request(method, path, body, timeout, _followed=True,
                                                                  traceparent=traceparent)
                            except CotxError:
                                continue
                    raise CoordinatorUnavailable(f"{method} {path}: {e}") from e
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
            raise CoordinatorError(status, err.get("code", "unknown"), err.get("message", str(payload)))
        return payload

    def _peer(self, url: str) -> "_Http":
        peers = self.__dict__.setdefault("_peers", {})
        if url not in peers:
            peers[url] = _Http(url, self.token, self.timeout, self.cafile)
        return peers[url]


class Coordinator:
    """Handle on a coordinator daemon: `Coordinator("http://127.0.0.1:7420", token)`, or on
    several daemons of one deployment (`Coordinator([url1, url2, url3], token)`): requests go
    to the first, and to the others when it cannot be reached."""

    def __init__(self, url: str | list[str], token: str | None = None, timeout: float = 10.0,
                 decision_timeout: float = 120.0, cafile: str | None = None):
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("at least one coordinator url is needed")
        self.http = _Http(urls[0], token, timeout, cafile)
        self.http.alternates = urls[1:]
        self.decision_timeout = decision_timeout

    # --- plain API calls -------------------------------------------------------------
    def begin(self, timeout_ms: int | None = None, traceparent: str | None = None) -> str:
        body = {"timeout_ms": timeout_ms} if timeout_ms is not None else {}
        return self.http.request("POST", "/v1/transactions", body, traceparent=traceparent)["gtid"]

    def get(self, gtid: str) -> dict:
        return self.http.request("GET", f"/v1/transactions/{_q(gtid)}")

    def decision(self, gtid: str, wait_ms: int = 0, traceparent: str | None = None) -> dict:
        return self.http.request("GET", f"/v1/transactions/{_q(gtid)}/decision?wait_ms={int(wait_ms)}",
                                 timeout=self.http.timeout + wait_ms / 1000.0, traceparent=traceparent)

    def list(self, state: str | None = None) -> list[dict]:
        path = "/v1/transactions" + (f"?state={_q(state)}" if state else "")
        return self.http.request("GET", path)["transactions"]

    def health(self) -> dict:
        return self.http.request("GET", "/healthz")

    # --- context managers ------------------------------------------------------------
    def transaction(self, timeout_ms: int | None = None, decide_in_participant: bool = False,
                    traceparent: str | None = None) -> "Transaction":
        """A new global transaction; this process is its root and decides it at exit.
        It is begun at the coordinator together with its first branch (one round trip),
        or when tx.gtid is first read. decide_in_participant=True: the last PostgreSQL
        branch is not prepared but commits in one phase with the global decision written
        inside it (pg_co's co.decide; its resource needs `decisions = true` at the
        coordinator): one store write and one round trip fewer.
        traceparent: the caller's W3C trace context; without it OpenTelemetry's current
        span if the API is installed, else a trace id of the transaction's own (cotx.trace)."""
        return Transaction(self, None, root=True, timeout_ms=timeout_ms, decide_in_participant=decide_in_participant,
                           trace=TraceContext.resolve(traceparent))

    def run(self, fn, retries: int = 5, **kw):
        """fn(tx) in a new global transaction, rerun on RetryableError up to `retries` more
        times with jittered exponential backoff; returns fn's result (cotx.retry.run)."""
        from .retry import run
        return run(self, fn, retries, **kw)

    def join(self, gtid: str, wait: bool = True, traceparent: str | None = None) -> "Transaction":
        """Take part in a global transaction begun elsewhere (gtid propagated as a string).
        At exit the branches are prepared and reported; with wait=True the exit then waits
        for the root's decision and finishes the branches, with wait=False a background
        thread does (call tx.wait() to collect its result). traceparent: as transaction()."""
        return Transaction(self, gtid, root=False, wait=wait, trace=TraceContext.resolve(traceparent))

    def join_from(self, headers, wait: bool = True, traceparent: str | None = None) -> "Transaction":
        """join() with the gtid of an incoming request's headers (`Cotx-Gtid`, put there by
        tx.headers() or another client's propagation); its `traceparent`, if any, is the
        trace context unless one is given or OpenTelemetry has a current span. Raises
        CotxError when the request carries no gtid."""
        gtid = gtid_from_headers(headers)
        if gtid is None:
            raise CotxError(f"the request carries no {GTID_HEADER} header: not called inside a global transaction")
        return Transaction(self, gtid, root=False, wait=wait,
                           trace=TraceContext.resolve(traceparent, traceparent_from_headers(headers)))


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _kind_of(conn) -> str:
    mod = type(conn).__module__
    if mod.startswith("psycopg"):
        return "postgres"
    if mod.startswith("pymysql"):
        return "mariadb"
    raise CotxError(f"unsupported connection type {type(conn)!r}: use psycopg 3 or PyMySQL")


# Spelled into SQL: only these exact strings are accepted.
ISOLATION_LEVELS = ("SERIALIZABLE", "REPEATABLE READ", "READ COMMITTED")


class Branch:
    """One database's part of a global transaction, on the owner's connection."""

    def __init__(self, tx: "Transaction", conn, resource: str, branch_id: str,
                 isolation: str = "SERIALIZABLE"):
        if isolation not in ISOLATION_LEVELS:
            raise CotxError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, not {isolation!r}")
        self.tx, self.conn, self.resource, self.branch_id = tx, conn, resource, branch_id
        self.isolation = isolation
        self.kind = _kind_of(conn)
        self.state = "new"          # new → active → ready → prepared → finished | rolled_back | failed
        self.gid = None             # PostgreSQL
        self.xid = None             # MariaDB (gtrid, bqual, format_id)

    # --- SQL on the owner's session ---------------------------------------------------
    def _pg(self, text: str, literal: str | None = None) -> None:
        self.conn.execute(text.format(_pg_literal(literal)) if literal is not None else text)

    def _my(self, text: str) -> None:
        g, b, f = self.xid
        xid = f"{self.conn.escape(g)},{self.conn.escape(b)},{int(f)}"
        with self.conn.cursor() as cur:
            cur.execute(text.replace("{xid}", xid))

    def __enter__(self) -> "Branch":
        reg = {"resource": self.resource, "branch_id": self.branch_id}
        if self.tx._gtid is None:
            body = {"branch": reg}
            if self.tx._timeout_ms is not None:
                body["timeout_ms"] = self.tx._timeout_ms
            begun = self.tx._request("POST", "/v1/transactions", body)
            self.tx._gtid = begun["gtid"]
            r = begun["branch"]
        else:
            r = self.tx._request("POST", f"/v1/transactions/{_q(self.tx.gtid)}/branches", reg)
        if r["kind"] != self.kind:
            raise CotxError(f"resource {self.resource!r} is {r['kind']} at the coordinator but the connection is {self.kind}")
        try:
            if self.kind == "postgres":
                self.gid = r["gid"]
                if not self.conn.autocommit:
                    # Our explicit BEGIN/PREPARE need a session psycopg does not wrap.
                    self.conn.autocommit = True
                self._pg(f"BEGIN ISOLATION LEVEL {self.isolation}")
            else:
                x = r["xid"]
                self.xid = (x["gtrid"], x["bqual"], x["format_id"])
                with self.conn.cursor() as cur:
                    cur.execute(f"SET TRANSACTION ISOLATION LEVEL {self.isolation}")
                self._my("XA START {xid}")
        except Exception as e:
            self._report_failed(f"begin failed: {e}", False)
            raise
        self.state = "active"
        self.tx._branches.append(self)
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            self.state = "ready"
            return False
        self._rollback_unprepared()
        retry = _retryable(ev)
        self._report_failed(f"{et.__name__}: {ev}", retry)
        self.state = "failed"
        if retry:
            # A serialization failure, deadlock or lock timeout inside the branch: the same
            # exception class as a refused prepare, so one `except RetryableError` retries.
            raise RetryableError(self.tx.gtid, f"{self.resource}: {ev}") from ev
        return False

    def _report_failed(self, reason: str, retryable: bool) -> None:
        try:
            self.tx._request(
                "POST", f"/v1/transactions/{_q(self.tx.gtid)}/branches/{_q(self.branch_id)}/failed",
                {"reason": reason[:900], "retryable": bool(retryable)})
        except CotxError:
            pass  # the coordinator aborts on timeout anyway (presumed abort)

    def _rollback_unprepared(self) -> None:
        try:
            if self.kind == "postgres":
                self._pg("ROLLBACK")
            else:
                try:
                    self._my("XA END {xid}")
                except Exception:  # noqa: BLE001 - already ended or failed
                    pass
                self._my("XA ROLLBACK {xid}")
        except Exception:  # noqa: BLE001 - the session may be broken; the engine rolls back
            pass

    def prepare(self) -> None:
        """PREPARE TRANSACTION / XA END + XA PREPARE. A refusal rolls back and raises."""
        try:
            if self.kind == "postgres":
                self._pg("PREPARE TRANSACTION {}", self.gid)
            else:
                self._my("XA END {xid}")
                self._my("XA PREPARE {xid}")
        except Exception as e:
            self._rollback_unprepared()
            self.state = "failed"
            retry = _retryable(e)
            self._report_failed(f"prepare refused: {e}", retry)
            if retry:
                raise PrepareRefused(self.tx.gtid, f"{self.resource}: {e}") from e
            raise TransactionAborted(self.tx.gtid, f"{self.resource}: prepare failed: {e}") from e
        self.state = "prepared"

    def commit_one_phase(self) -> None:
        if self.kind == "postgres":
            self._pg("COMMIT")
        else:
            self._my("XA END {xid}")
            self._my("XA COMMIT {xid} ONE PHASE")

    def finish(self, outcome: str, ack: bool = True) -> None:
        """Gives a prepared branch the decided outcome on the owner's session."""
        try:
            if self.kind == "postgres":
                self._pg(("COMMIT PREPARED {}" if outcome == "commit" else "ROLLBACK PREPARED {}"), self.gid)
            else:
                self._my("XA COMMIT {xid}" if outcome == "commit" else "XA ROLLBACK {xid}")
        except Exception as e:  # noqa: BLE001
            # Already finished by the coordinator (its owner grace period ran out).
            if _pg_state(e) == PG_NO_SUCH_PREPARED or _my_code(e) == MY_XAER_NOTA:
                pass
            else:
                raise
        self.state = "finished" if outcome == "commit" else "rolled_back"
        if ack:
            # Recovery confirms the branch if this acknowledgement is lost.
            self.tx._send_nowait(
                "POST", f"/v1/transactions/{_q(self.tx.gtid)}/branches/{_q(self.branch_id)}/finished",
                {"outcome": outcome})

    def rollback(self) -> None:
        if self.state == "prepared":
            try:
                self.finish("abort")
            except Exception:  # noqa: BLE001 - the coordinator's recovery rolls it back
                pass
        elif self.state in ("active", "ready"):
            self._rollback_unprepared()
            self.state = "rolled_back"


# PostgreSQL's longest gid (GIDSIZE 200 with its NUL): the daemon's naming::PG_GID_MAX.
GID_MAX = 199
_ID_CHARS = re.compile(r"^[A-Za-z0-9._:-]{1,%d}$" % GID_MAX)


def _pg_literal(s: str) -> str:
    """A gid as an SQL literal. The daemon only hands out gids of [A-Za-z0-9._:-]; checking
    again here means a misbehaving coordinator still cannot make us run its text as SQL."""
    if not _ID_CHARS.match(s):
        raise CotxError(f"refusing unexpected gid {s!r}")
    return "'" + s + "'"


def _pg_state(e) -> str | None:
    return getattr(e, "sqlstate", None)


def _my_code(e) -> int | None:
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _retryable(e) -> bool:
    return classify(e).retryable


class Transaction:
    def __init__(self, coord: Coordinator, gtid: str | None, root: bool, wait: bool = True,
                 timeout_ms: int | None = None, decide_in_participant: bool = False,
                 trace: TraceContext | None = None):
        self.coord, self._gtid, self.root, self.wait_at_exit = coord, gtid, root, wait
        # One trace per global transaction: every request below sends trace.header().
        self.trace = trace or TraceContext.resolve()
        self.decide_in_participant = decide_in_participant
        self._timeout_ms = timeout_ms
        self._branches: list[Branch] = []
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self.outcome: str | None = None
        # Branches of a committed transaction that could not be finished on their owner's
        # session (branch id, error): the coordinator finishes them.
        self.unfinished: list[tuple[str, str]] = []

    @property
    def gtid(self) -> str:
        """The global id, a plain string to hand to other services (they join with it)."""
        if self._gtid is None:
            self._gtid = self.coord.begin(self._timeout_ms, traceparent=self.trace.header())
        return self._gtid

    def headers(self) -> dict:
        """Headers for a call to another service inside this transaction: the gtid
        (`Cotx-Gtid`) and the trace context (`traceparent`); the other side joins with
        coord.join_from(its request's headers). Begins the transaction if needed."""
        return {GTID_HEADER: self.gtid, "traceparent": self.trace.header()}

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        return self.coord.http.request(method, path, body, traceparent=self.trace.header())

    def _send_nowait(self, method: str, path: str, body: dict | None = None) -> None:
        self.coord.http.send_nowait(method, path, body, traceparent=self.trace.header())

    def branch(self, conn, resource: str, branch_id: str | None = None,
               isolation: str = "SERIALIZABLE") -> Branch:
        """A branch on `conn`. Only SERIALIZABLE branches are protected by pg_co / mysql_co
        (which refuse the others' prepare by default); lower levels exist for comparisons
        with plain 2PC."""
        bid = branch_id or f"{resource[:24]}-{uuid.uuid4().hex[:16]}"
        return Branch(self, conn, resource, bid, isolation)

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            self.abort(f"{et.__name__}: {ev}")
            return False
        if self.root:
            self.commit()
        else:
            self.prepare_all()
            if self.wait_at_exit:
                self._finish(self._wait_decision())
            else:
                self._thread = threading.Thread(target=self._background, daemon=True)
                self._thread.start()
        return False

    # --- root -------------------------------------------------------------------------
    def commit(self) -> None:
        if self._gtid is None and not self._branches:
            self.outcome = "commit"  # never begun, nothing ran: nothing to decide
            return
        ready = [b for b in self._branches if b.state == "ready"]
        if len(ready) == 1 and len(self._branches) == 1 and self._one_phase(ready[0]):
            return
        decider = next((b for b in reversed(ready) if b.kind == "postgres"), None) if self.decide_in_participant else None
        # Our own branches' "prepared" reports ride along with the commit request.
        mine = self.prepare_all(report=False, skip=decider)
        if decider is not None:
            self._finish(self._decide_in(decider, mine))
            return
        self._finish(self._commit_call({"prepared": mine}))

    def _commit_call(self, body: dict) -> str:
        """POST …/commit, waiting for participants' prepared reports; the decision, or
        "in_participant" when the decision branch now decides."""
        mine = body.get("prepared", [])
        deadline = time.monotonic() + 5.0
        while True:
            try:
                return self._request("POST", f"/v1/transactions/{_q(self.gtid)}/commit", {**body, "prepared": mine})["decision"]
            except CoordinatorError as e:
                if e.code == "branch_not_prepared" and time.monotonic() < deadline:
                    time.sleep(0.01)  # a participant has not reported yet
                    continue
                if e.code == "already_prepared" and mine:
                    mine = []  # an earlier attempt got through
                    continue
                if e.status >= 500 or e.code in ("transaction_committed", "transaction_deciding"):
                    return self._wait_decision()
                return "abort"
            except CoordinatorUnavailable:
                return self._wait_decision()

    def _decide_in(self, d: Branch, mine: list[str]) -> str:
        """Every other branch is prepared: commit `d` in one phase with the global decision
        inside it. Returns the decision for the other branches."""
        decision = self._commit_call({"prepared": mine, "decide_in": d.branch_id})
        if decision != "in_participant":
            return decision  # refused (abort) or already decided: `d` is rolled back by _finish
        try:
            d.conn.execute("SELECT co.decide(%s)", (self.gtid,))
            d.conn.execute("COMMIT")
        except Exception as e:  # noqa: BLE001
            lost = bool(getattr(d.conn, "broken", False) or getattr(d.conn, "closed", False))
            if not lost:
                # The engine refused the decision (40001: CO rule, or already resolved as
                # abort) or another SQL error: nothing committed there.
                d._rollback_unprepared()
                d.state = "rolled_back"
                d._report_failed(f"decision commit refused: {e}", _retryable(e))
                self._rollback_local()
                if _retryable(e):
                    self.outcome = "abort"
                    raise RetryableError(self.gtid, f"{d.resource}: decision commit refused: {e}") from e
                self._raise_abort(f"{d.resource}: decision commit failed: {e}")
            # Connection lost during COMMIT: whether it committed is the database's to say;
            # the daemon reads it there (co.resolve) after the owners' grace period.
            d.state = "left_to_coordinator"
            return self._wait_decision()
        d.state = "finished"
        self._ack(d, "commit")
        return "commit"

    def _one_phase(self, b: Branch) -> bool:
        try:
            self._request("POST", f"/v1/transactions/{_q(self.gtid)}/commit", {"one_phase_branch": b.branch_id})
        except CoordinatorError as e:
            if e.code == "not_single_branch":
                return False  # other services joined: two-phase
            self.abort(f"one-phase commit refused: {e}")
            self._raise_abort()
        try:
            b.commit_one_phase()
        except Exception as e:
            b._rollback_unprepared()
            b.state = "rolled_back"
            self._ack(b, "abort")
            self.outcome = "abort"
            if _retryable(e):
                raise RetryableError(self.gtid, f"{b.resource}: commit refused: {e}") from e
            raise TransactionAborted(self.gtid, f"{b.resource}: commit failed: {e}") from e
        b.state = "finished"
        self._ack(b, "commit")
        self.outcome = "commit"
        return True

    def _ack(self, b: Branch, outcome: str) -> None:
        # Nobody waits for an acknowledgement: if it is lost, recovery confirms the branch.
        self._send_nowait("POST", f"/v1/transactions/{_q(self.gtid)}/branches/{_q(b.branch_id)}/finished",
                                    {"outcome": outcome})

    # --- both -------------------------------------------------------------------------
    def prepare_all(self, report: bool = True, skip: Branch | None = None) -> list[str]:
        """Prepares every ready local branch (but `skip`) and (report=True) reports it; on
        any failure rolls back all local branches (the coordinator aborts the global
        transaction) and raises. Returns the ids of the branches it prepared."""
        done = []
        for b in self._branches:
            if b.state != "ready" or b is skip:
                continue
            try:
                b.prepare()
            except TransactionAborted:
                self._rollback_local()
                raise
            done.append(b.branch_id)
            if not report:
                continue
            try:
                self._request("POST", f"/v1/transactions/{_q(self.gtid)}/branches/{_q(b.branch_id)}/prepared", {})
            except CotxError as e:
                # Refused (aborted meanwhile, e.g. timeout) or unreachable: never leave a
                # prepared branch behind for a transaction that may be aborted.
                self._rollback_local()
                self.abort(f"prepared report failed: {e}")
                self._raise_abort(str(e))
        return done

    def _rollback_local(self) -> None:
        for b in self._branches:
            b.rollback()

    def abort(self, reason: str = "aborted by client") -> None:
        if self._gtid is None:
            self._rollback_local()
            self.outcome = "abort"
            return
        try:
            self._request("POST", f"/v1/transactions/{_q(self.gtid)}/abort", {"reason": reason[:900]})
        except CotxError:
            pass
        self._rollback_local()
        for b in self._branches:
            if b.state == "rolled_back":
                self._ack(b, "abort")
        self.outcome = "abort"

    def _wait_decision(self) -> str:
        deadline = time.monotonic() + self.coord.decision_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OutcomeUnknown(f"no decision for {self.gtid} within {self.coord.decision_timeout}s; "
                                     "branches stay prepared until the coordinator finishes them")
            try:
                r = self.coord.decision(self.gtid, wait_ms=int(min(remaining, 10.0) * 1000),
                                       traceparent=self.trace.header())
                if r.get("decision"):
                    return r["decision"]
            except CoordinatorError as e:
                if e.code == "unknown_transaction":
                    return "abort"  # presumed abort: no record, no live transaction
                if e.code == "outcome_forgotten":
                    # Its record was purged after the retention: the outcome is not known
                    # any more (never "abort": it may have committed).
                    raise OutcomeUnknown(f"{self.gtid}: {e}") from e
                time.sleep(0.2)
            except CoordinatorUnavailable:
                time.sleep(0.2)  # coordinator restarting: its recovery keeps our branches safe

    def _finish(self, decision: str) -> None:
        self.outcome = decision
        if decision == "commit":
            done = []
            for b in self._branches:
                if b.state == "prepared":
                    try:
                        b.finish("commit", ack=False)
                    except Exception as e:  # noqa: BLE001
                        # The decision is commit and durable: a database error while
                        # finishing our branch (connection lost, server restarting) is not
                        # the application's failure. The daemon commits the branch after
                        # its owner grace period; the transaction stays committed.
                        b.state = "left_to_coordinator"
                        self.unfinished.append((b.branch_id, f"{type(e).__name__}: {e}"))
                        continue
                    done.append(b.branch_id)
            if done:
                # One acknowledgement for all of them; if it is lost, recovery confirms
                # the branches when it finds them no longer prepared.
                self._send_nowait("POST", f"/v1/transactions/{_q(self.gtid)}/finished",
                                            {"outcome": "commit", "branches": done})
            return
        self._rollback_local()
        self._raise_abort()

    def _raise_abort(self, reason: str | None = None) -> None:
        self.outcome = "abort"
        retry = False
        try:
            d = self.coord.decision(self.gtid, traceparent=self.trace.header())
            retry = bool(d.get("retryable"))
            reason = reason or d.get("abort_reason")
        except CotxError:
            pass
        if retry:
            raise RetryableError(self.gtid, reason)
        raise TransactionAborted(self.gtid, reason)

    def _background(self) -> None:
        try:
            self._finish(self._wait_decision())
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self._thread_error = e

    def wait(self, timeout: float | None = None) -> str | None:
        """For join(wait=False): waits for the background completion; re-raises its error."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread_error is not None:
                raise self._thread_error
        return self.outcome
