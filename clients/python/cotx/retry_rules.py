"""The retry rules: what the client does with each answer that is not a success, read from
the one table every client shares (clients/retry-rules.json; this package ships a copy,
cotx/retry-rules.json, that regress/pytest/clients/test_client_retry_rules.py checks is equal).

    from cotx.retry_rules import daemon_action, transport_action, abort_action, engine_rule
    daemon_action("begin", 503, "lease_unconfirmed")   # "retry_request"
    transport_action("commit")                         # "poll_decision"
    abort_action(False, "recorded abort (takeover)")   # "retry_transaction"
    engine_rule("40001", None, "could not serialize access ...")   # row of "pg serialization failure"

The lowest module of the package: it imports nothing of it.
"""
from __future__ import annotations

import json
from pathlib import Path

RULES = json.loads((Path(__file__).parent / "retry-rules.json").read_text())
ACTIONS = tuple(RULES["actions"])
PHASES = tuple(RULES["phases"])

RETRY_REQUEST = "retry_request"
RETRY_TRANSACTION = "retry_transaction"
ABORTED = "aborted"
POLL_DECISION = "poll_decision"
OUTCOME_UNKNOWN = "outcome_unknown"
FAIL = "fail"


def phase_of(method: str, path: str, body: dict | None = None) -> str:
    """Which phase of the table a request is (its method, its path after the base URL)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if method == "POST" and parts == ["v1", "gtid-leases"]:
        return "begin"  # the one-request path's begin: nothing of a transaction exists yet
    if parts[:2] != ["v1", "transactions"]:
        return "other"
    rest = parts[2:]
    if method == "POST" and not rest:
        return "begin"
    if method == "POST" and len(rest) == 2 and rest[1] == "branches":
        return "register"
    if method == "POST" and len(rest) == 2 and rest[1] == "commit":
        return "one_phase" if body and "one_phase_branch" in body else "commit"
    if method == "GET" and len(rest) == 2 and rest[1] == "decision":
        return "decision"
    if method == "POST" and len(rest) == 4 and rest[3] == "prepared":
        return "prepared"
    if method == "POST" and rest and rest[-1] in ("failed", "finished", "abort"):
        return "report"
    return "other"


def _daemon_row(phase: str, status: int, code: str) -> dict:
    best, score = None, -1
    for row in RULES["daemon"]:
        if row["phases"] == ["*"]:
            s = 0
        elif phase not in row["phases"]:
            continue
        elif row["code"] == code:
            s = 3
        elif row["code"] == "*" and row.get("status") == status:
            s = 2
        elif row["code"] == "*" and "status" not in row:
            s = 1
        else:
            continue
        if s > score:
            best, score = row, s
    return best


def daemon_action(phase: str, status: int, code: str) -> str:
    """The action for the daemon's answer `status` / `code` to a request of `phase`."""
    return _daemon_row(phase, status, code)["action"]


def transport_action(phase: str) -> str:
    """The action when the daemon could not be reached (or its answer not read) in `phase`."""
    for row in RULES["transport"]:
        if phase in row["phases"]:
            return row["action"]
    return FAIL


def abort_action(retryable: bool, reason: str | None) -> str:
    """The action for an aborted transaction, from GET …/decision's `retryable` and
    `abort_reason` (None: no reason recorded, or the daemon no longer knows it)."""
    for row in RULES["aborts"]:
        if row.get("retryable") is True:
            if retryable:
                return row["action"]
        elif "reason" in row:
            if reason is None:
                return row["action"]
        elif reason is not None and reason.startswith(row["reason_prefix"]):
            return row["action"]
    return FAIL


OTHER = {"kind": "other", "engine": None, "action": FAIL}


def engine_rule(sqlstate: str | None, errno: int | None, text: str) -> dict:
    """The engine row an error matches (OTHER when none): a SQLSTATE is PostgreSQL's, an
    errno MariaDB's; text alone (an abort reason) matches by the rows' messages."""
    low = text.lower()
    for row in RULES["engine"]:
        frags = row.get("message", [])
        if sqlstate is None and errno is None:
            if (frags and all(f in low for f in frags)) or ("text" in row and row["text"] in low):
                return row
            continue
        if row["engine"] == "postgres":
            if errno is not None or row.get("sqlstate", sqlstate) != sqlstate:
                continue
        elif sqlstate is not None or row.get("errno", errno) != errno:
            continue
        if all(f in low for f in frags):
            return row
    return OTHER
