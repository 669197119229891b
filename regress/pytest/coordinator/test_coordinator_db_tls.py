"""TLS from the daemon to its databases (docs/coordinator.md, "TLS to the databases"):
PostgreSQL (decision store and resource) and MariaDB that refuse unencrypted
connections. Without TLS configured the daemon cannot use them and says why; with
tls = "verify-full" and the right CA a global transaction commits and a daemon killed
after the decision finishes the branches when restarted; a CA that did not sign the
servers' certificates is refused, naming the certificate problem."""
import os
import shutil
import subprocess
import sys

import pytest
from cotest import MariaServer, PgServer
from cotest.certs import make_ca, make_cert
from cotest.servers import _chown
from cotx import Coordinator
from cotest.coord import wait_until
from cotest.daemon import Daemon
from cotest.transfers import CHILD


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A private CA with a server certificate for 127.0.0.1 and localhost, and a second CA
    that signed nothing the servers present."""
    d = tmp_path_factory.mktemp("dbtls")
    make_ca(d, "ca", "cotx db test CA")
    make_ca(d, "other", "some other CA")
    make_cert(d, "server", "cotx-db")
    return d


def _install(certs, server_dir):
    """The server's files where the servers' user can read them (the key private to it)."""
    out = {}
    for name in ("ca.pem", "server.pem", "server.key"):
        p = server_dir / name
        shutil.copy(certs / name, p)
        os.chmod(p, 0o600 if name.endswith(".key") else 0o644)
        _chown(p)
        out[name] = str(p)
    return out


@pytest.fixture(scope="module")
def pg(certs):
    s = PgServer(conf={"ssl": "on"})
    f = _install(certs, s.dir)
    with open(s.data / "postgresql.auto.conf", "a") as c:
        c.write(f"ssl_cert_file = '{f['server.pem']}'\nssl_key_file = '{f['server.key']}'\n")
    # TCP only with TLS; the socket stays open to the harness.
    (s.data / "pg_hba.conf").write_text("local all all trust\nhostssl all all 127.0.0.1/32 trust\n"
                                        "hostnossl all all 127.0.0.1/32 reject\n")
    with s:
        s.sql("CREATE TABLE IF NOT EXISTS crash(k text PRIMARY KEY, v int)")
        s.sql("CREATE DATABASE cotx_log")
        yield s


@pytest.fixture(scope="module")
def mariadb(certs):
    s = MariaServer()
    f = _install(certs, s.dir)
    s.options = list(getattr(s, "options", []) or []) + [
        f"--ssl-ca={f['ca.pem']}", f"--ssl-cert={f['server.pem']}", f"--ssl-key={f['server.key']}",
        "--require-secure-transport=ON"]
    with s:
        s.sql = lambda q, params=None, db="test": _maria_sql(s, certs, q, params, db)
        s.sql("CREATE TABLE IF NOT EXISTS crash(k varchar(64) PRIMARY KEY, v int) ENGINE=InnoDB")
        yield s


def _maria_sql(s, certs, q, params, db):
    c = s.connect(db, ssl={"ca": str(certs / "ca.pem")})
    try:
        with c.cursor() as cur:
            cur.execute(q, params)
            return cur.fetchall() if cur.description else None
    finally:
        c.close()


def store_dsn(pg):
    return pg.dsn.replace("dbname=postgres", "dbname=cotx_log")


def daemon(pg, mariadb, tls_pg=None, tls_my=None, tls_store=None, **kw):
    res = [{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2, **(tls_pg or {})},
           {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn, "pool_size": 2, **(tls_my or {})}]
    store = {"kind": "postgres", "dsn": store_dsn(pg), "table": "cotx_decisions_tls", **(tls_store or {})}
    return Daemon(res, store=store, **kw)


def verify_full(certs, ca="ca.pem"):
    return {"tls": "verify-full", "tls_ca_file": str(certs / ca)}


def start_fails(d, *expect, timeout=20):
    """The daemon refuses to run (or keeps failing): its log once every string of expect
    is in it (the daemon exits, or it keeps running and logs the failure), at most
    timeout seconds."""
    try:
        d.start()
    except RuntimeError as e:
        return str(e) + "\n" + d.log_file.read_text(errors="replace")
    # Still running: wait for the failure to be logged, not for a fixed time.
    wait_until(lambda: d.proc.poll() is not None or all(x in d.log_file.read_text(errors="replace") for x in expect),
               timeout=timeout,
               what=f"{expect} in the daemon's log")
    return d.log_file.read_text(errors="replace")


def test_plain_connections_are_refused(pg, mariadb, certs):
    # The store without TLS: the server's pg_hba refuses it, and the daemon says so.
    d = daemon(pg, mariadb, tls_pg=verify_full(certs), tls_my=verify_full(certs), tls_store={"tls": "disable"})
    try:
        log = start_fails(d, "pg_hba.conf rejects connection", "no encryption")
        assert "pg_hba.conf rejects connection" in log and "no encryption" in log, log
    finally:
        d.destroy()
    # The resources without TLS: PostgreSQL refused by pg_hba, MariaDB by
    # require_secure_transport; the store is fine.
    d = daemon(pg, mariadb, tls_pg={"tls": "disable"}, tls_my={"tls": "disable"}, tls_store=verify_full(certs))
    try:
        log = start_fails(d, "pg_hba.conf rejects connection", "no encryption")
        assert "pg_hba.conf rejects connection" in log and "no encryption" in log, log
    finally:
        d.destroy()
    # MariaDB 10.11 answers an unencrypted login under require_secure_transport with
    # "Access denied" (1045); the same login over TLS is accepted (the next test).
    d = daemon(pg, mariadb, tls_pg=verify_full(certs), tls_my={"tls": "disable"}, tls_store=verify_full(certs))
    try:
        d.start()
        wait_until(lambda: "my: Access denied" in d.log_file.read_text(errors="replace"), what="the mariadb resource's error in the log")
    finally:
        d.destroy()


def test_verify_full_commits_and_recovers(pg, mariadb, certs, daemons):
    d = daemons(daemon(pg, mariadb, tls_pg=verify_full(certs), tls_my=verify_full(certs), tls_store=verify_full(certs),
               timeouts={"owner_grace_ms": 600000})).start()
    coord = Coordinator(d.url, d.token)
    pc = pg.connect(sslmode="require")
    mc = mariadb.connect(ssl={"ca": str(certs / "ca.pem")})
    with coord.transaction() as tx:
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO crash VALUES ('tls-1', 1)")
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO crash VALUES ('tls-1', 1)")
    assert tx.outcome == "commit"
    pc.close()
    mc.close()
    assert committed(pg, mariadb, "tls-1")
    # The daemon's own connections are encrypted (pg_stat_ssl of its sessions).
    rows = pg.sql("SELECT bool_and(s.ssl), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                  "WHERE a.application_name LIKE 'cotx-coordinator%' OR a.datname = 'cotx_log' AND a.pid <> pg_backend_pid()")
    assert rows[0][0] is True and rows[0][1] >= 1, rows
    # Killed after the decision, before any branch is finished: the restarted daemon
    # finishes both over TLS from the record in the store.
    ch = TlsChild(d, pg, mariadb, certs, "tls-2")
    d.kill9()
    ch.kill9()
    d.timeouts["owner_grace_ms"] = 200
    d.write_config()
    d.start()
    wait_until(lambda: nothing_prepared_tls(pg, mariadb), what="recovery over TLS")
    assert committed(pg, mariadb, "tls-2")


def test_wrong_ca_is_refused(pg, mariadb, certs):
    d = daemon(pg, mariadb, tls_pg=verify_full(certs), tls_my=verify_full(certs), tls_store=verify_full(certs, "other.pem"))
    try:
        log = start_fails(d, "UnknownIssuer")
        assert "UnknownIssuer" in log, log
    finally:
        d.destroy()
    d = daemon(pg, mariadb, tls_pg=verify_full(certs, "other.pem"), tls_my=verify_full(certs, "other.pem"),
               tls_store=verify_full(certs))
    try:
        log = start_fails(d, "UnknownIssuer")
        assert "UnknownIssuer" in log, log
    finally:
        d.destroy()


def test_config_errors_name_the_field(pg, mariadb, certs):
    for tls_pg, field, words in [
        ({"tls": "verify-everything"}, "resources[0].tls", "unknown mode"),
        ({"tls": "verify-full"}, "resources[0].tls_ca_file", "required"),
        ({"tls": "verify-full", "tls_ca_file": str(certs / "missing.pem")}, "resources[0].tls_ca_file", "missing.pem"),
        ({"tls": "require", "tls_ca_file": str(certs / "ca.pem")}, "resources[0].tls_ca_file", "only with"),
    ]:
        d = daemon(pg, mariadb, tls_pg=tls_pg)
        r = d.cli("check-config")
        d.destroy()
        assert r.returncode == 2 and field in r.stderr and words in r.stderr, (tls_pg, r)
    d = daemon(pg, mariadb, tls_my={"tls": "prefer"})
    r = d.cli("check-config")
    d.destroy()
    assert r.returncode == 2 and "resources[1].tls" in r.stderr, r
    d = daemon(pg, mariadb)
    d.store["dsn"] += " sslmode=verify-full"
    d.write_config()
    r = d.cli("check-config")
    d.destroy()
    assert r.returncode == 2 and "store.dsn" in r.stderr and "tls_ca_file" in r.stderr, r


def committed(pg, mariadb, key):
    return pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == [(1,)] and \
        mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == ((1,),)


def nothing_prepared_tls(pg, mariadb):
    return not pg.sql("SELECT gid FROM pg_prepared_xacts") and not mariadb.sql("XA RECOVER")


class TlsChild:
    """test_coordinator_crash's client, stopped after the decision, with encrypted
    connections to both databases."""

    def __init__(self, d, pg, mariadb, certs, key):
        src = CHILD.replace('dbname="postgres", autocommit=True)', 'dbname="postgres", autocommit=True, sslmode="require")') \
                   .replace('database="test", autocommit=True)', f'database="test", autocommit=True, ssl={{"ca": {str(certs / "ca.pem")!r}}})')
        assert "sslmode" in src and "ssl=" in src
        self.p = subprocess.Popen([sys.executable, "-c", src, "after_decision", d.url, d.token, str(pg.port),
                                   str(mariadb.port), key, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        if not line or line[0] != "READY":
            self.p.kill()
            raise AssertionError(f"client did not reach the decision: {line} {self.p.stderr.read()}")
        self.gtid = line[1]

    def kill9(self):
        self.p.kill()
        self.p.wait()
