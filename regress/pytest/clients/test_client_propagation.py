"""The clients across services and daemons: one gtid header, `Cotx-Gtid`, the name
docs/coordinator.md documents ("Propagating a transaction between services"), written and
read alike by the Python and the Go client (the Go side runs as its compiled test binary,
clients/go/propagation_test.go); the W3C `traceparent` each client sends on every request
of a transaction, checked in the log of a real daemon; and the Go client following `421
wrong_node` from one daemon of a deployment (shared PostgreSQL store) to the owner."""
import email.message
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from cotx import GTID_HEADER, Coordinator, CotxError, gtid_from_headers, set_gtid
from cotest.daemon import Daemon
from cotx.propagation import traceparent_from_headers
from cotest.coord import pg_prepared, wait_until
from cotx.trace import TraceContext, valid

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("COTX_CACHE", "/var/cache/cotx"))
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def documented_header() -> str:
    """The header name as the docs give it, in the section every client points to."""
    text = (ROOT / "docs" / "coordinator.md").read_text()
    section = text.split("## Propagating a transaction between services", 1)[1].split("\n## ", 1)[0]
    return re.search(r"header `([A-Za-z-]+)`", section).group(1)


# --- helpers, no servers ---------------------------------------------------------------

def test_the_python_client_uses_the_documented_header():
    assert GTID_HEADER == documented_header() == "Cotx-Gtid"
    h = set_gtid({}, "g1.ab12-7")
    assert h == {"Cotx-Gtid": "g1.ab12-7"}
    # Read back whatever shape a framework hands over: any case, WSGI environ, a message.
    assert gtid_from_headers({"cotx-gtid": " g1.ab12-7 "}) == "g1.ab12-7"
    assert gtid_from_headers({"HTTP_COTX_GTID": "g1.ab12-7"}) == "g1.ab12-7"
    m = email.message.Message()
    m["COTX-GTID"] = "g1.ab12-7"
    assert gtid_from_headers(m) == "g1.ab12-7"
    assert gtid_from_headers({}) is None and gtid_from_headers({"Cotx-Gtid": ""}) is None
    assert traceparent_from_headers({"Traceparent": TP}) == TP
    assert traceparent_from_headers({"traceparent": TP.upper()}) is None   # the daemon's rule: lowercase
    coord = Coordinator("http://127.0.0.1:9", "x" * 16)
    with pytest.raises(CotxError):
        coord.join_from({"other": "1"})
    tx = coord.join_from({"Cotx-Gtid": "g1.ab12-7", "traceparent": TP}, wait=False)
    assert tx.gtid == "g1.ab12-7" and tx.headers() == {"Cotx-Gtid": "g1.ab12-7", "traceparent": TP}
    # Without a caller's context: one trace id per transaction, a new span id per request.
    t = TraceContext.resolve()
    a, b = t.header(), t.header()
    assert valid(a) and valid(b) and a[3:35] == b[3:35] == t.trace_id and a[36:52] != b[36:52]
    assert TraceContext.resolve().trace_id != t.trace_id
    # An explicit one wins over an incoming one; a malformed one is not used.
    assert TraceContext.resolve(TP, "00-" + "1" * 32 + "-" + "2" * 16 + "-01").header() == TP
    assert TraceContext.resolve("00-xyz").generated


def test_opentelemetrys_current_span_is_taken_when_the_api_is_there(monkeypatch):
    """opentelemetry-api is not installed here (nor a dependency): a stand-in module with
    the API's shape (trace.get_current_span().get_span_context()) shows the client uses it."""
    import sys
    import types

    class SpanContext:
        trace_id, span_id, trace_flags, is_valid = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1, True
    otel_trace = types.ModuleType("opentelemetry.trace")
    otel_trace.get_current_span = lambda: types.SimpleNamespace(get_span_context=lambda: SpanContext())
    otel = types.ModuleType("opentelemetry")
    otel.trace = otel_trace
    monkeypatch.setitem(sys.modules, "opentelemetry", otel)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", otel_trace)
    current = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    coord = Coordinator("http://127.0.0.1:9", "x" * 16)
    assert coord.transaction().trace.header() == current
    assert coord.join_from({"Cotx-Gtid": "g1.ab12-7", "traceparent": TP}).trace.header() == current
    assert coord.transaction(traceparent=TP).trace.header() == TP      # the explicit one wins
    SpanContext.is_valid = False                                        # no current span
    assert TraceContext.resolve().generated


# --- the Go client, as its test binary ---------------------------------------------------

@pytest.fixture(scope="module")
def go_tests(tmp_path_factory):
    """clients/go's tests compiled once; run(test_name, **env) runs one of them."""
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.access(p, os.X_OK)), None)
    if go is None or not (CACHE / "go" / "pkg" / "mod").is_dir():
        pytest.skip("Go or its module cache missing: run scripts/bootstrap.sh (bootstrap-tm.sh)")
    # The environment of scripts/tm-env.sh + test-go.sh: the project's offline module cache.
    env = {k: v for k, v in os.environ.items() if k not in ("PG_PORT", "MY_PORT")}
    env.update(GOPATH=str(CACHE / "go"), GOMODCACHE=str(CACHE / "go" / "pkg" / "mod"),
               GOCACHE=str(CACHE / "go" / "build-cache"), GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="-mod=readonly")
    binary = tmp_path_factory.mktemp("go") / "cotx.test"
    r = subprocess.run([go, "test", "-c", "-o", str(binary), "."], cwd=ROOT / "clients" / "go", env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr

    def run(name, **extra):
        r = subprocess.run([str(binary), "-test.run", f"^{name}$", "-test.v", "-test.count=1"],
                           cwd=ROOT / "clients" / "go", env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"--- PASS: {name}" in r.stdout, r.stdout + r.stderr
    return run


def test_headers_written_by_one_client_are_read_by_the_other(go_tests, tmp_path):
    # Python writes (what a Python root sends to a Go service) ...
    coord = Coordinator("http://127.0.0.1:9", "x" * 16)
    tx = coord.join("g3.py12-5", traceparent=TP)
    headers = tx.headers()
    out = tmp_path / "go-headers.json"
    # ... Go reads them through its Middleware, and writes with its Transport ...
    go_tests("TestHeadersAcrossLanguages", COTX_PY_HEADERS=json.dumps(headers), COTX_PY_GTID="g3.py12-5",
             COTX_PY_TRACEPARENT=TP, COTX_GO_HEADERS_OUT=str(out))
    # ... and Python reads what Go sent, and joins with it.
    sent = json.loads(out.read_text())
    assert GTID_HEADER in sent, sent
    assert gtid_from_headers(sent) == "g7.go-1"
    assert traceparent_from_headers(sent) == "00-11111111111111111111111111111111-2222222222222222-01"
    joined = coord.join_from(sent)
    assert joined.gtid == "g7.go-1" and joined.trace.trace_id == "1" * 32


# --- a real daemon: the trace id it logs is the client's ------------------------------------

def request_lines(d):
    return [x for x in (json.loads(s) for s in d.log_file.read_text().splitlines()) if x.get("message") == "request"]


@pytest.fixture(scope="module")
def daemon(pg):
    pg.sql("CREATE TABLE IF NOT EXISTS prop_t(k text PRIMARY KEY)")
    d = Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2}]).start()
    yield d
    d.destroy()


def test_python_requests_carry_the_transactions_trace(pg, daemon):
    coord = Coordinator(daemon.url, daemon.token)
    with psycopg.connect(pg.dsn) as root_conn, psycopg.connect(pg.dsn) as peer_conn:
        with coord.transaction() as tx:
            with tx.branch(root_conn, "pg"):
                root_conn.execute("INSERT INTO prop_t VALUES ('root')")
            # "Another service": joins from the headers the root would send it.
            with coord.join_from(tx.headers(), wait=False) as peer:
                with peer.branch(peer_conn, "pg"):
                    peer_conn.execute("INSERT INTO prop_t VALUES ('peer')")
        peer.wait(30)
        gtid, trace_id = tx.gtid, tx.trace.trace_id
        # The caller's own trace context (as OpenTelemetry's propagator would give it).
        with pytest.raises(RuntimeError):
            with coord.transaction(traceparent=TP) as tx2:
                gtid2 = tx2.gtid
                raise RuntimeError("abort")
    wait_until(lambda: not pg_prepared(pg), what="the branches finished")
    lines = request_lines(daemon)
    mine = [x for x in lines if x.get("trace_id") == trace_id]
    # Every request of the transaction, the participant's included, in one trace ...
    assert {x.get("gtid") for x in lines if x.get("gtid") == gtid} == {gtid}
    assert {x["trace_id"] for x in lines if x.get("gtid") == gtid} == {trace_id}, lines
    assert {"/v1/transactions", f"/v1/transactions/{gtid}/commit"} <= {x["path"] for x in mine}, mine
    assert any(x["path"].endswith("/prepared") for x in mine), mine   # the participant's report
    # ... and with the caller's context, exactly the caller's header.
    theirs = [x for x in lines if x.get("gtid") == gtid2 or x["trace_id"] == TP[3:35]]
    assert theirs and all(x["traceparent"] == TP for x in theirs), theirs


def test_go_requests_carry_the_transactions_trace(go_tests, daemon, tmp_path):
    out = tmp_path / "go.json"
    go_tests("TestLiveTraceparentReachesTheDaemon", COTX_LIVE_URL=daemon.url, COTX_LIVE_TOKEN=daemon.token,
             COTX_LIVE_OUT=str(out))
    got = json.loads(out.read_text())
    lines = request_lines(daemon)
    mine = [x for x in lines if x.get("trace_id") == got["trace_id"]]
    assert {x["path"] for x in mine} == {"/v1/transactions", f"/v1/transactions/{got['gtid']}/abort"}, mine
    assert len({x["parent_span_id"] for x in mine}) == len(mine)   # a new span id per request


# --- two daemons: the Go client follows 421 wrong_node ----------------------------------------

def test_go_client_follows_wrong_node_to_the_owner(pg, go_tests):
    pg.sql("CREATE DATABASE cotx_prop")
    store = {"kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=cotx_prop"), "table": "prop_t"}
    res = [{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2}]
    a = Daemon(res, store=store, node_id="pa")
    b = Daemon(res, store=store, node_id="pb")
    b.token = a.token
    b.write_config()
    try:
        a.start()
        b.start()
        gtid = Coordinator(a.url, a.token).begin()          # owned by A, undecided
        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        go_tests("TestLiveWrongNodeIsFollowed", COTX_LIVE_URL=b.url, COTX_LIVE_TOKEN=a.token, COTX_LIVE_GTID=gtid,
                 COTX_LIVE_TRACEPARENT=tp)
        # B answered 421 and A did the work: the abort is A's, asked through B.
        assert Coordinator(a.url, a.token).decision(gtid)["decision"] == "abort"
        at_b = [(x["path"], x["status"]) for x in request_lines(b) if x["traceparent"] == tp]
        at_a = [(x["path"], x["status"]) for x in request_lines(a) if x["traceparent"] == tp]
        assert (f"/v1/transactions/{gtid}/abort", 421) in at_b, at_b
        assert (f"/v1/transactions/{gtid}/abort", 200) in at_a, at_a
        assert (f"/v1/transactions/{gtid}/decision", 200) in at_a, at_a
    finally:
        a.destroy()
        b.destroy()
