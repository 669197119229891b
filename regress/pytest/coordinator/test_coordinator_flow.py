"""Coordinator end to end: real PostgreSQL, real MariaDB, the real daemon process, the
Python client. Commit and abort across both engines, one-phase commit, a participant that
joins by gtid, retryable refusals, bad requests that change nothing, timeouts."""
import threading

import psycopg
import pytest
from cotest.coord import make_daemon, metrics_text, nothing_prepared, pg_prepared, wait_until
from cotx import Coordinator, CoordinatorError, PrepareRefused, RetryableError


@pytest.fixture(scope="module")
def daemon(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS acct(id int PRIMARY KEY, v int NOT NULL)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS acct(id int PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
    d = make_daemon(pg, mariadb, timeouts={"transaction_ms": 10000, "owner_grace_ms": 300})
    with d:
        yield d


@pytest.fixture
def coord(daemon):
    return Coordinator(daemon.url, daemon.token)


def test_commit_across_both(pg, mariadb, coord):
    with pg.connect() as pc:
        mc = mariadb.connect()
        with coord.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO acct VALUES (1, 100)")
            with tx.branch(mc, "my"):
                mc.cursor().execute("INSERT INTO acct VALUES (1, 200)")
        mc.close()
    assert tx.outcome == "commit"
    assert pg.sql("SELECT v FROM acct WHERE id = 1") == [(100,)]
    assert mariadb.sql("SELECT v FROM acct WHERE id = 1") == ((200,),)
    assert nothing_prepared(pg, mariadb)
    t = coord.get(tx.gtid)
    assert t["state"] == "committed"
    assert [b["state"] for b in t["branches"]] == ["finished", "finished"]
    assert {b["finished_by"] for b in t["branches"]} == {"owner"}


def test_abort_across_both(pg, mariadb, coord):
    with pg.connect() as pc:
        mc = mariadb.connect()
        with pytest.raises(ZeroDivisionError):
            with coord.transaction() as tx:
                with tx.branch(pc, "pg"):
                    pc.execute("INSERT INTO acct VALUES (2, 1)")
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO acct VALUES (2, 1)")
                1 / 0
        mc.close()
    assert pg.sql("SELECT count(*) FROM acct WHERE id = 2") == [(0,)]
    assert mariadb.sql("SELECT count(*) FROM acct WHERE id = 2") == ((0,),)
    assert nothing_prepared(pg, mariadb)
    assert coord.get(tx.gtid)["state"] == "aborted"


def test_single_branch_commits_in_one_phase(pg, coord):
    with pg.connect() as pc:
        with coord.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO acct VALUES (3, 3)")
    t = coord.get(tx.gtid)
    assert t["state"] == "committed" and t["branches"][0]["state"] == "finished"
    assert pg.sql("SELECT v FROM acct WHERE id = 3") == [(3,)]
    assert pg_prepared(pg) == []


def test_single_mariadb_branch_one_phase(mariadb, coord):
    mc = mariadb.connect()
    with coord.transaction() as tx:
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO acct VALUES (3, 33)")
    mc.close()
    assert coord.get(tx.gtid)["state"] == "committed"
    assert mariadb.sql("SELECT v FROM acct WHERE id = 3") == ((33,),)


def test_participant_joins_by_gtid(pg, mariadb, coord, daemon):
    """Service B gets the gtid as a plain string, joins, prepares and returns; the root
    decides; B's background thread finishes its branch on its own session."""
    errors = []

    def service_b(gtid: str, done: threading.Event, holder: list):
        try:
            other = Coordinator(daemon.url, daemon.token)
            mc = mariadb.connect()
            tx = other.join(gtid, wait=False)
            with tx:
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO acct VALUES (4, 44)")
            holder.append((tx, mc))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            done.set()

    holder = []
    with pg.connect() as pc:
        with coord.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO acct VALUES (4, 4)")
            done = threading.Event()
            threading.Thread(target=service_b, args=(tx.gtid, done, holder)).start()
            assert done.wait(30)
    assert not errors, errors
    btx, mc = holder[0]
    assert btx.wait(30) == "commit"
    mc.close()
    assert pg.sql("SELECT v FROM acct WHERE id = 4") == [(4,)]
    assert mariadb.sql("SELECT v FROM acct WHERE id = 4") == ((44,),)
    assert nothing_prepared(pg, mariadb)


def _write_skew(pg, mariadb, coord, two_phase: bool):
    """T_A reads x writes y, T_B reads y writes x (write skew): PostgreSQL's SSI refuses
    the later one to finish: at PREPARE (two-phase) or at COMMIT (one phase)."""
    pg.sql("CREATE TABLE IF NOT EXISTS skew(k text PRIMARY KEY, v int)")
    pg.sql("TRUNCATE skew")
    pg.sql("INSERT INTO skew VALUES ('x', 0), ('y', 0)")
    ca, cb = pg.connect(), pg.connect()
    ma, mb = mariadb.connect(), mariadb.connect()
    tx_b = coord.transaction()
    with pytest.raises(RetryableError) as ei:
        with tx_b:
            with tx_b.branch(cb, "pg"):
                cb.execute("SELECT v FROM skew WHERE k = 'y'").fetchall()
                cb.execute("UPDATE skew SET v = 1 WHERE k = 'x'")
            if two_phase:
                with tx_b.branch(mb, "my"):
                    mb.cursor().execute("SELECT 1")
            with coord.transaction() as tx_a:
                with tx_a.branch(ca, "pg"):
                    ca.execute("SELECT v FROM skew WHERE k = 'x'").fetchall()
                    ca.execute("UPDATE skew SET v = 1 WHERE k = 'y'")
                if two_phase:
                    with tx_a.branch(ma, "my"):
                        ma.cursor().execute("SELECT 1")
            assert tx_a.outcome == "commit"
    for c in (ca, cb, ma, mb):
        c.close()
    assert pg.sql("SELECT k, v FROM skew ORDER BY k") == [("x", 0), ("y", 1)]
    assert nothing_prepared(pg, mariadb)
    return ei.value, tx_b


def test_refused_prepare_is_retryable(pg, mariadb, coord):
    err, tx_b = _write_skew(pg, mariadb, coord, two_phase=True)
    assert isinstance(err, PrepareRefused)
    t = coord.get(tx_b.gtid)
    assert t["state"] == "aborted" and t["retryable"] is True


def test_refused_one_phase_commit_is_retryable(pg, mariadb, coord):
    err, _ = _write_skew(pg, mariadb, coord, two_phase=False)
    assert isinstance(err, RetryableError)


def test_serialization_failure_inside_a_branch_is_retryable(pg, mariadb, coord):
    """40001 raised by a statement (not by PREPARE) surfaces as RetryableError too, and
    the other branch is rolled back."""
    pg.sql("INSERT INTO acct VALUES (20, 0) ON CONFLICT DO NOTHING")
    pc, mc = pg.connect(), mariadb.connect()
    with pytest.raises(RetryableError) as ei:
        with coord.transaction() as tx:
            with tx.branch(mc, "my"):
                mc.cursor().execute("INSERT INTO acct VALUES (20, 1)")
            with tx.branch(pc, "pg"):
                pc.execute("SELECT v FROM acct WHERE id = 20").fetchall()   # snapshot taken
                pg.sql("UPDATE acct SET v = 5 WHERE id = 20")               # concurrent commit
                pc.execute("UPDATE acct SET v = v + 1 WHERE id = 20")       # 40001
    assert isinstance(ei.value.__cause__, psycopg.errors.SerializationFailure)
    pc.close()
    mc.close()
    assert coord.get(tx.gtid)["state"] == "aborted"
    assert mariadb.sql("SELECT count(*) FROM acct WHERE id = 20") == ((0,),)
    assert nothing_prepared(pg, mariadb)


def _snapshot(coord, gtid):
    t = coord.get(gtid)
    t.pop("age_ms")
    return t


def test_bad_requests_change_nothing(pg, coord, daemon):
    h = coord.http
    gtid = coord.begin()
    h.request("POST", f"/v1/transactions/{gtid}/branches", {"resource": "pg", "branch_id": "b1"})
    before = _snapshot(coord, gtid)

    def refused(method, path, body, status, code):
        with pytest.raises(CoordinatorError) as ei:
            h.request(method, path, body)
        assert (ei.value.status, ei.value.code) == (status, code), ei.value
        assert _snapshot(coord, gtid) == before

    T = f"/v1/transactions/{gtid}"
    refused("POST", f"{T}/branches", {"resource": "pg", "branch_id": "b1"}, 409, "duplicate_branch")
    refused("POST", f"{T}/branches", {"resource": "nope", "branch_id": "b2"}, 404, "unknown_resource")
    refused("POST", f"{T}/branches", {"resource": "pg", "branch_id": "x" * 65}, 400, "id_too_long")
    refused("POST", f"{T}/branches", {"resource": "pg", "branch_id": "a'; DROP TABLE acct; --"}, 400, "invalid_id")
    refused("POST", f"{T}/branches", {"resource": "pg", "branch_id": "b2", "extra": 1}, 400, "invalid_field")
    refused("POST", f"{T}/branches", {"resource": "pg"}, 400, "invalid_field")
    refused("POST", f"{T}/commit", None, 409, "branch_not_prepared")
    refused("POST", f"{T}/branches/zz/prepared", {}, 404, "unknown_branch")
    # All or nothing: b1 must not stay marked prepared when zz is unknown.
    refused("POST", f"{T}/commit", {"prepared": ["b1", "zz"]}, 404, "unknown_branch")
    refused("POST", f"{T}/commit", {"prepared": ["b1"], "one_phase_branch": "b1"}, 400, "invalid_field")
    refused("POST", f"{T}/finished", {"outcome": "commit", "branches": ["b1"]}, 409, "not_decided")
    refused("POST", f"{T}/finished", {"outcome": "commit", "branches": []}, 400, "invalid_field")
    refused("POST", f"{T}/branches/b1/finished", {"outcome": "commit"}, 409, "not_decided")
    refused("POST", f"{T}/branches/b1/finished", {"outcome": "maybe"}, 400, "invalid_field")
    refused("POST", f"{T}/commit", {"one_phase_branch": "zz"}, 404, "unknown_branch")
    refused("POST", "/v1/transactions/nope.x-1/commit", {}, 404, "unknown_transaction")
    refused("GET", f"{T}/decision?wait_ms=abc", None, 400, "invalid_field")
    refused("POST", "/v1/admin/force", {"gtid": gtid, "outcome": "commit", "operator": "t", "reason": "r", "confirm": False}, 400, "confirmation_required")
    refused("POST", "/v1/admin/force", {"gtid": gtid, "outcome": "commit", "operator": "t", "reason": "r", "confirm": True}, 409, "branch_not_prepared")
    # Begin together with a first branch is all or nothing: no transaction is left behind.
    n = len(coord.list())
    refused("POST", "/v1/transactions", {"branch": {"resource": "nope", "branch_id": "b1"}}, 404, "unknown_resource")
    refused("POST", "/v1/transactions", {"branch": {"resource": "pg", "branch_id": "b 1"}}, 400, "invalid_id")
    assert len(coord.list()) == n
    # Raw malformed JSON and a missing token.
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=5)
    c.request("POST", f"{T}/branches", body=b"{not json", headers={"Authorization": f"Bearer {daemon.token}"})
    r = c.getresponse()
    assert r.status == 400 and b"invalid_json" in r.read()
    c.request("POST", f"{T}/abort", body=b"{}")
    r = c.getresponse()
    assert r.status == 401 and b"unauthorized" in r.read()
    assert _snapshot(coord, gtid) == before
    # A state change that is refused after a decision: commit after abort, prepared after it.
    h.request("POST", f"{T}/abort", {})
    after_abort = _snapshot(coord, gtid)
    for path, code in [(f"{T}/commit", "transaction_aborted"), (f"{T}/branches/b1/prepared", "transaction_aborted")]:
        with pytest.raises(CoordinatorError) as ei:
            h.request("POST", path, {})
        assert ei.value.code == code
        assert _snapshot(coord, gtid) == after_abort


def test_bad_one_request_commits_leave_nothing(coord):
    """The one-request commit checks its body before any effect: each bad combination is
    refused (invalid_field, naming it) and the leased gtid stays out of the daemon's
    memory: asked for, it is a leased gtid with no outcome yet (owner_unavailable), as
    before the request, and its commit can still come."""
    h = coord.http
    lease = h.request("POST", "/v1/gtid-leases", {"count": 1})
    g = f"{lease['prefix']}{lease['first']:x}"
    two = [{"resource": "pg", "branch_id": "b0"}, {"resource": "pg", "branch_id": "b1"}]
    bad = [
        ({"branches": two, "decide_in": "b1", "read_only": ["b0"]}, "read_only"),
        ({"branches": two, "decide_in": "b9"}, '"b9" is not one of the listed branches'),
        ({"branches": two, "prepared": ["b0"]}, "branches excludes"),
        ({"branches": two, "one_phase_branch": "b0"}, "branches excludes"),
        ({"branches": []}, "1..1000"),
        ({"branches": two + [{"resource": "pg", "branch_id": "b0"}]}, '"b0" is listed twice'),
    ]
    for body, says in bad:
        with pytest.raises(CoordinatorError) as ei:
            h.request("POST", f"/v1/transactions/{g}/commit", body)
        assert (ei.value.status, ei.value.code) == (400, "invalid_field"), (body, ei.value)
        assert says in str(ei.value), (body, ei.value)
        with pytest.raises(CoordinatorError) as ei:
            h.request("GET", f"/v1/transactions/{g}")
        assert ei.value.code == "owner_unavailable" and "no recorded outcome yet" in str(ei.value), (body, ei.value)


def test_prepared_after_commit_decision_refused(pg, mariadb, coord):
    h = coord.http
    gtid = coord.begin()
    h.request("POST", f"/v1/transactions/{gtid}/branches", {"resource": "pg", "branch_id": "b1"})
    h.request("POST", f"/v1/transactions/{gtid}/branches/b1/prepared", {})
    h.request("POST", f"/v1/transactions/{gtid}/commit", {})
    with pytest.raises(CoordinatorError) as ei:
        h.request("POST", f"/v1/transactions/{gtid}/branches/b1/prepared", {})
    assert ei.value.code == "transaction_committed"
    with pytest.raises(CoordinatorError) as ei:
        h.request("POST", f"/v1/transactions/{gtid}/abort", {})
    assert ei.value.code == "transaction_committed"


def test_timeout_aborts_and_late_prepare_is_rolled_back(pg, mariadb, coord):
    """A branch registered, then prepared only after its transaction timed out: the late
    'prepared' report is refused, and even if its owner then vanishes, recovery rolls the
    branch back. No dangling prepared branch."""
    h = coord.http
    gtid = coord.begin(timeout_ms=300)
    r = h.request("POST", f"/v1/transactions/{gtid}/branches", {"resource": "pg", "branch_id": "late"})
    rm = h.request("POST", f"/v1/transactions/{gtid}/branches", {"resource": "my", "branch_id": "late2"})
    with pg.connect() as pc:
        pc.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        pc.execute("INSERT INTO acct VALUES (9, 9)")
        wait_until(lambda: coord.decision(gtid)["decision"] == "abort", what="timeout abort")
        pc.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(psycopg.sql.Literal(r["gid"])))
        with pytest.raises(CoordinatorError) as ei:
            h.request("POST", f"/v1/transactions/{gtid}/branches/late/prepared", {})
        assert ei.value.code == "transaction_aborted"
    # The owner "forgot" to roll back (or died): a MariaDB branch prepared late too, its
    # session gone.
    mc = mariadb.connect()
    x = rm["xid"]
    xid = f"{mc.escape(x['gtrid'])},{mc.escape(x['bqual'])},{x['format_id']}"
    with mc.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        cur.execute(f"XA START {xid}")
        cur.execute("INSERT INTO acct VALUES (9, 9)")
        cur.execute(f"XA END {xid}")
        cur.execute(f"XA PREPARE {xid}")
    mc.close()
    assert r["gid"] in pg_prepared(pg)
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to roll back the late branches")
    assert pg.sql("SELECT count(*) FROM acct WHERE id = 9") == [(0,)]
    assert mariadb.sql("SELECT count(*) FROM acct WHERE id = 9") == ((0,),)


def test_metrics_and_openapi(daemon, coord):
    import urllib.request
    text = metrics_text(daemon)
    for name in ["cotx_transactions_total{outcome=\"commit\"}", "cotx_decision_seconds_bucket", "cotx_in_doubt",
                 "cotx_recovery_actions_total"]:
        assert name in text
    import json
    doc = json.load(urllib.request.urlopen(daemon.url + "/openapi.json", timeout=5))
    assert doc["openapi"].startswith("3.") and "/v1/transactions/{gtid}/commit" in doc["paths"]


def test_invalid_config_is_refused_with_line(daemon, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('token = "0123456789abcdef"\n\n[[resources]]\nname = "x"\nkind = "oracle"\ndsn = "x"\n')
    from cotest.daemon import find_binary
    import subprocess
    r = subprocess.run([find_binary(), "check-config", "--config", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "line 5" in r.stderr and "kind" in r.stderr, r.stderr


def test_acknowledgements_carried_by_the_next_begin(pg, mariadb):
    """carry_acks: a committed transaction's "finished" is not a request of its own but
    rides with the next begin (one request fewer per transaction), and flush_acks() sends
    what is still held. Without carry_acks the acknowledgement goes at once (above)."""
    d = make_daemon(pg, mariadb, timeouts={"transaction_ms": 10000, "owner_grace_ms": 60000})
    with d, pg.connect() as pc:
        coord = Coordinator(d.url, d.token, carry_acks=True)
        mc = mariadb.connect()

        def transfer(k):
            with coord.transaction() as tx:
                with tx.branch(pc, "pg"):
                    pc.execute("INSERT INTO acct VALUES (%s, 1)", (k,))
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO acct VALUES (%s, 1)", (k,))
            return tx.gtid

        def states(g):
            return [(b["state"], b.get("finished_by")) for b in coord.get(g)["branches"]]

        g1 = transfer(31)
        # Committed at both databases, its acknowledgement held: the daemon has not heard.
        assert nothing_prepared(pg, mariadb)
        assert [s for s, _ in states(g1)] == ["prepared", "prepared"], states(g1)
        g2 = transfer(32)
        assert states(g1) == [("finished", "owner")] * 2, "carried by the second begin"
        assert [s for s, _ in states(g2)] == ["prepared", "prepared"]
        coord.flush_acks()
        wait_until(lambda: states(g2) == [("finished", "owner")] * 2, 5)
        mc.close()


def test_a_refused_begin_applies_no_acknowledgement(pg, mariadb):
    """Every check of a begin comes before any effect: a begin refused for its branches
    leaves the acknowledgements it carried unapplied."""
    d = make_daemon(pg, mariadb, timeouts={"transaction_ms": 10000, "owner_grace_ms": 60000})
    with d:
        h = Coordinator(d.url, d.token).http
        g = h.request("POST", "/v1/transactions", {"branches": [{"resource": "pg", "branch_id": "b1"}]})["gtid"]
        assert h.request("POST", f"/v1/transactions/{g}/commit", {"prepared": ["b1"]})["decision"] == "commit"
        ack = [{"gtid": g, "outcome": "commit", "branches": ["b1"]}]
        both = {"branch": {"resource": "pg", "branch_id": "x"}, "branches": [{"resource": "pg", "branch_id": "y"}]}
        for bad in (both, {"branches": []}):
            with pytest.raises(CoordinatorError) as e:
                h.request("POST", "/v1/transactions", {**bad, "finished": ack})
            assert e.value.code == "invalid_field"
            assert [b["state"] for b in h.request("GET", f"/v1/transactions/{g}")["branches"]] == ["prepared"]
        h.request("POST", "/v1/transactions", {"finished": ack})
        assert [b["state"] for b in h.request("GET", f"/v1/transactions/{g}")["branches"]] == ["finished"]
