"""Client mode (docs/client-mode.md): commitment ordering on servers where neither pg_co
nor mysql_co can be loaded, by Sonata's shims run by the daemon and the client.

- the daemon tells each resource's mode (engine, client, none) and shows it; a resource
  that can do neither is refused by name, never run as plain 2PC;
- helper transactions and slots are let go once their branches settle, whatever the
  outcome;
- kill -9 of the client process or of the daemon at every step of a shimmed branch
  leaves nothing prepared, no transaction split, no helper behind;
- a MariaDB restart between prepare and decision: recovered branches have lost their read
  locks, so the daemon admits no new branch there until they are decided (shown first
  without the gate: the lost lock lets a conflicting writer commit).

The exhaustive schedules in client mode are test_schedules_client_mode.py's; the demo's
`--mode client` is test_e2e_demo.py's.
"""
from __future__ import annotations
import json
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request

import pytest
from cotest import MariaServer, PgServer
from cotest.coord import make_daemon, metric, my_prepared, pg_prepared, wait_until
from cotest.transfers import run_transfer, transfer as crash_transfer
from cotx import Coordinator
from cotx.errors import CoordinatorError, CotxError


@pytest.fixture(scope="module")
def bare_pg(bare_pg):
    bare_pg.sql("CREATE TABLE crash(k text PRIMARY KEY, v int NOT NULL)")
    return bare_pg


@pytest.fixture(scope="module")
def bare_my(bare_my):
    bare_my.sql("CREATE TABLE crash(k varchar(64) PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
    return bare_my


def resources(d):
    req = urllib.request.Request(d.url + "/v1/resources", headers={"Authorization": f"Bearer {d.token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return {x["name"]: x for x in json.loads(r.read())["resources"]}


def readyz(d):
    """(status, body) of GET /readyz, served without a credential."""
    try:
        with urllib.request.urlopen(d.url + "/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def settled(pg, my):
    """Nothing prepared on either server: no branch, no helper."""
    return not pg_prepared(pg) and not my_prepared(my)


def rows(pg, my, key):
    return (pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,))[0][0],
            my.sql("SELECT count(*) FROM crash WHERE k = %s", (key,))[0][0])


def transfer(d, pg, my, key):
    """cotest.transfers' transfer, with its two branches."""
    tx, _ = crash_transfer(d, pg, my, key)
    bp, bm = tx._branches
    return tx, bp, bm


def test_each_resource_gets_the_mode_it_can_do_and_shows_it(pg, mariadb, bare_pg, bare_my):
    """auto: engine where pg_co / mysql_co enforce, client where they are absent; in the
    registration's answer, the branch, the listing, the CLI and /metrics."""
    from cotest.daemon import Daemon
    d = Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn}, {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn},
                {"name": "bare-pg", "kind": "postgres", "dsn": bare_pg.dsn},
                {"name": "bare-my", "kind": "mariadb", "dsn": bare_my.dsn}])
    with d:
        tx = Coordinator(d.url, d.token).transaction()
        modes = {}
        for name, srv in (("pg", pg), ("my", mariadb), ("bare-pg", bare_pg), ("bare-my", bare_my)):
            conn = srv.connect()
            with tx.branch(conn, name) as b:
                pass
            modes[name] = (b.enforcement, b.shim_key is not None)
        tx.abort("test")
        assert modes == {"pg": ("engine", False), "my": ("engine", False), "bare-pg": ("client", True), "bare-my": ("client", True)}
        res = resources(d)
        assert {n: r["enforcement"]["mode"] for n, r in res.items()} == {"pg": "engine", "my": "engine", "bare-pg": "client", "bare-my": "client"}
        assert all(r["enforcement"]["configured"] == "auto" for r in res.values())
        assert metric(d, 'cotx_resource_enforcement{resource="bare-pg",mode="client"}') == 1
        assert metric(d, 'cotx_resource_enforcement{resource="pg",mode="engine"}') == 1
        cli = d.cli("resources")
        assert cli.returncode == 0, cli.stderr
        assert "bare-pg (postgres): up" in cli.stdout and "enforcement client (configured auto)" in cli.stdout, cli.stdout
        assert "pg (postgres): up, 0 prepared branch(es); enforcement engine" in cli.stdout
        # The daemon's log says which mode each resource is in.
        assert '"mode":"client"' in d.log_tail(200).replace("\\", "").replace(" ", "")
        wait_until(lambda: not pg_prepared(bare_pg), 10, "the aborted branch's helper rolled back\n" + d.log_tail(60))


def test_a_resource_that_can_do_neither_is_refused_by_name(bare_pg, bare_my):
    """Never plain 2PC by accident: no prepared transactions (client mode impossible) and
    no pg_co (engine impossible) → every registration is refused with the resource's name
    and the reasons; `engine` on a server without pg_co likewise. Nothing is left behind."""
    from cotest.daemon import Daemon
    with PgServer(preload=False, conf={"max_prepared_transactions": 0}) as no2pc:
        d = Daemon([{"name": "no2pc", "kind": "postgres", "dsn": no2pc.dsn},
                    {"name": "forced", "kind": "postgres", "dsn": bare_pg.dsn, "enforcement": "engine"}])
        with d:
            c = Coordinator(d.url, d.token)
            for name, srv, words in (("no2pc", no2pc, ["max_prepared_transactions = 0", "pg_co is not in shared_preload_libraries"]),
                                     ("forced", bare_pg, ['enforcement = "engine"', "pg_co is not in shared_preload_libraries"])):
                tx = c.transaction()
                with pytest.raises(CoordinatorError) as e:
                    with tx.branch(srv.connect(), name):
                        pass
                assert e.value.status == 409 and e.value.code == "resource_refused", e.value
                assert f"resource {name} cannot be used" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
                assert resources(d)[name]["enforcement"]["mode"] == "refused"
            assert not pg_prepared(no2pc) and not pg_prepared(bare_pg)
            # Its readiness says so too (before: /healthz answered ok, and nothing but the
            # first branch's refusal told), while liveness stays ok.
            code, ready = readyz(d)
            assert code == 503 and ready["status"] == "not_ready", ready
            assert [p.split(":")[0] for p in ready["problems"]] == ["resource no2pc", "resource forced"], ready
        with make_daemon(bare_pg, bare_my) as ok:
            wait_until(lambda: readyz(ok)[0] == 200, 15, "a daemon whose resources can each enforce is ready")
            assert readyz(ok)[1] == {"status": "ready", "node_id": readyz(ok)[1]["node_id"], "problems": []}


def test_helpers_and_slots_are_let_go_whatever_the_outcome(bare_pg, bare_my):
    """Commit, abort, a refused prepare and a failed branch: afterwards no helper is
    prepared and no slot held; the rows are there exactly for the committed one."""
    with make_daemon(bare_pg, bare_my) as d:
        tx, _, _ = transfer(d, bare_pg, bare_my, "ok")
        tx.commit()
        tx, _, _ = transfer(d, bare_pg, bare_my, "aborted")
        tx.abort("test")
        tx = Coordinator(d.url, d.token).transaction()
        with pytest.raises(Exception):
            with tx:
                with tx.branch(bare_pg.connect(), "pg") as b:
                    b.conn.execute("SELECT 1/0")
        # A REPEATABLE READ branch on a client-mode resource is refused before it runs.
        tx = Coordinator(d.url, d.token).transaction()
        with pytest.raises(CotxError, match="client mode.*must be SERIALIZABLE"):
            with tx.branch(bare_my.connect(), "my", isolation="REPEATABLE READ"):
                pass
        tx.abort("test")
        wait_until(lambda: settled(bare_pg, bare_my), 15, "no helper or branch left prepared")
        wait_until(lambda: all(r["enforcement"]["slots_in_use"] == 0 for r in resources(d).values()), 15, "slots freed")
        assert rows(bare_pg, bare_my, "ok") == (1, 1) and rows(bare_pg, bare_my, "aborted") == (0, 0)


def test_helpers_are_let_go_when_the_request_thread_ends_at_its_commit(bare_pg, bare_my):
    """A thread per request that ends right after its commit (as ThreadingHTTPServer and
    the demo's services run): the branch's "finished" acknowledgement is the thread's last
    request, and its connection closes with the thread. The helpers must go as soon as
    that acknowledgement arrives, not `owner_grace_ms` (here 5 s) later: they count
    against max_prepared_transactions. Before the daemon served a request whose client
    had half-closed (hyper's half_close), several stayed prepared for the whole grace."""
    import threading
    with make_daemon(bare_pg, bare_my, timeouts={"owner_grace_ms": 5000}) as d:
        coord = Coordinator(d.url, d.token)

        def request(i):
            pc, mc = bare_pg.connect(), bare_my.connect()
            with coord.transaction() as tx:
                with tx.branch(pc, "pg"):
                    pc.execute("INSERT INTO crash VALUES (%s, 1)", (f"thr-{i}",))
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO crash VALUES (%s, 1)", (f"thr-{i}",))
            pc.close()
            mc.close()

        for i in range(15):
            t = threading.Thread(target=request, args=(i,))
            t.start()
            t.join()
        # The grace is 5 s: within 2 s every helper is gone only if the acknowledgements
        # were served.
        wait_until(lambda: not pg_prepared(bare_pg), 2, "every helper rolled back well inside owner_grace_ms")
        assert rows(bare_pg, bare_my, "thr-14") == (1, 1)


CLIENT = textwrap.dedent('''
    import os, signal, sys
    import psycopg, pymysql
    from cotx import Coordinator
    url, token, pg_port, my_port, key, step = sys.argv[1:]
    def die(at):
        if at == step:
            print("killed at", at, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    pc = psycopg.connect(host="127.0.0.1", port=int(pg_port), user="postgres", dbname="postgres", autocommit=True)
    mc = pymysql.connect(host="127.0.0.1", port=int(my_port), user="root", database="test", autocommit=True)
    tx = Coordinator(url, token).transaction()
    with tx.branch(pc, "pg") as bp:
        pc.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
    with tx.branch(mc, "my") as bm:
        mc.cursor().execute("INSERT INTO crash VALUES (%s, 1)", (key,))
    die("registered")                  # helper prepared, branches active
    bp._sql.shim_touch(pc, bp.shim_key)
    bm._sql.shim_touch(mc, bm.shim_key)
    die("touched")                     # slots written, nothing prepared
    mine = tx.prepare_all(report=False)
    die("prepared")                    # both prepared, not decided
    decision = tx._commit_call({"prepared": mine})
    die("decided")                     # commit recorded, helpers still prepared
    bp.finish(decision)
    die("one_finished")                # PostgreSQL committed, MariaDB prepared
    bm.finish(decision)
    print("done", decision, flush=True)
''')

STEPS = ["registered", "touched", "prepared", "decided", "one_finished", "none"]


@pytest.mark.parametrize("step", STEPS)
def test_kill9_of_the_client_at_every_step_leaves_nothing_prepared_or_split(bare_pg, bare_my, step):
    with make_daemon(bare_pg, bare_my, timeouts={"transaction_ms": 1500, "owner_grace_ms": 300}) as d:
        key = f"client-{step}"
        p = subprocess.run([sys.executable, "-c", CLIENT, d.url, d.token, str(bare_pg.port), str(bare_my.port), key, step],
                           capture_output=True, text=True, timeout=60)
        if step == "none":
            assert p.returncode == 0 and "done commit" in p.stdout, p.stderr
        else:
            assert p.returncode == -signal.SIGKILL and f"killed at {step}" in p.stdout, (p.stdout, p.stderr)
        wait_until(lambda: settled(bare_pg, bare_my), 30, f"nothing prepared after the client died at {step!r}")
        committed = step in ("decided", "one_finished", "none")
        assert rows(bare_pg, bare_my, key) == ((1, 1) if committed else (0, 0)), step
        wait_until(lambda: all(r["enforcement"]["slots_in_use"] == 0 for r in resources(d).values()), 15, "slots freed")


@pytest.mark.parametrize("step", ["registered", "prepared", "decided", "one_finished"])
def test_kill9_of_the_daemon_at_every_step_leaves_nothing_prepared_or_split(bare_pg, bare_my, step):
    """The daemon dies with helpers prepared; its restart recovers them (after deciding
    the branches) before it admits a new client-mode branch."""
    assert settled(bare_pg, bare_my), "an earlier test left branches prepared"
    with make_daemon(bare_pg, bare_my, timeouts={"transaction_ms": 3000, "owner_grace_ms": 300}) as d:
        key = f"daemon-{step}"
        tx, bp, bm = transfer(d, bare_pg, bare_my, key)
        decision = None
        if step != "registered":
            mine = tx.prepare_all(report=False)
        if step in ("decided", "one_finished"):
            decision = tx._commit_call({"prepared": mine})
            assert decision == "commit"
        if step == "one_finished":
            bp.finish(decision, ack=False)
        d.kill9()
        assert any(".h" in g for g in pg_prepared(bare_pg)), "a helper should be prepared when the daemon dies"
        # The application finishes what it can without the daemon: an undecided branch is
        # rolled back by its owner, a decided one committed (its acknowledgement is lost).
        if step == "registered":
            bp.rollback()
            bm.rollback()
        elif decision:
            for b in (bp, bm):
                if b.state == "prepared":
                    try:
                        b.finish(decision, ack=False)
                    except Exception:  # noqa: BLE001
                        pass
        for b in (bp, bm):
            b.conn.close()
        d.start()
        # A new client-mode branch is admitted only once the old helpers are recovered; until
        # the old branches are decided the restart gate may refuse it, "not now", and the
        # client's retry path runs it again (the test below).
        run_transfer(d, bare_pg, bare_my, key + "-after")
        wait_until(lambda: settled(bare_pg, bare_my), 30, f"nothing prepared after the daemon died at {step!r}")
        assert rows(bare_pg, bare_my, key) == ((1, 1) if decision else (0, 0)), step
        assert rows(bare_pg, bare_my, key + "-after") == (1, 1)


def killed_after_commit_with_recovery_held(d, pg, my, key: str):
    """A transfer on daemon d committed (both branches prepared, the decision written), d
    killed -9 before it finished them, the application's sessions closed; then MariaDB's
    global read lock taken, which holds the next recovery's XA COMMIT. Returns the
    connection that holds the lock (UNLOCK TABLES on it lets the recovery go on)."""
    tx, bp, bm = transfer(d, pg, my, key)
    mine = tx.prepare_all(report=False)
    assert tx._commit_call({"prepared": mine}) == "commit"
    d.kill9()
    for b in (bp, bm):
        b.conn.close()
    hold = my.connect()
    hold.cursor().execute("FLUSH TABLES WITH READ LOCK")
    return hold


def both_committed_after_the_restart(pg, my, key: str) -> None:
    """Nothing left prepared; the transfer of `key` and the one run after the restart
    (`key`-after) both committed on both servers."""
    wait_until(lambda: settled(pg, my), 30, "nothing prepared")
    assert rows(pg, my, key) == (1, 1)
    assert rows(pg, my, key + "-after") == (1, 1)


def test_a_registration_refused_while_a_restarted_daemon_recovers_is_admitted_by_the_retry_path(bare_pg, bare_my):
    """A daemon restarted with a committed branch still prepared at MariaDB closes the
    restart gate at its first look (it cannot know whether MariaDB restarted while it was
    away) until its recovery has committed that branch. A registration in between is
    refused 503 restart_gate, "not now", and the client's retry path admits it once the
    branch is committed: the application sees no failure. MariaDB's global read lock holds
    the recovery's XA COMMIT until the retry path's first wait, so the registration surely
    comes in between: the daemon's start waits for its first recovery pass, gives up after
    5 s and serves with the gate closed (on a slow machine it once came in between by
    itself: the kill -9 test above failed so in CI)."""
    assert settled(bare_pg, bare_my), "an earlier test left branches prepared"
    with make_daemon(bare_pg, bare_my, timeouts={"transaction_ms": 3000, "owner_grace_ms": 300}) as d:
        key = "gate-retry"
        hold = killed_after_commit_with_recovery_held(d, bare_pg, bare_my, key)
        refusals = []

        def let_recovery_commit(retries, e, delay):
            refusals.append(getattr(e, "code", repr(e)))
            hold.cursor().execute("UNLOCK TABLES")

        try:
            d.start()
            run_transfer(d, bare_pg, bare_my, key + "-after", on_retry=let_recovery_commit)
        finally:
            hold.close()
        assert refusals == ["restart_gate"], refusals
        both_committed_after_the_restart(bare_pg, bare_my, key)


def test_a_restarted_daemon_decides_what_its_last_run_left_before_it_serves(bare_pg, bare_my):
    """The same restart, the recovery's XA COMMIT held for one second: the daemon's start
    waits for its first recovery pass (within 5 s), so the first registration after it
    serves is admitted at once, with no `restart_gate` refusal and no Retry-After to wait
    out. Failed before (the daemon served at once): that registration was refused."""
    assert settled(bare_pg, bare_my), "an earlier test left branches prepared"
    with make_daemon(bare_pg, bare_my, timeouts={"transaction_ms": 3000, "owner_grace_ms": 300}) as d:
        key = "gate-first-pass"
        hold = killed_after_commit_with_recovery_held(d, bare_pg, bare_my, key)
        unlock = threading.Timer(1.0, lambda: hold.cursor().execute("UNLOCK TABLES"))
        refusals = []
        try:
            unlock.start()
            d.start()
            run_transfer(d, bare_pg, bare_my, key + "-after",
                         on_retry=lambda retries, e, delay: refusals.append(getattr(e, "code", repr(e))))
        finally:
            unlock.join()
            hold.close()
        assert refusals == [], refusals
        both_committed_after_the_restart(bare_pg, bare_my, key)


def test_mariadb_restart_gate(bare_pg):
    """A branch prepared, MariaDB restarted before the decision: InnoDB recovers the branch
    with its exclusive locks only. Without protection a writer overwrites the row the
    branch read and commits first (shown with plain 2PC); in client mode the daemon admits
    no new branch there until the recovered one is decided."""
    with MariaServer(plugin=False) as my:
        my.sql("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
        my.sql("INSERT INTO acct VALUES (1, 100), (2, 100)")

        def read_one_prepare(d):
            """A branch that reads row 1 (SERIALIZABLE: a shared lock), writes row 2, and is
            prepared; the decision is left pending."""
            tx = Coordinator(d.url, d.token).transaction()
            mc = my.connect()
            with tx.branch(mc, "my") as b:
                with mc.cursor() as cur:
                    cur.execute("SELECT bal FROM acct WHERE id = 1")
                    cur.execute("UPDATE acct SET bal = bal - 1 WHERE id = 2")
            tx.prepare_all(report=True)
            return tx, b

        def overwrite_row_1(timeout_s):
            """A plain autocommit write of the row the prepared branch read."""
            c = my.connect()
            with c.cursor() as cur:
                cur.execute(f"SET SESSION innodb_lock_wait_timeout = {timeout_s}")
                try:
                    cur.execute("UPDATE acct SET bal = bal + 1 WHERE id = 1")
                    return "committed"
                except Exception as e:  # noqa: BLE001
                    return f"refused: {e}"

        # Without the gate (plain 2PC): the read lock protects the branch before the
        # restart, not after it.
        with make_daemon(bare_pg, my, enforcement="none") as d:
            tx, b = read_one_prepare(d)
            assert overwrite_row_1(1).startswith("refused"), "SERIALIZABLE read lock should block the writer"
            b.conn.close()
            my.kill9()
            my.start()
            assert my_prepared(my), "the prepared branch survives the restart"
            assert overwrite_row_1(1) == "committed", "after the restart the read lock is gone"
            tx.abort("test")
            wait_until(lambda: not my_prepared(my), 30, "branch rolled back")

        # Client mode: the daemon sees the restart and holds new branches back.
        with make_daemon(bare_pg, my, enforcement="client", timeouts={"transaction_ms": 60000}) as d:
            tx, b = read_one_prepare(d)
            b.conn.close()
            my.kill9()
            my.start()
            blocked = Coordinator(d.url, d.token).transaction()
            try:
                with blocked.branch(my.connect(), "my"):
                    pass
                refused = None
            except CoordinatorError as e:
                refused = e
            assert refused is not None and refused.status == 503 and refused.code == "restart_gate", (refused, d.log_tail(80))
            assert "restarted" in str(refused) and "1 of our branches" in str(refused)
            assert resources(d)["my"]["enforcement"]["restart_gate"]
            assert metric(d, 'cotx_restart_gate_closed{resource="my"}') == 1
            # Counted by resource and code: where a storm of retried registrations goes.
            assert metric(d, 'cotx_branch_refusals_total{resource="my",code="restart_gate"}') >= 1
            blocked.abort("test")
            # Decided (commit): the daemon completes the recovered branch; the gate opens.
            assert tx._commit_call({"prepared": []}) == "commit"
            wait_until(lambda: not my_prepared(my), 30, "recovered branch completed by the daemon")
            ok = Coordinator(d.url, d.token).transaction()
            mc = my.connect()

            def admitted():
                try:
                    with ok.branch(mc, "my"):
                        mc.cursor().execute("UPDATE acct SET bal = bal + 1 WHERE id = 1")
                    return True
                except CoordinatorError as err:
                    assert err.code == "restart_gate", err
                    return False
            wait_until(admitted, 30, "the gate to open once the recovered branch is decided")
            ok.commit()
            assert metric(d, 'cotx_restart_gate_closed{resource="my"}') == 0


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    """What a managed service gives: TLS only (the CA's certificate), an ordinary role that
    owns its database (no superuser), no extension, no plugin. Yields (pg, my, certs, dsns)."""
    import shutil
    from cotest.certs import make_ca, make_cert
    from cotest.servers import _chown
    certs = tmp_path_factory.mktemp("managed-tls")
    make_ca(certs, "ca", "cotx managed test CA")
    make_cert(certs, "server", "cotx-db")

    def install(server_dir):
        out = {}
        for name in ("ca.pem", "server.pem", "server.key"):
            p = server_dir / name
            shutil.copy(certs / name, p)
            p.chmod(0o600 if name.endswith(".key") else 0o644)
            _chown(p)
            out[name] = str(p)
        return out

    pg = PgServer(preload=False, conf={"ssl": "on"})
    f = install(pg.dir)
    with open(pg.data / "postgresql.auto.conf", "a") as c:
        c.write(f"ssl_cert_file = '{f['server.pem']}'\nssl_key_file = '{f['server.key']}'\n")
    # The harness's own superuser over TLS; everybody else with a password.
    (pg.data / "pg_hba.conf").write_text("local all all trust\nhostssl all postgres 127.0.0.1/32 trust\n"
                                         "hostssl all all 127.0.0.1/32 scram-sha-256\n"
                                         "hostnossl all all 127.0.0.1/32 reject\n")
    my = MariaServer(plugin=False)
    f = install(my.dir)
    my.options = list(getattr(my, "options", []) or []) + [
        f"--ssl-ca={f['ca.pem']}", f"--ssl-cert={f['server.pem']}", f"--ssl-key={f['server.key']}",
        "--require-secure-transport=ON"]
    with pg, my:
        import psycopg
        with psycopg.connect(host=str(pg.dir), port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
            c.execute("CREATE ROLE app LOGIN PASSWORD 'app-secret'")
            c.execute("CREATE DATABASE appdb OWNER app")
        ssl = {"ca": str(certs / "ca.pem")}
        root = my.connect("mysql", ssl=ssl)
        with root.cursor() as cur:
            cur.execute("CREATE DATABASE app")
            cur.execute("CREATE USER 'app'@'%' IDENTIFIED BY 'app-secret'")
            cur.execute("GRANT ALL ON app.* TO 'app'@'%'")
        root.close()
        dsns = {"pg": f"host=127.0.0.1 port={pg.port} user=app password=app-secret dbname=appdb",
                "my": f"mysql://app:app-secret@127.0.0.1:{my.port}/app"}
        yield pg, my, certs, dsns


def test_managed_service_tls_and_an_ordinary_owner_role(managed):
    """Client mode with what a managed service allows: every connection TLS (verify-full
    against the service's CA), the daemon and the application as an ordinary role that owns
    its database (PostgreSQL) or has ALL on its database (MariaDB). The daemon creates the
    shim objects itself; a transfer commits and its helper is gone afterwards."""
    import psycopg
    import pymysql
    from cotest.daemon import Daemon
    pg, my, certs, dsns = managed
    tls = {"tls": "verify-full", "tls_ca_file": str(certs / "ca.pem")}
    d = Daemon([{"name": "pg", "kind": "postgres", "dsn": dsns["pg"], **tls},
                {"name": "my", "kind": "mariadb", "dsn": dsns["my"], **tls}])
    with d:
        pc = psycopg.connect(dsns["pg"] + f" sslmode=verify-full sslrootcert={certs / 'ca.pem'}", autocommit=True)
        mc = pymysql.connect(host="127.0.0.1", port=my.port, user="app", password="app-secret", database="app",
                             autocommit=True, ssl={"ca": str(certs / "ca.pem")})
        pc.execute("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL)")
        pc.execute("INSERT INTO acct VALUES (1, 100)")
        with mc.cursor() as cur:
            cur.execute("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
            cur.execute("INSERT INTO acct VALUES (1, 100)")
        tx = Coordinator(d.url, d.token).transaction()
        with tx:
            with tx.branch(pc, "pg") as bp:
                pc.execute("UPDATE acct SET bal = bal - 10 WHERE id = 1")
            with tx.branch(mc, "my") as bm:
                mc.cursor().execute("UPDATE acct SET bal = bal + 10 WHERE id = 1")
        assert tx.outcome == "commit" and (bp.enforcement, bm.enforcement) == ("client", "client")
        assert pc.execute("SELECT bal FROM acct").fetchone()[0] == 90
        # Created by the daemon as the ordinary role: owned by it.
        assert pc.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'cotx' AND tablename = 'shim'").fetchone()[0] == "app"
        wait_until(lambda: not pc.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0], 15, "helper rolled back")
        assert {n: r["enforcement"]["mode"] for n, r in resources(d).items()} == {"pg": "client", "my": "client"}, resources(d)


@pytest.mark.parametrize("first", ["successor", "predecessor"])
def test_the_postgresql_shim_refuses_what_breaks_commitment_ordering_on_every_major(pg_major, first):
    """The SSI shim itself, on each PostgreSQL major without pg_co: T1 reads a row T2
    writes (T1 -rw-> T2). Commitment ordering wants T1 committed before T2 prepares. Plain
    2PC prepares both in either order; client mode refuses the second prepare — T1's when
    T2 prepared first, T2's when T1 did (its helper makes T1 a prepared pivot)."""
    from cotx.errors import PrepareRefused
    with PgServer(preload=False) as pg:
        pg.sql("CREATE TABLE t(k int PRIMARY KEY, v int NOT NULL)")
        pg.sql("INSERT INTO t VALUES (1, 0), (2, 0)")
        outcome = {}
        for mode in ("none", "client"):
            from cotest.daemon import Daemon
            with Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "enforcement": mode}]) as d:
                c = Coordinator(d.url, d.token)
                t1, t2 = c.transaction(), c.transaction()
                c1, c2 = pg.connect(), pg.connect()
                with t1.branch(c1, "pg") as b1:
                    c1.execute("SELECT v FROM t WHERE k = 1")
                    c1.execute("UPDATE t SET v = v + 1 WHERE k = 2")
                with t2.branch(c2, "pg") as b2:
                    c2.execute("UPDATE t SET v = v + 1 WHERE k = 1")
                assert (b1.enforcement, b2.enforcement) == (mode, mode)
                order = [t2, t1] if first == "successor" else [t1, t2]
                refused = []
                for t in order:
                    try:
                        t.prepare_all(report=True)
                    except PrepareRefused:
                        refused.append("T1" if t is t1 else "T2")
                outcome[mode] = refused
                for t in (t1, t2):
                    t.abort("test")
                wait_until(lambda: not pg_prepared(pg), 15, "nothing prepared")
        assert outcome["none"] == [], outcome
        assert outcome["client"] == (["T1"] if first == "successor" else ["T2"]), outcome


def test_a_change_of_mode_is_seen_and_logged(pg, bare_my):
    """auto on a PostgreSQL with pg_co: engine. pg_co switched off at run time: the next
    recovery pass moves the resource to client mode and logs the change; switched back on:
    engine again. A client-mode branch commits in one phase after its slot write
    (docs/client-mode.md, "One phase"; before, the daemon refused it)."""
    def set_pg_co(on):
        pg.sql(f"ALTER SYSTEM SET pg_co.enabled = {'on' if on else 'off'}")
        pg.sql("SELECT pg_reload_conf()")
    with make_daemon(pg, bare_my, timeouts={"recovery_interval_ms": 200}) as d:
        try:
            wait_until(lambda: resources(d)["pg"]["enforcement"]["mode"] == "engine", 15, "engine mode")
            set_pg_co(False)
            wait_until(lambda: resources(d)["pg"]["enforcement"]["mode"] == "client", 15, "client mode after pg_co.enabled = off")
            changes = [json.loads(x) for x in d.log_tail(400).splitlines() if "enforcement at resource" in x]
            extra = [json.loads(c["extra"]) if isinstance(c.get("extra"), str) else c for c in changes if c.get("resource") == "pg"]
            assert [(e["was"], e["mode"]) for e in extra][-1] == ("engine", "client"), changes
            tx = Coordinator(d.url, d.token).transaction()
            with tx.branch(pg.connect(), "pg") as b:
                pass
            assert b.enforcement == "client"
            assert b.shim_one_phase
            b.write_slot_for_one_phase()
            r = tx._request("POST", f"/v1/transactions/{tx.gtid}/commit", {"one_phase_branch": b.branch_id})
            assert r["decision"] == "one_phase", r
            b.commit_one_phase()
            tx._ack(b, "commit")
        finally:
            set_pg_co(True)
        wait_until(lambda: resources(d)["pg"]["enforcement"]["mode"] == "engine", 15, "engine mode again")
        wait_until(lambda: not pg_prepared(pg), 15, "helper rolled back")
