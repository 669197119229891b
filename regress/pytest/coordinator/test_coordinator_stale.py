"""A daemon must never answer from what it held in memory once the store says
otherwise. Three daemons on one PostgreSQL store, transfers from PostgreSQL to MariaDB
through the HTTP API, tried as a hostile operator would:

1. a daemon paused past its lease, taken over, finished and handed back, asked to commit;
2. the store paused while commits are in flight and clients give up; the store stopped,
   then back, with decision writes waiting for their retry; the Python client's commit
   waiting through a stopped store;
3. a commit record made unreadable while its owner still holds the decision in memory;
4. a committed, finished transaction asked about after a restart, and after the retention.

Each test failed on the coordinator before the fix it checks (cotx-coordinator of
3ef333e)."""
import os
import signal
import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from cotx import Coordinator
from cotest.coord import api, decision_of, make_daemon, metric, nothing_prepared, peers, wait_until
from cotest.transfers import absent_both, committed_both, prepared_transfer, transfer

pytestmark = pytest.mark.usefixtures("crash_tables", "store_db")

LEASE = {"ttl_ms": 1500, "renew_ms": 300}


def store_sql(pg, sql, *args):
    dsn = pg.dsn.replace("dbname=postgres", "dbname=cotx_log")
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(sql, args or None)
        return cur.fetchall() if cur.description else None


def committed_transfer(d, pg, mariadb, key):
    tx, _ = transfer(d, pg, mariadb, key)
    tx.commit()
    assert tx.outcome == "commit"
    assert committed_both(pg, mariadb, key)
    return tx.gtid


def settled(pred):
    """pred() over the databases, False while pg_co refuses the read (rule C: a branch it
    would have to see is still in doubt)."""
    try:
        return pred()
    except psycopg.errors.SerializationFailure:
        return False


@contextmanager
def stoppable_store(table):
    """A PostgreSQL server of its own as the decision store: (the server, the store's config)."""
    from cotest import PgServer
    with PgServer() as store_pg:
        store_pg.sql("CREATE DATABASE cotx_log")
        yield store_pg, {"kind": "postgres", "dsn": store_pg.dsn.replace("dbname=postgres", "dbname=cotx_log"),
                         "table": table}


def pause(proc_pid):
    os.kill(proc_pid, signal.SIGSTOP)


def resume(proc_pid):
    os.kill(proc_pid, signal.SIGCONT)


# --- 1. a stale daemon answers "commit" for what its successor aborted ---------------------

def test_daemon_paused_past_a_takeover_and_handback_never_commits(pg, mariadb, daemons):
    a, b, c = peers(pg, mariadb, daemons, "stale_t", ["stale-a", "stale-b", "stale-c"], lease=LEASE,
                    timeouts={"transaction_ms": 60000})
    for d in (a, b, c):
        d.start()
    gtid = prepared_transfer(a, pg, mariadb, "stale-1")
    pause(a.proc.pid)
    a.stopped = True
    try:
        wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="a survivor to take node stale-a over and roll back")
        # ... and give the node back once everything of it is finished (its lease row goes).
        wait_until(lambda: store_sql(pg, "SELECT count(*) FROM stale_t_nodes WHERE node = 'stale-a'") == [(0,)],
                   timeout=30, what="the survivor to hand node stale-a back")
    finally:
        resume(a.proc.pid)
        a.stopped = False
    # A's next renewal after the pause finds its lease gone (the event the sleep stood for).
    wait_until(lambda: (metric(a, "cotx_lease_losses_total") or 0) >= 1, timeout=15,
               what="A to find its node lease lost")
    st, body = api(a, "POST", f"/v1/transactions/{gtid}/commit", {})
    assert not (st == 200 and body.get("decision") == "commit"), (st, body, a.log_tail(30))
    assert absent_both(pg, mariadb, "stale-1")
    # Every daemon gives the same answer, A included, once it has its node back.
    wait_until(lambda: {decision_of(d, gtid) for d in (a, b, c)} == {"abort"}, timeout=15,
               what="A, B and C to answer abort")
    assert "node lease lost" in a.log_tail(200)
    assert "paused or cut off" in a.log_tail(200)
    assert metric(a, "cotx_lease_losses_total") >= 1
    # A keeps serving: a new transfer through it commits.
    committed_transfer(a, pg, mariadb, "stale-2")


# --- 2. stuck in "committing" after the store paused ------------------------------------------

def test_commits_in_flight_while_the_store_is_paused_are_answered_once_it_is_back(pg, mariadb, daemons):
    with stoppable_store("paused_t") as (store_pg, store):
        ds = [daemons(make_daemon(pg, mariadb, node_id=n, store=store, lease={"ttl_ms": 3000, "renew_ms": 750},
                                  timeouts={"owner_grace_ms": 1000, "transaction_ms": 120000})) for n in ("pz-a", "pz-b", "pz-c")]
        for d in ds[1:]:
            d.token = ds[0].token
            d.write_config()
        for d in ds:
            d.start()
        a = ds[0]
        gtids = [prepared_transfer(a, pg, mariadb, f"paused-{i}") for i in range(4)]
        # Every process of the store server stops (postmaster and backends).
        pm = int((store_pg.data / "postmaster.pid").read_text().split()[0])
        pids = [pm] + [int(p) for p in os.popen(f"pgrep -P {pm}").read().split()]
        for p in pids:
            pause(p)
        try:
            # Commits in flight, all at once while the lease is still good; each client gives
            # up after 2 s.
            def ask_commit(g):
                try:
                    Coordinator(a.url, a.token, timeout=2).http.request("POST", f"/v1/transactions/{g}/commit", {})
                except Exception:  # noqa: BLE001 - the client gives up (timeout): what we test
                    pass
            threads = [threading.Thread(target=ask_commit, args=(g,)) for g in gtids]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # The operator sees them in doubt during the outage (memory and the databases,
            # not the store, answer this).
            st, rep = api(a, "GET", "/v1/in-doubt")
            assert st == 200 and set(gtids) <= {t["gtid"] for t in rep["transactions"]}, (st, rep)
            # The outage itself is the test: the store stays paused many leases (1.5 s)
            # long, well past the clients giving up (2 s), so the daemons' renewals and
            # the queued commit records all wait on it. Then the daemon must have said so.
            time.sleep(12)
            wait_until(lambda: "decision store is not answering" in a.log_tail(300), timeout=10,
                       what="A to log the store's outage while it lasts")
            outage_log = a.log_tail(300)
        finally:
            for p in pids:
                resume(p)
        # Once the store is back, every transaction is answered alike by every daemon:
        # "commit" where its commit record reached the store (completed in both within a
        # few seconds), otherwise "abort" (never committed anywhere).
        wait_until(lambda: "decision store answers again" in a.log_file.read_text(errors="replace"), timeout=30,
                   what="A's store to answer again")
        outcomes = {}
        for i, g in enumerate(gtids):
            key = f"paused-{i}"
            # A's final word. A commit whose record write failed at the store's return
            # (a connection reset: unknown whether it was written) is written by A's retry
            # a moment later, so the store is not read at one instant. The client, given
            # up, asks to abort meanwhile (refused while A is committing; asked again
            # while A takes its node back, if a survivor took it over during the outage).
            seen = []

            def final(g=g):
                answer = api(a, "POST", f"/v1/transactions/{g}/abort", {"reason": "client gave up"})
                seen[:] = [answer, {d.node_id: decision_of(d, g) for d in ds}]
                return seen[1]["pz-a"] if seen[1]["pz-a"] in ("commit", "abort") else None
            try:
                outcomes[g] = wait_until(final, timeout=30, what=f"A to answer commit or abort for {g}")
            except AssertionError as e:
                # What A last answered, each daemon's decision and each one's lines about g.
                lines = {d.node_id: [ln for ln in d.log_file.read_text(errors="replace").splitlines() if g in ln][-15:]
                         for d in ds}
                raise AssertionError(f"{e}; last abort answer and decisions: {seen}; log lines: {lines}") from None
            with psycopg.connect(store["dsn"], autocommit=True) as c:
                stored = c.execute("SELECT outcome FROM paused_t WHERE gtid = %s", (g,)).fetchall()
            if outcomes[g] == "commit":
                assert stored == [("commit",)], (g, stored)
                wait_until(lambda: {decision_of(d, g) for d in ds} == {"commit"}, timeout=8,
                           what=f"every daemon to answer commit for {g}, committed in the store")
                wait_until(lambda: settled(lambda: committed_both(pg, mariadb, key)), timeout=30, what=f"{key} committed in both")
            else:
                assert ("commit",) not in stored, (g, stored)
                wait_until(lambda: settled(lambda: absent_both(pg, mariadb, key)), timeout=30, what=f"{key} rolled back in both")
                assert "commit" not in {decision_of(d, g) for d in ds}
        assert "commit" in outcomes.values(), f"no commit reached the store: the test did not test anything ({outcomes})"
        # The outage was said while it lasted, not only afterwards.
        assert "decision store is not answering" in outage_log, outage_log[-3000:]


def test_decisions_left_to_retry_are_written_once_the_store_answers_again(pg, mariadb, daemons):
    """The store stopped (connections refused) when commits are asked: each decision write
    fails at once and is retried in the background with a growing delay (doubling from
    timeouts.retry_initial_ms up to retry_max_ms). Once the store answers again, the
    pending decisions are written then, not after the delay they had grown to: a client
    polling for its outcome would wait that long, or give up. Before, the last retry of the
    outage set the next one up to 10 s after it, whether the store was back or not."""
    with stoppable_store("back_t") as (store_pg, store):
        a = daemons(make_daemon(pg, mariadb, node_id="sb-a", store=store, lease={"ttl_ms": 3000, "renew_ms": 750},
                                timeouts={"retry_initial_ms": 100, "retry_max_ms": 10000}))
        a.start()
        gtids = [prepared_transfer(a, pg, mariadb, f"back-{i}") for i in range(3)]
        store_pg.stop()
        for g in gtids:
            st, body = api(a, "POST", f"/v1/transactions/{g}/commit", {})
            assert st == 503 and body["error"]["code"] == "store_unavailable", (st, body)
        # Down long enough for the retries' delay to pass 6 s (0.1 + 0.2 + … + 6.4 = 12.7 s):
        # with the delay alone the next retry comes about 8 s after the store is back.
        time.sleep(14)
        store_pg.start()
        wait_until(lambda: {decision_of(a, g) for g in gtids} == {"commit"}, timeout=4,
                   what="every pending decision written within seconds of the store answering again")
        for i in range(len(gtids)):
            wait_until(lambda: settled(lambda: committed_both(pg, mariadb, f"back-{i}")), timeout=30,
                       what=f"back-{i} committed in both")
        wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="nothing prepared")


@pytest.mark.parametrize("one_request", [False, True], ids=["begin-path", "one-request"])
def test_a_client_commit_rides_out_a_stopped_store(pg, mariadb, daemons, one_request):
    """The Python client commits while the store is stopped: the daemon answers 503
    store_unavailable (the decision is pending), which the retry rules read as "poll the
    decision"; the client waits, and once the store is back its commit returns committed,
    no error raised, applied once."""
    with stoppable_store("ride_t") as (store_pg, store):
        a = daemons(make_daemon(pg, mariadb, node_id="ride-a", store=store))
        a.start()
        key = f"ride-{int(one_request)}"
        tx = Coordinator(a.url, a.token, one_request=one_request).transaction()
        pc, mc = pg.connect(), mariadb.connect()
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO crash VALUES (%s, 1)", (key,))
        store_pg.stop()
        failed = []

        def commit():
            try:
                tx.commit()
            except Exception as e:  # noqa: BLE001 - what the test checks
                failed.append(e)
        t = threading.Thread(target=commit)
        t.start()
        wait_until(lambda: "decision store write failed; retrying" in a.log_file.read_text(errors="replace"),
                   timeout=30, what="the commit to find the store stopped")
        time.sleep(3)
        assert t.is_alive(), f"the client did not wait for the store: {failed}"
        store_pg.start()
        t.join(timeout=60)
        assert not t.is_alive() and not failed, failed
        assert tx.outcome == "commit"
        wait_until(lambda: committed_both(pg, mariadb, key), timeout=30, what=f"{key} committed in both")


# --- 3. answers from memory over a quarantined record -----------------------------------------

def test_a_quarantined_record_is_answered_alike_by_every_daemon(pg, mariadb, daemons):
    a, b = peers(pg, mariadb, daemons, "quar_t", ["quar-a", "quar-b"], lease=LEASE,
                 timeouts={"owner_grace_ms": 600000})
    a.start()
    b.start()
    gtid = prepared_transfer(a, pg, mariadb, "quar-1")
    st, body = api(a, "POST", f"/v1/transactions/{gtid}/commit", {})
    assert (st, body.get("decision")) == (200, "commit")
    store_sql(pg, "UPDATE quar_t SET outcome = 'comit' WHERE gtid = %s", gtid)
    assert decision_of(b, gtid) == "quarantined"
    # A, which decided it, says the same once its recovery pass has read the store.
    wait_until(lambda: decision_of(a, gtid) == "quarantined", timeout=10, what="A to answer quarantined too")
    st, body = api(a, "POST", f"/v1/transactions/{gtid}/commit", {})
    assert st == 503 and body["error"]["code"] == "quarantined", (st, body)


# --- 4. a finished committed transaction must not read as presumed abort ---------------------

def test_finished_commits_stay_answerable_after_a_restart(pg, mariadb, daemons):
    a, b = peers(pg, mariadb, daemons, "kept_t", ["kept-a", "kept-b"], lease=LEASE, timeouts={"retention_ms": 0})
    a.start()
    b.start()
    gtid = committed_transfer(a, pg, mariadb, "kept-1")
    # Owners' reports and the record's bookkeeping done: the record is marked finished.
    wait_until(lambda: store_sql(pg, "SELECT finished_ms IS NOT NULL FROM kept_t WHERE gtid = %s", gtid) == [(True,)],
               timeout=15, what="the record to be marked finished")
    a.restart()
    b.restart()
    # The client lost the answer and asks again, of either daemon, after the restart.
    assert {decision_of(a, gtid), decision_of(b, gtid)} == {"commit"}
    st, body = api(a, "POST", f"/v1/transactions/{gtid}/commit", {})
    assert (st, body.get("decision")) == (200, "commit"), (st, body)
    # Any other call on it says the recorded outcome, on every daemon: never "presumed
    # abort" (its owner said so before the daemon's answers became cotx_protocol's rule),
    # nor "ask its owner" (another daemon), for a committed transaction.
    for d in (a, b):
        st, body = api(d, "POST", f"/v1/transactions/{gtid}/abort", {})
        assert (st, body["error"]["code"]) == (409, "transaction_committed"), (d.url, st, body)


def test_a_purged_outcome_is_forgotten_not_aborted(pg, mariadb, daemons):
    a, b = peers(pg, mariadb, daemons, "gone_t", ["gone-a", "gone-b"], lease=LEASE,
                 timeouts={"retention_ms": 0, "outcome_retention_ms": 4000})
    a.start()
    b.start()
    gtid = committed_transfer(a, pg, mariadb, "gone-1")
    assert decision_of(b, gtid) == "commit"
    # After the retention the record is purged: "forgotten", never "abort".
    wait_until(lambda: decision_of(a, gtid) == "outcome_forgotten", timeout=20, what="the record to be purged")
    st, body = api(a, "GET", f"/v1/transactions/{gtid}/decision")
    assert st == 410, (st, body)
    assert decision_of(b, gtid) == "outcome_forgotten"
    st, body = api(a, "POST", f"/v1/transactions/{gtid}/commit", {})
    assert (st, body["error"]["code"]) == (410, "outcome_forgotten"), (st, body)
    # A gtid of the same epoch above the purge watermark was never recorded: its owner
    # presumes abort; another daemon does not (only the owner may).
    node, rest = gtid.split(".", 1)
    epoch, seq = rest.rsplit("-", 1)
    later = f"{node}.{epoch}-{int(seq, 16) + 1000:x}"
    assert decision_of(a, later) == "unknown_transaction"
    assert decision_of(b, later) == "wrong_node"
