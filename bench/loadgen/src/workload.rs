//! The workloads, as lists of statements per sub-transaction (the same tables, parameters
//! and key choices as bench/micro/micro.py and bench/tpcc/tpcc.py).

use serde_json::{json, Value};

/// A statement parameter: a constant, or a value an earlier query of the same
/// sub-transaction returned (register), optionally times a constant.
#[derive(Clone, Debug)]
pub enum P {
    I(i64),
    Reg(usize),
    RegTimes(usize, i64),
}

#[derive(Clone, Debug)]
pub struct Op {
    pub sql: String,
    pub params: Vec<P>,
    /// Store the query's value (last column of the first row) in this register.
    pub store: Option<usize>,
    /// For the attempt log: (table, key, is_write).
    pub touch: Option<(String, Value, bool)>,
}

impl Op {
    pub fn new(sql: impl Into<String>, params: Vec<P>) -> Op {
        Op { sql: sql.into(), params, store: None, touch: None }
    }
    pub fn store(mut self, r: usize) -> Op {
        self.store = Some(r);
        self
    }
    pub fn reads(mut self, table: &str, key: Value) -> Op {
        self.touch = Some((table.to_string(), key, false));
        self
    }
    pub fn writes(mut self, table: &str, key: Value) -> Op {
        self.touch = Some((table.to_string(), key, true));
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Pg,
    My,
}

impl Db {
    pub fn name(self) -> &'static str {
        match self {
            Db::Pg => "pg",
            Db::My => "my",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Sub {
    pub session: String, // e.g. "pg0": two sub-transactions on one database need two sessions
    pub db: Db,
    pub ops: Vec<Op>,
    /// Plain autocommit statements, no transaction (the autocommit-read mix).
    pub autocommit: bool,
    /// The branch writes nothing: declared read-only as an application declares it to the
    /// clients (`read_only=True`), checked before PREPARE and listed with the commit when
    /// it wrote nothing, so the bench measures the daemon's all-read-only commit
    /// (client.rs, `prepare_one`).
    pub read_only: bool,
}

impl Sub {
    /// The attempt log's view of the branch: table (when it touches one), keys read, written.
    pub fn touched(&self) -> (Value, Vec<Value>, Vec<Value>) {
        let tables: std::collections::BTreeSet<&str> =
            self.ops.iter().filter_map(|o| o.touch.as_ref().map(|t| t.0.as_str())).collect();
        let single = tables.len() == 1;
        let (mut r, mut w) = (vec![], vec![]);
        for o in &self.ops {
            if let Some((t, k, wr)) = &o.touch {
                let key = if single { k.clone() } else { json!(format!("{t}:{}", k)) };
                if *wr {
                    w.push(key)
                } else {
                    r.push(key)
                }
            }
        }
        let table = if single { json!(tables.iter().next().unwrap()) } else { Value::Null };
        (table, r, w)
    }
}

/// xorshift64*: small, fast, seeded per client.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo) as u64)) as i64
    }
}

pub trait Workload: Send + Sync {
    /// Session names and databases a client opens before the run.
    fn sessions(&self) -> Vec<(String, Db)>;
    fn txn(&self, rng: &mut Rng, wid: usize) -> Vec<Sub>;
}

// --- microbenchmark ------------------------------------------------------------------------
pub struct Micro {
    pub s: usize,
    pub r: usize,
    pub w: usize,
    pub n: i64,
    pub dbs: Vec<Db>,
    cdf: Option<Vec<f64>>,
    /// Share of transactions that are R autocommit reads on the first MariaDB table instead.
    pub autocommit_reads: f64,
    /// Share of global transactions that are read-only (--ro-share): every branch keeps its
    /// R reads and drops its W updates (not R+W reads: the read part stays the same as the
    /// writers', so only the writes differ between the two kinds). Still S branches through
    /// the coordinator in the global modes: read-only branches are prepared like the others.
    pub ro_share: f64,
}

impl Micro {
    pub fn new(s: usize, r: usize, w: usize, p: f64, n: i64, k: f64) -> Micro {
        let n_pg = (s as f64 * p + 0.5) as usize;
        let dbs = (0..s).map(|i| if i < n_pg { Db::Pg } else { Db::My }).collect();
        let cdf = if k > 0.0 {
            let mut acc = 0.0;
            let mut c = Vec::with_capacity(n as usize);
            for rank in 1..=n {
                acc += 1.0 / (rank as f64).powf(k);
                c.push(acc);
            }
            Some(c.into_iter().map(|x| x / acc).collect())
        } else {
            None
        };
        Micro { s, r, w, n, dbs, cdf, autocommit_reads: 0.0, ro_share: 0.0 }
    }

    fn key(&self, rng: &mut Rng) -> i64 {
        match &self.cdf {
            None => rng.range(0, self.n),
            Some(c) => {
                let u = rng.f64();
                let rank = c.partition_point(|&x| x < u) as i64;
                (rank * 7919 + 13) % self.n // 7919 is prime, coprime to N = 10^k
            }
        }
    }
}

impl Workload for Micro {
    fn sessions(&self) -> Vec<(String, Db)> {
        self.dbs.iter().enumerate().map(|(i, d)| (format!("{}{i}", d.name()), *d)).collect()
    }

    fn txn(&self, rng: &mut Rng, _wid: usize) -> Vec<Sub> {
        let _ = self.s;
        if self.autocommit_reads > 0.0 && rng.f64() < self.autocommit_reads {
            if let Some(i) = self.dbs.iter().position(|&d| d == Db::My) {
                let t = format!("mt{i}");
                let ops = (0..self.r)
                    .map(|_| {
                        let k = self.key(rng);
                        Op::new(format!("SELECT v FROM {t} WHERE k = ?"), vec![P::I(k)]).reads(&t, json!(k))
                    })
                    .collect();
                return vec![Sub { session: format!("my{i}"), db: Db::My, ops, autocommit: true, read_only: false }];
            }
        }
        // Drawn only when asked for, so that without --ro-share every client's key sequence
        // (and so every earlier measurement's workload) stays what it was.
        let w = if self.ro_share > 0.0 && rng.f64() < self.ro_share { 0 } else { self.w };
        self.dbs
            .iter()
            .enumerate()
            .map(|(i, &db)| {
                let t = format!("mt{i}");
                let mut ops = Vec::with_capacity(self.r + w);
                for _ in 0..self.r {
                    let k = self.key(rng);
                    ops.push(Op::new(format!("SELECT v FROM {t} WHERE k = ?"), vec![P::I(k)]).reads(&t, json!(k)));
                }
                let mut ws: Vec<i64> = (0..w).map(|_| self.key(rng)).collect();
                ws.sort();
                for k in ws {
                    ops.push(
                        Op::new(format!("UPDATE {t} SET v = v + 1 WHERE k = ?"), vec![P::I(k)]).writes(&t, json!(k)),
                    );
                }
                Sub { session: format!("{}{i}", db.name()), db, ops, autocommit: false, read_only: w == 0 }
            })
            .collect()
    }
}

// --- TPC-C subset ----------------------------------------------------------------------------
pub const DISTRICTS: i64 = 10;

pub struct Tpcc {
    pub w: i64,
    pub items: i64,
    pub customers: i64,
    pub remote_item: f64,
    pub remote_customer: f64,
    pub n_pg: i64,
    /// 0: payment updates w_ytd / d_ytd in the warehouse / district rows (the classic
    /// schema); k > 0: in warehouse_ytd / district_ytd, one of k rows per warehouse /
    /// district (summed on read), so new-order's reads of w_tax / d_tax and its
    /// d_next_o_id update never meet payment's writes.
    pub ytd_split: i64,
}

impl Tpcc {
    fn db_of(&self, w: i64) -> Db {
        if w <= self.n_pg {
            Db::Pg
        } else {
            Db::My
        }
    }
    fn home(&self, wid: usize) -> i64 {
        (wid as i64) % self.w + 1
    }
    fn other_w(&self, rng: &mut Rng, w: i64) -> i64 {
        if self.w == 1 {
            return w;
        }
        let o = rng.range(1, self.w);
        if o < w {
            o
        } else {
            o + 1
        }
    }

    fn stock_ops(&self, w: i64, items: &[(i64, i64, i64)]) -> Vec<Op> {
        items
            .iter()
            .map(|&(sw, i_id, qty)| {
                Op::new(
                    "UPDATE stock SET s_quantity = CASE WHEN s_quantity >= ? + 10 THEN s_quantity - ? \
                     ELSE s_quantity - ? + 91 END, s_ytd = s_ytd + ?, s_order_cnt = s_order_cnt + 1, \
                     s_remote_cnt = s_remote_cnt + ? WHERE s_w_id = ? AND s_i_id = ?",
                    vec![P::I(qty), P::I(qty), P::I(qty), P::I(qty), P::I((sw != w) as i64), P::I(sw), P::I(i_id)],
                )
                .writes("stock", json!([sw, i_id]))
            })
            .collect()
    }

    fn new_order(&self, rng: &mut Rng, wid: usize) -> Vec<Sub> {
        let w = self.home(wid);
        let d = rng.range(1, DISTRICTS + 1);
        let c = rng.range(1, self.customers + 1);
        let n = rng.range(5, 16);
        let mut chosen: Vec<i64> = Vec::new();
        while (chosen.len() as i64) < n {
            let i = rng.range(1, self.items + 1);
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
        let mut lines: Vec<(i64, i64, i64)> = chosen
            .into_iter()
            .map(|i| {
                let sw = if rng.f64() < self.remote_item { self.other_w(rng, w) } else { w };
                (sw, i, rng.range(1, 11))
            })
            .collect();
        lines.sort();
        let all_local = lines.iter().all(|l| l.0 == w) as i64;
        let home_db = self.db_of(w);
        let home_stock: Vec<_> = lines.iter().copied().filter(|l| self.db_of(l.0) == home_db).collect();
        let remote_stock: Vec<_> = lines.iter().copied().filter(|l| self.db_of(l.0) != home_db).collect();
        let mut ops = vec![
            Op::new("SELECT w_tax FROM warehouse WHERE w_id = ?", vec![P::I(w)]).reads("warehouse", json!(w)),
            Op::new(
                "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = ? AND d_id = ?",
                vec![P::I(w), P::I(d)],
            )
            .writes("district", json!([w, d])),
            Op::new(
                "SELECT d_tax, d_next_o_id - 1 FROM district WHERE d_w_id = ? AND d_id = ?",
                vec![P::I(w), P::I(d)],
            )
            .store(0)
            .reads("district", json!([w, d])),
            Op::new(
                "SELECT c_discount FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
                vec![P::I(w), P::I(d), P::I(c)],
            )
            .reads("customer", json!([w, d, c])),
            Op::new(
                "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
                vec![P::I(w), P::I(d), P::Reg(0), P::I(c), P::I(n), P::I(all_local)],
            ),
            Op::new("INSERT INTO new_order VALUES (?, ?, ?)", vec![P::I(w), P::I(d), P::Reg(0)]),
        ];
        for (num, &(sw, i_id, qty)) in lines.iter().enumerate() {
            ops.push(Op::new("SELECT i_price FROM item WHERE i_id = ?", vec![P::I(i_id)]).store(1));
            ops.push(Op::new(
                "INSERT INTO order_line VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                vec![
                    P::I(w),
                    P::I(d),
                    P::Reg(0),
                    P::I(num as i64 + 1),
                    P::I(i_id),
                    P::I(sw),
                    P::I(qty),
                    P::RegTimes(1, qty),
                ],
            ));
        }
        ops.extend(self.stock_ops(w, &home_stock));
        // TPC-C's new-order and payment both write (this subset has no order-status or
        // stock-level): never declared read-only.
        let mut subs =
            vec![Sub { session: home_db.name().into(), db: home_db, ops, autocommit: false, read_only: false }];
        if !remote_stock.is_empty() {
            let rdb = self.db_of(remote_stock[0].0);
            subs.push(Sub {
                session: rdb.name().into(),
                db: rdb,
                ops: self.stock_ops(w, &remote_stock),
                autocommit: false,
                read_only: false,
            });
        }
        subs
    }

    fn payment(&self, rng: &mut Rng, wid: usize) -> Vec<Sub> {
        let w = self.home(wid);
        let d = rng.range(1, DISTRICTS + 1);
        let (cw, cd) = if rng.f64() < self.remote_customer && self.w > 1 {
            (self.other_w(rng, w), rng.range(1, DISTRICTS + 1))
        } else {
            (w, d)
        };
        let c = rng.range(1, self.customers + 1);
        let amount = rng.range(100, 500001);
        let mut home = if self.ytd_split > 0 {
            let slot = rng.range(0, self.ytd_split);
            vec![
                Op::new(
                    "UPDATE warehouse_ytd SET w_ytd = w_ytd + ? WHERE w_id = ? AND slot = ?",
                    vec![P::I(amount), P::I(w), P::I(slot)],
                )
                .writes("warehouse_ytd", json!([w, slot])),
                Op::new(
                    "UPDATE district_ytd SET d_ytd = d_ytd + ? WHERE d_w_id = ? AND d_id = ? AND slot = ?",
                    vec![P::I(amount), P::I(w), P::I(d), P::I(slot)],
                )
                .writes("district_ytd", json!([w, d, slot])),
            ]
        } else {
            vec![
                Op::new("UPDATE warehouse SET w_ytd = w_ytd + ? WHERE w_id = ?", vec![P::I(amount), P::I(w)])
                    .writes("warehouse", json!(w)),
                Op::new(
                    "UPDATE district SET d_ytd = d_ytd + ? WHERE d_w_id = ? AND d_id = ?",
                    vec![P::I(amount), P::I(w), P::I(d)],
                )
                .writes("district", json!([w, d])),
            ]
        };
        home.push(Op::new(
            "INSERT INTO history VALUES (?, ?, ?, ?, ?, ?)",
            vec![P::I(c), P::I(cd), P::I(cw), P::I(d), P::I(w), P::I(amount)],
        ));
        let customer = vec![
            Op::new(
                "UPDATE customer SET c_balance = c_balance - ?, c_ytd_payment = c_ytd_payment + ?, \
                 c_payment_cnt = c_payment_cnt + 1 WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
                vec![P::I(amount), P::I(amount), P::I(cw), P::I(cd), P::I(c)],
            )
            .writes("customer", json!([cw, cd, c])),
            Op::new(
                "SELECT c_balance FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
                vec![P::I(cw), P::I(cd), P::I(c)],
            )
            .reads("customer", json!([cw, cd, c])),
        ];
        let (hdb, cdb) = (self.db_of(w), self.db_of(cw));
        if hdb == cdb {
            home.extend(customer);
            return vec![Sub { session: hdb.name().into(), db: hdb, ops: home, autocommit: false, read_only: false }];
        }
        vec![
            Sub { session: hdb.name().into(), db: hdb, ops: home, autocommit: false, read_only: false },
            Sub { session: cdb.name().into(), db: cdb, ops: customer, autocommit: false, read_only: false },
        ]
    }
}

impl Workload for Tpcc {
    fn sessions(&self) -> Vec<(String, Db)> {
        vec![("pg".into(), Db::Pg), ("my".into(), Db::My)]
    }

    fn txn(&self, rng: &mut Rng, wid: usize) -> Vec<Sub> {
        if rng.f64() < 0.5 {
            self.new_order(rng, wid)
        } else {
            self.payment(rng, wid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(subs: &[Sub]) -> usize {
        subs.iter().map(|s| s.ops.iter().filter(|o| o.touch.as_ref().is_some_and(|t| t.2)).count()).sum()
    }

    #[test]
    fn five_branches_each_on_its_own_table_and_session() {
        let m = Micro::new(5, 2, 1, 0.5, 100, 0.0);
        // round(5 * 0.5) = 3 branches on PostgreSQL, the first ones.
        assert_eq!(m.dbs, vec![Db::Pg, Db::Pg, Db::Pg, Db::My, Db::My]);
        let names: Vec<String> = m.sessions().into_iter().map(|s| s.0).collect();
        assert_eq!(names, ["pg0", "pg1", "pg2", "my3", "my4"]);
        let subs = m.txn(&mut Rng::new(1), 0);
        for (i, s) in subs.iter().enumerate() {
            let (table, r, w) = s.touched();
            assert_eq!(table, json!(format!("mt{i}")));
            assert_eq!((r.len(), w.len()), (2, 1));
        }
    }

    #[test]
    fn ro_share_drops_the_writes_keeps_the_reads() {
        let mut m = Micro::new(2, 3, 2, 0.5, 1000, 0.0);
        m.ro_share = 1.0;
        let subs = m.txn(&mut Rng::new(7), 0);
        assert_eq!(writes(&subs), 0);
        assert!(subs.iter().all(|s| s.read_only), "a read-only transaction's branches are declared so");
        for s in &subs {
            let (table, r, w) = s.touched();
            assert!(table.is_string());
            assert_eq!((r.len(), w.len()), (3, 0));
        }
        m.ro_share = 0.5;
        let mut rng = Rng::new(3);
        let ro = (0..2000)
            .filter(|_| {
                let subs = m.txn(&mut rng, 0);
                assert!(
                    subs.iter().all(|s| s.read_only == (writes(&subs) == 0)),
                    "declared read-only exactly when it writes nothing"
                );
                writes(&subs) == 0
            })
            .count();
        assert!((800..1200).contains(&ro), "{ro} of 2000 read-only at share 0.5");
    }

    #[test]
    fn no_ro_share_draws_nothing_more() {
        // ro_share = 0 draws no number for the share: the same transactions as before the
        // option existed (uniform keys: one draw per key, S * (R + W) of them).
        let m = Micro::new(2, 3, 2, 0.5, 1000, 0.0);
        let mut a = Rng::new(5);
        m.txn(&mut a, 0);
        let mut b = Rng::new(5);
        for _ in 0..2 * (3 + 2) {
            b.next();
        }
        assert_eq!(a.next(), b.next());
    }
}
