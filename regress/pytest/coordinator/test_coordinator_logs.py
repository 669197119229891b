"""The daemon's logs and traces: JSON log lines whose fields (gtid, trace id, resource,
SQLSTATE) are fields, not text; human-readable lines without `[log] format = "json"`; a
caller's W3C trace context followed into the log and, with `[telemetry] otlp_endpoint`,
exported as OTLP/HTTP JSON spans to a collector (here a small HTTP receiver)."""
import http.server
import json
import threading
import urllib.request

import psycopg
from cotest.coord import make_daemon, pg_prepared, wait_until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def call(d, method, path, body=None, traced=True):
    headers = {"Authorization": f"Bearer {d.token}", "content-type": "application/json"}
    if traced:
        headers["traceparent"] = TRACEPARENT
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(d.url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def one_transaction(d, pg):
    """Begin with a PostgreSQL branch, prepare it, commit: every request traced."""
    pg.sql("CREATE TABLE IF NOT EXISTS logs_t(k text PRIMARY KEY)")
    t = call(d, "POST", "/v1/transactions", {"branch": {"resource": "pg", "branch_id": "b1"}})
    gtid = t["gtid"]
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        c.execute("INSERT INTO logs_t VALUES (%s)", (gtid,))
        c.execute(f"PREPARE TRANSACTION '{t['branch']['gid']}'")
    call(d, "POST", f"/v1/transactions/{gtid}/commit", {"prepared": ["b1"]})
    return gtid


def test_json_log_lines_carry_the_gtid_with_the_trace_id(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, log={"format": "json"})
    gtid = one_transaction(d, pg)
    wait_until(lambda: not pg_prepared(pg), what="the branch committed")
    d.stop()
    lines = [json.loads(x) for x in d.log_file.read_text().splitlines()]  # every line is JSON
    assert any(x["message"] == "listening" and x["node_id"] == d.node_id for x in lines), lines[:3]
    traced = [x for x in lines if x.get("trace_id") == TRACE]
    assert {x["path"] for x in traced} == {"/v1/transactions", f"/v1/transactions/{gtid}/commit"}, traced
    assert [x["status"] for x in traced if x.get("gtid") == gtid] == [200], traced
    assert all(x["traceparent"] == TRACEPARENT and x["level"] == "INFO" for x in traced)


def test_text_log_lines_by_default_and_a_bad_format_is_refused(pg, mariadb):
    d = make_daemon(pg, mariadb)
    d.log = {}  # no [log] table: the daemon's default
    d.write_config()
    d.start()
    try:
        call(d, "POST", "/v1/transactions", {})
        d.stop()
        text = d.log_file.read_text()
        first = next(x for x in text.splitlines() if "decisions loaded" in x)
        assert not first.startswith("{") and " INFO " in first, first
        line = next(x for x in text.splitlines() if "path=/v1/transactions" in x)
        assert f"trace_id={TRACE}" in line and "status=201" in line, line
        d.log = {"format": "xml"}
        d.write_config()
        r = d.cli("check-config")
        assert r.returncode == 2 and "log.format" in r.stderr, r
    finally:
        d.destroy()


def test_the_environment_overrides_the_config(pg, mariadb, monkeypatch, daemons):
    """COTX_LOG_FORMAT (= serve --log-format) wins over [log] format."""
    monkeypatch.setenv("COTX_LOG_FORMAT", "text")
    d = daemons.start(pg, mariadb, log={"format": "json"})
    d.stop()
    lines = d.log_file.read_text().splitlines()
    assert lines and not any(x.startswith("{") for x in lines), lines


def test_driver_errors_are_logged_with_the_sqlstate_as_a_field(pg, mariadb, daemons):
    from cotest.daemon import Daemon
    d = daemons(Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=nope")}])).start()
    def found():
        lines = [json.loads(x) for x in d.log_file.read_text().splitlines()]
        return [x for x in lines if x.get("sqlstate") == "3D000" and x.get("resource") == "pg"]
    wait_until(found, what="a log line with sqlstate 3D000 and resource pg")


class Collector(http.server.ThreadingHTTPServer):
    """A stand-in OpenTelemetry collector: keeps what is POSTed to /v1/traces."""

    def __init__(self):
        self.spans = []
        self.paths = []
        collector = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                collector.paths.append((self.path, self.headers["content-type"]))
                for rs in json.loads(body)["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        collector.spans += ss["spans"]
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), H)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_traced_requests_are_exported_as_otlp_spans(pg, mariadb):
    col = Collector()
    d = make_daemon(pg, mariadb, telemetry={"otlp_endpoint": f"http://127.0.0.1:{col.server_port}"}).start()
    try:
        # Untraced requests make no span; the traced ones each make one, child of the caller's.
        call(d, "POST", "/v1/transactions", {}, traced=False)
        gtid = one_transaction(d, pg)
        wait_until(lambda: len(col.spans) >= 2, what="two spans at the collector")
        assert {p for p in col.paths} == {("/v1/traces", "application/json")}
        assert all(s["traceId"] == TRACE and s["parentSpanId"] == TRACEPARENT.split("-")[2] for s in col.spans), col.spans
        names = sorted(s["name"] for s in col.spans)
        assert names == ["POST /v1/transactions", "POST /v1/transactions/{gtid}/commit"], names
        commit = next(s for s in col.spans if s["name"].endswith("commit"))
        attrs = {a["key"]: a["value"] for a in commit["attributes"]}
        assert attrs["cotx.gtid"] == {"stringValue": gtid} and attrs["http.response.status_code"] == {"intValue": "200"}
        assert int(commit["endTimeUnixNano"]) >= int(commit["startTimeUnixNano"]) > 0
    finally:
        d.destroy()
        col.shutdown()
