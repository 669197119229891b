"""The API facade: `Coordinator(url or urls, token)`, a handle on the coordinator daemons
of one deployment, with the plain API calls (begin, get, decision, list, health) and the
entry points of a global transaction (transaction, join, join_from, run).

The top of the client: it builds on cotx._http (the transport) and cotx.transaction.
"""
from __future__ import annotations

import threading
import time

from ._http import _Http, _q
from .errors import CotxError
from .leases import GtidLeases
from .propagation import HEADER as GTID_HEADER
from .propagation import gtid_from_headers, traceparent_from_headers
from .trace import TraceContext
from .transaction import Transaction


class Coordinator:
    """Handle on a coordinator daemon: `Coordinator("http://127.0.0.1:7420", token)`, or on
    several daemons of one deployment (`Coordinator([url1, url2, url3], token)`): requests go
    to the first, and to the others when it cannot be reached."""

    # Acknowledgements held for the next begin at most (then sent on their own).
    MAX_HELD_ACKS = 64

    def __init__(self, url: str | list[str], token: str | None = None, timeout: float = 10.0,
                 decision_timeout: float = 120.0, cafile: str | None = None, carry_acks: bool = False,
                 one_request: bool = False, lease_count: int = 1000, lease_ttl_ms: int | None = None):
        """carry_acks=True: a committed transaction's "finished" acknowledgement is not a
        request of its own but rides with the next begin (one request fewer per
        transaction). A process that stops beginning transactions should call
        flush_acks(); one that never does leaves the daemon to confirm those branches
        itself after its owner grace period (nothing is lost either way).

        one_request=True: a root transaction whose branches are all on engine-mode or
        plain-2PC resources is one request, its commit: its gtid is drawn from a range
        leased from the daemon (`lease_count` gtids per `POST /v1/gtid-leases`, for
        `lease_ttl_ms` or the daemon's `timeouts.transaction_ms`), its branches are
        prepared under names made from the lease and listed in the commit, which also
        carries the held acknowledgements (docs/coordinator.md, "One request per
        transaction: leased gtids"). Off by default because the daemon does not know such
        a transaction before its commit: its cross-database deadlock detector cannot see
        it (a deadlock between two of them is broken only by the databases' lock
        timeouts), and no other service can join it. A transaction that reads tx.gtid or
        tx.headers() before its first branch, decides in a participant, or touches a
        client-mode resource (the daemon refuses those here: their slot comes with a
        registration) takes the begin path as before."""
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("at least one coordinator url is needed")
        self.http = _Http(urls[0], token, timeout, cafile)
        self.http.alternates = urls[1:]
        self.decision_timeout = decision_timeout
        self.carry_acks = carry_acks
        self._acks: list[dict] = []
        self._acks_lock = threading.Lock()
        self.one_request = one_request
        self.leases = GtidLeases(self.http, lease_count, lease_ttl_ms) if one_request else None
        # Resource -> how the daemon enforces commitment ordering there ("engine",
        # "client", "none"; else unknown): the one-request path is for engine and none.
        self._modes: dict[str, str] = {}
        self._kinds: dict[str, str] = {}
        self._modes_read = 0.0
        self._modes_lock = threading.Lock()

    # --- acknowledgements ------------------------------------------------------------
    def acknowledge(self, gtid: str, outcome: str, branches: list[str], traceparent: str | None = None) -> None:
        """Branches finished on their owner's sessions: held for the next begin
        (carry_acks), else sent at once; nobody waits for the answer."""
        if not branches:
            return
        if self.carry_acks or self.one_request:
            with self._acks_lock:
                self._acks.append({"gtid": gtid, "outcome": outcome, "branches": list(branches)})
                full = len(self._acks) >= self.MAX_HELD_ACKS
            if full:
                self.flush_acks()
            return
        if len(branches) == 1:
            self.http.send_nowait("POST", f"/v1/transactions/{_q(gtid)}/branches/{_q(branches[0])}/finished",
                                  {"outcome": outcome}, traceparent=traceparent)
        else:
            self.http.send_nowait("POST", f"/v1/transactions/{_q(gtid)}/finished",
                                  {"outcome": outcome, "branches": list(branches)}, traceparent=traceparent)

    def leasable(self, resource: str) -> bool:
        """Whether a branch on `resource` may be on the one-request path: the daemon said
        its enforcement is engine or none (a registration's answer or GET /v1/resources,
        read again at most once a second while a resource is not known)."""
        if not self.one_request:
            return False
        mode = self._modes.get(resource)
        if mode is None:
            with self._modes_lock:
                if time.monotonic() - self._modes_read >= 1.0:
                    self._modes_read = time.monotonic()
                    try:
                        for r in self.http.request("GET", "/v1/resources")["resources"]:
                            self._modes[r["name"]] = (r.get("enforcement") or {}).get("mode", "engine")
                            self._kinds[r["name"]] = r["kind"]
                    except (CotxError, KeyError, TypeError):
                        pass  # an older daemon, or no answer now: the begin path
            mode = self._modes.get(resource)
        return mode in ("engine", "none")

    def mode_of(self, resource: str) -> str | None:
        return self._modes.get(resource)

    def kind_of(self, resource: str) -> str | None:
        return self._kinds.get(resource)

    def learn_mode(self, resource: str | None, mode: str | None) -> None:
        """A registration's word on how `resource` enforces; (None, None): a refusal said
        the modes changed, forget them all (read again when next needed)."""
        if resource is None:
            self._modes.clear()
        else:
            self._modes[resource] = mode

    def carried_acks(self, body: dict) -> dict:
        """`body` of a begin with the held acknowledgements added (they leave the queue)."""
        with self._acks_lock:
            if self._acks:
                body = {**body, "finished": self._acks}
                self._acks = []
        return body

    def flush_acks(self) -> None:
        """Sends every held acknowledgement on its own request (not waited for)."""
        with self._acks_lock:
            held, self._acks = self._acks, []
        for a in held:
            self.http.send_nowait("POST", f"/v1/transactions/{_q(a['gtid'])}/finished",
                                  {"outcome": a["outcome"], "branches": a["branches"]})

    # --- plain API calls -------------------------------------------------------------
    def begin(self, timeout_ms: int | None = None, traceparent: str | None = None) -> str:
        body = {"timeout_ms": timeout_ms} if timeout_ms is not None else {}
        return self.http.request("POST", "/v1/transactions", self.carried_acks(body), traceparent=traceparent)["gtid"]

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
                    traceparent: str | None = None, one_request: bool | None = None) -> "Transaction":
        """A new global transaction; this process is its root and decides it at exit.
        It is begun at the coordinator together with its first branch (one round trip),
        or when tx.gtid is first read. decide_in_participant=True: the last PostgreSQL
        branch is not prepared but commits in one phase with the global decision written
        inside it (pg_co's co.decide; its resource needs `decisions = true` at the
        coordinator): one store write and one round trip fewer.
        traceparent: the caller's W3C trace context; without it OpenTelemetry's current
        span if the API is installed, else a trace id of the transaction's own (cotx.trace).
        one_request: this transaction on the one-request path (None: as the Coordinator's
        one_request says; True needs the Coordinator's, which holds the leased range)."""
        leased = self.one_request if one_request is None else (one_request and self.one_request)
        return Transaction(self, None, root=True, timeout_ms=timeout_ms, decide_in_participant=decide_in_participant,
                           trace=TraceContext.resolve(traceparent), one_request=leased)

    def run(self, fn, retries: int = 5, **kw):
        """fn(tx) in a new global transaction, run again as the retry rules say
        (clients/retry-rules.json): a RetryableError up to `retries` more times with
        jittered exponential backoff, the daemon's "not now" answers at the begin after
        Retry-After within `max_wait`; returns fn's result (cotx.retry.run)."""
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
