"""Helpers for tests and benches of the coordinator: start a real daemon on a PostgreSQL
and a MariaDB server (harness objects), and look at what is prepared.

Test-only, so it lives in the harness rather than in the shipped client (it was
cotx.testing). The daemon itself is started by cotest.daemon.
"""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from cotest.daemon import Daemon


def make_daemon(pg, mariadb, enforcement: str | None = None, **kw) -> Daemon:
    """A daemon with resources "pg" and "my"; `enforcement` (auto by default) for both."""
    extra = {"enforcement": enforcement} if enforcement else {}
    return Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2, **extra},
                   {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn, "pool_size": 2, **extra}], **kw)


@contextmanager
def servers_in_mode(mode: str, table: str, pg_conf: dict | None = None, my_options: list[str] | None = None,
                    **daemon_kw):
    """(mode, pg, mariadb, daemon): a PostgreSQL and a MariaDB server with the mode's
    extensions (pg_co and mysql_co in mode "engine"), a table `table` of 10 rows (k, v = 0)
    on each, and a started daemon whose resources are in that enforcement mode."""
    from cotest.servers import MariaServer, PgServer
    engine = mode == "engine"
    with PgServer(preload=engine, **({"conf": pg_conf} if pg_conf else {})) as pg, \
            MariaServer(plugin=engine, **({"options": my_options} if my_options else {})) as my:
        if engine:
            pg.sql("CREATE EXTENSION pg_co")
        pg.sql(f"CREATE TABLE {table}(k int PRIMARY KEY, v int NOT NULL)")
        pg.sql(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 10) g")
        my.sql(f"CREATE TABLE {table}(k int PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
        my.sql(f"INSERT INTO {table} VALUES " + ",".join(f"({k}, 0)" for k in range(1, 11)))
        d = make_daemon(pg, my, enforcement=mode, **daemon_kw)
        d.start()
        try:
            yield mode, pg, my, d
        finally:
            d.destroy()


def pg_prepared(pg) -> list[str]:
    return [r[0] for r in pg.sql("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


def my_prepared(mariadb) -> list[bytes]:
    return [r[3] for r in mariadb.sql("XA RECOVER")]


def wait_until(pred, timeout: float = 30.0, what: str = "condition", step: float = 0.1):
    """Polls pred until it returns a truthy value; fails with `what` after timeout."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what} (last value: {last!r})")


def nothing_prepared(pg, mariadb) -> bool:
    return not pg_prepared(pg) and not my_prepared(mariadb)


def decision_of(d, gtid: str) -> str:
    """The daemon's decision for gtid, or the error code it answers instead."""
    st, body = api(d, "GET", f"/v1/transactions/{gtid}/decision")
    return body.get("decision") if st == 200 else body["error"]["code"]


def metrics_text(d) -> str:
    """The daemon's /metrics page (Prometheus text), read with its token (none when it
    runs with per-role credentials) and, over HTTPS, its CA."""
    headers = {"Authorization": f"Bearer {d.token}"} if d.token else {}
    req = urllib.request.Request(d.url + "/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=10, context=d.ssl_context()) as r:
        return r.read().decode()


def metric(d, name: str, default: float | None = None) -> float | None:
    """One sample of the daemon's /metrics, `default` when it has none. `name` is a metric's
    name (its first sample, with or without labels: `cotx_lease_losses_total`) or a name with
    its labels as the daemon writes them (`cotx_resource_enforcement{resource="pg",mode="engine"}`)."""
    for line in metrics_text(d).splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return default


class Daemons:
    """The daemons one test starts: each registered one is destroyed (stopped, its directory
    removed) by `destroy_all`, which the `daemons` fixture of regress/pytest calls at
    teardown, so a test needs no try/finally of its own."""

    def __init__(self):
        self.made: list[Daemon] = []

    def __call__(self, d: Daemon) -> Daemon:
        """Registers d (not started: the test may change its config first) and returns it."""
        self.made.append(d)
        return d

    def start(self, pg, mariadb, **kw) -> Daemon:
        """make_daemon(pg, mariadb, **kw), registered and started."""
        return self(make_daemon(pg, mariadb, **kw)).start()

    def destroy_all(self) -> None:
        for d in self.made:
            # A daemon the test paused (SIGSTOP) would only die by the SIGKILL after stop's
            # 10 s wait: woken first.
            if d.proc and d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
            d.destroy()
        self.made.clear()


def api(d, method: str, path: str, body=None) -> tuple[int, dict]:
    """One call of the daemon's HTTP API with its token: (status, JSON body), errors
    included (a 4xx/5xx is an answer to check, not an exception)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(d.url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {d.token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=d.ssl_context()) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def shared_store(pg, table: str) -> dict:
    """A decision store in database cotx_log of pg, table `table`: the store that the
    daemons of one deployment share."""
    return {"kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=cotx_log"), "table": table}


def peers(pg, mariadb, daemons: Daemons, table: str, names: list[str], **kw) -> list[Daemon]:
    """Daemons of one deployment, registered with `daemons`, not started: a shared store,
    one token, each its own node id."""
    ds = [daemons(make_daemon(pg, mariadb, node_id=n, store=shared_store(pg, table), **kw)) for n in names]
    for d in ds[1:]:
        d.token = ds[0].token
        d.write_config()
    return ds
