//! A daemon's witness of its decision store: the store's identity, restore count and tick
//! (store::Identity), written to a local file after every lease claim and renewal.
//!
//! Why: presumed abort reads a missing record as "abort". A store restored from an older
//! copy is missing every commit recorded after the copy was taken, and a branch of such a
//! commit still prepared would be rolled back while its other branches committed: a split.
//! The documented restore runs `cotx-coordinator mark-restored`, which seals the copy's
//! epochs (a missing record of theirs is "forgotten", never "aborted"). The witness catches
//! a restore done without it: the store's tick only grows, so a store whose tick is behind
//! what this daemon saw is an older copy, and the daemon refuses to act on it.
//!
//! What it cannot see: a copy taken after the last renewal this daemon wrote down (at most
//! `lease.renew_ms` before it stopped), and a daemon without its file (a new machine).
//! The procedure covers those (docs/ops.md, "Backup and restore").
//!
//! The file is replaced by rename, without fsync: it only ever holds values the store had
//! already made durable, so a lost update leaves it behind the store (the check passes),
//! never ahead of it (a false alarm).

use crate::store::Identity;

/// Whether the store may be acted on, given what this daemon saw of it before.
pub fn check(seen: Option<&Identity>, now: &Identity) -> Result<(), String> {
    let Some(seen) = seen else { return Ok(()) };
    if seen.store_id != now.store_id {
        return Ok(()); // another store: its epochs and records are its own
    }
    if now.restores > seen.restores {
        return Ok(()); // marked restored since: the copy's epochs are sealed
    }
    if now.restores < seen.restores || now.tick < seen.tick {
        return Err(format!(
            "the decision store went back to an older copy: this daemon saw it at tick {} after {} restore(s), it is now at tick {} after {}. \
             Records of commits made after that copy was taken are missing, and presuming them aborted would split transactions. \
             Stop every daemon on this store, run `cotx-coordinator mark-restored --config <file>` once, then start them again (docs/ops.md, \"Backup and restore\")",
            seen.tick, seen.restores, now.tick, now.restores
        ));
    }
    Ok(())
}

/// The identity last written to `path`; None when there is no file yet.
pub fn read(path: &str) -> Result<Option<Identity>, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).map(Some).map_err(|e| {
            format!("witness file {path} cannot be read ({e}); if it was damaged, remove it (the store is then not compared with what this daemon saw before)")
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("witness file {path}: {e}")),
    }
}

pub fn write(path: &str, id: &Identity) -> Result<(), String> {
    let tmp = format!("{path}.tmp");
    let body = serde_json::to_string(id).map_err(|e| e.to_string())?;
    std::fs::write(&tmp, body)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| format!("witness file {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(store: &str, restores: i64, tick: i64) -> Identity {
        Identity { store_id: store.into(), restores, tick }
    }

    #[test]
    fn an_older_copy_is_refused_a_marked_one_accepted() {
        let seen = id("s", 0, 10);
        assert!(check(None, &id("s", 0, 1)).is_ok(), "no witness: nothing to compare");
        assert!(check(Some(&seen), &id("s", 0, 10)).is_ok());
        assert!(check(Some(&seen), &id("s", 0, 12)).is_ok());
        let e = check(Some(&seen), &id("s", 0, 9)).unwrap_err();
        assert!(e.contains("mark-restored") && e.contains("tick 10") && e.contains("tick 9"), "{e}");
        assert!(check(Some(&seen), &id("s", 1, 3)).is_ok(), "marked restored since");
        assert!(check(Some(&id("s", 2, 50)), &id("s", 1, 60)).is_err(), "a copy from before a restore mark");
        assert!(check(Some(&seen), &id("other", 0, 1)).is_ok(), "another store");
    }

    #[test]
    fn the_file_round_trips_and_a_damaged_one_is_named() {
        let d = std::env::temp_dir().join(format!("cotx-witness-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("w").display().to_string();
        assert_eq!(read(&p).unwrap(), None);
        write(&p, &id("s", 1, 7)).unwrap();
        assert_eq!(read(&p).unwrap(), Some(id("s", 1, 7)));
        std::fs::write(&p, "{").unwrap();
        assert!(read(&p).unwrap_err().contains(&p));
        let _ = std::fs::remove_dir_all(&d);
    }
}
