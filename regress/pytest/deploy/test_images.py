"""The container images of scripts/images.sh, built, saved into one archive, loaded into
an empty podman store (a machine that never built anything) and run from there for real:
the PostgreSQL image (Debian's postgresql-15 + the pg_co package) and the MariaDB image
(Debian's mariadb-server + the mysql_co package) start on empty data volumes, the
daemon-only image (the cotx-coordinator package) runs with a config and a token mounted at
the documented paths, and the Python client runs global transactions through it: a 2PC
commit across both engines, and a withdrawal whose read another transaction overwrote and
committed before the withdrawal prepared, which pg_co refuses at PREPARE (rule A) where
PostgreSQL alone would let it commit. Every container is removed
afterwards, with its anonymous volumes.

The containers share the host's network (--network host, on free loopback ports): the
daemon, the servers and this test reach each other as on a development machine, and no
bridge networking (netavark, slirp) is needed on the CI kernel. Built from scratch (base
image and server layers missing) this takes a few minutes, warm about a minute
(docs/testing.md, "Container images")."""
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pymysql
import pytest
from cotest.coord import nothing_prepared

from cotx import Coordinator, PrepareRefused

ROOT = Path(__file__).resolve().parents[3]
IMAGES_SH = ROOT / "scripts" / "images.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root (scripts/images.sh installs podman and builds the packages)")


def run(*cmd, check=True, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{cmd}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def lib_array(name: str) -> list[str]:
    """A bash array of scripts/lib.sh (the podman command and limits scripts/images.sh uses)."""
    out = run("bash", "-c", f'source "{ROOT}/scripts/lib.sh"; printf "%s\\0" "${{{name}[@]}}"').stdout
    return out.rstrip("\0").split("\0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(connect, what: str, container: str, podman: list[str], timeout: float = 120):
    """Calls connect() until it succeeds; fails with the container's log otherwise."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            return connect()
        except Exception as e:  # the server is still initializing its data directory
            last = e
        if run(*podman, "container", "exists", container, check=False).returncode != 0:
            break
        time.sleep(0.5)
    logs = run(*podman, "logs", container, check=False)
    raise AssertionError(f"{what} did not answer ({last}):\n{logs.stdout}\n{logs.stderr}")


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Builds the packages (quick when built) and the three images (cached layers), saves
    them into one archive and loads that into an empty podman store, as on a machine that
    never built anything (README, "Install from images"). Yields the image names."""
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="cotx-images-", dir="/var/tmp"))
    archive = work / "cotx-images.tar"
    r = run("bash", IMAGES_SH, "save", archive, timeout=1800)
    names = run("bash", IMAGES_SH, "names").stdout.split()
    print(f"scripts/images.sh save took {time.time() - t0:.0f} s\n{r.stdout}\n{r.stderr}")
    # The fresh store: the build's podman command with its own storage and run directories.
    fresh = lib_array("PODMAN")
    fresh[fresh.index("--root") + 1] = str(work / "storage")
    fresh[fresh.index("--runroot") + 1] = str(work / "run")
    try:
        t0 = time.time()
        out = run(*fresh, "load", "-q", "-i", archive).stdout
        archive.unlink()
        for n in names:
            assert f"localhost/{n}" in out, out
        print(f"podman load took {time.time() - t0:.0f} s")
        yield {"podman": fresh, **dict(zip(("coordinator", "postgres", "mariadb"), names))}
    finally:
        run(*fresh, "rm", "-a", "-f", "-v", check=False)
        run(*fresh, "rmi", "-a", "-f", check=False)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def podman(images) -> list[str]:
    return images["podman"]


@pytest.fixture(scope="module")
def stack(images, podman):
    """The three containers, started like the README shows; removed at the end."""
    limits = lib_array("PODMAN_LIMITS")
    tag = secrets.token_hex(3)
    names = {k: f"cotx-test-{k}-{tag}" for k in ("pg", "my", "coord")}
    ports = {k: free_port() for k in names}
    work = Path(tempfile.mkdtemp(prefix="cotx-images-"))
    base = [*podman, "run", "-d", "--network", "host", *limits]
    try:
        # Passwords as the README starts them (hex: no quoting needed in the DSNs below).
        pg_pw, my_pw = secrets.token_hex(8), secrets.token_hex(8)
        run(*base, "--name", names["pg"], "-e", f"POSTGRES_PASSWORD={pg_pw}", "-e", f"PGPORT={ports['pg']}",
            images["postgres"])
        run(*base, "--name", names["my"], "-e", f"MARIADB_ROOT_PASSWORD={my_pw}",
            "-e", f"MARIADB_PORT={ports['my']}", images["mariadb"])
        pg_dsn = f"host=127.0.0.1 port={ports['pg']} user=postgres password={pg_pw} dbname=postgres"
        wait_for(lambda: psycopg.connect(pg_dsn, connect_timeout=2).close(), "PostgreSQL", names["pg"], podman)
        my_kw = dict(host="127.0.0.1", port=ports["my"], user="root", password=my_pw, connect_timeout=2,
                     autocommit=True)
        wait_for(lambda: pymysql.connect(**my_kw).close(), "MariaDB", names["my"], podman)
        with pymysql.connect(**my_kw) as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE bank")
        # The config and the token at the paths the package documents (/etc/cotx), the
        # SQLite store in the image's volume /var/lib/cotx (owned by the user cotx).
        token = secrets.token_hex(16)
        (work / "token").write_text(token + "\n")
        (work / "coordinator.toml").write_text(f"""\
node_id = "img-{tag}"
listen = "127.0.0.1:{ports['coord']}"
token_file = "token"

[timeouts]
transaction_ms = 10000
owner_grace_ms = 500
recovery_interval_ms = 500

[store]
kind = "sqlite"
path = "/var/lib/cotx/decisions.db"

[[resources]]
name = "savings"
kind = "postgres"
dsn = "{pg_dsn}"
pool_size = 2

[[resources]]
name = "checking"
kind = "mariadb"
dsn = "mysql://root:{my_pw}@127.0.0.1:{ports['my']}/bank"
pool_size = 2
""")
        for f in ("token", "coordinator.toml"):
            os.chmod(work / f, 0o644)   # the daemon runs as cotx inside; these files are its
        run(*podman, "run", "--rm", *limits, "-v", f"{work}/coordinator.toml:/etc/cotx/coordinator.toml:ro",
            "-v", f"{work}/token:/etc/cotx/token:ro", images["coordinator"],
            "check-config", "--config", "/etc/cotx/coordinator.toml")
        run(*base, "--name", names["coord"], "-v", f"{work}/coordinator.toml:/etc/cotx/coordinator.toml:ro",
            "-v", f"{work}/token:/etc/cotx/token:ro", images["coordinator"])
        url = f"http://127.0.0.1:{ports['coord']}"
        wait_for(lambda: Coordinator(url, token, timeout=2).health(), "the coordinator", names["coord"], podman)
        yield {"pg_dsn": pg_dsn, "pg_pw": pg_pw, "my_kw": my_kw, "url": url, "token": token, "names": names, "ports": ports}
    finally:
        for n in names.values():
            # -v: the anonymous volumes (data directories, the decision store) go too.
            run(*podman, "rm", "-f", "-v", "-t", "5", n, check=False)
        shutil.rmtree(work, ignore_errors=True)


class _Srv:
    """What cotest.coord.nothing_prepared reads: .sql() of a server."""
    def __init__(self, sql):
        self.sql = sql


def pg_sql(stack, q):
    with psycopg.connect(stack["pg_dsn"], autocommit=True) as c:
        cur = c.execute(q)
        return cur.fetchall() if cur.description else None


def my_sql(stack, q, db="bank"):
    with pymysql.connect(**stack["my_kw"], database=db) as c, c.cursor() as cur:
        cur.execute(q)
        return cur.fetchall()


def test_engines_load_the_plugins(stack, podman):
    assert pg_sql(stack, "SHOW shared_preload_libraries") == [("pg_co",)]
    assert pg_sql(stack, "SELECT extversion FROM pg_extension WHERE extname = 'pg_co'")[0][0]
    assert int(pg_sql(stack, "SHOW max_prepared_transactions")[0][0]) > 0
    assert pg_sql(stack, "SELECT count(*) FROM co.stats") == [(1,)]
    plugins = {r[0]: r[1] for r in my_sql(stack, "SHOW PLUGINS", db=None)}
    assert plugins.get("mysql_co") == "ACTIVE", plugins
    assert my_sql(stack, "SHOW GLOBAL STATUS LIKE 'Mysql_co_health'", db=None) == (("Mysql_co_health", "OK"),)
    # The passwords given at the first start are required over TCP.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(stack["pg_dsn"].replace(stack["pg_pw"], "wrong"), connect_timeout=5)
    with pytest.raises(pymysql.err.OperationalError, match="Access denied"):
        pymysql.connect(**{**stack["my_kw"], "password": "wrong"})
    # The daemon runs as the package's unprivileged user, not root.
    user = run(*podman, "exec", stack["names"]["coord"], "id", "-un").stdout.strip()
    assert user == "cotx"


def test_global_commit_and_pg_co_refusal_through_the_daemon(stack):
    pg_sql(stack, "CREATE TABLE savings(u int PRIMARY KEY, bal int NOT NULL)")
    pg_sql(stack, "INSERT INTO savings VALUES (1, 0), (2, 0)")
    my_sql(stack, "CREATE TABLE checking(u int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
    my_sql(stack, "INSERT INTO checking VALUES (1, 0)")
    coord = Coordinator(stack["url"], stack["token"])
    pc = psycopg.connect(stack["pg_dsn"])
    mc = pymysql.connect(**stack["my_kw"], database="bank")
    servers = _Srv(lambda q: pg_sql(stack, q)), _Srv(lambda q: my_sql(stack, q))

    # 1. A deposit across both engines: two-phase commit through the daemon.
    with coord.transaction() as tx:
        with tx.branch(pc, "savings"):
            pc.execute("UPDATE savings SET bal = bal + 100 WHERE u = 1")
        with tx.branch(mc, "checking"):
            mc.cursor().execute("UPDATE checking SET bal = bal + 50 WHERE u = 1")
    assert tx.outcome == "commit"
    assert coord.get(tx.gtid)["state"] == "committed"
    assert pg_sql(stack, "SELECT bal FROM savings WHERE u = 1") == [(100,)]
    assert my_sql(stack, "SELECT bal FROM checking WHERE u = 1") == ((50,),)
    assert nothing_prepared(*servers)

    # 2. The withdrawal reads savings of user 1 (and writes elsewhere); meanwhile another
    # transaction changes that balance and commits. T -rw-> X with X committed: T can no
    # longer commit before X prepared, so pg_co refuses T's PREPARE (rule A). PostgreSQL's
    # SSI alone sees a single edge, no cycle, and would prepare it.
    refused_before = pg_sql(stack, "SELECT refused_rule_a FROM co.stats")[0][0]
    tx = coord.transaction()
    with pytest.raises(PrepareRefused) as ei:
        with tx:
            with tx.branch(pc, "savings"):
                assert pc.execute("SELECT bal FROM savings WHERE u = 1").fetchone() == (100,)
                pc.execute("UPDATE savings SET bal = bal - 80 WHERE u = 2")
            with tx.branch(mc, "checking"):
                mc.cursor().execute("UPDATE checking SET bal = bal - 80 WHERE u = 1")
            with psycopg.connect(stack["pg_dsn"]) as other:
                other.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                other.execute("UPDATE savings SET bal = 0 WHERE u = 1")
                other.execute("COMMIT")
    assert "rule A" in str(ei.value), ei.value
    assert coord.get(tx.gtid)["state"] == "aborted"
    assert pg_sql(stack, "SELECT refused_rule_a FROM co.stats")[0][0] == refused_before + 1
    # Nothing of the refused transaction stayed, in either engine.
    assert pg_sql(stack, "SELECT u, bal FROM savings ORDER BY u") == [(1, 0), (2, 0)]
    assert my_sql(stack, "SELECT bal FROM checking WHERE u = 1") == ((50,),)
    assert nothing_prepared(*servers)
    pc.close()
    mc.close()
