"""Run a real cotx-coordinator process (tests, demo, bench): writes its TOML config,
starts it on a free loopback port, waits until /healthz answers.

Part of the harness, not of the shipped client: the client talks to a daemon, it does not
start one. Imports nothing of cotx, so `import cotest` may load it."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("COTX_CACHE", "/var/cache/cotx"))


def find_binary() -> str:
    env = os.environ.get("COTX_COORDINATOR_BIN")
    cands = [env] if env else []
    cands += [str(CACHE / "bin" / "cotx-coordinator"),
              str(CACHE / "target-coord" / "release" / "cotx-coordinator"),
              str(CACHE / "target-coord" / "debug" / "cotx-coordinator")]
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("cotx-coordinator not built: run scripts/build.sh (or set COTX_COORDINATOR_BIN)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def default_store(d: Path) -> dict:
    """The store of a daemon whose test names none: SQLite, or the append-only log with
    COTX_TEST_STORE_KIND=log (the recovery, crash and restore tests run on either)."""
    kind = os.environ.get("COTX_TEST_STORE_KIND", "sqlite")
    if kind == "log":
        return {"kind": "log", "path": str(d / "decisions.log")}
    if kind != "sqlite":
        raise ValueError(f"COTX_TEST_STORE_KIND={kind!r}: expected 'sqlite' or 'log'")
    return {"kind": "sqlite", "path": str(d / "decisions.db")}


def store_kind() -> str:
    """The default store's kind in this run (tests that edit the SQLite file skip on 'log')."""
    return os.environ.get("COTX_TEST_STORE_KIND", "sqlite")


class Daemon:
    """resources: list of dicts {name, kind, dsn[, pool_size]}; timeouts: dict (ms)."""

    def __init__(self, resources: list[dict], timeouts: dict | None = None, store: dict | None = None,
                 node_id: str | None = None, workdir: str | None = None, port: int | None = None,
                 lease: dict | None = None, limits: dict | None = None, tls: dict | None = None,
                 log: dict | None = None, telemetry: dict | None = None, auth: dict | None = None):
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="cotx-coord-"))
        self.port = port or _free_port()
        # auth: one credential per role ({"client_token": ..., ...}: the config's [auth]);
        # without it, one token with every role.
        self.auth = auth or {}
        self.token = None if auth else secrets.token_hex(16)
        # Every daemon owns its node id exclusively: a fresh one unless the test shares one
        # on purpose (a restart of the same daemon keeps it).
        self.node_id = node_id or f"t{secrets.token_hex(4)}"
        self.lease = lease or {}
        self.limits = limits or {}
        self.tls = tls or {}
        # JSON log lines: tests and the fault campaign read fields from them.
        self.log = {"format": "json", **(log or {})}
        self.telemetry = telemetry or {}
        self.resources = resources
        self.timeouts = {"transaction_ms": 10000, "owner_grace_ms": 500, "recovery_interval_ms": 500,
                         "retry_initial_ms": 50, "retry_max_ms": 500, "retention_ms": 60000}
        self.timeouts.update(timeouts or {})
        self.store = store or default_store(self.dir)
        self.config = self.dir / "coordinator.toml"
        self.log_file = self.dir / "coordinator.log"
        self.proc: subprocess.Popen | None = None
        self.write_config()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def write_config(self) -> None:
        lines = [f"node_id = {_toml(self.node_id)}", f"listen = \"127.0.0.1:{self.port}\""]
        lines += [f"token = {_toml(self.token)}"] if self.token else []
        lines += ["", "[timeouts]"]
        lines += [f"{k} = {_toml(v)}" for k, v in self.timeouts.items()]
        for table, values in (("lease", self.lease), ("limits", self.limits), ("tls", self.tls), ("log", self.log),
                              ("telemetry", self.telemetry), ("auth", self.auth)):
            if values:
                lines += ["", f"[{table}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
        lines += ["", "[store]"] + [f"{k} = {_toml(v)}" for k, v in self.store.items()]
        for r in self.resources:
            lines += ["", "[[resources]]"] + [f"{k} = {_toml(v)}" for k, v in r.items()]
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> "Daemon":
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen([find_binary(), "serve", "--config", str(self.config)],
                                     stdout=log, stderr=log, start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1, context=self.ssl_context()) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"coordinator did not answer on {self.url}:\n{self.log_tail()}")

    @property
    def cafile(self) -> str | None:
        """What a client trusts for this daemon's TLS certificate (None: plain HTTP)."""
        return self.tls.get("ca_file", self.tls.get("cert_file")) if self.tls else None

    def ssl_context(self):
        import ssl
        return ssl.create_default_context(cafile=self.cafile) if self.tls else None

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()

    def destroy(self) -> None:
        """Stops the daemon and removes the directory it was given by us (its config, store
        and log), unless COTX_KEEP_SERVERS is set (as for the harness's servers)."""
        self.stop()
        if self._own_dir and not os.environ.get("COTX_KEEP_SERVERS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cli(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        cmd = [find_binary(), args[0], "--config", str(self.config), *args[1:]]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()
