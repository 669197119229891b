#![cfg(test)]
use super::*;

#[test]
fn only_branches_of_nodes_and_epochs_we_act_for_are_ours() {
    let o = Ownership::new("n1", 7);
    o.granted("n2", 1);
    o.adopt("n2");
    let epochs: HashSet<(String, u64)> =
        [("n1".to_string(), 7), ("n1".to_string(), 3), ("n2".to_string(), 5)].into_iter().collect();
    assert_eq!(whose(&o, &naming::new_gtid("n1", 7, 1), &epochs), Ok(true), "our current epoch");
    assert_eq!(whose(&o, &naming::new_gtid("n1", 3, 1), &epochs), Ok(false), "a previous run of ours");
    assert_eq!(whose(&o, &naming::new_gtid("n2", 5, 1), &epochs), Ok(false), "a node taken over");
    assert_eq!(whose(&o, &naming::new_gtid("n1", 9, 1), &epochs), Err(NotOurs::ForeignEpoch));
    assert_eq!(whose(&o, &naming::new_gtid("n3", 5, 1), &epochs), Err(NotOurs::AnotherNode));
    assert_eq!(whose(&o, "garbage", &epochs), Err(NotOurs::NotAGtid));
    assert_eq!(NotOurs::ForeignEpoch.to_string(), "foreign epoch", "the words the logs had");
}
