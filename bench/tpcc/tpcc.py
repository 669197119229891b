#!/usr/bin/env python3
"""A TPC-C subset (new-order + payment) with warehouses split between PostgreSQL and
MariaDB, in the four modes (local, 2pc, co, client), with consistency checks after every run.

Scaled down for a 2-core machine (RESULTS.md says so): ITEMS items (replicated, read-only,
on both databases), 10 districts per warehouse, CUSTOMERS customers per district, a stock
row per item and warehouse; no initial orders. Warehouses 1..W/2 live on PostgreSQL, the
rest on MariaDB. Each client has a home warehouse (round robin; 2 clients per warehouse by
default, no think time: the warehouse row every payment updates is the hot spot, and at
SERIALIZABLE PostgreSQL aborts concurrent updaters of a row ("first updater wins"), so
more clients per warehouse mostly add aborts). Mix 50 % new-order,
50 % payment (the two transactions' shares of the standard mix, 45:43, normalised).
  new-order: 5-15 items, each supplied by a remote warehouse with probability
             --remote-item (standard: 1 %; default here 10 % so that most new-orders span
             both databases, as in the Sonata setup); the home branch updates the district
             and inserts the order, new-order row and order lines (reading the item
             prices) and updates home stock; stock of another database is updated in a
             branch there (a remote warehouse on the same database stays in the home branch).
  payment:   warehouse and district YTD, history row at home; customer (by id; 15 %
             remote warehouse, as in the standard) updated on its own database.
Consistency checks (TPC-C 3.3.2.1-3 per database, plus two across databases that only hold
if every global transaction was atomic):
  W_YTD = sum(D_YTD); D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID); sum(O_OL_CNT) = #order_lines;
  sum(S_YTD) over both databases = sum(OL_QUANTITY) over both;
  sum(H_AMOUNT) = sum(W_YTD) - initial = sum(C_YTD_PAYMENT) - initial (over both);
  and nothing left prepared.

  /var/cache/cotx/venv/bin/python bench/tpcc/tpcc.py [--warehouses 2,4] [--seconds 4]
      [--warmup 1] [--reps 3] [--clients-per-warehouse 2] [--out bench/results]   (--smoke for CI)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.harness import MODES
from bench.harness.core import Env, log, machine, run_point, summarize, write_summary
from bench.harness.driver import Sub

DISTRICTS = 10
W_YTD0 = 30000000        # cents
D_YTD0 = 3000000
C_YTD0 = 1000
C_BAL0 = -1000

SCHEMA = [
    "CREATE TABLE warehouse (w_id int PRIMARY KEY, w_tax int NOT NULL, w_ytd bigint NOT NULL)",
    "CREATE TABLE district (d_w_id int, d_id int, d_tax int NOT NULL, d_ytd bigint NOT NULL, "
    "d_next_o_id int NOT NULL, PRIMARY KEY (d_w_id, d_id))",
    "CREATE TABLE customer (c_w_id int, c_d_id int, c_id int, c_discount int NOT NULL, "
    "c_balance bigint NOT NULL, c_ytd_payment bigint NOT NULL, c_payment_cnt int NOT NULL, "
    "PRIMARY KEY (c_w_id, c_d_id, c_id))",
    "CREATE TABLE item (i_id int PRIMARY KEY, i_price int NOT NULL)",
    "CREATE TABLE stock (s_w_id int, s_i_id int, s_quantity int NOT NULL, s_ytd int NOT NULL, "
    "s_order_cnt int NOT NULL, s_remote_cnt int NOT NULL, PRIMARY KEY (s_w_id, s_i_id))",
    "CREATE TABLE orders (o_w_id int, o_d_id int, o_id int, o_c_id int NOT NULL, "
    "o_ol_cnt int NOT NULL, o_all_local int NOT NULL, PRIMARY KEY (o_w_id, o_d_id, o_id))",
    "CREATE TABLE new_order (no_w_id int, no_d_id int, no_o_id int, PRIMARY KEY (no_w_id, no_d_id, no_o_id))",
    "CREATE TABLE order_line (ol_w_id int, ol_d_id int, ol_o_id int, ol_number int, ol_i_id int NOT NULL, "
    "ol_supply_w_id int NOT NULL, ol_quantity int NOT NULL, ol_amount int NOT NULL, "
    "PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number))",
    "CREATE TABLE history (h_c_id int NOT NULL, h_c_d_id int NOT NULL, h_c_w_id int NOT NULL, "
    "h_d_id int NOT NULL, h_w_id int NOT NULL, h_amount int NOT NULL)",
]
# The split schema (ytd_split = k > 0): payment's year-to-date sums live in their own rows,
# k per warehouse / district (payment adds to a random one; readers sum them), as TPC-C
# ports built for throughput do. New-order reads w_tax / d_tax and bumps d_next_o_id;
# with the sums in the same rows every payment of the warehouse conflicts with those
# (a write on a row new-order read, and first-updater-wins on the district row).
SPLIT_SCHEMA = [
    "CREATE TABLE warehouse_ytd (w_id int, slot int, w_ytd bigint NOT NULL, PRIMARY KEY (w_id, slot))",
    "CREATE TABLE district_ytd (d_w_id int, d_id int, slot int, d_ytd bigint NOT NULL, PRIMARY KEY (d_w_id, d_id, slot))",
]
# Room for HOT updates on PostgreSQL (the same in every mode): a non-HOT update of a hot
# warehouse/district row inserts an index entry, which is an rw-conflict with every
# transaction that looked up any row on that index page.
PG_FILLFACTOR = {"warehouse": 10, "district": 10, "customer": 80, "stock": 80,
                 "warehouse_ytd": 10, "district_ytd": 10}
TABLES = ["warehouse", "district", "customer", "item", "stock", "orders", "new_order", "order_line",
          "history", "warehouse_ytd", "district_ytd"]


class TpcC:
    def __init__(self, warehouses: int, remote_item: float = 0.10, remote_customer: float = 0.15,
                 items: int = 10000, customers: int = 300, ytd_split: int = 0):
        self.W, self.items, self.customers = warehouses, items, customers
        self.ytd_split = ytd_split
        self.remote_item, self.remote_customer = remote_item, remote_customer
        self.n_pg = max(1, warehouses // 2)

    def db_of(self, w: int) -> str:
        return "pg" if w <= self.n_pg else "my"

    def home(self, wid: int) -> int:
        return wid % self.W + 1

    def sessions(self, wid):
        return [Sub("pg", "pg", None), Sub("my", "my", None)]

    def other_w(self, rng, w):
        if self.W == 1:
            return w
        o = rng.randrange(1, self.W)
        return o if o < w else o + 1

    def txn(self, rng, wid):
        return self.new_order(rng, wid) if rng.random() < 0.5 else self.payment(rng, wid)

    def new_order(self, rng, wid):
        w = self.home(wid)
        d = rng.randrange(1, DISTRICTS + 1)
        c = rng.randrange(1, self.customers + 1)
        n = rng.randrange(5, 16)
        chosen = rng.sample(range(1, self.items + 1), n)
        lines = []
        for i_id in chosen:
            sw = self.other_w(rng, w) if rng.random() < self.remote_item else w
            lines.append((sw, i_id, rng.randrange(1, 11)))
        lines.sort()
        all_local = int(all(sw == w for sw, _, _ in lines))
        home_db = self.db_of(w)
        home_stock = [l for l in lines if self.db_of(l[0]) == home_db]
        remote_stock = [l for l in lines if self.db_of(l[0]) != home_db]

        def stock(ex, items):
            for sw, i_id, qty in items:
                ex.q("UPDATE stock SET s_quantity = CASE WHEN s_quantity >= %s + 10 THEN s_quantity - %s "
                     "ELSE s_quantity - %s + 91 END, s_ytd = s_ytd + %s, s_order_cnt = s_order_cnt + 1, "
                     "s_remote_cnt = s_remote_cnt + %s WHERE s_w_id = %s AND s_i_id = %s",
                     (qty, qty, qty, qty, int(sw != w), sw, i_id))
            return len(items)

        def home(ex):
            ex.q("SELECT w_tax FROM warehouse WHERE w_id = %s", (w,))
            ex.q("UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = %s AND d_id = %s", (w, d))
            o_id = ex.q("SELECT d_tax, d_next_o_id - 1 FROM district WHERE d_w_id = %s AND d_id = %s", (w, d))[0][1]
            ex.q("SELECT c_discount FROM customer WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s", (w, d, c))
            ex.q("INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s)", (w, d, o_id, c, n, all_local))
            ex.q("INSERT INTO new_order VALUES (%s, %s, %s)", (w, d, o_id))
            for num, (sw, i_id, qty) in enumerate(lines, 1):
                price = ex.q("SELECT i_price FROM item WHERE i_id = %s", (i_id,))[0][0]
                ex.q("INSERT INTO order_line VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                     (w, d, o_id, num, i_id, sw, qty, qty * int(price)))
            stock(ex, home_stock)
            return 1

        subs = [Sub(home_db, home_db, home)]
        if remote_stock:
            rdb = self.db_of(remote_stock[0][0])
            subs.append(Sub(rdb, rdb, lambda ex: stock(ex, remote_stock)))
        return subs

    def payment(self, rng, wid):
        w = self.home(wid)
        d = rng.randrange(1, DISTRICTS + 1)
        if rng.random() < self.remote_customer and self.W > 1:
            cw, cd = self.other_w(rng, w), rng.randrange(1, DISTRICTS + 1)
        else:
            cw, cd = w, d
        c = rng.randrange(1, self.customers + 1)
        amount = rng.randrange(100, 500001)

        slot = rng.randrange(self.ytd_split) if self.ytd_split else 0

        def home(ex):
            if self.ytd_split:
                ex.q("UPDATE warehouse_ytd SET w_ytd = w_ytd + %s WHERE w_id = %s AND slot = %s", (amount, w, slot))
                ex.q("UPDATE district_ytd SET d_ytd = d_ytd + %s WHERE d_w_id = %s AND d_id = %s AND slot = %s",
                     (amount, w, d, slot))
            else:
                ex.q("UPDATE warehouse SET w_ytd = w_ytd + %s WHERE w_id = %s", (amount, w))
                ex.q("UPDATE district SET d_ytd = d_ytd + %s WHERE d_w_id = %s AND d_id = %s", (amount, w, d))
            ex.q("INSERT INTO history VALUES (%s, %s, %s, %s, %s, %s)", (c, cd, cw, d, w, amount))
            return 3

        def customer(ex):
            ex.q("UPDATE customer SET c_balance = c_balance - %s, c_ytd_payment = c_ytd_payment + %s, "
                 "c_payment_cnt = c_payment_cnt + 1 WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s",
                 (amount, amount, cw, cd, c))
            ex.q("SELECT c_balance FROM customer WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s", (cw, cd, c))
            return 1

        hdb, cdb = self.db_of(w), self.db_of(cw)
        if hdb == cdb:
            return [Sub(hdb, hdb, lambda ex: home(ex) + customer(ex))]
        return [Sub(hdb, hdb, home), Sub(cdb, cdb, customer)]

    # --- load and checks -----------------------------------------------------------------
    def load(self, env: Env) -> None:
        t0 = time.time()
        for db in ("pg", "my"):
            ws = [w for w in range(1, self.W + 1) if self.db_of(w) == db]
            lo, hi = ws[0], ws[-1]
            if db == "pg":
                gen = lambda a, b: f"generate_series({a}, {b})"  # noqa: E731
                run = env.pg.sql
            else:
                gen = lambda a, b: f"seq_{a}_to_{b}"  # noqa: E731
                run = env.my.sql
            col = "g" if db == "pg" else "seq"
            al = " g" if db == "pg" else ""
            for t in TABLES:
                run(f"DROP TABLE IF EXISTS {t}")
            for stmt in SCHEMA + (SPLIT_SCHEMA if self.ytd_split else []):
                table = stmt.split()[2]
                run(stmt + (f" WITH (fillfactor = {PG_FILLFACTOR[table]})" if db == "pg" and table in PG_FILLFACTOR else ""))
            run(f"INSERT INTO item SELECT {col}, 100 + ({col} * 37) % 9900 FROM {gen(1, self.items)}{al}")
            run(f"INSERT INTO warehouse SELECT {col}, ({col} * 7) % 2000, {W_YTD0} FROM {gen(lo, hi)}{al}")
            for w in ws:
                run(f"INSERT INTO district SELECT {w}, {col}, ({col} * 13) % 2000, {D_YTD0}, 1 FROM {gen(1, DISTRICTS)}{al}")
                for d in range(1, DISTRICTS + 1):
                    run(f"INSERT INTO customer SELECT {w}, {d}, {col}, ({col} * 11) % 5000, {C_BAL0}, {C_YTD0}, 1 "
                        f"FROM {gen(1, self.customers)}{al}")
                run(f"INSERT INTO stock SELECT {w}, {col}, 10 + ({col} * 17) % 91, 0, 0, 0 FROM {gen(1, self.items)}{al}")
            if self.ytd_split:
                # Slot 0 starts with the initial sums, the others at 0.
                for w in ws:
                    run(f"INSERT INTO warehouse_ytd SELECT {w}, {col}, CASE WHEN {col} = 0 THEN {W_YTD0} ELSE 0 END "
                        f"FROM {gen(0, self.ytd_split - 1)}{al}")
                    for d in range(1, DISTRICTS + 1):
                        run(f"INSERT INTO district_ytd SELECT {w}, {d}, {col}, CASE WHEN {col} = 0 THEN {D_YTD0} ELSE 0 END "
                            f"FROM {gen(0, self.ytd_split - 1)}{al}")
        env.pg.sql("VACUUM ANALYZE")
        log(f"TPC-C: loaded {self.W} warehouses ({self.n_pg} on PostgreSQL) in {time.time() - t0:.1f} s")

    def check(self, env: Env) -> str:
        bad = []
        tot = {"s_ytd": 0, "ol_qty": 0, "h": 0, "w_ytd": 0, "c_ytd": 0}
        if self.ytd_split:
            w_ytd = "(SELECT sum(y.w_ytd) FROM warehouse_ytd y WHERE y.w_id = warehouse.w_id)"
            d_ytd = "(SELECT sum(d_ytd) FROM district_ytd WHERE d_w_id = w_id)"
            w_total = "(SELECT coalesce(sum(w_ytd), 0) FROM warehouse_ytd)"
        else:
            w_ytd, d_ytd = "w_ytd", "(SELECT sum(d_ytd) FROM district WHERE d_w_id = w_id)"
            w_total = "(SELECT coalesce(sum(w_ytd), 0) FROM warehouse)"
        for db, run in (("pg", env.pg.sql), ("my", env.my.sql)):
            for w, wy, dy in run(f"SELECT w_id, {w_ytd}, {d_ytd} FROM warehouse"):
                if int(wy) != int(dy):
                    bad.append(f"{db} W_YTD != sum(D_YTD) w{w}")
            for w, d, nxt, mo, mno in run(
                    "SELECT d_w_id, d_id, d_next_o_id, "
                    "(SELECT coalesce(max(o_id), 0) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id), "
                    "(SELECT coalesce(max(no_o_id), 0) FROM new_order WHERE no_w_id = d_w_id AND no_d_id = d_id) "
                    "FROM district"):
                if not (nxt - 1 == mo == mno):
                    bad.append(f"{db} D_NEXT_O_ID/max(O_ID)/max(NO_O_ID) w{w} d{d}: {nxt - 1}/{mo}/{mno}")
            r = run("SELECT (SELECT coalesce(sum(o_ol_cnt), 0) FROM orders), (SELECT count(*) FROM order_line)")[0]
            if int(r[0]) != int(r[1]):
                bad.append(f"{db} sum(O_OL_CNT) {r[0]} != order lines {r[1]}")
            r = run("SELECT (SELECT coalesce(sum(s_ytd), 0) FROM stock), (SELECT coalesce(sum(ol_quantity), 0) FROM order_line), "
                    f"(SELECT coalesce(sum(h_amount), 0) FROM history), {w_total}, "
                    "(SELECT coalesce(sum(c_ytd_payment), 0) FROM customer), (SELECT count(*) FROM warehouse), "
                    "(SELECT count(*) FROM customer)")[0]
            tot["s_ytd"] += int(r[0])
            tot["ol_qty"] += int(r[1])
            tot["h"] += int(r[2])
            tot["w_ytd"] += int(r[3]) - W_YTD0 * int(r[5])
            tot["c_ytd"] += int(r[4]) - C_YTD0 * int(r[6])
        if tot["s_ytd"] != tot["ol_qty"]:
            bad.append(f"sum(S_YTD) {tot['s_ytd']} != sum(OL_QUANTITY) {tot['ol_qty']} across databases")
        if not (tot["h"] == tot["w_ytd"] == tot["c_ytd"]):
            bad.append(f"payments: history {tot['h']}, W_YTD {tot['w_ytd']}, C_YTD_PAYMENT {tot['c_ytd']}")
        # Env.leftovers: what is still prepared once owners and the daemon had their time
        # (client mode's ready helpers go within a second of the last branch).
        n_pg, n_my = env.leftovers()
        if n_pg or n_my:
            bad.append(f"left prepared: {n_pg} PostgreSQL, {n_my} MariaDB")
        return "ok" if not bad else "; ".join(bad[:3])


def run(env: Env, warehouses: list[int], *, seconds: float, warmup: float, reps: int,
        clients_per_warehouse: int, out: Path, modes=MODES, small: bool = False,
        remote_item: float = 0.10, ytd_split: int = 0) -> list[dict]:
    all_rows = []
    for i, W in enumerate(warehouses):
        clients = clients_per_warehouse * W
        wl = TpcC(W, remote_item=remote_item, items=1000 if small else 10000, customers=30 if small else 300,
                  ytd_split=ytd_split)
        wl.load(env)
        first = wl.check(env)
        if first != "ok":
            raise RuntimeError(f"consistency check fails right after loading: {first}")
        params = {"W": W, "clients": clients, "remote_item": remote_item, "remote_customer": 0.15,
                  "items": wl.items, "customers_per_district": wl.customers, "ytd_split": ytd_split}
        all_rows += run_point(env, "tpcc", f"W={W}", params, wl, clients=clients, warmup=warmup,
                              duration=seconds, reps=reps, modes=modes, csv_path=out / "tpcc_runs.csv",
                              progress_prefix=f"({i + 1}/{len(warehouses)}) ", check=wl.check)
    write_summary(summarize(all_rows, modes), out / "tpcc_summary.csv")
    return all_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warehouses", default="2,4")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients-per-warehouse", type=int, default=2,
                    help="client processes per warehouse, no think time (default 2)")
    ap.add_argument("--remote-item", type=float, default=0.10)
    ap.add_argument("--ytd-split", type=int, default=0,
                    help="YTD rows per warehouse/district in their own tables (0: the classic schema)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        a.seconds, a.warmup, a.reps, a.clients_per_warehouse, a.no_fsync, a.warehouses = 0.6, 0.2, 1, 1, True, "2"
    a.out.mkdir(parents=True, exist_ok=True)
    for f in ("tpcc_runs.csv", "tpcc_summary.csv"):
        (a.out / f).unlink(missing_ok=True)
    log(f"machine: {machine()}")
    with Env(fsync=not a.no_fsync) as env:
        rows = run(env, [int(x) for x in a.warehouses.split(",")], seconds=a.seconds, warmup=a.warmup,
                   reps=a.reps, clients_per_warehouse=a.clients_per_warehouse, out=a.out, small=a.smoke, remote_item=a.remote_item,
                   ytd_split=a.ytd_split)
    for s in summarize(rows):
        log(f"summary {s['point']:6s} {s['mode']:5s} {s['tps_median']:8.1f} tx/s  ratio to 2pc "
            f"{s['ratio_to_2pc']:.3f}  aborts {s['abort_rate']:.2%}  checks {s['checks']}")
    bad = [r for r in rows if r["errors"] or r["check"] != "ok"]
    if bad:
        log(f"{len(bad)} run(s) with errors or failed checks: {bad[0]['errors'] or bad[0]['check']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
