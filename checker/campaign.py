"""Fault campaign: bank transfers through several coordinator daemons sharing
one PostgreSQL decision store, while a fault injector kills and pauses processes.

    python -m checker.campaign --seconds 600            # as root, from the repository root
    python -m checker.campaign --seconds 60 --json out.json --store plain

World: a participant PostgreSQL (pg_co) and MariaDB (mysql_co) holding the accounts
(checker/bank.py), a decision store (default: the harness's primary + synchronous
standby, harness/cotest/replica.py, reached through a multi-host DSN; `--store plain`: one
PostgreSQL), N daemons (node ids n1..nN) on that store. Client threads run transfers, each
through a randomly chosen daemon; an attempt that fails before the commit request
(daemon dead or paused, database down) is aborted and the next attempt goes to another
daemon; an attempt whose commit outcome the client could not learn is recorded as
unknown and settled at the end by reading the databases.

Faults, one at a time at random intervals: kill -9 a daemon (restarted after a random
downtime), SIGSTOP a daemon (SIGCONT after a random pause), both also with a long
downtime (takeover by the surviving daemons), kill -9 and restart the
participant PostgreSQL, the same for MariaDB, kill -9 the store's primary (promote the
standby, rebuild a standby; with a plain store: restart it).

Afterwards (faults stopped, everything running, recovery given time), the verdict:
total balance conserved; no split transfer (applied in one database only); no transfer
the client was told committed missing from either database; none told aborted applied;
nothing left prepared (pg_prepared_xacts, XA RECOVER); the history checker finds no
cycle. A monitor samples the prepared branches twice a second for the longest time a
branch stayed in doubt.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import bank
from .graph import check
from .history import Txn

ROOT = Path(__file__).resolve().parents[1]

FAULT_KINDS = ("daemon_kill9", "daemon_stop", "daemon_kill9_long", "daemon_stop_long", "pg_kill9", "mariadb_kill9",
               "store_kill9")
# *_long: the daemon stays dead / paused for `long_downtime`, longer than a node lease is
# expected to last, so that its transactions are taken over — or, before
# takeover exists, stay in doubt that long (see longest_in_doubt_s in the report).
DEFAULT_WEIGHTS = {"daemon_kill9": 3, "daemon_stop": 3, "daemon_kill9_long": 1, "daemon_stop_long": 1,
                   "pg_kill9": 1, "mariadb_kill9": 1, "store_kill9": 1}


@dataclass
class Config:
    seconds: float = 60.0             # how long transfers run with faults
    daemons: int = 3
    threads: int = 4                  # client threads
    accounts: int = 8                 # per database
    fault_gap: tuple = (2.0, 6.0)     # seconds between the end of a fault and the next one
    downtime: tuple = (0.3, 4.0)      # a killed process stays down / a paused one paused
    long_downtime: tuple = (10.0, 20.0)
    store: str = "replica"            # replica | plain
    weights: dict = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    seed: int | None = None
    recovery_timeout: float = 180.0   # after the faults: time allowed for nothing to stay prepared
    http_timeout: float = 3.0         # the client's per-call timeout (a paused daemon answers nothing)
    decision_timeout: float = 30.0    # then the client reports the outcome unknown
    daemon_timeouts: dict = field(default_factory=lambda: {
        "transaction_ms": 10000, "owner_grace_ms": 1000, "recovery_interval_ms": 500,
        "retry_initial_ms": 50, "retry_max_ms": 1000})
    lease: dict | None = None         # the daemons' [lease] table (daemons with node leases)
    victims: bool = True              # park a transfer in doubt on the daemon before each daemon fault
    shared_node_id: bool = False      # misconfiguration on purpose: every daemon "n1" (two daemons with one node id)
    quiet: bool = False


class Campaign:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
        self.rnd = random.Random(self.seed)
        self.history: list[Txn] = []
        self.lock = threading.Lock()
        self.stop_clients = threading.Event()
        self.stop_faults = threading.Event()
        self.stop_monitor = threading.Event()
        self.faults: list[dict] = []
        self.fault_errors: list[str] = []  # a fault that could not be injected or undone
        self.notes: list[str] = []         # retried restarts, victims that could not be parked
        self.counts = {"attempted": 0, "committed": 0, "aborted": 0, "unknown": 0, "retried_elsewhere": 0}
        self.per_daemon = {}
        self.unknown_errors: dict[str, int] = {}
        self.in_doubt_max = (0.0, None)     # (seconds, gid)
        self._my_first_seen: dict = {}
        self.pg = self.my = self.store = None
        self.daemons = []
        self.busy: set = set()            # node ids the injector is working on right now
        self.victims: list = []           # {gtid, step, fault, t_fault, in_doubt_s}
        self.supervisor_restarts: list = []

    def log(self, msg: str) -> None:
        if not self.cfg.quiet:
            print(f"[campaign {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # --- world -------------------------------------------------------------------------
    def setup(self) -> None:
        from cotest import MariaServer, PgReplicaPair, PgServer, reap_orphans
        from cotest.daemon import Daemon
        reap_orphans()
        self.pg = PgServer().start()
        self.my = MariaServer().start()
        self.start_accounts = bank.setup(self.pg, self.my, self.cfg.accounts)
        self.total0 = sum(self.start_accounts.values())
        if self.cfg.store == "replica":
            self.store = PgReplicaPair().start()
            sdsn = self.store.dsn("cotx_log")
        else:
            self.store = PgServer(preload=False).start()
            sdsn = self.store.dsn.replace("dbname=postgres", "dbname=cotx_log")
        self.store.sql("CREATE DATABASE cotx_log")
        res = [{"name": "pg", "kind": "postgres", "dsn": self.pg.dsn, "pool_size": 2},
               {"name": "my", "kind": "mariadb", "dsn": self.my.dsn, "pool_size": 2}]
        for i in range(self.cfg.daemons):
            extra = {"lease": self.cfg.lease} if self.cfg.lease else {}
            d = Daemon(res, timeouts=self.cfg.daemon_timeouts, node_id="n1" if self.cfg.shared_node_id else f"n{i + 1}",
                       store={"kind": "postgres", "dsn": sdsn, "table": "cotx_decisions"}, **extra)
            self.daemons.append(d)
            d.start()   # one after the other: the first creates the store's table
            self.per_daemon[self._name(d)] = {"attempted": 0, "committed": 0}
        self.log(f"seed {self.seed}; pg :{self.pg.port} (pg_co {self.pg.preload}), mariadb :{self.my.port} "
                 f"(mysql_co {self.my.plugin}), store {self.cfg.store} {sdsn}; daemons "
                 + ", ".join(f"{d.node_id}={d.url}" for d in self.daemons))

    def _name(self, d) -> str:
        return f"{d.node_id}@{d.port}" if self.cfg.shared_node_id else d.node_id

    def teardown(self) -> None:
        for d in self.daemons:
            try:
                if d.proc and d.proc.poll() is None:
                    d.proc.send_signal(signal.SIGCONT)
                d.destroy()
            except Exception:  # noqa: BLE001
                pass
        for s in (self.store, self.my, self.pg):
            if s is not None:
                try:
                    s.destroy()
                except Exception:  # noqa: BLE001
                    pass

    # --- clients -----------------------------------------------------------------------
    def _client(self, i: int) -> None:
        from cotx import Coordinator
        rnd = random.Random(self.seed * 1000 + i)
        coords = [Coordinator(d.url, d.token, timeout=self.cfg.http_timeout,
                              decision_timeout=self.cfg.decision_timeout) for d in self.daemons]
        di = rnd.randrange(len(coords))
        moved = False
        conns = None   # kept across transfers; replaced after any failure (state unknown)
        while not self.stop_clients.is_set():
            tid = f"c{i}x{uuid.uuid4().hex[:8]}"
            rec = Txn(tid, note=f"transfer via {self._name(self.daemons[di])}")
            a, b = f"a{rnd.randrange(self.cfg.accounts)}", f"b{rnd.randrange(self.cfg.accounts)}"
            amt = rnd.randint(1, 9) * rnd.choice((1, -1))
            err = None
            try:
                if conns is None:
                    rec.phase = "body"
                    conns = (bank.pg_connect(self.pg.port), bank.my_connect(self.my.port))
                bank.transfer(coords[di], self.pg.port, self.my.port, a, b, amt, tid, rec, conns=conns)
            except Exception as e:  # noqa: BLE001 - every outcome is recorded
                err = e
                for c in conns or ():
                    try:
                        c.close()
                    except Exception:  # noqa: BLE001
                        pass
                conns = None
            rec.status = bank.status_of(err, rec)
            if err is not None:
                rec.note += f" -> {type(err).__name__}: {str(err)[:200]}"
            node = self._name(self.daemons[di])
            with self.lock:
                self.history.append(rec)
                self.counts["attempted"] += 1
                self.counts[{"ok": "committed", "fail": "aborted", "info": "unknown"}[rec.status]] += 1
                self.counts["retried_elsewhere"] += moved
                self.per_daemon[node]["attempted"] += 1
                self.per_daemon[node]["committed"] += rec.status == "ok"
                if rec.status == "info":
                    k = type(err).__name__
                    self.unknown_errors[k] = self.unknown_errors.get(k, 0) + 1
            moved = False
            if err is not None:
                if _daemon_trouble(err):
                    # The daemon died or does not answer: the next attempt goes elsewhere.
                    di = (di + 1 + rnd.randrange(len(coords) - 1)) % len(coords) if len(coords) > 1 else di
                    moved = True
                time.sleep(0.02 + 0.08 * rnd.random())
            else:
                di = rnd.randrange(len(coords))
        for c in conns or ():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass

    # --- faults ------------------------------------------------------------------------
    def _pick_kind(self) -> str:
        """Every enabled kind once (in random order), so that even a short run has them all;
        then by weight."""
        kinds = [k for k in FAULT_KINDS if self.cfg.weights.get(k, 0) > 0]
        if not hasattr(self, "_first_round"):
            self._first_round = self.rnd.sample(kinds, len(kinds))
        if self._first_round:
            return self._first_round.pop()
        return self.rnd.choices(kinds, [self.cfg.weights[k] for k in kinds])[0]

    def _restart(self, what: str, start) -> None:
        for attempt in range(20):
            try:
                start()
                return
            except Exception as e:  # noqa: BLE001 - e.g. a daemon started while the store is busy
                # The end of the message is the daemon's log tail: why it did not start.
                self.notes.append(f"restart {what} attempt {attempt} failed: ...{str(e)[-600:]}")
                time.sleep(1)
        raise RuntimeError(f"could not restart {what}")

    def inject(self, kind: str) -> dict:
        down = self.rnd.uniform(*(self.cfg.long_downtime if kind.endswith("_long") else self.cfg.downtime))
        f = {"kind": kind, "at": round(time.time() - self.t0, 2), "down_s": round(down, 2)}
        if kind.startswith("daemon_"):
            d = self.rnd.choice(self.daemons)
            f["target"] = self._name(d)
            victim = self._park_victim(d, kind) if self.cfg.victims else None
            with self.lock:
                self.busy.add(self._name(d))
            try:
                if kind.startswith("daemon_kill9"):
                    d.kill9()
                else:
                    d.proc.send_signal(signal.SIGSTOP)
                if victim is not None:
                    # The owner dies with (or while) its daemon: only a daemon can finish
                    # the victim's prepared branches now.
                    victim["proc"].kill()
                    victim["proc"].wait()
                    victim["t_fault"] = time.time()
                    f["victim"] = f"{victim['step']} {victim['gtid']}"
                    with self.lock:
                        self.victims.append(victim)
                time.sleep(down)
                if kind.startswith("daemon_kill9"):
                    self._restart(d.node_id, d.start)
                else:
                    d.proc.send_signal(signal.SIGCONT)
            finally:
                with self.lock:
                    self.busy.discard(self._name(d))
        elif kind == "pg_kill9":
            self.pg.kill9()
            time.sleep(down)
            self._restart("postgresql", self.pg.start)
        elif kind == "mariadb_kill9":
            self.my.kill9()
            time.sleep(down)
            self._restart("mariadb", self.my.start)
        elif kind == "store_kill9":
            if self.cfg.store == "replica":
                f["target"] = f"primary :{self.store.primary.port}"
                self.store.kill9_primary()
                time.sleep(down)
                self.store.promote()
                f["promoted"] = self.store.primary.port
                self.store.rejoin()
            else:
                self.store.kill9()
                time.sleep(down)
                self._restart("store", self.store.start)
        f["took_s"] = round(time.time() - self.t0 - f["at"], 2)
        return f

    def _park_victim(self, d, kind: str) -> dict | None:
        """A transfer through daemon d in a child process (checker.bank victim) that stops
        with its branches prepared, before or right after the commit decision."""
        step = self.rnd.choice(("after_all_prepares", "after_decision"))
        tid = f"v{uuid.uuid4().hex[:8]}"
        env = dict(os.environ)
        p = subprocess.Popen([sys.executable, "-m", "checker.bank", "victim", step, d.url, d.token,
                              str(self.pg.port), str(self.my.port), tid],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, cwd=str(ROOT), env=env)
        line = ""
        if select.select([p.stdout], [], [], 30)[0]:
            line = p.stdout.readline()
        if not line.startswith("READY "):
            p.kill()
            p.wait()
            self.notes.append(f"victim for {kind} on {self._name(d)} did not reach {step}: {line[:200]!r}")
            return None
        ready = json.loads(line[6:])
        rec = Txn.from_json(ready["rec"])
        # After the decision the victim's client had been told "commit".
        rec.status = "ok" if step == "after_decision" else "info"
        rec.note += f" (victim of {kind} on {self._name(d)})"
        with self.lock:
            self.history.append(rec)
            self.counts["attempted"] += 1
            self.counts["committed" if rec.status == "ok" else "unknown"] += 1
        return {"proc": p, "gtid": ready["gtid"], "tid": tid, "step": step, "fault": kind,
                "node": self._name(d), "in_doubt_s": None}

    def _injector(self) -> None:
        while not self.stop_faults.wait(self.rnd.uniform(*self.cfg.fault_gap)):
            kind = self._pick_kind()
            try:
                f = self.inject(kind)
            except Exception as e:  # noqa: BLE001 - reported; the heal step restores the world
                f = {"kind": kind, "error": str(e)[:500]}
                self.fault_errors.append(f"{kind}: {str(e)[:500]}")
            self.faults.append(f)
            self.log(f"fault {len(self.faults)}: {f}")

    def _supervise(self) -> None:
        """What systemd's Restart=always does in a deployment: a daemon that exited on its
        own (e.g. it woke from a pause to find its node lease taken over) is restarted."""
        for d in self.daemons:
            with self.lock:
                if self._name(d) in self.busy:
                    continue
            if d.proc is not None and d.proc.poll() is not None:
                rc = d.proc.returncode
                try:
                    self._restart(d.node_id, d.start)
                    ok = True
                except Exception:  # noqa: BLE001 - recorded in fault_errors
                    ok = False
                self.supervisor_restarts.append({"node": d.node_id, "exit": rc, "restarted": ok,
                                                 "at": round(time.time() - self.t0, 2)})
                self.log(f"supervisor: {d.node_id} had exited ({rc}); restarted: {ok}")

    # --- in-doubt monitor --------------------------------------------------------------
    def _sample_in_doubt(self) -> None:
        now = time.time()
        pg_gids = my_xids = None
        try:
            pg_gids = []
            for gid, age in self.pg.sql("SELECT gid, extract(epoch FROM now() - prepared)::float8 "
                                        "FROM pg_prepared_xacts WHERE gid LIKE 'cotx:%'"):
                pg_gids.append(gid)
                if age > self.in_doubt_max[0]:
                    self.in_doubt_max = (age, f"pg {gid}")
        except Exception:  # noqa: BLE001 - down right now
            pg_gids = None
        try:
            seen = set()
            for row in self.my.sql("XA RECOVER"):
                xid = row[3] if isinstance(row[3], str) else row[3].decode(errors="replace")
                seen.add(xid)
                first = self._my_first_seen.setdefault(xid, now)
                if now - first > self.in_doubt_max[0]:
                    self.in_doubt_max = (now - first, f"my {xid}")
            for x in list(self._my_first_seen):
                if x not in seen:
                    del self._my_first_seen[x]
            my_xids = seen
        except Exception:  # noqa: BLE001
            pass
        if pg_gids is not None and my_xids is not None:
            # A victim is out of doubt once neither database lists a branch of its gtid.
            with self.lock:
                open_victims = [v for v in self.victims if v["in_doubt_s"] is None]
            for v in open_victims:
                g = v["gtid"]
                if not any(f":{g}:" in x for x in pg_gids) and not any(x.startswith(g) for x in my_xids):
                    v["in_doubt_s"] = round(now - v["t_fault"], 1)

    def _monitor(self) -> None:
        while not self.stop_monitor.wait(0.5):
            self._sample_in_doubt()
            if not self.stop_faults.is_set():
                self._supervise()

    # --- the run -----------------------------------------------------------------------
    def heal(self) -> None:
        """Everything running again (an injected fault restores what it broke; this is for
        a fault that failed half way)."""
        for d in self.daemons:
            if d.proc is None or d.proc.poll() is not None:
                self._restart(d.node_id, d.start)
            else:
                d.proc.send_signal(signal.SIGCONT)
        for s, name in ((self.pg, "postgresql"), (self.my, "mariadb")):
            try:
                s.sql("SELECT 1")
            except Exception:  # noqa: BLE001
                self._restart(name, s.start)
        if self.cfg.store == "replica" and self.store.standby is None:
            self.store.rejoin()

    def log_warnings(self, top: int = 15) -> dict:
        """warn/error lines of every daemon's log (all its runs), counted by message."""
        counts: dict = {}
        for d in self.daemons:
            try:
                text = d.log_file.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                level = str(j.get("level", "")).lower() if isinstance(j, dict) else ""
                if level in ("warn", "error"):
                    k = f"{level}: {j.get('message')}"
                    counts[k] = counts.get(k, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:top])

    def prepared(self) -> tuple[list, list]:
        from cotest.coord import my_prepared, pg_prepared
        return pg_prepared(self.pg), my_prepared(self.my)

    def run(self) -> dict:
        self.t0 = time.time()
        clients = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.cfg.threads)]
        injector = threading.Thread(target=self._injector, daemon=True)
        monitor = threading.Thread(target=self._monitor, daemon=True)
        monitor.start()
        for t in clients:
            t.start()
        injector.start()
        last = 0
        while time.time() - self.t0 < self.cfg.seconds:
            time.sleep(1)
            if time.time() - last >= 10:
                last = time.time()
                with self.lock:
                    self.log(f"{time.time() - self.t0:.0f}s {self.counts}, faults {len(self.faults)}")
        self.stop_faults.set()
        injector.join()
        try:
            self.heal()
        except Exception as e:  # noqa: BLE001 - reported; the verdict still runs
            self.fault_errors.append(f"heal: {e}")
            self.log(f"heal failed: {e}")
        self.stop_clients.set()
        for t in clients:
            t.join(self.cfg.decision_timeout + 60)
        stuck_clients = sum(t.is_alive() for t in clients)
        load_s = time.time() - self.t0
        self.log(f"faults stopped after {load_s:.0f}s; waiting for recovery")
        t_rec = time.time()
        while time.time() - t_rec < self.cfg.recovery_timeout:
            self._sample_in_doubt()
            p, m = self.prepared()
            if not p and not m:
                break
            time.sleep(0.5)
        recovery_s = time.time() - t_rec
        self.stop_monitor.set()
        monitor.join()
        return self.verdict(load_s, recovery_s, stuck_clients)

    def verdict(self, load_s: float, recovery_s: float, stuck_clients: int) -> dict:
        left_pg, left_my = self.prepared()
        total, logs = bank.state(self.pg, self.my)
        seen: dict = {}
        for key, lst in logs.items():
            for x in lst:
                seen.setdefault(x, set()).add(key.split(":")[0])
        with self.lock:
            history = list(self.history)
        split = sorted(x for x, s in seen.items() if s != {"pg", "my"})
        lost = [t.id for t in history if t.status == "ok" and seen.get(t.id) != {"pg", "my"}]
        aborted_applied = [t.id for t in history if t.status == "fail" and t.id in seen]
        resolved = {"committed": 0, "aborted": 0, "split": 0}
        for t in history:
            if t.status == "info":
                s = seen.get(t.id)
                if s == {"pg", "my"}:
                    t.status, t.note = "ok", t.note + " (settled: committed)"
                    resolved["committed"] += 1
                elif s is None:
                    t.status, t.note = "fail", t.note + " (settled: aborted)"
                    resolved["aborted"] += 1
                else:
                    resolved["split"] += 1
        t_check = time.time()
        rep = check(history, final_reads=logs)
        faults_by_kind: dict = {}
        for f in self.faults:
            faults_by_kind[f["kind"]] = faults_by_kind.get(f["kind"], 0) + 1
        incidents = {}
        from cotx import Coordinator
        for d in self.daemons:
            try:
                incidents[d.node_id] = len(Coordinator(d.url, d.token).http.request("GET", "/v1/incidents")["incidents"])
            except Exception as e:  # noqa: BLE001
                incidents[d.node_id] = f"unreachable: {e}"
        r = {
            "seed": self.seed,
            "daemon_binary": _binary_info(),
            "config": {k: v for k, v in asdict(self.cfg).items() if k != "quiet"},
            "load_seconds": round(load_s, 1),
            "transfers": dict(self.counts),
            "per_daemon": self.per_daemon,
            "unknown_settled": resolved,
            "unknown_errors": self.unknown_errors,
            "faults": len(self.faults),
            "faults_by_kind": faults_by_kind,
            "fault_errors": self.fault_errors,
            "notes": self.notes,
            "store_failovers": getattr(self.store, "failovers", 0),
            "total_expected": self.total0,
            "total_found": total,
            "total_conserved": total == self.total0,
            "split": split,
            "lost_commits": lost,
            "aborted_but_applied": aborted_applied,
            "left_prepared": {"pg": left_pg, "my": [x.decode(errors="replace") if isinstance(x, bytes) else x
                                                    for x in left_my]},
            "recovery_seconds": round(recovery_s, 1),
            "longest_in_doubt_s": round(self.in_doubt_max[0], 1),
            "longest_in_doubt_branch": self.in_doubt_max[1],
            "checker": {"ok": rep.ok, "txns": rep.txns, "committed": rep.committed, "edges": rep.edges,
                        "anomalies": [a.kind for a in rep.anomalies][:20], "summary": rep.summary()[:4000],
                        "seconds": round(time.time() - t_check, 1)},
            "daemon_incidents": incidents,
            "stuck_clients": stuck_clients,
            "supervisor_restarts": self.supervisor_restarts,
            "victims": [{k: v for k, v in x.items() if k != "proc"} for x in self.victims],
            "victims_in_doubt_max_s": max([x["in_doubt_s"] or 0 for x in self.victims], default=0),
            "victims_unresolved": [x["gtid"] for x in self.victims if x["in_doubt_s"] is None],
            "daemon_log_warnings": self.log_warnings(),
        }
        r["ok"] = (r["total_conserved"] and not split and not lost and not aborted_applied
                   and not left_pg and not left_my and rep.ok)
        return r


def _binary_info() -> str:
    from cotest.daemon import find_binary
    try:
        b = find_binary()
        st = os.stat(b)
        return f"{b} (modified {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(st.st_mtime))} UTC, {st.st_size} bytes)"
    except Exception as e:  # noqa: BLE001
        return f"unknown: {e}"


def _daemon_trouble(e: BaseException) -> bool:
    from cotx import CoordinatorUnavailable, OutcomeUnknown
    from cotx.errors import CoordinatorError
    if isinstance(e, (CoordinatorUnavailable, OutcomeUnknown, ConnectionError, TimeoutError)):
        return True
    return isinstance(e, CoordinatorError) and e.status >= 500


def run(cfg: Config) -> dict:
    """Sets up, runs, tears down (every process stopped; COTX_KEEP_SERVERS=1 keeps the
    directories: data, daemon configs and logs)."""
    c = Campaign(cfg)
    try:
        c.setup()
        return c.run()
    finally:
        c.teardown()


def summary(r: dict) -> str:
    t = r["transfers"]
    lines = [
        f"campaign {'PASSED' if r['ok'] else 'FAILED'} (seed {r['seed']}, {r['load_seconds']} s of load, "
        f"{r['config']['daemons']} daemons, store {r['config']['store']})",
        f"  transfers: {t['attempted']} attempted, {t['committed']} committed, {t['aborted']} aborted, "
        f"{t['unknown']} unknown (settled: {r['unknown_settled']}), {t['retried_elsewhere']} retried on another daemon",
        f"  faults: {r['faults']} {r['faults_by_kind']}, store failovers {r['store_failovers']}"
        + (f", fault errors {len(r['fault_errors'])}" if r["fault_errors"] else ""),
        f"  total {r['total_found']} (expected {r['total_expected']}); split {len(r['split'])}; "
        f"lost commits {len(r['lost_commits'])}; aborted-but-applied {len(r['aborted_but_applied'])}; "
        f"left prepared pg {len(r['left_prepared']['pg'])} my {len(r['left_prepared']['my'])}",
        f"  checker: {'no cycle' if r['checker']['ok'] else 'ANOMALIES ' + str(r['checker']['anomalies'])} "
        f"({r['checker']['txns']} txns, {r['checker']['committed']} committed, {r['checker']['seconds']} s)",
        f"  longest in doubt {r['longest_in_doubt_s']} s ({r['longest_in_doubt_branch']}); "
        f"recovery after the faults {r['recovery_seconds']} s; daemon incidents {r['daemon_incidents']}",
    ]
    vs = r["victims"]
    if vs:
        by: dict = {}
        for v in vs:
            k = f"{v['fault']}/{v['step']}"
            by.setdefault(k, []).append(v["in_doubt_s"])
        lines.append(f"  victims (a transfer parked in doubt on the daemon, its client killed with the fault): "
                     f"{len(vs)}; in doubt after the fault, max {r['victims_in_doubt_max_s']} s; by fault/step "
                     + ", ".join(f"{k}: {sorted(x for x in v if x is not None)}" for k, v in sorted(by.items()))
                     + (f"; never resolved {len(r['victims_unresolved'])}" if r["victims_unresolved"] else ""))
    if r["notes"]:
        lines.append(f"  notes ({len(r['notes'])}): {r['notes'][:5]}")
    lines.append(f"  daemon binary: {r['daemon_binary']}")
    if r["daemon_log_warnings"]:
        lines.append(f"  daemon log warnings/errors: {r['daemon_log_warnings']}")
    if r["supervisor_restarts"]:
        lines.append(f"  daemons that exited on their own and were restarted: {r['supervisor_restarts']}")
    if r["stuck_clients"]:
        lines.append(f"  {r['stuck_clients']} client threads did not stop")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checker.campaign", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--daemons", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--accounts", type=int, default=8)
    ap.add_argument("--store", choices=("replica", "plain"), default="replica")
    ap.add_argument("--fault-gap", type=float, nargs=2, default=(2.0, 6.0), metavar=("MIN", "MAX"))
    ap.add_argument("--downtime", type=float, nargs=2, default=(0.3, 4.0), metavar=("MIN", "MAX"))
    ap.add_argument("--long-downtime", type=float, nargs=2, default=(10.0, 20.0), metavar=("MIN", "MAX"))
    ap.add_argument("--no", action="append", default=[], choices=FAULT_KINDS, help="leave out a fault kind")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--no-victims", action="store_true", help="do not park a transfer in doubt before daemon faults")
    ap.add_argument("--shared-node-id", action="store_true",
                    help="give every daemon the same node id (a misconfiguration, to see the campaign fail)")
    ap.add_argument("--lease-ttl-ms", type=int, help="daemons' lease.ttl_ms (daemons with node leases)")
    ap.add_argument("--recovery-timeout", type=float, default=180)
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--keep", action="store_true", help="keep the servers' and daemons' directories (data, logs) after stopping them")
    a = ap.parse_args(argv)
    weights = {k: (0 if k in a.no else v) for k, v in DEFAULT_WEIGHTS.items()}
    cfg = Config(seconds=a.seconds, daemons=a.daemons, threads=a.threads, accounts=a.accounts, store=a.store,
                 fault_gap=tuple(a.fault_gap), downtime=tuple(a.downtime),
                 long_downtime=tuple(a.long_downtime), lease={"ttl_ms": a.lease_ttl_ms} if a.lease_ttl_ms else None,
                 weights=weights, shared_node_id=a.shared_node_id, victims=not a.no_victims, seed=a.seed,
                 recovery_timeout=a.recovery_timeout)
    if a.keep:
        os.environ["COTX_KEEP_SERVERS"] = "1"
    r = run(cfg)
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1, default=str))
    print(summary(r))
    if not r["ok"]:
        for k in ("split", "lost_commits", "aborted_but_applied"):
            if r[k]:
                print(f"  {k}: {r[k][:20]}")
        if not r["checker"]["ok"]:
            print(r["checker"]["summary"][:2000])
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
