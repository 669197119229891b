"""The overdraft demo: plain 2PC vs cotx, side by side, on real servers.

A user has savings in PostgreSQL (service "savings") and checking in MariaDB (service
"checking"); an overdraft is allowed while savings + checking >= 0. Each round gives a new
user 50 + 50 and sends two withdrawals of 80 at the same time, one to each service. Each
withdrawal is one global transaction through the coordinator: the service reads its own
balance, asks the other service for its balance (passing the gtid; the other service joins
the transaction), and debits its own account if the total stays >= 0.

  plain 2PC: pg_co.enabled = off, mysql_co_enabled = OFF, MariaDB branch REPEATABLE READ
  cotx:      pg_co on, mysql_co on, every branch SERIALIZABLE (the project's setup)
  observe:   plain 2PC, with pg_co and mysql_co on in observe-only mode: every check runs,
             nothing is refused; the summary shows what would have been refused and
             whether every cycle the checker finds was among it
  client:    servers with neither pg_co nor mysql_co loaded (a managed database): plain
             2PC first, then client mode, where the coordinator and the client enforce
             commitment ordering with Sonata's shims (docs/client-mode.md)

The modes of one run share the servers and services; the coordinator is restarted between
modes with the enforcement each one needs (plain/observe: "none", co: "engine", client:
"client"). Every transaction is recorded and fed to the history checker (checker/), which
explains any cycle it finds.

    python demo/overdraft.py [--rounds N] [--mode both|plain|observe|co|client] [--keep-history DIR]

Exit status: 0 when cotx (engine or client mode) held the invariant and the checker found
no cycle with it, and observe-only flagged a member of every cycle of its rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from cotest import MariaServer, PgServer, free_port, reap_orphans
from cotest.daemon import Daemon

from checker import Txn, check
from checker.history import dump_jsonl, parse_list
from cotest.servers import DEFAULT_PG_MAJOR, PG_MAJORS

HERE = Path(__file__).resolve().parent

START = 50
AMOUNT = 80
# The engines' observe-only log lines (docs/pg_co.md, docs/mysql_co.md "observe").
PG_OBSERVED = re.compile(r"pg_co observe-only, not refused: (.*?) \(this transaction: xid (\d+), (?:gid '([^']*)'|no gid)\)")
MY_OBSERVED = re.compile(r"mysql_co observe-only, not refused: XA branch '([^']*)'")


def say(msg=""):
    print(msg, flush=True)


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class External:
    """A server the demo did not start (--external: the compose quickstart's), on
    127.0.0.1 as the superuser, with the password from the environment; what the demo asks
    of its own servers: sql(), port, version, destroy() (nothing: not ours)."""

    def __init__(self, kind: str, port: int):
        self.kind, self.port = kind, port
        self.version = {"postgres": "PostgreSQL", "mariadb": "MariaDB"}[kind] + f" on 127.0.0.1:{port}"

    def sql(self, query: str, params=None, db: str = "test"):
        if self.kind == "postgres":
            import psycopg
            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                 password=os.environ.get("COTX_DEMO_PG_PASSWORD"), autocommit=True,
                                 connect_timeout=5) as c:
                cur = c.execute(query, params)
                return cur.fetchall() if cur.description else None
        import pymysql
        with pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True, connect_timeout=5,
                             password=os.environ.get("COTX_DEMO_MY_PASSWORD") or "") as c, c.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
            cur.execute(f"USE {db}")
            cur.execute(query, params)
            return cur.fetchall() if cur.description else None

    def destroy(self):
        pass


class ExternalDaemon:
    """A running coordinator (--external): its URL and client token; never restarted."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def destroy(self):
        pass


class Bank:
    """Servers, coordinator and the two service processes."""

    def __init__(self, workdir: Path, pg_major: int | None = None, extensions: bool = True,
                 external: dict | None = None):
        self.workdir = workdir
        # extensions=False: the servers a managed service gives you (no pg_co, no mysql_co).
        self.extensions = extensions
        # external: servers and a coordinator already running; the demo starts only the
        # services, and changes nothing of the servers' or the coordinator's settings.
        self.external = external
        if external:
            self.pg, self.my = External("postgres", external["pg_port"]), External("mariadb", external["my_port"])
        else:
            self.pg = PgServer(major=pg_major, preload=None if extensions else False)
            self.my = MariaServer(plugin=None if extensions else False)
        self.procs = []
        self.enforcement = "none"

    def start(self):
        if self.external:
            return self._start_external()
        if self.extensions:
            say(f"starting {self.pg.version} (pg_co preloaded) and MariaDB (mysql_co loaded) ...")
        else:
            say(f"starting {self.pg.version} and MariaDB, neither pg_co nor mysql_co loaded (as on a managed service) ...")
        self.pg.start()
        self.my.start()
        self.pg.sql("CREATE TABLE savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')")
        self.my.sql("CREATE TABLE checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, "
                    "log text NOT NULL) ENGINE=InnoDB")
        (self.workdir / "coordinator").mkdir(exist_ok=True)
        self.daemon = Daemon([{"name": "savings", "kind": "postgres", "dsn": self.pg.dsn, "pool_size": 2,
                               "enforcement": self.enforcement},
                              {"name": "checking", "kind": "mariadb", "dsn": self.my.dsn, "pool_size": 2,
                               "enforcement": self.enforcement}],
                             timeouts={"transaction_ms": 30000, "owner_grace_ms": 2000},
                             workdir=str(self.workdir / "coordinator"))
        say(f"starting the coordinator on {self.daemon.url} ...")
        self.daemon.start()
        self._start_services()

    def _start_external(self):
        say(f"using {self.pg.version} and {self.my.version}, and the coordinator at {self.external['url']}")
        # A run again starts from empty tables: its users' names are the previous run's.
        self.pg.sql("DROP TABLE IF EXISTS savings")
        self.pg.sql("CREATE TABLE savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')")
        self.my.sql("DROP TABLE IF EXISTS checking")
        self.my.sql("CREATE TABLE checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, log text NOT NULL) ENGINE=InnoDB")
        self.daemon = ExternalDaemon(self.external["url"], self.external["token"])
        self._start_services()

    def _start_services(self):
        ports = {"savings": free_port(), "checking": free_port()}
        self.urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
        for name, kind, dbport in (("savings", "postgres", self.pg.port), ("checking", "mariadb", self.my.port)):
            peer = "checking" if name == "savings" else "savings"
            log = open(self.workdir / f"{name}.log", "ab")
            self.procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "bank_service.py"), name, kind, str(ports[name]), str(dbport),
                 self.daemon.url, self.daemon.token, self.urls[peer]],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL))
        for name, url in self.urls.items():
            deadline = time.time() + 30
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=1).read()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise RuntimeError(f"service {name} did not start: see {self.workdir}/{name}.log")
                    time.sleep(0.1)
        say(f"services: savings {self.urls['savings']} (PostgreSQL :{self.pg.port}), "
            f"checking {self.urls['checking']} (MariaDB :{self.my.port})")

    def set_enforcement(self, enforcement: str):
        """Restarts the coordinator (same port and store) with every resource's
        `enforcement` set so; the services reconnect by themselves."""
        if enforcement == self.enforcement:
            return
        self.enforcement = enforcement
        for r in self.daemon.resources:
            r["enforcement"] = enforcement
        self.daemon.write_config()
        self.daemon.restart()
        say(f"coordinator restarted with enforcement = \"{enforcement}\"")

    def set_mode(self, mode: str):
        if self.external:
            return   # the servers' and the coordinator's own settings (engine mode: co)
        self._set_engines(mode)
        # After the engines' settings: the coordinator probes them when it starts.
        self.set_enforcement({"plain": "none", "observe": "none", "co": "engine", "client": "client"}[mode])

    def _set_engines(self, mode: str):
        if not self.extensions:
            return
        on, observe = mode in ("co", "observe"), mode == "observe"
        self.pg.sql(f"ALTER SYSTEM SET pg_co.enabled = {'on' if on else 'off'}")
        self.pg.sql(f"ALTER SYSTEM SET pg_co.observe_only = {'on' if observe else 'off'}")
        self.pg.sql("SELECT pg_reload_conf()")
        self.my.sql(f"SET GLOBAL mysql_co_enabled = {'ON' if on else 'OFF'}")
        self.my.sql(f"SET GLOBAL mysql_co_observe_only = {'ON' if observe else 'OFF'}")
        deadline = time.time() + 10
        want = ("on" if on else "off", "on" if observe else "off")
        while (self.pg.sql("SHOW pg_co.enabled")[0][0], self.pg.sql("SHOW pg_co.observe_only")[0][0]) != want:
            if time.time() > deadline:
                raise RuntimeError("pg_co.enabled / pg_co.observe_only did not change")
            time.sleep(0.05)

    def observed(self) -> dict:
        """What observe-only let through, from the servers' logs: {gtid: [who, ...]}, who
        being "pg_co rule A" etc. or "mysql_co isolation"."""
        found: dict = {}
        for line in Path(self.pg.log_file).read_text(errors="replace").splitlines():
            m = PG_OBSERVED.search(line)
            if m and m.group(3):
                rule = re.search(r"rule ([ABCS])\b", m.group(1))
                gtid = m.group(3).split(":")[1]
                found.setdefault(gtid, []).append(f"pg_co rule {rule.group(1)}" if rule else "pg_co precondition")
        for line in Path(self.my.log_file).read_text(errors="replace").splitlines():
            m = MY_OBSERVED.search(line)
            if m:
                found.setdefault(m.group(1), []).append("mysql_co " + ("restart gate" if "restart gate" in line else "isolation"))
        return found

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for part in (getattr(self, "daemon", None), self.pg, self.my):
            try:
                if part is not None:
                    part.destroy()  # stops it and removes its directory
            except Exception:  # noqa: BLE001
                pass


def run_mode(bank: Bank, mode: str, rounds: int, think_ms: int) -> dict:
    bank.set_mode(mode)
    st = {"mode": mode, "rounds": rounds, "withdrawn": 0, "declined": 0, "retries": 0, "refused": 0,
          "failed": 0, "negative_rounds": 0, "lowest": None, "history": [], "final": {}, "examples": [],
          "gtids": {}}
    t0 = time.time()
    for r in range(1, rounds + 1):
        user = f"{mode}-u{r}"
        bank.pg.sql("INSERT INTO savings VALUES (%s, %s, '')", (user, START))
        bank.my.sql("INSERT INTO checking VALUES (%s, %s, '')", (user, START))
        results = {}

        def go(svc):
            results[svc] = post(bank.urls[svc] + "/withdraw",
                                {"user": user, "amount": AMOUNT, "mode": mode, "think_ms": think_ms,
                                 "tag": f"{mode}-r{r}-{svc}"})
        threads = [threading.Thread(target=go, args=(s,)) for s in ("savings", "checking")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        # Final balances (after the coordinator finished every branch).
        deadline = time.time() + 30
        while (bank.pg.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0] or bank.my.sql("XA RECOVER")) \
                and time.time() < deadline:
            time.sleep(0.05)
        (sb, slog), = bank.pg.sql("SELECT bal, log FROM savings WHERE u = %s", (user,))
        (cb, clog), = bank.my.sql("SELECT bal, log FROM checking WHERE u = %s", (user,))
        st["final"][f"pg:savings/{user}"] = parse_list(slog)
        st["final"][f"my:checking/{user}"] = parse_list(clog)
        total = sb + cb
        st["lowest"] = total if st["lowest"] is None else min(st["lowest"], total)
        st["negative_rounds"] += total < 0
        for svc, res in results.items():
            st[{"withdrawn": "withdrawn", "declined": "declined", "refused": "refused"}.get(res["result"], "failed")] += 1
            st["retries"] += len(res["refusals"])
            st["history"] += [Txn.from_json(h) for h in res["history"]]
            st["gtids"].update(res.get("gtids", {}))
            if res["refusals"] and len(st["examples"]) < 1:
                st["examples"].append(res["refusals"][0])
        if rounds <= 12 or r % max(1, rounds // 10) == 0 or r == rounds:
            outcome = ", ".join(f"{s}: {results[s]['result']}"
                                + (f" after {len(results[s]['refusals'])} refusal(s)" if results[s]["refusals"] else "")
                                + (f" [{results[s].get('reason')}]" if results[s]["result"] == "failed" else "")
                                for s in ("savings", "checking") if s in results)
            say(f"  [{mode:5}] round {r}/{rounds}: savings {sb:4} + checking {cb:4} = {total:4}  ({outcome})"
                + (f"  [{time.time() - t0:.0f} s]" if rounds > 12 else ""))
    st["report"] = check(st["history"], final_reads=st["final"])
    if mode == "observe":
        seen = bank.observed()
        mine = {st["gtids"][t.id] for t in st["history"] if t.id in st["gtids"]}
        st["observed"] = {g: who for g, who in seen.items() if g in mine}
        # A cycle counts as flagged when one of its members would have been refused. At
        # MariaDB that is the isolation rule: at REPEATABLE READ a branch's reads take no
        # lock, which is where these cycles break commitment ordering; enforcing refuses
        # every such branch, and with SERIALIZABLE branches InnoDB's locks order them.
        st["cycles_flagged"] = sum(any(st["observed"].get(st["gtids"].get(t)) for t in c.txns)
                                   for c in st["report"].cycles())
    return st


def observed_count(s: dict, engine: str) -> str:
    """Transactions observe-only let through at `engine`, with the rules: "3 (rule B 2, rule A 1)"."""
    if "observed" not in s:
        return "-"
    whos = [w for ws in s["observed"].values() for w in set(ws) if w.startswith(engine)]
    n = sum(1 for ws in s["observed"].values() if any(w.startswith(engine) for w in ws))
    by = {}
    for w in whos:
        k = w[len(engine) + 1:]
        by[k] = by.get(k, 0) + 1
    return f"{n} ({', '.join(f'{k} {v}' for k, v in sorted(by.items()))})" if n else "0"


def summary(stats: list) -> None:
    say()
    say("=" * 78)
    names = {"plain": "plain 2PC", "observe": "observe-only", "co": "cotx (CO on)", "client": "cotx client mode"}
    cols = [names[s["mode"]] for s in stats]
    rows = [
        ("rounds (2 concurrent withdrawals of 80 from 50 + 50)", [s["rounds"] for s in stats]),
        ("withdrawals done", [s["withdrawn"] for s in stats]),
        ("withdrawals declined (would overdraw)", [s["declined"] for s in stats]),
        ("prepares/commits refused (engines, shims), retried", [s["retries"] for s in stats]),
        ("withdrawals given up after retries / failed", [s["refused"] + s["failed"] for s in stats]),
        ("rounds ending with savings + checking < 0", [s["negative_rounds"] for s in stats]),
        ("lowest final total", [s["lowest"] for s in stats]),
        ("transactions checked (committed)", [f"{s['report'].txns} ({s['report'].committed})" for s in stats]),
        ("cycles found by the history checker", [len(s["report"].cycles()) for s in stats]),
        ("would have been refused (observe-only): pg_co", [observed_count(s, "pg_co") for s in stats]),
        ("would have been refused (observe-only): mysql_co", [observed_count(s, "mysql_co") for s in stats]),
        ("cycles with a member that would have been refused", [f"{s['cycles_flagged']} of {len(s['report'].cycles())}"
                                                               if "observed" in s else "-" for s in stats]),
        ("invariant savings + checking >= 0", ["held" if s["negative_rounds"] == 0 else "BROKEN" for s in stats]),
    ]
    w = max(len(r[0]) for r in rows) + 2
    cw = max(16, *(len(c) + 2 for c in cols))
    say(f"{'':{w}}" + "".join(f"{c:>{cw}}" for c in cols))
    for label, vals in rows:
        say(f"{label:{w}}" + "".join(f"{str(v):>{cw}}" for v in vals))
    say("=" * 78)
    for s in stats:
        cyc = s["report"].cycles()
        if cyc:
            say(f"\n{names[s['mode']]}: the checker's explanation of one cycle:")
            say(cyc[0].text)
        if s["examples"]:
            say(f"\n{names[s['mode']]}: an engine refusal (the withdrawal was retried):\n  {s['examples'][0]}")


HEADINGS = {"plain": "plain 2PC: pg_co off, mysql_co off, MariaDB branch REPEATABLE READ",
            "observe": "plain 2PC watched by observe-only: pg_co and mysql_co check, refuse nothing",
            "co": "cotx: pg_co on, mysql_co on, branches SERIALIZABLE",
            "client": "cotx client mode: no extension, no plugin; helper transactions and slot writes, branches SERIALIZABLE"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("DEMO_ROUNDS", 8)))
    ap.add_argument("--mode", choices=["both", "plain", "observe", "co", "client"], default="both",
                    help="both: plain then co; observe: plain 2PC with observe-only on; client: plain then "
                         "client mode, on servers without pg_co and mysql_co")
    ap.add_argument("--think-ms", type=int, default=200,
                    help="time a withdrawal spends between reading and writing (widens the race)")
    ap.add_argument("--keep-history", metavar="DIR", help="write each mode's history (JSON lines) there")
    ap.add_argument("--pg", type=int, choices=PG_MAJORS, default=DEFAULT_PG_MAJOR,
                    help="PostgreSQL major to run (default $COTX_PG_MAJOR or 15)")
    ap.add_argument("--external", nargs=3, metavar=("PG_PORT", "MARIADB_PORT", "COORDINATOR_URL"),
                    help="servers and a coordinator already running on 127.0.0.1 (the compose quickstart, "
                         "deploy/compose): only the co mode, with their own settings; passwords from "
                         "COTX_DEMO_PG_PASSWORD and COTX_DEMO_MY_PASSWORD, the client token from COTX_TOKEN")
    args = ap.parse_args(argv)
    external = None
    if args.external:
        if args.mode not in ("both", "co"):
            ap.error("--external runs the co mode only: the servers and the coordinator keep their settings")
        args.mode = "co"
        if not os.environ.get("COTX_TOKEN"):
            ap.error("--external needs the coordinator's client token in COTX_TOKEN")
        external = {"pg_port": int(args.external[0]), "my_port": int(args.external[1]), "url": args.external[2],
                    "token": os.environ["COTX_TOKEN"]}
    elif os.geteuid() != 0:
        say("run as root (the demo starts throwaway servers as the 'cotx' user)")
        return 2
    else:
        reap_orphans()
    workdir = Path(tempfile.mkdtemp(prefix="cotx-demo-"))
    bank = Bank(workdir, args.pg, extensions=args.mode != "client", external=external)
    modes = {"both": ["plain", "co"], "client": ["plain", "client"]}.get(args.mode, [args.mode])
    stats = []
    try:
        bank.start()
        for m in modes:
            say(f"\n--- {HEADINGS[m]} ---")
            stats.append(run_mode(bank, m, args.rounds, args.think_ms))
            if args.keep_history:
                Path(args.keep_history).mkdir(parents=True, exist_ok=True)
                dump_jsonl(stats[-1]["history"], Path(args.keep_history) / f"overdraft-{m}.jsonl")
    finally:
        bank.stop()
    summary(stats)
    obs = [s for s in stats if s["mode"] == "observe"]
    if obs and obs[0]["cycles_flagged"] < len(obs[0]["report"].cycles()):
        say("\nFAILED: observe-only did not flag a member of every cycle the checker found")
        say(f"service, coordinator and server logs: {workdir}")
        return 1
    co = [s for s in stats if s["mode"] in ("co", "client")]
    if co and (co[0]["negative_rounds"] or co[0]["report"].cycles() or not co[0]["withdrawn"]):
        say("\nFAILED: with cotx the invariant broke, the checker found a cycle, or nothing was withdrawn")
        say(f"service and coordinator logs: {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    if co:
        say("\ncotx: every committed history was serializable; refused withdrawals were retried and then "
            "done or declined.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
