//! cotx-model: checks the coordinator's commit protocol (cotx-protocol) exhaustively to a
//! depth, then checks that every deliberately broken variant is caught. Prints states
//! explored, depth and time for each; exit status 1 when the real protocol breaks a
//! property or a broken variant goes unnoticed.

use clap::Parser;
use cotx_model::{check, Bug, Proto, MODES};

/// Model-check the coordinator's commit protocol (docs/guarantees.md, "The commit protocol, model-checked").
#[derive(Parser)]
struct Args {
    /// Steps per path explored (breadth-first).
    #[arg(long, default_value_t = 40)]
    depth: usize,
    /// Daemons sharing the store (daemon 0 owns the transaction's node).
    #[arg(long, default_value_t = 3)]
    daemons: usize,
    /// Faults injected per path (lease run out, crash, lost write, MariaDB revive).
    #[arg(long, default_value_t = 3)]
    faults: u8,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Daemons and faults for the one-request ("leased") modes and their broken variants,
    /// whose space grows fastest (by default as --daemons and --faults; the test command
    /// explores 2 and 2 whole).
    #[arg(long)]
    leased_daemons: Option<usize>,
    #[arg(long)]
    leased_faults: Option<u8>,
    /// Depth for the broken variants (each stops at its first counterexample).
    #[arg(long, default_value_t = 30)]
    variant_depth: usize,
}

fn main() {
    let a = Args::parse();
    let mut failed = false;
    for ((dip, ro, leased), what) in MODES {
        let (daemons, faults) = match leased {
            true => (a.leased_daemons.unwrap_or(a.daemons), a.leased_faults.unwrap_or(a.faults)),
            false => (a.daemons, a.faults),
        };
        let p = Proto { daemons, faults, dip, ro, leased, bug: Bug::None };
        let o = check(p, a.depth, a.threads);
        println!(
            "protocol ({}): {} daemons, {} faults, depth bound {}: {} states, longest path {} ({}), {:.1} s: {}",
            what,
            daemons,
            faults,
            a.depth,
            o.unique_states,
            o.max_depth,
            if o.max_depth < a.depth { "the whole state space" } else { "cut at the bound" },
            o.seconds,
            if o.violations.is_empty() {
                "no property broken".to_string()
            } else {
                format!("{} BROKEN", o.violations.len())
            }
        );
        for (name, trace) in &o.violations {
            println!("  {name}: {trace}");
            failed = true;
        }
    }
    for bug in Bug::BROKEN {
        let (daemons, faults) = match bug.leased() {
            true => (a.leased_daemons.unwrap_or(a.daemons), a.leased_faults.unwrap_or(a.faults)),
            false => (a.daemons, a.faults),
        };
        let o = check(Proto::new(daemons, faults, bug), a.variant_depth, a.threads);
        match o.violations.first() {
            Some((name, trace)) => println!(
                "variant {bug:?}: caught ({name}) after {} states, {:.1} s\n  {trace}",
                o.unique_states, o.seconds
            ),
            None => {
                println!("variant {bug:?}: NOT caught in {} states to depth {}", o.unique_states, a.variant_depth);
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
