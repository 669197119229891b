"""Start and stop real PostgreSQL (15, 16, 17 or 18) and MariaDB 10.11 servers in temporary
directories.

Every server lives in its own directory under BASE_DIR, named after the harness process
that owns it. A server left behind by a killed run is found by reap_orphans() (its owner
pid is dead) and stopped, so a crashed run never breaks the next one.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

COTX_CACHE = Path(os.environ.get("COTX_CACHE", "/var/cache/cotx"))
# The PostgreSQL majors pg_co supports; COTX_PG_MAJORS narrows them (e.g. "15"), COTX_PG_MAJOR
# picks the one a PgServer() without major= starts.
PG_MAJORS = [int(m) for m in os.environ.get("COTX_PG_MAJORS", "15 16 17 18").split()]  # as scripts/lib.sh
DEFAULT_PG_MAJOR = int(os.environ.get("COTX_PG_MAJOR", "15"))
MARIADB_PLUGIN_DIR = Path(os.environ.get("COTX_MARIADB_PLUGIN_DIR", "/usr/lib/mysql/plugin"))
BASE_DIR = Path(os.environ.get("COTX_TEST_BASE", "/tmp/cotx-servers"))
RUN_USER = os.environ.get("COTX_USER", "cotx")


class ServerError(RuntimeError):
    pass


def _pg_config(major: int, what: str) -> Path | None:
    """pg_config --bindir / --pkglibdir of a major: $COTX_CACHE/pg/<major>/bin/pg_config
    (scripts/build-pg-servers.sh), Debian's for 15 when that link is missing."""
    candidates = [COTX_CACHE / "pg" / str(major) / "bin" / "pg_config", Path(f"/usr/lib/postgresql/{major}/bin/pg_config")]
    if major == 15 and os.environ.get("COTX_PG_BIN"):  # a staged or other build of 15
        candidates.insert(0, Path(os.environ["COTX_PG_BIN"]) / "pg_config")
    for cfg in candidates:
        if cfg.exists():
            out = subprocess.run([str(cfg), what], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip():
                return Path(out.stdout.strip())
    return None


def pg_unavailable(major: int) -> str | None:
    """Why a major is not built here (its source package did not download; written by
    scripts/build-pg-servers.sh), or None."""
    if (COTX_CACHE / "pg" / str(major) / ".cotx-installed").exists():
        return None  # installed from a wheel (16, 17): a marker there is stale
    try:
        return (COTX_CACHE / "pg" / str(major) / "UNAVAILABLE").read_text().strip()
    except OSError:
        return None


def pg_bin(major: int | None = None) -> Path:
    major = major or DEFAULT_PG_MAJOR
    if major == 15 and os.environ.get("COTX_PG_BIN"):
        return Path(os.environ["COTX_PG_BIN"])
    b = _pg_config(major, "--bindir")
    if b is None:
        raise ServerError(f"PostgreSQL {major} is not installed: run scripts/bootstrap.sh (scripts/build-pg-servers.sh)")
    return b


def pg_co_installed(major: int | None = None) -> bool:
    lib = _pg_config(major or DEFAULT_PG_MAJOR, "--pkglibdir")
    return lib is not None and (lib / "pg_co.so").exists()


def mysql_co_installed() -> bool:
    return (MARIADB_PLUGIN_DIR / "mysql_co.so").exists()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _as_user(cmd: list[str]) -> list[str]:
    """Servers must not run as root (initdb refuses): drop to the test user when root."""
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_USER)
        except KeyError:
            raise ServerError(f"user {RUN_USER!r} is missing: run scripts/bootstrap.sh as root first")
        return ["runuser", "-u", RUN_USER, "--"] + cmd
    return cmd


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam(RUN_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(_as_user(cmd), capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise ServerError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _new_dir(kind: str) -> Path:
    BASE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(BASE_DIR, 0o1777)
    d = Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=BASE_DIR))
    os.chmod(d, 0o755)
    _chown(d)
    return d


def reap_orphans() -> int:
    """Stop servers whose owning harness process is gone; remove their directories."""
    if not BASE_DIR.exists():
        return 0
    n = 0
    for d in BASE_DIR.iterdir():
        try:
            owner = int(d.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if _pid_alive(owner) and owner != os.getpid():
            continue
        if owner == os.getpid():
            continue
        for pidfile in (d / "data" / "postmaster.pid", d / "mariadbd.pid"):
            if pidfile.exists():
                try:
                    pid = int(pidfile.read_text().split()[0])
                    os.kill(pid, signal.SIGKILL)
                except (ValueError, IndexError, ProcessLookupError, PermissionError):
                    pass
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    return n


class _Server:
    kind = "server"

    def __init__(self, port: int | None = None):
        if port is not None and port_in_use(port):
            raise ServerError(f"port {port} on 127.0.0.1 is already in use: choose another or leave it unset")
        self.port = port or free_port()
        self.dir = _new_dir(self.kind)
        self.running = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.destroy()

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            if not os.environ.get("COTX_KEEP_SERVERS"):
                shutil.rmtree(self.dir, ignore_errors=True)

    def _wait_ready(self, probe, what: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                probe()
                return
            except Exception as e:  # noqa: BLE001 - any failure means "not ready yet"
                last = e
                time.sleep(0.1)
        raise ServerError(f"{what} did not become ready on port {self.port}: {last}\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_file).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


class PgServer(_Server):
    """A PostgreSQL cluster of one major (default DEFAULT_PG_MAJOR). preload=True loads pg_co
    when the extension is installed."""

    kind = "pg"

    def __init__(self, port: int | None = None, preload: bool | None = None,
                 conf: dict | None = None, fsync: bool = False, major: int | None = None):
        self.major = major or DEFAULT_PG_MAJOR
        self.bin = pg_bin(self.major)
        super().__init__(port)
        self.data = self.dir / "data"
        self.log_file = self.dir / "postgres.log"
        self.preload = pg_co_installed(self.major) if preload is None else preload
        self.conf = {
            "port": self.port,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.dir}'",
            "max_connections": 120,
            "max_prepared_transactions": 120,
            "fsync": "on" if fsync else "off",
            "synchronous_commit": "on" if fsync else "off",
            "default_transaction_isolation": "'serializable'",
            "lc_messages": "'C'",
        }
        if self.preload:
            self.conf["shared_preload_libraries"] = "'pg_co'"
        self.conf.update(conf or {})
        _run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
              "--no-sync", "-E", "UTF8", "--locale=C"])
        with open(self.data / "postgresql.auto.conf", "a") as f:
            for k, v in self.conf.items():
                f.write(f"{k} = {v}\n")

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @property
    def version(self) -> str:
        """"PostgreSQL 17.12", from the server binary this cluster runs."""
        out = subprocess.run([str(self.bin / "postgres"), "--version"], capture_output=True, text=True)
        return "PostgreSQL " + out.stdout.split()[-1] if out.stdout else f"PostgreSQL {self.major}"

    def start(self) -> "PgServer":
        log = self.log_file
        if os.geteuid() == 0 and not log.exists():
            log.touch()
            _chown(log)
        _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(log), "-w", "-t", "60", "start"])
        self.running = True
        self._wait_ready(lambda: self.connect().close(), "PostgreSQL")
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.running or (self.data / "postmaster.pid").exists():
            subprocess.run(_as_user([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
                           capture_output=True)
        self.running = False

    def kill9(self) -> None:
        """Crash the postmaster (and its children) as a power loss would."""
        pidfile = self.data / "postmaster.pid"
        pid = int(pidfile.read_text().split()[0])
        subprocess.run(["pkill", "-9", "-P", str(pid)], capture_output=True)
        os.kill(pid, signal.SIGKILL)
        while _pid_alive(pid):
            time.sleep(0.05)
        self.running = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def connect(self, dbname: str = "postgres", autocommit: bool = True, **kw):
        import psycopg
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                               autocommit=autocommit, connect_timeout=5, **kw)

    def sql(self, query: str, params=None, dbname: str = "postgres"):
        """Run one statement in autocommit; return all rows (or None)."""
        with self.connect(dbname) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None


class MariaServer(_Server):
    """A MariaDB 10.11 server. plugin=True loads mysql_co at startup when it is installed."""

    kind = "mariadb"

    def __init__(self, port: int | None = None, plugin: bool | None = None,
                 binlog: bool = False, options: list[str] | None = None, fsync: bool = False):
        super().__init__(port)
        self.data = self.dir / "data"
        self.socket = self.dir / "mariadb.sock"
        self.pid_file = self.dir / "mariadbd.pid"
        self.log_file = self.dir / "mariadb.err"
        self.plugin = mysql_co_installed() if plugin is None else plugin
        self.binlog = binlog
        self.options = list(options or [])
        self.fsync = fsync
        self.data.mkdir()
        _chown(self.data)
        # A private tmpdir: bootstrap's temporary tables in the shared /tmp were seen removed
        # underneath it ("Could not remove temporary table '/tmp/#sql-temptable-...'").
        self.tmpdir = self.dir / "tmp"
        self.tmpdir.mkdir()
        _chown(self.tmpdir)
        _run(["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", "--auth-root-authentication-method=normal",
              "--skip-test-db", "--skip-name-resolve", f"--tmpdir={self.tmpdir}"])
        self.proc: subprocess.Popen | None = None

    def server_args(self) -> list[str]:
        args = ["mariadbd", "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                "--bind-address=127.0.0.1", f"--socket={self.socket}", f"--pid-file={self.pid_file}",
                f"--log-error={self.log_file}", "--skip-name-resolve", "--innodb-buffer-pool-size=256M",
                "--max-connections=200", f"--plugin-dir={MARIADB_PLUGIN_DIR}",
                "--innodb-lock-wait-timeout=10", "--character-set-server=utf8mb4",
                f"--tmpdir={self.tmpdir}"]
        if not self.fsync:
            args += ["--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0"]
        if self.plugin:
            args.append("--plugin-load-add=mysql_co.so")
        if self.binlog:
            args += [f"--log-bin={self.data}/binlog", "--server-id=1"]
        return args + self.options

    def start(self) -> "MariaServer":
        self.proc = subprocess.Popen(_as_user(self.server_args()), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.running = True

        def probe():
            if self.proc.poll() is not None:
                raise ServerError(f"mariadbd exited with {self.proc.returncode}")
            c = self._root_socket_conn()
            c.close()
        self._wait_ready(probe, "MariaDB")
        # Tests connect over TCP as root; install-db only created root@localhost.
        c = self._root_socket_conn()
        with c.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
            cur.execute("GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
            cur.execute("CREATE DATABASE IF NOT EXISTS test")
        c.close()
        return self

    def _root_socket_conn(self):
        import pymysql
        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, connect_timeout=5)

    def stop(self) -> None:
        """Shut mariadbd down cleanly. self.proc is `runuser` when root, which does not
        always pass signals on: signal the whole process group (start_new_session) and wait
        for mariadbd itself, so no server outlives its (deleted) directory."""
        self._signal_until_gone(signal.SIGTERM, 60)
        self._signal_until_gone(signal.SIGKILL, 30)

    def kill9(self) -> None:
        """Crash mariadbd, as a power loss would."""
        self._signal_until_gone(signal.SIGKILL, 30)

    def _signal_until_gone(self, sig: int, timeout: float) -> None:
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        while pid and _pid_alive(pid) and time.time() < deadline:
            if sig == signal.SIGKILL:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
            time.sleep(0.05)
        if self.proc:
            try:
                self.proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        self.running = False

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def dsn(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/test"

    def connect(self, db: str = "test", autocommit: bool = True, **kw):
        import pymysql
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", database=db,
                               autocommit=autocommit, connect_timeout=5, **kw)

    def sql(self, query: str, params=None, db: str = "test"):
        c = self.connect(db)
        try:
            with c.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else None
        finally:
            c.close()
