"""A global transaction and its commit protocols.

- two-phase through the daemon (`commit` → `_commit_call`): every branch prepared (in
  plain 2PC a branch that wrote nothing votes read-only instead: Branch.prepare), the
  "prepared" reports riding on the commit request, the durable decision, then each branch
  finished on its owner's session (`_finish`) with one acknowledgement;
- one phase (`_one_phase`): a single branch and no other participant, no prepare, no record;
- decision in a participant (`_decide_in`, decide_in_participant=True): the last
  PostgreSQL branch commits in one phase with the decision written inside it (pg_co);
- a participant (join): prepare and report at exit, then wait for the root's decision;
- one request (`_commit_leased`, Coordinator(one_request=True)): the gtid drawn from a
  leased range (cotx.leases), nothing sent before the commit, which lists every branch
  (with decide_in_participant=True too: `_leased_decide_in`).

Branches are cotx.branch's; the HTTP goes through the Coordinator handle it is given
(`coord.http`, `coord.decision`), which this module does not import: cotx.coordinator
imports it, not the other way round.
"""
from __future__ import annotations

import threading
import time
import uuid

from ._http import _q
from .branch import Branch
from .dialect import Postgres, _retryable
from .errors import (BeginPathNeeded, CoordinatorError, CoordinatorUnavailable, CotxError, OutcomeUnknown,
                     RetryableError, TransactionAborted)
from .propagation import HEADER as GTID_HEADER
from .retry_rules import (ABORTED, OUTCOME_UNKNOWN, POLL_DECISION, RETRY_REQUEST, RETRY_TRANSACTION, abort_action,
                          daemon_action)
from .trace import TraceContext


class Transaction:
    """A global transaction as this process sees it: its root (coord.transaction()) or a
    participant (coord.join()). Holds its local branches; at exit the root decides, a
    participant prepares, reports and waits for the root's decision. `coord` is the
    cotx.coordinator.Coordinator that made it (not imported here: that module imports
    this one)."""

    def __init__(self, coord, gtid: str | None, root: bool, wait: bool = True,
                 timeout_ms: int | None = None, decide_in_participant: bool = False,
                 trace: TraceContext | None = None, one_request: bool = False):
        self.coord, self._gtid, self.root, self.wait_at_exit = coord, gtid, root, wait
        # One trace per global transaction: every request below sends trace.header().
        self.trace = trace or TraceContext.resolve()
        self.decide_in_participant = decide_in_participant
        self._timeout_ms = timeout_ms
        # The one-request path: chosen at the first branch, when its resource allows it;
        # `_drawn` is the leased gtid (cotx.leases.Drawn) once chosen.
        self.one_request = one_request and root
        self._drawn = None
        # The one-request commit answered: the daemon knows the gtid from then on (a
        # refused decision commit is reported to it).
        self._commit_answered = False
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
        coord.join_from(its request's headers). Begins the transaction if needed.
        Refused on the one-request path once a branch is in it: the daemon does not know
        the gtid before the commit, so nobody can join it (read tx.gtid or call headers()
        before the first branch to take the begin path)."""
        if self._drawn is not None:
            raise CotxError(f"{self._gtid} is a one-request transaction (leased gtid): other services cannot join "
                            "it; call headers() before its first branch, or use one_request=False")
        return {GTID_HEADER: self.gtid, "traceparent": self.trace.header()}

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        return self.coord.http.request(method, path, body, traceparent=self.trace.header())

    def _send_nowait(self, method: str, path: str, body: dict | None = None) -> None:
        self.coord.http.send_nowait(method, path, body, traceparent=self.trace.header())

    def branch(self, conn, resource: str, branch_id: str | None = None,
               isolation: str = "SERIALIZABLE", read_only: bool = False) -> Branch:
        """A branch on `conn`. Only SERIALIZABLE branches are protected by pg_co / mysql_co
        (which refuse the others' prepare by default); lower levels exist for comparisons
        with plain 2PC. `read_only=True` says the branch writes nothing: checked before
        PREPARE (PostgreSQL: no transaction id assigned) or enforced by the engine (MariaDB
        in engine mode: a READ ONLY transaction); when every branch is read-only the
        daemon commits without a synced store write (docs/coordinator.md, "All-read-only
        transactions"). In plain 2PC such a branch is committed in one phase at its vote
        instead of prepared (Branch.prepare)."""
        bid = branch_id or f"{resource[:24]}-{uuid.uuid4().hex[:16]}"
        return Branch(self, conn, resource, bid, isolation, read_only)

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

    def _leased_names(self, resource: str, kind: str, branch_id: str) -> dict | None:
        """A branch's names on the one-request path (what a registration would answer), or
        None for the begin path. The path is chosen at the first branch; a later branch
        the one-request commit does not serve sends the transaction back to the begin
        path by a rerun (BeginPathNeeded), before anything was sent."""
        if self._drawn is None:
            if not self.one_request or self._gtid is not None or not self.coord.leasable(resource):
                return None
            self._drawn = self.coord.leases.draw(self.trace.header())
            self._gtid = self._drawn.gtid
        elif not self.coord.leasable(resource):
            self._rollback_local()
            self.outcome = "abort"
            raise BeginPathNeeded(self._gtid, f"resource {resource!r} is not served by the one-request commit "
                                              "(client mode, or its enforcement not known yet): run again on the begin path")
        known = self.coord.kind_of(resource)
        if known is not None and known != kind:
            raise CotxError(f"resource {resource!r} is {known} at the coordinator but the connection is {kind}")
        return {**self._drawn.names(kind, branch_id), "enforcement": self.coord.mode_of(resource)}

    def _drop_lease(self) -> None:
        """The daemon may not know our range any more (restart, takeover, a refusal): the
        next transaction leases a new one."""
        self.coord.leases.drop(self._drawn.prefix)

    # --- root -------------------------------------------------------------------------
    def commit(self) -> None:
        if self._gtid is None and not self._branches:
            self.outcome = "commit"  # never begun, nothing ran: nothing to decide
            return
        if self._drawn is not None:
            self._commit_leased()
            return
        ready = [b for b in self._branches if b.state == "ready"]
        # Client mode commits one branch in one phase where the daemon says it may: the
        # slot is written before the request, as before PREPARE (docs/client-mode.md, "One
        # phase").
        if (len(ready) == 1 and len(self._branches) == 1
                and (ready[0].enforcement != "client" or ready[0].shim_one_phase) and self._one_phase(ready[0])):
            return
        decider = self._decider()
        # Our own branches' "prepared" reports ride along with the commit request.
        # A read-only branch may vote so (plain 2PC) only when the daemon decides: with the
        # decision in a participant the transaction is not two-phase throughout.
        mine = self.prepare_all(report=False, skip=decider, vote=decider is None)
        if decider is not None:
            self._finish(self._decide_in(decider, mine))
            return
        # Branches that wrote nothing (checked at their PREPARE): listed, so that the daemon
        # skips its store sync when that is every branch. Absent when none is (older
        # daemons do not know the field).
        read_only = [b.branch_id for b in self._branches if b.wrote_nothing]
        self._finish(self._commit_call({"prepared": mine, **({"read_only": read_only} if read_only else {})}))

    def _decider(self) -> Branch | None:
        """With decide_in_participant: the branch whose commit carries the decision, the
        last ready PostgreSQL branch in engine mode (co.decide needs pg_co there)."""
        if not self.decide_in_participant:
            return None
        return next((b for b in reversed(self._branches)
                     if b.state == "ready" and b.kind == "postgres" and b.enforcement != "client"), None)

    def _commit_call(self, body: dict) -> str:
        """POST …/commit, waiting for participants' prepared reports; the decision, or
        "in_participant" when the decision branch now decides. Each refusal is handled as
        the retry rules' "commit" rows say (clients/retry-rules.json)."""
        mine = body.get("prepared", [])
        deadline = time.monotonic() + 5.0
        while True:
            try:
                return self._request("POST", f"/v1/transactions/{_q(self.gtid)}/commit", {**body, "prepared": mine})["decision"]
            except CoordinatorError as e:
                act = daemon_action("commit", e.status, e.code)
                if e.code == "invalid_field" and "read_only" in body and "read_only" in str(e):
                    # A daemon older than the field (0.3.0): the decision synced, as it was.
                    body = {k: v for k, v in body.items() if k != "read_only"}
                    continue
                if e.code == "already_prepared" and mine:
                    mine = []  # an earlier attempt got through
                    continue
                if act == RETRY_REQUEST and e.code != "already_prepared" and time.monotonic() < deadline:
                    # A participant has not reported yet, or the request was not read.
                    time.sleep(min(e.retry_after or 0.01, max(0.0, deadline - time.monotonic())))
                    continue
                if act == POLL_DECISION:
                    return self._wait_decision()
                if act == OUTCOME_UNKNOWN:
                    raise OutcomeUnknown(f"{self.gtid}: {e}") from e
                # Refused: abort it (with the reason, which the abort's classification
                # reads back), roll back our branches, raise the abort.
                self._abort_at_daemon(f"commit refused: {e}")
                return "abort"
            except CoordinatorUnavailable:
                return self._wait_decision()

    def _commit_leased(self) -> None:
        """The one-request commit: every branch prepared, then listed in the commit (the
        transaction's only request), with the held acknowledgements."""
        if any(b.state == "failed" for b in self._branches):
            # A branch failed and the application went on: the daemon never heard of it.
            self._rollback_local()
            self.outcome = "abort"
            raise TransactionAborted(self.gtid, "a branch failed before the commit")
        decider = self._decider()
        try:
            self.prepare_all(report=False, skip=decider, vote=decider is None)
        except BaseException:
            # Nobody else would roll the prepared ones back before the range's lease lapses.
            self._rollback_local()
            self.outcome = "abort"
            raise
        prepared = [b for b in self._branches if b.state == "prepared"]
        branches = [{"resource": b.resource, "branch_id": b.branch_id,
                     **({"session": b.session} if b.session is not None else {})}
                    for b in prepared + ([decider] if decider is not None else [])]
        if decider is not None:
            body = self.coord.carried_acks({"branches": branches, "decide_in": decider.branch_id})
            self._finish(self._leased_decide_in(decider, body))
            return
        read_only = [b.branch_id for b in prepared if b.wrote_nothing]
        body = {"branches": branches, **({"read_only": read_only} if read_only else {})}
        self._finish(self._leased_commit_call(self.coord.carried_acks(body)))

    def _leased_commit_call(self, body: dict) -> str:
        """POST …/commit with the branches, as the retry rules' "commit" rows say; a 429 or
        503 and a lost connection ask the same commit again (that is how the outcome is
        asked for here: the daemon answers a gtid it holds as any commit asked again, and
        records nothing for a range it did not lease), for up to the decision timeout."""
        path = f"/v1/transactions/{_q(self.gtid)}/commit"
        deadline = time.monotonic() + self.coord.decision_timeout
        while True:
            try:
                return self._request("POST", path, body)["decision"]
            except CoordinatorError as e:
                # The acknowledgements went with the first attempt (a lost one is confirmed
                # by the daemon's recovery).
                body.pop("finished", None)
                self._drop_lease()
                act = daemon_action("commit", e.status, e.code)
                if e.status in (429, 503) and time.monotonic() < deadline:
                    time.sleep(min(e.retry_after or 0.2, 1.0))
                    continue
                if act == POLL_DECISION:
                    return self._wait_decision()
                if act == OUTCOME_UNKNOWN:
                    raise OutcomeUnknown(f"{self.gtid}: {e}") from e
                if act == ABORTED:
                    # Aborted (a deadlock victim, presumed abort: the daemon's decision
                    # says whether to run it again), or refused for the request itself (a bad
                    # id, a resource without decisions: nothing recorded, the refusal the reason,
                    # not retried).
                    self._rollback_local()
                    self._raise_abort(f"one-request commit refused: {e}")
                self._rollback_local()
                self.outcome = "abort"
                if e.code == "resource_refused":
                    # A resource's enforcement changed to one the commit does not serve.
                    self.coord.learn_mode(None, None)
                    raise BeginPathNeeded(self.gtid, f"commit refused: {e}") from e
                raise TransactionAborted(self.gtid, f"commit refused: {e}") from e
            except CoordinatorUnavailable as e:
                body.pop("finished", None)
                self._drop_lease()
                if time.monotonic() >= deadline:
                    raise OutcomeUnknown(f"no answer for {self.gtid} within {self.coord.decision_timeout}s; "
                                         "its branches stay prepared until the coordinator finishes them") from e
                time.sleep(0.2)  # restarting: its recovery keeps our branches safe

    def _leased_decide_in(self, d: Branch, body: dict) -> str:
        """The one-request commit handing the decision to `d` (every other branch
        prepared): on "in_participant", `d` commits with the decision inside it. Sent once:
        on any other answer `d` never commits, so nothing can commit (a daemon that took
        the request resolves abort in `d`'s database, co.resolve), and every branch is
        rolled back here at once. A refusal the retry rules call "aborted" raises the abort
        as the daemon tells it (as `_leased_commit_call`: an unknown gtid, after a restart,
        is retryable; a refusal of the request itself, which the daemon did not record,
        is not, and names it); any other, and no answer, raise RetryableError: nothing
        committed."""
        try:
            decision = self._request("POST", f"/v1/transactions/{_q(self.gtid)}/commit", body)["decision"]
        except (CoordinatorError, CoordinatorUnavailable) as e:
            self._drop_lease()
            self._rollback_local()
            if isinstance(e, CoordinatorError) and daemon_action("commit", e.status, e.code) == ABORTED:
                # The abort as the daemon tells it; refused for the request itself (e.g.
                # not_a_decision_resource: configuration), the refusal is the reason.
                self._raise_abort(f"one-request commit refused: {e}")
            self.outcome = "abort"
            raise RetryableError(self.gtid, f"commit with the decision in {d.resource}: {e}") from e
        self._commit_answered = True
        if decision != "in_participant":
            return decision  # abort: _finish rolls `d` back with the others
        return self._commit_decision_branch(d)

    def _abort_at_daemon(self, reason: str) -> None:
        try:
            self._request("POST", f"/v1/transactions/{_q(self.gtid)}/abort", {"reason": reason[:900]})
        except CotxError:
            pass  # already aborted, or unreachable: the daemon aborts on timeout

    def _decide_in(self, d: Branch, mine: list[str]) -> str:
        """Every other branch is prepared: commit `d` in one phase with the global decision
        inside it. Returns the decision for the other branches."""
        decision = self._commit_call({"prepared": mine, "decide_in": d.branch_id})
        if decision != "in_participant":
            return decision  # refused (abort) or already decided: `d` is rolled back by _finish
        return self._commit_decision_branch(d)

    def _commit_decision_branch(self, d: Branch) -> str:
        """The daemon answered "in_participant": `d` commits with the decision inside it
        (co.decide, then COMMIT). Returns the decision for the other branches."""
        try:
            Postgres.commit_with_decision(d.conn, self.gtid)
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
        if b.enforcement == "client":
            try:
                b.write_slot_for_one_phase()
            except CotxError:
                self._rollback_local()
                raise
        try:
            self._request("POST", f"/v1/transactions/{_q(self.gtid)}/commit", {"one_phase_branch": b.branch_id})
        except CoordinatorError as e:
            if e.code == "not_single_branch":
                return False  # other services joined: two-phase
            self.abort(f"one-phase commit refused: {e}")
            if daemon_action("one_phase", e.status, e.code) == RETRY_TRANSACTION:
                # Not acted on ("not now"), and the branch was never committed.
                raise RetryableError(self.gtid, f"one-phase commit refused: {e}") from e
            self._raise_abort()
        except CoordinatorUnavailable as e:
            # The branch commits only after the daemon's answer: rolled back, run again.
            self.abort(f"one-phase commit: {e}")
            raise RetryableError(self.gtid, f"one-phase commit: {e}") from e
        try:
            b.commit_one_phase()
        except Exception as e:
            b._rollback_unprepared()
            if not b.session_alive():
                # Lost during the COMMIT: it may have committed (the database's to say), so
                # neither an abort nor "run it again"; nothing acknowledged.
                b.state = "left_to_database"
                self.outcome = None
                raise OutcomeUnknown(f"{self.gtid}: {b.resource}: the session was lost during the one-phase "
                                     f"COMMIT; whether it committed is the database's to say: {e}") from e
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
        self.coord.acknowledge(self.gtid, outcome, [b.branch_id], traceparent=self.trace.header())

    # --- both -------------------------------------------------------------------------
    def prepare_all(self, report: bool = True, skip: Branch | None = None, vote: bool = False) -> list[str]:
        """Prepares every ready local branch (but `skip`) and (report=True) reports it; on
        any failure rolls back all local branches (the coordinator aborts the global
        transaction) and raises. Returns the ids of the branches it prepared (or that
        voted read-only: `vote`, the root's two-phase commit through the daemon;
        Branch.prepare)."""
        done = []
        for b in self._branches:
            if b.state != "ready" or b is skip:
                continue
            try:
                b.prepare(vote=vote)
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
        if self._gtid is None or self._drawn is not None:
            # Never begun, or one-request (the daemon hears of it only at its commit).
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
                act = daemon_action("decision", e.status, e.code)
                if act == ABORTED:
                    return "abort"  # presumed abort: no record, no live transaction
                if act == OUTCOME_UNKNOWN:
                    # Its record was purged after the retention: the outcome is not known
                    # any more (never "abort": it may have committed).
                    raise OutcomeUnknown(f"{self.gtid}: {e}") from e
                time.sleep(min(e.retry_after or 0.2, 1.0))
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
                self.coord.acknowledge(self.gtid, "commit", done, traceparent=self.trace.header())
            return
        self._rollback_local()
        self._raise_abort()

    def _raise_abort(self, reason: str | None = None) -> None:
        """Raises the abort of this transaction: RetryableError when the retry rules'
        "aborts" rows say running it again is safe and may work (the daemon marked it
        retryable, or it was aborted by a crash, a takeover or presumed abort), else
        TransactionAborted. The daemon's own reason decides; `reason` (the client's words)
        is shown, and decides only when the daemon cannot be asked."""
        self.outcome = "abort"
        retryable, recorded = False, reason
        try:
            d = self.coord.decision(self.gtid, traceparent=self.trace.header())
            if d.get("decision") is not None:  # (undecided: only the client's words)
                retryable, recorded = bool(d.get("retryable")), d.get("abort_reason")
        except CoordinatorError as e:
            if daemon_action("decision", e.status, e.code) == ABORTED:
                recorded = None  # presumed abort: the daemon no longer knows it
        except CotxError:
            pass
        shown = reason or recorded
        if abort_action(retryable, recorded) == RETRY_TRANSACTION:
            raise RetryableError(self.gtid, shown)
        raise TransactionAborted(self.gtid, shown)

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
