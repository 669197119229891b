"""The one place that says what an engine error means for a global transaction: retrying
may cure it or not, and which rule or mechanism raised it.

    from cotx.refusals import classify
    r = classify(exc)            # a psycopg / PyMySQL error, or a cotx error wrapping one
    r.retryable, r.kind          # True, "pg_co rule A"

The client decides RetryableError vs TransactionAborted with it; the bench driver, the
schedule runner and the workloads label their aborts with `kind`. The rows are the
engine rows of the retry rules (clients/retry-rules.json, shared with the Go client):
codes first (SQLSTATE, MariaDB errno); the message only picks the pg_co / mysql_co rule,
because both engines report every refusal of a kind under one code (pg_co: 40001 for
rules A, B, C; mysql_co: 1402 XA_RBROLLBACK for both of its refusals). The messages
matched are the ones pg_co_ext/src/refusal.rs and mysql_co_plugin/mysql_co.cc raise; the
table in regress/pytest/clients/test_refusals.py pins them, and the same test provokes them on
real servers.
"""
from __future__ import annotations

from dataclasses import dataclass

from .retry_rules import RETRY_TRANSACTION, RULES, engine_rule


@dataclass(frozen=True)
class Refusal:
    kind: str          # short stable label, one of KINDS
    retryable: bool    # retrying the whole global transaction may succeed
    engine: str | None  # "postgres", "mariadb", or None when unknown


# kind -> (engine, retryable), from the engine rows of the retry rules
# (clients/retry-rules.json): retryable is the action "retry_transaction" (a conflict with
# concurrent transactions, which a new attempt with fresh snapshots and locks may not meet
# again, or a resource that frees itself); not retryable: the transaction's own setup is
# wrong (isolation level, READ ONLY) or it was cancelled.
KINDS = {row["kind"]: (row["engine"], row["action"] == RETRY_TRANSACTION) for row in RULES["engine"]}
KINDS["other"] = (None, False)

# MariaDB error numbers (include/mysqld_error.h)
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_QUERY_INTERRUPTED = 1317
ER_XA_RBROLLBACK = 1402     # also every mysql_co refusal
ER_XA_RBTIMEOUT = 1613
ER_XA_RBDEADLOCK = 1614


def _refusal(kind: str) -> Refusal:
    engine, retryable = KINDS[kind]
    return Refusal(kind, retryable, engine)


def _codes(e: BaseException) -> tuple[str | None, int | None]:
    state = getattr(e, "sqlstate", None)
    args = getattr(e, "args", ())
    errno = args[0] if args and isinstance(args[0], int) and not isinstance(args[0], bool) else None
    if errno is not None and len(args) < 2:
        errno = None  # PyMySQL errors are (errno, message); a bare int argument is something else
    if errno is not None:
        state = None  # PyMySQL also carries MariaDB's SQLSTATE (40001 for a deadlock): the errno says more
    return state, errno


def classify(e: BaseException | None = None, *, sqlstate: str | None = None, errno: int | None = None,
             message: str = "") -> Refusal:
    """What error `e` (or the given sqlstate / errno / message) means. An exception without
    codes of its own (a cotx error, a wrapper) is classified by its `raise ... from` chain
    down to the first error with a SQLSTATE or errno; the messages on the way count too."""
    texts = [message] if message else []
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        s, n = _codes(e)
        sqlstate, errno = sqlstate or s, errno or n
        texts.append(str(e))
        if sqlstate or errno:
            break
        e = e.__cause__
    return _by_codes(sqlstate, errno, " ".join(texts))


def _by_codes(state: str | None, errno: int | None, text: str) -> Refusal:
    return _refusal(engine_rule(state, errno, text)["kind"])
