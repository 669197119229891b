"""TLS for the API: a daemon with [tls] serves HTTPS only (a plain-HTTP request gets no
answer), the Python client and the operator commands talk to it with its certificate
trusted, and a config that exposes the API beyond loopback without TLS is refused."""
import os
import socket
import subprocess

import pytest
from cotx import Coordinator, CotxError
from cotest.daemon import find_binary
from cotest.coord import make_daemon
from cotest.certs import make_ca, make_cert


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A private CA and a certificate for 127.0.0.1 and localhost signed by it
    (docs/coordinator.md, "TLS")."""
    d = tmp_path_factory.mktemp("tls")
    make_ca(d, "ca", "cotx test CA")
    make_cert(d, "cert", "cotx-test")
    return d


def test_api_over_tls(pg, mariadb, cert, daemons):
    d = daemons(make_daemon(pg, mariadb, tls={"cert_file": str(cert / "cert.pem"), "key_file": str(cert / "cert.key"),
                                      "ca_file": str(cert / "ca.pem")})).start()
    assert d.url.startswith("https://")
    c = Coordinator(d.url, d.token, cafile=d.cafile)
    pc, mc = pg.connect(), mariadb.connect()
    pg.sql("CREATE TABLE IF NOT EXISTS tls_t(k text PRIMARY KEY)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS tls_t(k varchar(20) PRIMARY KEY) ENGINE=InnoDB")
    with c.transaction() as tx:
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO tls_t VALUES ('a')")
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO tls_t VALUES ('a')")
    assert tx.outcome == "commit"
    # Without trusting the certificate: refused by the client.
    with pytest.raises(CotxError):
        Coordinator(d.url, d.token).begin()
    # Plain HTTP on the TLS port: no HTTP answer.
    with socket.create_connection(("127.0.0.1", d.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert not s.recv(100).startswith(b"HTTP/1.1 200")
        except (ConnectionResetError, socket.timeout):
            pass
    r = d.cli("in-doubt")
    assert r.returncode == 0 and "in-doubt transaction" in r.stdout, r
    # By URL, as an operator elsewhere would: the certificate is checked against the
    # name in the URL.
    cli = [find_binary(), "in-doubt", "--url", f"https://localhost:{d.port}", "--ca-file", str(cert / "ca.pem")]
    env = {"PATH": os.environ["PATH"], "COTX_TOKEN": d.token}
    r = subprocess.run(cli, capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0 and "in-doubt transaction" in r.stdout, r
    r = subprocess.run(cli[:-2], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2 and "--ca-file" in r.stderr, r
    pc.close()
    mc.close()


def test_plain_http_only_on_loopback(pg, mariadb):
    d = make_daemon(pg, mariadb)
    d.config.write_text(d.config.read_text().replace('listen = "127.0.0.1:', 'allow_non_loopback = true\nlisten = "0.0.0.0:'))
    r = d.cli("check-config")
    assert r.returncode == 2 and "[tls]" in r.stderr, r
    d.destroy()


def test_traceparent_is_logged_with_the_gtid(pg, mariadb, daemons):
    """A caller's W3C trace context (traceparent header) is logged with the gtid."""
    import json
    import urllib.request
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    d = daemons.start(pg, mariadb)
    gtid = Coordinator(d.url, d.token).begin()
    req = urllib.request.Request(f"{d.url}/v1/transactions/{gtid}/abort", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {d.token}", "traceparent": tp})
    urllib.request.urlopen(req, timeout=5).read()
    lines = [json.loads(x) for x in d.log_tail(50).splitlines() if "traceparent" in x]
    assert [(x["gtid"], x["traceparent"], x["status"]) for x in lines] == [(gtid, tp, 200)], lines
