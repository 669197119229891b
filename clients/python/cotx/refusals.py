"""The one place that says what an engine error means for a global transaction: retrying
may cure it or not, and which rule or mechanism raised it.

    from cotx.refusals import classify
    r = classify(exc)            # a psycopg / PyMySQL error, or a cotx error wrapping one
    r.retryable, r.kind          # True, "pg_co rule A"

The client decides RetryableError vs TransactionAborted with it; the bench driver, the
schedule runner and the workloads label their aborts with `kind`. Codes come first
(SQLSTATE, MariaDB errno); the message only picks the pg_co / mysql_co rule, because both
engines report every refusal of a kind under one code (pg_co: 40001 for rules A, B, C;
mysql_co: 1402 XA_RBROLLBACK for both of its refusals). The messages matched here are
the ones pg_co_ext/src/refusal.rs and mysql_co_plugin/mysql_co.cc raise; the table in
regress/pytest/test_refusals.py pins them, and the same test provokes them on real servers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    kind: str          # short stable label, one of KINDS
    retryable: bool    # retrying the whole global transaction may succeed
    engine: str | None  # "postgres", "mariadb", or None when unknown


# kind -> (engine, retryable). Retryable: a conflict with concurrent transactions, which a
# new attempt (with fresh snapshots and locks) may not meet again. Not retryable: the
# transaction's own setup is wrong (isolation level, READ ONLY) or it was cancelled.
KINDS = {
    "pg_co rule A": ("postgres", True),
    "pg_co rule A (summarized)": ("postgres", True),
    "pg_co rule B": ("postgres", True),
    "pg_co rule B wait timeout": ("postgres", True),
    "pg_co rule C": ("postgres", True),
    "pg_co rule S": ("postgres", True),
    "pg_co already decided": ("postgres", True),
    "pg_co not serializable": ("postgres", False),
    "pg_co read only": ("postgres", False),
    "pg concurrent update": ("postgres", True),
    "pg serialization failure": ("postgres", True),
    "pg deadlock": ("postgres", True),
    "pg lock timeout": ("postgres", True),
    "pg cancelled": ("postgres", False),
    "mysql_co restart gate": ("mariadb", True),
    "mysql_co isolation": ("mariadb", False),
    "my deadlock": ("mariadb", True),
    "my lock wait timeout": ("mariadb", True),
    "my XA rollback": ("mariadb", True),
    "my interrupted": ("mariadb", False),
    "other": (None, False),
}

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


# Only for text without codes (an abort reason the coordinator recorded): the server's
# own wording of the code-classified errors above.
_MESSAGES = (
    ("could not serialize access due to concurrent update", "pg concurrent update"),
    ("could not serialize access", "pg serialization failure"),
    ("deadlock detected", "pg deadlock"),
    ("canceling statement due to lock timeout", "pg lock timeout"),
    ("deadlock found when trying to get lock", "my deadlock"),
    ("lock wait timeout exceeded", "my lock wait timeout"),
)


def _by_codes(state: str | None, errno: int | None, text: str) -> Refusal:
    low = text.lower()
    r = _postgres(state, low) if errno is None else None
    if r is None and state is None:
        r = _mariadb(errno, low)
    if r is None and state is None and errno is None:
        r = next((_refusal(kind) for needle, kind in _MESSAGES if needle in low), None)
    return r or _refusal("other")


def _postgres(state: str | None, low: str) -> Refusal | None:
    if "pg_co refused" in low:
        if "rule a (summarized" in low:
            return _refusal("pg_co rule A (summarized)")
        for rule in ("a", "b", "c"):
            if f"commitment ordering rule {rule}" in low:
                return _refusal(f"pg_co rule {rule.upper()}")
        if "rule s (a reader postgresql summarized)" in low:
            return _refusal("pg_co rule S")
        if "is already decided" in low:
            return _refusal("pg_co already decided")   # co.decide after co.resolve: abort
        if "not serializable" in low:
            return _refusal("pg_co not serializable")
        if "read only" in low:
            return _refusal("pg_co read only")
    if "pg_co: lock_timeout expired while waiting" in low:
        return _refusal("pg_co rule B wait timeout")
    if state == "40001":
        return _refusal("pg concurrent update" if "concurrent update" in low else "pg serialization failure")
    if state == "40P01":
        return _refusal("pg deadlock")
    if state == "55P03":
        return _refusal("pg lock timeout")
    if state == "57014":
        return _refusal("pg cancelled")
    return None


def _mariadb(errno: int | None, low: str) -> Refusal | None:
    if "mysql_co:" in low and errno in (ER_XA_RBROLLBACK, None):
        if "restart gate" in low:
            return _refusal("mysql_co restart gate")
        if "refused: this xa branch ran at" in low:
            return _refusal("mysql_co isolation")
    if errno == ER_LOCK_DEADLOCK:
        return _refusal("my deadlock")
    if errno == ER_LOCK_WAIT_TIMEOUT:
        return _refusal("my lock wait timeout")
    if errno in (ER_XA_RBROLLBACK, ER_XA_RBTIMEOUT, ER_XA_RBDEADLOCK):
        return _refusal("my XA rollback")
    if errno == ER_QUERY_INTERRUPTED:
        return _refusal("my interrupted")
    return None
