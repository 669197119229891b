"""One credential per role (the config's [auth]; docs/coordinator.md, "Credentials"):
a client credential runs transactions and nothing else, the metrics credential only reads
/metrics, the operator credential inspects and forces but cannot begin a transaction. A
known credential without the role gets 403 `forbidden`, an unknown one 401. The operator
commands reach the daemon by URL with their own credential, without its config file
(which holds the database secrets)."""
import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest
from cotx import Coordinator
from cotest.daemon import find_binary
from cotest.coord import make_daemon

CLIENT, OPERATOR, METRICS = "client-" + "c" * 16, "operator-" + "o" * 16, "metrics-" + "m" * 16


@pytest.fixture(scope="module")
def daemon(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS roles_t(k text PRIMARY KEY)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS roles_t(k varchar(20) PRIMARY KEY) ENGINE=InnoDB")
    d = make_daemon(pg, mariadb, auth={"client_token": CLIENT, "operator_token": OPERATOR,
                                       "metrics_token": METRICS}).start()
    yield d
    d.destroy()


def call(d, method, path, token=None, body=None):
    req = urllib.request.Request(d.url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_client_credential_runs_transactions_and_nothing_else(daemon, pg, mariadb):
    pc, mc = pg.connect(), mariadb.connect()
    with Coordinator(daemon.url, CLIENT).transaction() as tx:
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO roles_t VALUES ('c1')")
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO roles_t VALUES ('c1')")
    assert tx.outcome == "commit"
    assert call(daemon, "GET", f"/v1/transactions/{tx.gtid}", CLIENT)[0] == 200
    for method, path in (("GET", "/v1/in-doubt"), ("GET", "/metrics"), ("GET", "/v1/audit"), ("GET", "/v1/transactions"),
                         ("GET", "/v1/nodes"), ("GET", "/v1/resources")):
        st, body = call(daemon, method, path, CLIENT)
        assert st == 403 and b"forbidden" in body and b"auth.client_token" in body, (path, st, body)
    st, body = call(daemon, "POST", "/v1/admin/force", CLIENT,
                    {"gtid": tx.gtid, "outcome": "abort", "operator": "x", "reason": "x", "confirm": True})
    assert st == 403, body
    pc.close()
    mc.close()


def test_metrics_and_operator_credentials(daemon):
    assert call(daemon, "GET", "/metrics", METRICS)[0] == 200
    for method, path in (("POST", "/v1/transactions"), ("GET", "/v1/in-doubt"), ("GET", "/v1/transactions/x.1-1"),
                         ("GET", "/v1/nodes"), ("GET", "/v1/resources")):
        assert call(daemon, method, path, METRICS, {} if method == "POST" else None)[0] == 403, path
    for path in ("/v1/in-doubt", "/v1/nodes", "/v1/resources"):
        assert call(daemon, "GET", path, OPERATOR)[0] == 200, path
    assert call(daemon, "GET", "/metrics", OPERATOR)[0] == 200
    assert call(daemon, "POST", "/v1/transactions", OPERATOR, {})[0] == 403
    # Unknown or missing credential: 401, before anything about the route is said.
    assert call(daemon, "GET", "/v1/in-doubt", "x" * 24)[0] == 401
    assert call(daemon, "GET", "/v1/nope")[0] == 401
    assert call(daemon, "GET", "/healthz")[0] == 200
    assert call(daemon, "GET", "/console")[0] == 200, "the console's page holds no data"


def cli(*args, token=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COTX_")}
    if token:
        env["COTX_TOKEN"] = token
    return subprocess.run([find_binary(), *args], capture_output=True, text=True, timeout=30, env=env)


def test_cli_by_url_with_its_own_credential(daemon, tmp_path):
    r = cli("in-doubt", "--url", daemon.url, token=OPERATOR)
    assert r.returncode == 0 and "in-doubt transaction" in r.stdout, r
    f = tmp_path / "operator.token"
    f.write_text(OPERATOR + "\n")
    r = cli("audit", "--url", daemon.url, "--token-file", str(f))
    assert r.returncode == 0, r
    r = cli("in-doubt", "--url", daemon.url, token=CLIENT)
    assert r.returncode == 1 and "403" in r.stderr and "forbidden" in r.stderr, r
    r = cli("in-doubt")
    assert r.returncode == 2 and "--url" in r.stderr, r
    r = cli("in-doubt", "--url", "https://127.0.0.1:1", token=OPERATOR)
    assert r.returncode == 2 and "--ca-file" in r.stderr, r


def test_config_refuses_one_secret_for_two_roles(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('node_id = "r1"\n[auth]\nclient_token = "same-secret-0123456"\noperator_token = "same-secret-0123456"\n'
                    '[store]\nkind = "sqlite"\npath = "/tmp/x.db"\n')
    r = cli("check-config", "--config", str(conf))
    assert r.returncode == 2 and "auth.operator_token" in r.stderr and "own credential" in r.stderr, r
