//! The global wait-for graph and the cycles the coordinator breaks (pure: no I/O; the
//! pass that reads the databases and acts is deadlocks.rs).
//!
//! A node is a global transaction, or a session no global transaction is known to run on
//! (a local transaction) at one resource. An edge "a waits for b" comes from one resource's lock waits. Each engine
//! breaks the cycles it can see itself (PostgreSQL after `deadlock_timeout`, InnoDB at
//! once); a cycle whose edges come from two or more resources no engine sees, and only
//! those are ours to break. The victim is the youngest global transaction in the cycle
//! (the latest begun; ties by gtid): deterministic, and the one that has done least. The
//! sessions given include other daemons' (published through the store): every daemon sees
//! the same cycle and names the same victim, and only the victim's owner acts on it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    Global(String),
    /// A session at a resource that no global transaction of ours runs on.
    Local(String, i64),
}

/// One lock wait at `resource` between two sessions.
#[derive(Debug, Clone)]
pub struct Edge {
    pub resource: String,
    pub waiter: i64,
    pub blocker: i64,
    /// What is waited for (tables, a key), for the log.
    pub on: String,
}

/// A cycle to break: its nodes, the waits that close it, and the victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub nodes: Vec<Node>,
    /// (waiter, blocker, resource, on) of each wait inside the cycle.
    pub waits: Vec<(Node, Node, String, String)>,
    pub victim: String,
}

/// Global transactions' sessions (ours and other daemons'): (resource, session) -> gtid;
/// `begun`: gtid -> when it began (unix ms), which decides the victim.
pub fn cycles(edges: &[Edge], sessions: &HashMap<(String, i64), String>, begun: &HashMap<String, u64>) -> Vec<Cycle> {
    let node = |res: &str, s: i64| match sessions.get(&(res.to_string(), s)) {
        Some(g) => Node::Global(g.clone()),
        None => Node::Local(res.to_string(), s),
    };
    // Deterministic order everywhere (BTree): the same waits give the same victims.
    let mut adj: BTreeMap<Node, BTreeSet<Node>> = BTreeMap::new();
    let mut labels: BTreeMap<(Node, Node), (String, String)> = BTreeMap::new();
    for e in edges {
        let (a, b) = (node(&e.resource, e.waiter), node(&e.resource, e.blocker));
        if a == b {
            continue; // two sessions of one transaction: not a wait between transactions
        }
        adj.entry(b.clone()).or_default();
        adj.entry(a.clone()).or_default().insert(b.clone());
        labels.entry((a, b)).or_insert_with(|| (e.resource.clone(), e.on.clone()));
    }
    let mut out = Vec::new();
    for comp in components(&adj) {
        let inside: BTreeSet<&Node> = comp.iter().collect();
        let waits: Vec<(Node, Node, String, String)> = labels
            .iter()
            .filter(|((a, b), _)| inside.contains(a) && inside.contains(b))
            .map(|((a, b), (r, on))| (a.clone(), b.clone(), r.clone(), on.clone()))
            .collect();
        let resources: BTreeSet<&str> = waits.iter().map(|w| w.2.as_str()).collect();
        if resources.len() < 2 {
            continue; // the engine sees this one itself
        }
        let victim = comp
            .iter()
            .filter_map(|n| match n {
                Node::Global(g) => Some(g),
                Node::Local(..) => None,
            })
            .max_by(|x, y| (begun.get(*x), *x).cmp(&(begun.get(*y), *y)));
        if let Some(v) = victim {
            out.push(Cycle { nodes: comp.clone(), waits, victim: v.clone() });
        }
    }
    out
}

/// Strongly connected components with more than one node (Tarjan's algorithm, iterative:
/// a long chain of waits must not overflow the stack).
fn components(adj: &BTreeMap<Node, BTreeSet<Node>>) -> Vec<Vec<Node>> {
    let nodes: Vec<&Node> = adj.keys().collect();
    let ix: HashMap<&Node, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes.iter().map(|n| adj[*n].iter().map(|m| ix[m]).collect()).collect();
    let n = nodes.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = succ[v].get(*i) {
                *i += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    out.push(comp);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(resource: &str, waiter: i64, blocker: i64) -> Edge {
        Edge { resource: resource.into(), waiter, blocker, on: format!("t{waiter}") }
    }

    fn ours(list: &[(&str, i64, &str)]) -> HashMap<(String, i64), String> {
        list.iter().map(|(r, s, g)| ((r.to_string(), *s), g.to_string())).collect()
    }

    fn begun(list: &[(&str, u64)]) -> HashMap<String, u64> {
        list.iter().map(|(g, t)| (g.to_string(), *t)).collect()
    }

    #[test]
    fn the_crossed_pair_loses_its_youngest() {
        // T1: pg session 11, my session 21; T2: pg 12, my 22. T1 waits for T2 on my, T2
        // for T1 on pg.
        let s = ours(&[("pg", 11, "T1"), ("my", 21, "T1"), ("pg", 12, "T2"), ("my", 22, "T2")]);
        let c = cycles(&[e("my", 21, 22), e("pg", 12, 11)], &s, &begun(&[("T1", 100), ("T2", 200)]));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].victim, "T2");
        assert_eq!(c[0].waits.len(), 2);
        // Begun in the other order: the other one.
        let c = cycles(&[e("my", 21, 22), e("pg", 12, 11)], &s, &begun(&[("T1", 300), ("T2", 200)]));
        assert_eq!(c[0].victim, "T1");
    }

    #[test]
    fn a_cycle_inside_one_database_is_the_engines() {
        let s = ours(&[("pg", 11, "T1"), ("pg", 12, "T2")]);
        assert!(cycles(&[e("pg", 11, 12), e("pg", 12, 11)], &s, &begun(&[])).is_empty());
    }

    #[test]
    fn a_wait_that_is_not_a_cycle_is_left_alone() {
        let s = ours(&[("pg", 11, "T1"), ("my", 21, "T1"), ("pg", 12, "T2"), ("my", 22, "T2")]);
        // T1 waits for T2 on both databases; T2 waits for nobody.
        assert!(cycles(&[e("pg", 11, 12), e("my", 21, 22)], &s, &begun(&[])).is_empty());
        // A chain through a local transaction that ends.
        assert!(cycles(&[e("pg", 11, 99), e("pg", 99, 12)], &s, &begun(&[])).is_empty());
    }

    #[test]
    fn three_transactions_across_two_databases() {
        // T1 -> T2 on pg, T2 -> T3 on my, T3 -> T1 on pg.
        let s = ours(&[("pg", 1, "T1"), ("pg", 2, "T2"), ("my", 12, "T2"), ("my", 13, "T3"), ("pg", 3, "T3")]);
        let c =
            cycles(&[e("pg", 1, 2), e("my", 12, 13), e("pg", 3, 1)], &s, &begun(&[("T1", 1), ("T2", 3), ("T3", 2)]));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].nodes.len(), 3);
        assert_eq!(c[0].victim, "T2");
    }

    #[test]
    fn a_cycle_through_a_local_transaction_holding_a_lock() {
        // T1 waits (pg) for local session 50, which waits (pg) for T2; T2 waits (my) for T1.
        let s = ours(&[("pg", 11, "T1"), ("my", 21, "T1"), ("pg", 12, "T2"), ("my", 22, "T2")]);
        let c = cycles(&[e("pg", 11, 50), e("pg", 50, 12), e("my", 22, 21)], &s, &begun(&[("T1", 1), ("T2", 2)]));
        assert_eq!(c.len(), 1);
        assert!(c[0].nodes.contains(&Node::Local("pg".into(), 50)));
        assert_eq!(c[0].victim, "T2", "a local transaction is never the victim");
    }

    #[test]
    fn a_cycle_through_two_daemons_needs_their_sessions_and_has_one_victim() {
        // The crossed pair, T1 on daemon A and T2 on daemon B. Without B's sessions, A sees
        // T2's two sessions as two unrelated nodes: no cycle (the defect: left to timeouts).
        let a = ours(&[("pg", 11, "T1"), ("my", 21, "T1")]);
        let w = [e("my", 21, 22), e("pg", 12, 11)];
        assert!(cycles(&w, &a, &begun(&[("T1", 1)])).is_empty());
        // With the sessions both publish through the store, each daemon sees the one cycle
        // and names the same victim; only its owner (B) acts on it.
        let all = ours(&[("pg", 11, "T1"), ("my", 21, "T1"), ("pg", 12, "T2"), ("my", 22, "T2")]);
        let b = begun(&[("T1", 1), ("T2", 2)]);
        let seen_by_a = cycles(&w, &all, &b);
        let seen_by_b = cycles(&w, &all, &b);
        assert_eq!(seen_by_a.len(), 1);
        assert_eq!(seen_by_a, seen_by_b);
        assert_eq!(seen_by_a[0].victim, "T2");
    }

    #[test]
    fn two_separate_cycles_each_lose_one() {
        let s = ours(&[("pg", 1, "A"), ("my", 1, "A"), ("pg", 2, "B"), ("my", 2, "B")])
            .into_iter()
            .chain(ours(&[("pg", 3, "C"), ("my", 3, "C"), ("pg", 4, "D"), ("my", 4, "D")]))
            .collect();
        let w = [e("pg", 1, 2), e("my", 2, 1), e("pg", 3, 4), e("my", 4, 3)];
        let mut v: Vec<String> =
            cycles(&w, &s, &begun(&[("A", 1), ("B", 2), ("C", 3), ("D", 4)])).into_iter().map(|c| c.victim).collect();
        v.sort();
        assert_eq!(v, ["B", "D"]);
    }
}
