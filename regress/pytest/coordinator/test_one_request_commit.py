"""The one-request commit (cotx_protocol::leased, checked by the model's "leased" mode):
a client leases a range of gtids (`POST /v1/gtid-leases`), prepares its branches under a
gtid of it that no daemon has heard of, and sends them with its commit — the only
request of the transaction. Real servers (PostgreSQL, MariaDB), plain 2PC, real daemons:

- the commit is one request, commits both branches, and is answered again when sent again;
- recovery leaves a leased gtid's prepared branches alone while the lease runs; once it
  ran out it records abort first, then rolls back, and the late commit is told "abort";
- the daemon killed (-9) between PREPARE and the commit request: the restarted daemon (a
  new epoch) records abort and rolls back, and the late commit is refused, never split;
- a second daemon takes the node over and does the same;
- a gtid that no range leased is never committed from a commit with branches; the old
  two-request path still works.
"""
import time

import psycopg
import pymysql
import pytest
from cotx import Coordinator
from cotest.coord import api, metric, nothing_prepared, peers, wait_until
from cotest.transfers import absent_both, committed_both

pytestmark = pytest.mark.usefixtures("crash_tables")

PLAIN = {"enforcement": "none"}


def lease(d, count=10, ttl_ms=None):
    body = {"count": count} | ({"ttl_ms": ttl_ms} if ttl_ms else {})
    st, r = api(d, "POST", "/v1/gtid-leases", body)
    assert st == 201, (st, r)
    return r


def gtids(r):
    return [r["prefix"] + format(r["first"] + i, "x") for i in range(r["count"])]


def prepare_both(pg, mariadb, r, gtid, key):
    """Both branches of a transfer prepared under `gtid` (the names the lease gave), their
    sessions closed; the branches as the commit request lists them."""
    pc = psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres", autocommit=True)
    pc.execute("BEGIN")
    pc.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
    pc.execute(f"PREPARE TRANSACTION '{r['gid_prefix']}:{gtid}:b-pg'")
    pc.close()
    mc = pymysql.connect(host="127.0.0.1", port=mariadb.port, user="root", database="test", autocommit=True)
    xid = f"'{gtid}','b-my',{r['xa_format_id']}"
    with mc.cursor() as c:
        c.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        c.execute(f"XA START {xid}")
        c.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
        c.execute(f"XA END {xid}")
        c.execute(f"XA PREPARE {xid}")
    mc.close()
    return [{"resource": "pg", "branch_id": "b-pg"}, {"resource": "my", "branch_id": "b-my"}]


def commit(d, gtid, branches):
    return api(d, "POST", f"/v1/transactions/{gtid}/commit", {"branches": branches})


def test_one_request_commits_both_branches(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 300}, **PLAIN)
    r = lease(d)
    g = gtids(r)[0]
    branches = prepare_both(pg, mariadb, r, g, "one-1")
    before = metric(d, "cotx_requests_total")
    st, body = commit(d, g, branches)
    # The metrics read before is counted when it is answered, the commit is the one other.
    assert (st, body["decision"]) == (200, "commit"), body
    assert metric(d, "cotx_requests_total") - before == 2, "more than one request for the transaction"
    wait_until(lambda: nothing_prepared(pg, mariadb), what="the daemon to complete both branches")
    assert committed_both(pg, mariadb, "one-1")
    # Sent again (a lost answer): answered as any commit asked twice.
    st, body = commit(d, g, branches)
    assert body.get("decision") == "commit" or body["error"]["code"] == "transaction_committed", (st, body)
    # A gtid of our epoch that no range leased (the next one begin will issue) is not
    # committed from a commit with branches: nothing is written for it.
    st, body = commit(d, r["prefix"] + format(r["first"] + r["count"] + 100, "x"), branches)
    assert st >= 400 and body["error"]["code"] == "unknown_transaction", body


def test_old_clients_keep_the_two_request_commit(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, **PLAIN)
    coord = Coordinator(d.url, d.token)
    pc, mc = pg.connect(), mariadb.connect()
    with coord.transaction() as tx:
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO crash VALUES ('one-old', 1)")
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO crash VALUES ('one-old', 1)")
    assert tx.outcome == "commit" and committed_both(pg, mariadb, "one-old")


def test_a_lapsed_lease_is_aborted_on_record_and_the_late_commit_is_told_so(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts={"recovery_interval_ms": 300}, **PLAIN)
    r = lease(d, count=2, ttl_ms=2500)
    g = gtids(r)[0]
    branches = prepare_both(pg, mariadb, r, g, "one-lapsed")
    # Passes every 0.3 s: the branches stay while the lease runs.
    time.sleep(1.5)
    assert not nothing_prepared(pg, mariadb), "recovery rolled back a gtid of a live lease"
    # No record yet: never answered "abort" (the commit may still come).
    st, body = api(d, "GET", f"/v1/transactions/{g}/decision")
    assert st == 503 and body["error"]["code"] == "owner_unavailable", (st, body)
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to abort the lapsed gtid")
    st, body = commit(d, g, branches)
    assert not (st == 200 and body.get("decision") == "commit"), body
    assert body.get("decision") == "abort" or body["error"]["code"] == "transaction_aborted", body
    assert absent_both(pg, mariadb, "one-lapsed")


def test_daemon_killed_between_prepare_and_commit(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts={"recovery_interval_ms": 300}, **PLAIN)
    r = lease(d, count=2, ttl_ms=60000)
    g = gtids(r)[0]
    branches = prepare_both(pg, mariadb, r, g, "one-killed")
    d.kill9()
    d.start()
    # A new epoch: the old one's leases are unknown; its abort is recorded, then rolled back.
    wait_until(lambda: nothing_prepared(pg, mariadb), what="the restarted daemon to roll back")
    st, body = commit(d, g, branches)
    assert st >= 400 and body["error"]["code"] == "transaction_aborted", (st, body)
    assert absent_both(pg, mariadb, "one-killed")


def test_a_takeover_aborts_on_record_and_refuses_the_late_commit(pg, mariadb, daemons, store_db):
    a, b = peers(pg, mariadb, daemons, "one_t", ["one-a", "one-b"], lease={"ttl_ms": 1500, "renew_ms": 300},
                 timeouts={"recovery_interval_ms": 300}, **PLAIN)
    a.start()
    b.start()
    r = lease(a, count=2, ttl_ms=60000)
    g = gtids(r)[0]
    branches = prepare_both(pg, mariadb, r, g, "one-taken")
    a.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="b to take node one-a over and roll back")
    st, body = commit(b, g, branches)
    assert not (st == 200 and body.get("decision") == "commit"), body
    assert st >= 400 and body["error"]["code"] == "transaction_aborted", (st, body)
    assert absent_both(pg, mariadb, "one-taken")
