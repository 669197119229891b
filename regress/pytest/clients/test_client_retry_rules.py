"""The retry rules (clients/retry-rules.json), the one table every client classifies from:
the Python client's copy is the table byte for byte, the table names only the daemon's own
codes with their own statuses, and the client's classification equals every row (daemon
answers per phase, transport failures, aborts, engine errors). The limit of prepared
transactions is provoked on a real PostgreSQL: its SQLSTATE is the table's and it is
retryable. Run() acting on the rules against a real daemon: test_client_retry_faults.py."""
import json
import re
from pathlib import Path

import psycopg
import pytest
from cotest import PgServer
from cotx.errors import (CoordinatorError, CoordinatorUnavailable, OutcomeUnknown, RetryableError,
                         TransactionAborted)
from cotx.refusals import KINDS, classify
from cotx.retry import action_of
from cotx.retry_rules import RULES, abort_action, daemon_action, phase_of, transport_action

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "clients" / "retry-rules.json"


def test_the_package_ships_the_table_byte_for_byte():
    copy = ROOT / "clients" / "python" / "cotx" / "retry-rules.json"
    assert copy.read_bytes() == TABLE.read_bytes(), "cp clients/retry-rules.json clients/python/cotx/"
    assert json.loads(TABLE.read_text()) == RULES


def daemon_codes():
    """code -> HTTP status, from the daemon's RefusalCode (coordinator-daemon/src/refusal.rs)."""
    src = (ROOT / "coordinator-daemon" / "src" / "refusal.rs").read_text()
    names = dict(re.findall(r'RefusalCode::(\w+) => "(\w+)"', src))
    statuses = dict(re.findall(r"RefusalCode::(\w+) => (\d{3}),", src))
    return {names[v]: int(statuses[v]) for v in names}


def test_rows_name_the_daemons_codes_actions_and_phases():
    codes = daemon_codes()
    codes["too_many_connections"] = 503   # also written by the accept loop (api/server.rs)
    for row in RULES["daemon"]:
        assert row["action"] in RULES["actions"], row
        assert row["phases"] == ["*"] or set(row["phases"]) <= set(RULES["phases"]), row
        if row["code"] != "*":
            assert codes.get(row["code"]) == row["status"], row
    for row in RULES["transport"] + RULES["aborts"] + RULES["engine"]:
        assert row["action"] in RULES["actions"], row
    # Every "not now" of the daemon is retried at the begin; every phase has a fallback.
    for code, status in codes.items():
        if status in (429, 503):
            assert daemon_action("begin", status, code) == "retry_request", code
    for phase in RULES["phases"]:
        assert any(phase in r["phases"] and r["code"] == "*" for r in RULES["daemon"]), phase


def sample(row, phase):
    """A daemon answer the row is the most specific for."""
    if row["code"] != "*":
        return row["status"], row["code"]
    return row.get("status", 418), "a_code_of_no_row"


@pytest.mark.parametrize("row", RULES["daemon"], ids=lambda r: f"{'+'.join(r['phases'])}:{r['code']}")
def test_daemon_answers_are_classified_as_the_table_says(row):
    for phase in row["phases"] if row["phases"] != ["*"] else ["other"]:
        status, code = sample(row, phase)
        e = CoordinatorError(status, code, "m", phase)
        assert (phase, code, action_of(e)) == (phase, code, row["action"])


@pytest.mark.parametrize("row", RULES["transport"], ids=lambda r: "+".join(r["phases"]))
def test_transport_failures_are_classified_as_the_table_says(row):
    for phase in row["phases"]:
        assert action_of(CoordinatorUnavailable("connection refused", phase)) == row["action"]
        assert transport_action(phase) == row["action"]


def abort_sample(row):
    if row.get("retryable"):
        return True, "branch b1 failed: prepare refused: could not serialize access"
    if "reason" in row:
        return False, None
    return False, row["reason_prefix"] + "…"


@pytest.mark.parametrize("row", RULES["aborts"], ids=lambda r: str(r.get("reason_prefix", r.get("reason", "flag"))))
def test_aborts_are_classified_as_the_table_says(row):
    assert abort_action(*abort_sample(row)) == row["action"]


@pytest.mark.parametrize("row", RULES["engine"], ids=lambda r: f"{r['kind']}:{r.get('sqlstate', r.get('errno', ''))}")
def test_engine_errors_are_classified_as_the_table_says(row):
    r = classify(sqlstate=row.get("sqlstate"), errno=row.get("errno"), message=row["example"])
    assert (r.kind, r.retryable, r.engine) == (row["kind"], row["action"] == "retry_transaction", row["engine"])
    assert KINDS[row["kind"]] == (row["engine"], row["action"] == "retry_transaction")
    if row.get("message") or row.get("text"):      # as an abort reason: text only
        assert classify(message=row["example"]).kind == row["kind"]


def test_what_run_does_with_the_clients_own_errors():
    assert action_of(RetryableError("g", "x")) == "retry_transaction"
    assert action_of(TransactionAborted("g", "x")) == "fail"
    assert action_of(OutcomeUnknown("x")) == "outcome_unknown"
    assert action_of(ValueError("application bug")) == "fail"


@pytest.mark.parametrize("method,path,body,phase", [
    ("POST", "/v1/transactions", {}, "begin"),
    ("POST", "/v1/transactions/n1.a-1/branches", {}, "register"),
    ("POST", "/v1/transactions/n1.a-1/commit", {"prepared": []}, "commit"),
    ("POST", "/v1/transactions/n1.a-1/commit", {"one_phase_branch": "b"}, "one_phase"),
    ("GET", "/v1/transactions/n1.a-1/decision?wait_ms=10", None, "decision"),
    ("POST", "/v1/transactions/n1.a-1/branches/b/prepared", {}, "prepared"),
    ("POST", "/v1/transactions/n1.a-1/branches/b/failed", {}, "report"),
    ("POST", "/v1/transactions/n1.a-1/finished", {}, "report"),
    ("POST", "/v1/transactions/n1.a-1/abort", {}, "report"),
    ("GET", "/v1/transactions/n1.a-1", None, "other"),
])
def test_requests_are_named_by_their_phase(method, path, body, phase):
    assert phase_of(method, path, body) == phase


def test_the_prepared_transactions_limit_is_53200_and_retryable():
    """PostgreSQL's own refusal (twophase.c: ERRCODE_OUT_OF_MEMORY), provoked: with
    max_prepared_transactions = 1 and one prepared, the next PREPARE TRANSACTION."""
    with PgServer(preload=False, conf={"max_prepared_transactions": 1}) as s:
        a, b = s.connect(), s.connect()
        a.execute("BEGIN")
        a.execute("PREPARE TRANSACTION 'first'")
        b.execute("BEGIN")
        with pytest.raises(psycopg.Error) as ei:
            b.execute("PREPARE TRANSACTION 'second'")
        assert ei.value.sqlstate == "53200", ei.value
        r = classify(ei.value)
        assert (r.kind, r.retryable) == ("pg prepared transactions exhausted", True)
        s.sql("ROLLBACK PREPARED 'first'")
