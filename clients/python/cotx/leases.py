"""Leased gtids for the one-request commit (docs/coordinator.md, "One request per
transaction: leased gtids"): a range of gtids leased from the daemon once
(`POST /v1/gtid-leases`), drawn here one per transaction by any thread, and the names a
branch is prepared under (PostgreSQL gid, MariaDB XID) made from the lease's answer
instead of a registration.

Under cotx.transaction; it talks to the daemon through the `_Http` it is given.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Drawn:
    """One gtid of a leased range and what its branches' names are made of."""
    gtid: str
    prefix: str          # the range's: dropped together when the daemon no longer knows it
    gid_prefix: str
    xa_format_id: int
    expires_at: float    # time.monotonic() when the range's lease runs out at the daemon

    def names(self, kind: str, branch_id: str) -> dict:
        """What a registration would answer for a branch (kind, gid or xid): the names the
        daemon's recovery recognises (`<gid_prefix>:<gtid>:<branch_id>`, XID (gtid,
        branch_id, format))."""
        if kind == "postgres":
            return {"kind": kind, "gid": f"{self.gid_prefix}:{self.gtid}:{branch_id}"}
        return {"kind": kind, "xid": {"gtrid": self.gtid, "bqual": branch_id, "format_id": self.xa_format_id}}


class GtidLeases:
    """The current range of one Coordinator, shared by its threads.

    A range is drawn from only during the first `use_fraction` of its lease: a
    transaction must be committed before the lease runs out (after it, recovery records
    abort for whatever it finds prepared under the range), so the last gtid drawn still has
    the rest of the lease to finish in. A range that is used up or past that point is
    replaced by a new lease (one request per `count` transactions)."""

    def __init__(self, http, count: int = 1000, ttl_ms: int | None = None, use_fraction: float = 0.5):
        if not 1 <= count <= 100_000:
            raise ValueError("lease_count must be between 1 and 100000")
        if not 0.0 < use_fraction < 1.0:
            raise ValueError("use_fraction must be between 0 and 1")
        self.http, self.count, self.ttl_ms, self.use_fraction = http, count, ttl_ms, use_fraction
        self._lock = threading.Lock()
        self._range: dict | None = None
        self._next = 0
        self._stop_at = 0.0
        self._expires_at = 0.0
        self.leased = 0  # ranges leased (for tests and the curious)

    def draw(self, traceparent: str | None = None) -> Drawn:
        """A gtid no other transaction has; leases a new range first when needed (the
        lease's refusals and transport errors propagate as a begin's do)."""
        with self._lock:
            r = self._range
            if r is None or self._next >= r["first"] + r["count"] or time.monotonic() >= self._stop_at:
                r = self._lease(traceparent)
            n = self._next
            self._next += 1
            return Drawn(r["prefix"] + format(n, "x"), r["prefix"], r["gid_prefix"], int(r["xa_format_id"]),
                         self._expires_at)

    def _lease(self, traceparent: str | None) -> dict:
        body: dict = {"count": self.count}
        if self.ttl_ms is not None:
            body["ttl_ms"] = self.ttl_ms
        start = time.monotonic()
        r = self.http.request("POST", "/v1/gtid-leases", body, traceparent=traceparent)
        # Measured from before the request: the daemon's clock started no earlier.
        ttl = float(r["expires_in_ms"]) / 1000.0
        self._range, self._next = r, int(r["first"])
        self._stop_at = start + ttl * self.use_fraction
        self._expires_at = start + ttl
        self.leased += 1
        return r

    def drop(self, prefix: str) -> None:
        """Forget the range `prefix` (the daemon may no longer know it: restarted, taken
        over, unreachable); the next draw leases anew."""
        with self._lock:
            if self._range is not None and self._range["prefix"] == prefix:
                self._range = None
