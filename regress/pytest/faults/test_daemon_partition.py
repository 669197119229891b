"""A partition of one daemon under load leaves its clients' transactions done, not failed,
on real servers and two real daemons.

Daemons A and B share a PostgreSQL decision store (its own server) with short leases
(ttl 1 s); A reaches the store through a TCP relay of the test (`Cut`), B directly. Eight
clients run withdrawals through `Coordinator([A, B], token).run(...)`, each request in a
thread of its own that ends after its commit (as a threaded service runs). In the middle
the relay stops forwarding for 5 s: A alone is cut off from the store (its sessions stay
open, their bytes held, as in a partition; its new connections wait), while B keeps its
access and takes A's node over (it fences A's store session and records abort for A's
undecided transactions). Then:

- every withdrawal ends done or declined: during the cut A's clients wait in their commits
  (A cannot write their decisions); what B aborted by its takeover, or A's timeout, is run
  again; a decision is learned by asking; once the link is up A refuses new work for a
  moment (503 lease_unconfirmed) and those begins go to B at once, a registration refused
  is run again after Retry-After;
- money is conserved: each done withdrawal is on both databases, nothing else is;
- nothing is left prepared;
- A really refused work: begins moved to B once the cut began (before it A took them all),
  and A's log says its lease lapsed.

What it catches: the same run with the client given only A's URL and no wait on a "not now"
(max_wait=0, as clients did before the retry rules' retry_request) ended 11 of 165
withdrawals in 503 lease_unconfirmed at begin (2026-11-29; the books still balanced)."""
from __future__ import annotations
import asyncio
import collections
import json
import random
import re
import threading
import time

from cotest import PgServer
from cotest.coord import make_daemon, metric, nothing_prepared, wait_until
from cotest.transfers import reset_accounts, run_withdrawal
from cotx import Coordinator

USERS, BALANCE = 8, 2000
CLIENTS, LOAD_S, CUT_AT_S, CUT_S = 8, 20.0, 7.0, 5.0
LEASE = {"ttl_ms": 1000, "renew_ms": 250}


class Cut:
    """A TCP relay from a local port to (host, port) that can stop forwarding: cut() holds
    every byte and every new connection in both directions (the relay keeps reading, as
    the peers' kernels would keep retransmitting), heal() delivers them and forwards
    again. One daemon's store DSN points at it: that daemon alone is partitioned."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _relay(self, down_r, down_w) -> None:
        try:
            await self.flowing.wait()          # a connection made during the cut waits for the heal
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                down_w.close()
                return
            await asyncio.gather(self._pump(down_r, up_w), self._pump(up_r, down_w))
        except asyncio.CancelledError:
            down_w.close()                     # close(): the relay's connections end with it

    async def _pump(self, src, dst) -> None:
        try:
            while True:
                data = await src.read(65536)
                await self.flowing.wait()
                if not data:
                    break
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            # A session ended on one side (the store fenced it, the daemon dropped it) ends
            # on the other once the link is up: the close is a byte like any other.
            await self.flowing.wait()
            dst.close()

    def cut(self) -> None:
        self.loop.call_soon_threadsafe(self.flowing.clear)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(self.flowing.set)

    async def _shutdown(self) -> None:
        self.flowing.set()
        self.server.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def log_messages(d) -> collections.Counter:
    """How many times the daemon logged each message (its log is JSON lines)."""
    out = collections.Counter()
    for line in d.log_file.read_text(errors="replace").splitlines():
        try:
            out[json.loads(line).get("message", "")] += 1
        except ValueError:
            continue
    return out


def kind(e) -> str:
    """An error run again, in a word: the daemon's refusal (status, code, phase), or the
    start of an abort's reason (a takeover's, a serialization failure's)."""
    if getattr(e, "status", None):
        return f"{e.status} {e.code} at {e.phase}"
    return f"{type(e).__name__}: " + re.sub(r"\S+\.[0-9a-f]{12}-[0-9a-f]+:? ?", "", str(e))[:60]


def partitioned_load(pg, mariadb, urls, token, *, run_kw, cut, a_node):
    """CLIENTS clients, a thread per request, for LOAD_S seconds; A cut off from CUT_AT_S to
    CUT_AT_S + CUT_S. Returns (results by withdrawal id, retried errors, where each attempt
    began: (on A?, after the cut began?))."""
    coord = Coordinator(urls, token, decision_timeout=60)
    results, stop, seq = {}, threading.Event(), iter(range(10**6))
    retried, begun, cut_at = [], [], [None]

    def recorded(inner):
        def fn(tx):
            begun.append((tx.gtid.split(".")[0] == a_node, cut_at[0] is not None and time.time() >= cut_at[0]))
            return inner(tx)
        return fn

    def request(wid, u, amt):
        results[wid] = run_withdrawal(coord, pg, mariadb, wid, u, amt, wrap=recorded,
                                      on_retry=lambda n, e, s: retried.append(kind(e)), **run_kw)

    def client(rng):
        while not stop.is_set():
            t = threading.Thread(target=request, args=(f"w{next(seq)}", rng.randrange(USERS), rng.randrange(5, 40)))
            t.start()
            t.join()

    clients = [threading.Thread(target=client, args=(random.Random(i),)) for i in range(CLIENTS)]
    start = time.time()
    for t in clients:
        t.start()
    try:
        time.sleep(CUT_AT_S)
        cut_at[0] = time.time()
        cut.cut()
        time.sleep(CUT_S)
        cut.heal()
        time.sleep(max(0.0, LOAD_S - (time.time() - start)))
    finally:
        cut.heal()
        stop.set()
        for t in clients:
            t.join(120)
    return results, retried, begun


def check_books(pg, mariadb, results):
    """Each done withdrawal on both databases and nothing else; money conserved."""
    done = {w for w, r in results.items() if r == "done"}
    wait_until(lambda: nothing_prepared(pg, mariadb), 30, "nothing left prepared")
    logged = {r[0] for r in mariadb.sql("SELECT id FROM wd_log")}
    assert logged == done, (f"lost: {sorted(done - logged)[:5]}", f"not done yet committed: {sorted(logged - done)[:5]}")
    spent = dict(mariadb.sql("SELECT u, SUM(amt) FROM wd_log GROUP BY u"))
    for u, bal in pg.sql("SELECT u, bal FROM wd_acct"):
        assert bal == BALANCE - int(spent.get(u, 0)) and bal >= 0, (u, bal, spent.get(u))


def two_daemons(pg, mariadb, store_srv, cut):
    """A (store through the relay) and B (direct) on one store table, one token."""
    store_b = {"kind": "postgres", "dsn": store_srv.dsn, "table": "part_t"}
    store_a = {**store_b, "dsn": store_srv.dsn.replace(f"port={store_srv.port}", f"port={cut.port}")}
    a = make_daemon(pg, mariadb, store=store_a, lease=LEASE)
    b = make_daemon(pg, mariadb, store=store_b, lease=LEASE)
    b.token = a.token
    b.write_config()
    return a, b


def partition_run(pg, mariadb, *, both_urls: bool, run_kw: dict):
    """The load with A cut off: (results, retried, begun, A's log messages, B's takeovers)."""
    reset_accounts(pg, mariadb, USERS, BALANCE)
    with PgServer(preload=False) as store_srv:
        cut = Cut("127.0.0.1", store_srv.port)
        a, b = two_daemons(pg, mariadb, store_srv, cut)
        try:
            a.start()
            b.start()
            urls = [a.url, b.url] if both_urls else [a.url]
            results, retried, begun = partitioned_load(pg, mariadb, urls, a.token, cut=cut, a_node=a.node_id,
                                                       run_kw=run_kw)
            a_log, takeovers = log_messages(a), metric(b, "cotx_takeovers_total", 0.0)
        finally:
            cut.close()
            a.destroy()
            b.destroy()
    failed = {w: r for w, r in results.items() if r not in ("done", "declined")}
    print(f"{len(results)} withdrawals: {sum(r == 'done' for r in results.values())} done, "
          f"{sum(r == 'declined' for r in results.values())} declined, {len(failed)} failed "
          f"({collections.Counter(kind(e) for e in failed.values())}); "
          f"attempts begun on A {sum(1 for on_a, _ in begun if on_a)}, on B {sum(1 for on_a, _ in begun if not on_a)} "
          f"({sum(1 for on_a, after in begun if not on_a and after)} after the cut began); "
          f"run again after: {collections.Counter(retried)}; B's takeovers {takeovers}; "
          f"A's lease lines: { {m: n for m, n in a_log.items() if 'lease' in m or 'store' in m} }")
    return results, failed, begun, a_log


def test_a_partitioned_daemon_under_load_leaves_every_request_done(pg, mariadb, withdrawal_tables):
    results, failed, begun, a_log = partition_run(pg, mariadb, both_urls=True,
                                                  run_kw={"retries": 30, "max_wait": 60})
    assert not failed, f"{len(failed)} of {len(results)} withdrawals failed: {list(failed.items())[:5]}"
    assert len(results) >= 30, len(results)
    # A refused work during the cut: begins went to B (before it, A took them all), and
    # A says its lease lapsed.
    assert any(not on_a and after for on_a, after in begun), begun
    assert any("lease" in m and ("not renewed" in m or "lost" in m or "late" in m) for m in a_log), a_log
    check_books(pg, mariadb, results)

