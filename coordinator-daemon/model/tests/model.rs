//! The model must be able to fail: every broken variant yields a counterexample, and the
//! real protocol none, over its whole state space (2 daemons, 2 faults: every path ends
//! before depth 30). The 3-daemon, 3-fault run is `cotx-model` in the test command.

use cotx_model::{check, Bug, Proto, MODES};

#[test]
fn the_real_protocol_breaks_no_property_in_its_whole_state_space() {
    for ((dip, ro, leased), _) in MODES {
        let o = check(Proto { daemons: 2, faults: 2, dip, ro, leased, bug: Bug::None }, 60, 2);
        assert!(o.violations.is_empty(), "dip={dip} ro={ro} leased={leased}: {:?}", o.violations);
        assert!(o.max_depth < 60, "the state space was cut at the depth bound");
        assert!(o.unique_states > 10_000, "suspiciously small: {}", o.unique_states);
    }
}

#[test]
fn every_broken_variant_is_caught() {
    for bug in Bug::BROKEN {
        let o = check(Proto::new(2, 2, bug), 30, 2);
        assert!(!o.violations.is_empty(), "{bug:?} was not caught ({} states)", o.unique_states);
    }
}

#[test]
fn the_read_only_variants_are_caught_with_the_one_request_commit_too() {
    for bug in [Bug::InMemoryWithAWriter, Bug::ReadOnlySkipsStoreCheck] {
        let o = check(Proto { leased: true, ..Proto::new(2, 2, bug) }, 30, 2);
        assert!(!o.violations.is_empty(), "{bug:?} with leased gtids was not caught ({} states)", o.unique_states);
    }
}
