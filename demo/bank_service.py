"""One bank service of the overdraft demo: "savings" (PostgreSQL) or "checking" (MariaDB).

Each service owns one table in its own database:  <name>(u, bal, log)  where `log` is the
list of withdrawals that debited the row (space separated ids; the history checker reads
it as a list-append key). It speaks plain HTTP/JSON:

  POST /withdraw {user, amount, mode, think_ms, tag}
      Root of a global transaction: begin at the coordinator, read our balance in our
      branch, ask the peer service for its balance (propagating the gtid in the
      Cotx-Gtid header, with the trace context beside it: tx.headers()), and debit our
      balance when savings + checking stays >= 0. Refusals by the engines (PrepareRefused,
      RetryableError) are retried a few times; an overdraft is declined.
  POST /read {user, mode}, header Cotx-Gtid (and traceparent)
      Participant: join the gtid (coord.join_from(headers)), read our balance in a branch, prepare, return it; a
      background thread waits for the root's decision and finishes the branch on the
      same session (a read-only MariaDB branch is lost if its session closes first).

mode "co" (and "client") runs branches SERIALIZABLE (what the project requires); mode "plain" runs the
MariaDB branch at REPEATABLE READ, the usual plain-2PC setup (the demo also turns pg_co
and mysql_co off for it); mode "observe" runs branches as "plain" does, with pg_co and
mysql_co on in observe-only mode.

Usage: bank_service.py NAME KIND PORT DB_PORT COORD_URL TOKEN PEER_URL
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cotx import Coordinator, CotxError, RetryableError, TransactionAborted

from checker import Txn
from checker.history import parse_list

MAX_ATTEMPTS = 5


class PeerRefused(Exception):
    pass


class Declined(Exception):
    pass


class Service:
    def __init__(self, name, kind, db_port, coord_url, token, peer_url):
        self.name, self.kind, self.db_port = name, kind, db_port
        self.peer_name = "checking" if name == "savings" else "savings"
        self.coord = Coordinator(coord_url, token, decision_timeout=60)
        self.peer_url = peer_url

    # --- database -----------------------------------------------------------------
    def connect(self):
        if self.kind == "postgres":
            import psycopg
            # A password only for servers the demo did not start (overdraft.py --external).
            return psycopg.connect(host="127.0.0.1", port=self.db_port, user="postgres", dbname="postgres",
                                   password=os.environ.get("COTX_DEMO_PG_PASSWORD"), autocommit=True,
                                   connect_timeout=5)
        import pymysql
        return pymysql.connect(host="127.0.0.1", port=self.db_port, user="root", database="test",
                               password=os.environ.get("COTX_DEMO_MY_PASSWORD") or "", autocommit=True,
                               connect_timeout=5)

    def q(self, conn, sql, args=()):
        if self.kind == "postgres":
            cur = conn.execute(sql, args)
            return cur.fetchall() if cur.description else None
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None

    def branch(self, tx, conn, mode):
        # Plain 2PC as most deployments run it: MariaDB branches at REPEATABLE READ (also
        # under observe-only, which watches plain 2PC).
        if self.kind == "mariadb" and mode in ("plain", "observe"):
            return tx.branch(conn, self.name, isolation="REPEATABLE READ")
        return tx.branch(conn, self.name)

    def read_row(self, conn, user):
        (bal, log), = self.q(conn, f"SELECT bal, log FROM {self.name} WHERE u = %s", (user,))
        return int(bal), parse_list(log)

    def key(self, user, name=None):
        return f"{'pg' if (name or self.name) == 'savings' else 'my'}:{name or self.name}/{user}"

    # --- participant ----------------------------------------------------------------
    def read(self, req, headers):
        conn = self.connect()
        try:
            tx = self.coord.join_from(headers, wait=False)
            with tx:
                with self.branch(tx, conn, req["mode"]):
                    bal, log = self.read_row(conn, req["user"])
        except RetryableError as e:
            conn.close()
            return 409, {"refused": str(e)}
        except Exception as e:  # noqa: BLE001
            conn.close()
            return 500, {"error": f"{type(e).__name__}: {e}"}

        def finish():
            try:
                tx.wait(120)
            except Exception:  # noqa: BLE001 - the coordinator finishes what we could not
                pass
            finally:
                conn.close()
        threading.Thread(target=finish, daemon=True).start()
        return 200, {"balance": bal, "log": log}

    def call_peer(self, body, tx_headers):
        req = urllib.request.Request(self.peer_url + "/read", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **tx_headers}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            payload = json.loads(e.read() or b"{}")
            if e.code == 409:
                raise PeerRefused(payload.get("refused", "refused")) from None
            raise RuntimeError(f"peer failed: {payload}") from None

    # --- root -----------------------------------------------------------------------
    def withdraw(self, req):
        user, amount, mode = req["user"], int(req["amount"]), req["mode"]
        think = req.get("think_ms", 200) / 1000.0
        out = {"service": self.name, "result": "failed", "attempts": 0, "refusals": [], "history": [], "gtids": {}}
        for attempt in range(1, MAX_ATTEMPTS + 1):
            out["attempts"] = attempt
            tid = f"{req.get('tag', self.name)}.{attempt}"
            rec = Txn(tid, note=f"{self.name} withdraws {amount} ({mode})")
            conn = self.connect()
            try:
                with self.coord.transaction() as tx:
                    out["gtids"][tid] = tx.gtid   # the engines' logs name the gtid, the history the tid
                    with self.branch(tx, conn, mode):
                        mine, mylog = self.read_row(conn, user)
                        rec.read(self.key(user), mylog)
                        peer = self.call_peer({"user": user, "mode": mode}, tx.headers())
                        rec.read(self.key(user, self.peer_name), peer["log"])
                        time.sleep(think * random.uniform(0.5, 1.5))
                        if mine + peer["balance"] - amount < 0:
                            raise Declined(f"savings + checking = {mine + peer['balance']} < {amount}")
                        cat = "log || ' ' || %s::text" if self.kind == "postgres" else "CONCAT(log, ' ', %s)"
                        self.q(conn, f"UPDATE {self.name} SET bal = bal - %s, log = {cat} WHERE u = %s",
                               (amount, tid, user))
                        rec.append(self.key(user), tid)
                rec.status = "ok"
                out["result"] = "withdrawn"
                out["history"].append(rec.to_json())
                return out
            except Declined as e:
                # Nothing written: the reads were consistent, the decision is final.
                rec.status = "fail"
                out["history"].append(rec.to_json())
                out["result"] = "declined"
                out["reason"] = str(e)
                return out
            except (RetryableError, PeerRefused) as e:
                rec.status = "fail"
                out["history"].append(rec.to_json())
                out["refusals"].append(str(e).splitlines()[0][:300])
                time.sleep(random.uniform(0.02, 0.1) * attempt)
            except (TransactionAborted, CotxError, Exception) as e:  # noqa: BLE001
                rec.status = "info"   # outcome not known to us: the checker settles it
                out["history"].append(rec.to_json())
                out["reason"] = f"{type(e).__name__}: {e}"
                return out
            finally:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
        out["result"] = "refused"
        return out


def serve(argv):
    name, kind, port, db_port, coord_url, token, peer_url = argv
    svc = Service(name, kind, int(db_port), coord_url, token, peer_url)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"service": name}) if self.path == "/health" else self._send(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/withdraw":
                self._send(200, svc.withdraw(body))
            elif self.path == "/read":
                self._send(*svc.read(body, self.headers))
            else:
                self._send(404, {})

    ThreadingHTTPServer.daemon_threads = True
    srv = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    srv.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1:])
