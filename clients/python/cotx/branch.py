"""One database's part of a global transaction (`tx.branch(conn, resource)`): its state
machine and its conversation with the coordinator about itself (registration, the
"failed" report, the "finished" acknowledgement).

    new → active → ready → prepared → finished | rolled_back | failed

(and left_to_coordinator, set by the Transaction when the owner's session could not finish
the branch: the daemon finishes it; left_to_database, when its session was lost during its
one-phase COMMIT: whether it committed only the database knows). In plain 2PC a branch that wrote nothing votes
read-only at "prepared" (prepare(vote=True)): committed in one phase there, with nothing
left to run at the decision.

Branches run on the application's own connections: psycopg 3 (PostgreSQL) or PyMySQL
(MariaDB). The owner keeps its session until the decision and finishes its branch itself
(a MariaDB read-only branch is lost if its session closes first); the coordinator
finishes branches whose owner is gone.

The SQL it runs is cotx.dialect's; the requests go through its Transaction
(`tx._request`, `tx._send_nowait`), so every one carries the transaction's trace context.
It imports neither cotx.transaction nor cotx.coordinator.
"""
from __future__ import annotations

from ._http import _q
from .dialect import DIALECTS, ISOLATION_LEVELS, SessionNotChecked, _already_finished, _kind_of, _retryable
from .errors import CoordinatorError, CotxError, PrepareRefused, RetryableError, TransactionAborted
from .retry_rules import ABORTED, daemon_action


class Branch:
    """One database's part of a global transaction, on the owner's connection. `tx` is its
    cotx.transaction.Transaction (not imported here: that module imports this one)."""

    def __init__(self, tx, conn, resource: str, branch_id: str,
                 isolation: str = "SERIALIZABLE", read_only: bool = False):
        if isolation not in ISOLATION_LEVELS:
            raise CotxError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, not {isolation!r}")
        self.tx, self.conn, self.resource, self.branch_id = tx, conn, resource, branch_id
        self.isolation = isolation
        self.kind = _kind_of(conn)
        self._sql = DIALECTS[self.kind]
        self.state = "new"          # new → active → ready → prepared → finished | rolled_back | failed
        self.gid = None             # PostgreSQL
        self.xid = None             # MariaDB (gtrid, bqual, format_id)
        # How the coordinator says commitment ordering is enforced at this resource:
        # "engine" (pg_co / mysql_co), "client" (the shims below, docs/client-mode.md) or
        # "none" (plain 2PC, configured so); and client mode's slot.
        self.enforcement = None
        self.shim_key = None
        self.shim_one_phase = False
        # Declared read-only by the application; `wrote_nothing` is what PREPARE found
        # (the commit lists such branches: the daemon skips its sync when all are).
        self.read_only = bool(read_only)
        self.wrote_nothing = False
        # Committed in one phase at its vote instead of prepared (plain 2PC's read-only
        # vote, prepare(vote=True)): nothing is left to run for it after the decision.
        self.voted_read_only = False
        # Its database session as registered (the one-request commit lists it).
        self.session = None

    @property
    def _engine_read_only(self) -> bool:
        """MariaDB in engine mode runs a read-only branch as a READ ONLY transaction (a
        write is refused there). Not in client mode, whose slot write must go through;
        not on PostgreSQL, where pg_co refuses to prepare READ ONLY transactions (SSI does
        not track them): their writes are looked for before PREPARE instead."""
        return self.read_only and self.kind == "mariadb" and self.enforcement != "client"

    @property
    def _engine_id(self):
        """What the engine knows the branch by: the gid or the xid."""
        return self.gid if self.kind == "postgres" else self.xid

    def __enter__(self) -> "Branch":
        reg = {"resource": self.resource, "branch_id": self.branch_id}
        session = self._sql.session(self.conn)
        if session is not None:
            reg["session"] = session
        self.session = session
        # The one-request path: the names come from the leased gtid, nothing is sent.
        r = self.tx._leased_names(self.resource, self.kind, self.branch_id)
        if r is None:
            r = self._register(reg)
        if r["kind"] != self.kind:
            raise CotxError(f"resource {self.resource!r} is {r['kind']} at the coordinator but the connection is {self.kind}")
        try:
            if self.kind == "postgres":
                self.gid = r["gid"]
            else:
                x = r["xid"]
                self.xid = (x["gtrid"], x["bqual"], x["format_id"])
            self.enforcement = r.get("enforcement", "engine")
            if self.enforcement == "client":
                # The shims protect SERIALIZABLE branches only (docs/client-mode.md).
                if self.isolation != "SERIALIZABLE":
                    raise CotxError(f"resource {self.resource!r} runs in client mode (no pg_co / mysql_co there): "
                                    f"its branches must be SERIALIZABLE, not {self.isolation}")
                self.shim_key = int(r["shim"]["key"])
                # Older daemons do not say: their client-mode branches are always prepared.
                self.shim_one_phase = bool(r["shim"].get("one_phase", False))
                if self.kind == "mariadb" and not self._sql.is_checked(self.conn):
                    self._sql.set_serializable_verified(self.conn)
            self._sql.begin(self.conn, self._engine_id, self.isolation, self._engine_read_only)
        except Exception as e:
            self._report_failed(f"begin failed: {e}", False)
            raise
        self.state = "active"
        self.tx._branches.append(self)
        return self

    def _register(self, reg: dict) -> dict:
        """The branch's registration (with the begin when the transaction has no gtid
        yet): the daemon's answer, its names and enforcement."""
        if self.kind == "mariadb":
            # Client mode: the server's start as this connection's check read it, so the
            # daemon need not look at the server for this registration (dialect.MariaDB).
            started = self._sql.checked_start(self.conn)
            if started is not None:
                reg["server_started"] = started
        if self.tx._gtid is None:
            body = {"branch": reg}
            if self.tx._timeout_ms is not None:
                body["timeout_ms"] = self.tx._timeout_ms
            begun = self.tx._request("POST", "/v1/transactions", self.tx.coord.carried_acks(body))
            self.tx._gtid = begun["gtid"]
            r = begun["branch"]
        else:
            try:
                r = self.tx._request("POST", f"/v1/transactions/{_q(self.tx.gtid)}/branches", reg)
            except CoordinatorError as e:
                if daemon_action("register", e.status, e.code) == ABORTED:
                    # Aborted meanwhile, or presumed aborted (the daemon restarted): the
                    # abort's own reason says whether running it again may work.
                    self.tx._rollback_local()
                    self.tx._raise_abort(f"{self.resource}: registration refused: {e}")
                raise
        if getattr(self.tx.coord, "one_request", False):
            # What the one-request path needs to know of the resource.
            self.tx.coord.learn_mode(self.resource, r.get("enforcement", "engine"))
        return r

    def __exit__(self, et, ev, tb):
        if et is None:
            self.state = "ready"
            return False
        self._rollback_unprepared()
        retry = _retryable(ev)
        ack = self._report_failed(f"{et.__name__}: {ev}", retry)
        # The daemon had aborted the transaction and cancelled our statement (a deadlock
        # across databases, a timeout): the error is that cancel; the daemon says whether
        # running the transaction again may work.
        retry = retry or bool(ack.get("retryable"))
        self.state = "failed"
        if retry:
            # A serialization failure, deadlock or lock timeout inside the branch: the same
            # exception class as a refused prepare, so one `except RetryableError` retries.
            raise RetryableError(self.tx.gtid, f"{self.resource}: {ev}") from ev
        return False

    def _report_failed(self, reason: str, retryable: bool) -> dict:
        """The daemon's answer ({} when it could not be told, or the transaction is on the
        one-request path before its commit: the daemon hears of it only there)."""
        if self.tx._drawn is not None and not self.tx._commit_answered:
            return {}
        try:
            return self.tx._request(
                "POST", f"/v1/transactions/{_q(self.tx.gtid)}/branches/{_q(self.branch_id)}/failed",
                {"reason": reason[:900], "retryable": bool(retryable)}) or {}
        except CotxError:
            return {}  # the coordinator aborts on timeout anyway (presumed abort)

    def session_alive(self) -> bool:
        """Whether the branch's session still answers (after a failed statement: refused by
        the engine, or lost with the connection)."""
        return self._sql.alive(self.conn)

    def _rollback_unprepared(self) -> None:
        try:
            self._sql.rollback_unprepared(self.conn, self._engine_id)
        except Exception:  # noqa: BLE001 - the session may be broken; the engine rolls back
            pass

    def prepare(self, vote: bool = False) -> None:
        """PREPARE TRANSACTION / XA END + XA PREPARE. A refusal rolls back and raises.
        In client mode the branch first writes its shim slot: the write PostgreSQL's SSI
        (against the daemon's prepared helper) or InnoDB's locking needs to refuse what
        would break commitment ordering.

        `vote`: the transaction commits in two phases through the daemon (not in one phase,
        not with the decision in a participant), so a branch of plain 2PC (enforcement
        "none") that wrote nothing votes read-only: it commits in one phase here instead of
        preparing, and stays listed as prepared and read-only in the commit. Plain 2PC
        promises atomicity only, and a branch that wrote nothing has the same data whether
        the decision commits or aborts; ending it now only releases its locks sooner. Not
        where commitment ordering is enforced: there its reads must stay protected until the
        last PREPARE (docs/coordinator.md, "The read-only vote in plain 2PC")."""
        step = "prepare"
        try:
            if self.read_only:
                # Before client mode's slot write, which is not the application's data.
                self.wrote_nothing = self._engine_read_only or self._sql.wrote_nothing(self.conn)
            if vote and self.wrote_nothing and self.enforcement == "none":
                step = "read-only commit"
                self._sql.commit_one_phase(self.conn, self._engine_id)
                self.voted_read_only = True
            else:
                if self.enforcement == "client":
                    self._sql.shim_touch(self.conn, self.shim_key)
                self._sql.prepare(self.conn, self._engine_id)
        except Exception as e:
            # A failed one-phase commit is a refused PREPARE: rolled back, the transaction
            # aborted (retryable as the refusal would be).
            self._refused(e, step)
        self.state = "prepared"

    def write_slot_for_one_phase(self) -> None:
        """Client mode, the transaction's only branch, before its one-phase commit is asked
        for: the slot write it would make before PREPARE (docs/client-mode.md, "One
        phase"). A refusal rolls back and raises, as at prepare()."""
        try:
            self._sql.shim_touch(self.conn, self.shim_key)
        except Exception as e:
            self._refused(e, "slot write")

    def _refused(self, e: Exception, step: str) -> None:
        """A refusal before the branch is prepared (its PREPARE, or the slot write before a
        one-phase commit): rolled back, reported to the daemon, raised as retryable or not."""
        self._rollback_unprepared()
        self.state = "failed"
        retry = _retryable(e) or isinstance(e, SessionNotChecked)
        self._report_failed(f"{step} refused: {e}", retry)
        if retry:
            raise PrepareRefused(self.tx.gtid, f"{self.resource}: {e}") from e
        raise TransactionAborted(self.tx.gtid, f"{self.resource}: {step} failed: {e}") from e

    def commit_one_phase(self) -> None:
        self._sql.commit_one_phase(self.conn, self._engine_id)

    def finish(self, outcome: str, ack: bool = True) -> None:
        """Gives a prepared branch the decided outcome on the owner's session (nothing to
        run for a branch that voted read-only: it wrote nothing and is finished already;
        only its acknowledgement, so that the daemon does not look for it)."""
        try:
            if not self.voted_read_only:
                self._sql.finish(self.conn, self._engine_id, outcome)
        except Exception as e:  # noqa: BLE001
            # Already finished by the coordinator (its owner grace period ran out).
            if _already_finished(e):
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
