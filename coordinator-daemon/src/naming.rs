//! The one place that turns (gtid, branch id) into database transaction ids and back.
//!
//! PostgreSQL: gid `<prefix>:<gtid>:<bid>` (PostgreSQL's GIDSIZE is 200 bytes with the
//! terminating NUL: 199 bytes of gid at most).
//! MariaDB: XID with gtrid = gtid, bqual = bid (64 bytes each), and a fixed formatID so
//! `XA RECOVER` tells our branches from anybody else's.
//!
//! Ids are restricted to `[A-Za-z0-9._-]`: no id can carry a quote, a colon (our gid
//! separator) or anything an engine might interpret. Literals are still quoted when SQL
//! is built, so the restriction is a second fence, not the only one.

use crate::refusal::RefusalCode;

/// The longest gid PostgreSQL accepts (GIDSIZE 200, NUL included). The clients check
/// against the same number (regress/pytest/coordinator/test_id_limits.py).
pub const PG_GID_MAX: usize = 199;
pub const XA_PART_MAX: usize = 64;
/// "cotx" in ASCII: 0x636f7478. Fits a signed 32-bit int as MariaDB requires.
pub const XA_FORMAT_ID: i64 = 0x636f_7478;
pub const NODE_MAX: usize = 16;
pub const PREFIX_MAX: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdError {
    pub code: RefusalCode,
    pub message: String,
}

fn id_chars_ok(s: &str, allow_dot: bool) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (allow_dot && b == b'.'))
}

/// A gtid or branch id: 1..=64 bytes of `[A-Za-z0-9._-]` (the MariaDB gtrid/bqual limit).
pub fn check_id(what: &str, s: &str) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError { code: RefusalCode::InvalidId, message: format!("{what} must not be empty") });
    }
    if s.len() > XA_PART_MAX {
        return Err(IdError {
            code: RefusalCode::IdTooLong,
            message: format!("{what} is {} bytes; MariaDB allows at most {XA_PART_MAX}", s.len()),
        });
    }
    if !id_chars_ok(s, true) {
        return Err(IdError {
            code: RefusalCode::InvalidId,
            message: format!("{what} may contain only A-Z a-z 0-9 . _ -"),
        });
    }
    Ok(())
}

/// Node ids and gid prefixes: no dots (the dot separates the node inside a gtid).
pub fn check_token_name(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() || s.len() > max || !id_chars_ok(s, false) {
        return Err(format!("{what} must be 1..={max} characters of A-Z a-z 0-9 _ -"));
    }
    Ok(())
}

/// PostgreSQL gid of a branch; checked against PostgreSQL's limit.
pub fn pg_gid(prefix: &str, gtid: &str, bid: &str) -> Result<String, IdError> {
    check_id("gtid", gtid)?;
    check_id("branch_id", bid)?;
    let gid = format!("{prefix}:{gtid}:{bid}");
    if gid.len() > PG_GID_MAX {
        return Err(IdError {
            code: RefusalCode::IdTooLong,
            message: format!("PostgreSQL gid would be {} bytes; the limit is {PG_GID_MAX}", gid.len()),
        });
    }
    Ok(gid)
}

/// Inverse of [`pg_gid`]; None for gids that are not ours.
pub fn parse_pg_gid(prefix: &str, gid: &str) -> Option<(String, String)> {
    let rest = gid.strip_prefix(prefix)?.strip_prefix(':')?;
    let (gtid, bid) = rest.split_once(':')?;
    if check_id("gtid", gtid).is_err() || check_id("branch_id", bid).is_err() {
        return None;
    }
    Some((gtid.to_string(), bid.to_string()))
}

/// PostgreSQL gid of the client-mode helper transaction of a branch, holding shim slot
/// `key`: `<prefix>.s<key>:<gtid>:<bid>`. A prefix has no dot, so no branch gid of any
/// prefix has this form; the slot is in the name so a restarted daemon knows which slots
/// earlier helpers still hold (crate::participants::enforcement::shim).
pub fn pg_helper_gid(prefix: &str, key: i32, gtid: &str, bid: &str) -> Result<String, IdError> {
    check_id("gtid", gtid)?;
    check_id("branch_id", bid)?;
    let gid = format!("{prefix}.s{key}:{gtid}:{bid}");
    if gid.len() > PG_GID_MAX {
        return Err(IdError {
            code: RefusalCode::IdTooLong,
            message: format!(
                "in client mode the branch's helper transaction gid would be {} bytes; PostgreSQL's limit is {PG_GID_MAX}: use a shorter branch id",
                gid.len()
            ),
        });
    }
    Ok(gid)
}

/// Inverse of [`pg_helper_gid`]: (slot, gtid, bid); None for anything else.
pub fn parse_pg_helper_gid(prefix: &str, gid: &str) -> Option<(i32, String, String)> {
    let rest = gid.strip_prefix(prefix)?.strip_prefix(".s")?;
    let (key, rest) = rest.split_once(':')?;
    let key: i32 = key.parse().ok()?;
    let (gtid, bid) = rest.split_once(':')?;
    if key <= 0 || check_id("gtid", gtid).is_err() || check_id("branch_id", bid).is_err() {
        return None;
    }
    Some((key, gtid.to_string(), bid.to_string()))
}

/// PostgreSQL gid of a shared client-mode helper (participants/enforcement/helpers.rs):
/// `<prefix>.h<first>x<n>:<token>`, reading shim keys `first ..= first+n-1`; `token` is
/// gtid-shaped, `<node>.<nonce>-<seq>` (new_gtid), so the gid names the daemon run that
/// prepared it (its epoch) and is unique across runs and daemons. Like the one-per-branch
/// form below (`.s`), it cannot be any prefix's branch gid (a prefix has no dot).
pub fn pg_shared_helper_gid(prefix: &str, first: i32, n: i32, token: &str) -> String {
    format!("{prefix}.h{first}x{n}:{token}")
}

/// Inverse of [`pg_shared_helper_gid`]: (first key, n, token); None for anything else.
pub fn parse_pg_shared_helper_gid(prefix: &str, gid: &str) -> Option<(i32, i32, String)> {
    let rest = gid.strip_prefix(prefix)?.strip_prefix(".h")?;
    let (block, token) = rest.split_once(':')?;
    let (first, n) = block.split_once('x')?;
    let (first, n): (i32, i32) = (first.parse().ok()?, n.parse().ok()?);
    if first <= 0 || n <= 0 || gtid_epoch(token).is_none() || check_id("token", token).is_err() {
        return None;
    }
    Some((first, n, token.to_string()))
}

/// SQL string literal for either engine: single quotes doubled, backslashes doubled
/// (MariaDB treats backslash as an escape unless NO_BACKSLASH_ESCAPES; PostgreSQL with
/// standard_conforming_strings does not, so the E'' form keeps both readings identical).
pub fn quote_pg(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

pub fn quote_maria(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The XID as it appears in `XA COMMIT <xid>`.
pub fn xa_xid_sql(gtid: &str, bid: &str) -> Result<String, IdError> {
    check_id("gtid", gtid)?;
    check_id("branch_id", bid)?;
    Ok(format!("{},{},{}", quote_maria(gtid), quote_maria(bid), XA_FORMAT_ID))
}

/// One row of `XA RECOVER` (formatID, gtrid_length, bqual_length, data) → (gtid, bid)
/// when it is one of ours.
pub fn parse_xa_row(format_id: i64, gtrid_len: usize, bqual_len: usize, data: &[u8]) -> Option<(String, String)> {
    if format_id != XA_FORMAT_ID || gtrid_len + bqual_len != data.len() {
        return None;
    }
    let gtid = std::str::from_utf8(&data[..gtrid_len]).ok()?;
    let bid = std::str::from_utf8(&data[gtrid_len..]).ok()?;
    if check_id("gtid", gtid).is_err() || check_id("branch_id", bid).is_err() {
        return None;
    }
    Some((gtid.to_string(), bid.to_string()))
}

/// A new gtid: `<node>.<nonce>-<seq>`. The nonce is drawn once per daemon start, so a
/// restarted daemon never reissues a gtid that an earlier run may have left prepared.
pub fn new_gtid(node: &str, nonce: u64, seq: u64) -> String {
    format!("{}{seq:x}", gtid_prefix(node, nonce))
}

/// What every gtid of an epoch starts with (a leased range's gtids are it followed by
/// their sequence number in lowercase hexadecimal).
pub fn gtid_prefix(node: &str, nonce: u64) -> String {
    format!("{node}.{nonce:012x}-")
}

/// The node that issued a gtid; recovery only acts on its own node's transactions (other
/// coordinators sharing a store own theirs).
pub fn gtid_node(gtid: &str) -> Option<&str> {
    gtid.split_once('.').map(|(n, _)| n)
}

/// The epoch of a gtid, (node, nonce): one daemon start. Recovery acts only on epochs its
/// store registered.
pub fn gtid_epoch(gtid: &str) -> Option<(&str, u64)> {
    let (node, rest) = gtid.split_once('.')?;
    let (nonce, _) = rest.split_once('-')?;
    Some((node, u64::from_str_radix(nonce, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_gid_roundtrip_and_limits() {
        let gid = pg_gid("cotx", "n1.abc-1", "b1").unwrap();
        assert_eq!(gid, "cotx:n1.abc-1:b1");
        assert_eq!(parse_pg_gid("cotx", &gid), Some(("n1.abc-1".into(), "b1".into())));
        assert_eq!(parse_pg_gid("other", &gid), None);
        assert_eq!(parse_pg_gid("cotx", "cotx:x"), None);
        let long = "a".repeat(64);
        // 64 + 64 + prefix fits 199
        assert!(pg_gid("cotx", &long, &long).is_ok());
        assert_eq!(check_id("gtid", &"a".repeat(65)).unwrap_err().code, RefusalCode::IdTooLong);
        let p = "p".repeat(80);
        assert_eq!(pg_gid(&p, &long, &long).unwrap_err().code, RefusalCode::IdTooLong);
    }

    #[test]
    fn ids_cannot_carry_sql() {
        for bad in ["a'b", "a;b", "a b", "a:b", "", "a\\b", "é"] {
            assert!(check_id("x", bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(quote_maria("a'b\\"), "'a''b\\\\'");
        assert_eq!(quote_pg("a'b"), "'a''b'");
        assert_eq!(quote_pg("a\\'"), "E'a\\\\'''");
    }

    #[test]
    fn xa_roundtrip() {
        assert_eq!(xa_xid_sql("g1", "b1").unwrap(), "'g1','b1',1668248696");
        assert_eq!(parse_xa_row(XA_FORMAT_ID, 2, 2, b"g1b1"), Some(("g1".into(), "b1".into())));
        assert_eq!(parse_xa_row(1, 2, 2, b"g1b1"), None);
        assert_eq!(parse_xa_row(XA_FORMAT_ID, 3, 2, b"g1b1"), None);
    }

    #[test]
    fn gtid_shape() {
        let g = new_gtid("n1", 0xabc, 17);
        assert_eq!(gtid_node(&g), Some("n1"));
        assert_eq!(gtid_epoch(&g), Some(("n1", 0xabc)));
        assert_eq!(gtid_epoch("n1.zz-1"), None);
        assert!(check_id("gtid", &g).is_ok());
        assert!(check_id("gtid", &new_gtid("abcdefghijklmnop", u64::MAX, u64::MAX)).is_ok());
    }

    #[test]
    fn helper_gids_are_never_branch_gids_and_round_trip() {
        let h = pg_helper_gid("cotx", 17, "n1.abc-1", "pg-1").unwrap();
        assert_eq!(h, "cotx.s17:n1.abc-1:pg-1");
        assert_eq!(parse_pg_helper_gid("cotx", &h), Some((17, "n1.abc-1".into(), "pg-1".into())));
        assert_eq!(parse_pg_gid("cotx", &h), None);
        assert_eq!(parse_pg_helper_gid("cotx", "cotx:n1.abc-1:pg-1"), None);
        assert_eq!(parse_pg_helper_gid("cotx", "cotx.s0:n1.abc-1:pg-1"), None);
        let long = "b".repeat(64);
        let g = "g".repeat(64);
        assert!(pg_gid(&"p".repeat(32), &g, &long).is_ok());
        // The longest prefix, gtid and branch id leave room for the slot number.
        assert!(pg_helper_gid(&"p".repeat(PREFIX_MAX), i32::MAX, &g, &long).unwrap().len() <= PG_GID_MAX);
    }

    #[test]
    fn shared_helper_gids_name_their_block_and_run() {
        let token = new_gtid("n1", 0xabc, 7);
        let h = pg_shared_helper_gid("cotx", 41, 10, &token);
        assert_eq!(h, "cotx.h41x10:n1.000000000abc-7");
        assert_eq!(parse_pg_shared_helper_gid("cotx", &h), Some((41, 10, token.clone())));
        assert_eq!(parse_pg_gid("cotx", &h), None);
        assert_eq!(parse_pg_helper_gid("cotx", &h), None, "never read as a one-per-branch helper");
        assert_eq!(parse_pg_shared_helper_gid("cotx", "cotx.s17:n1.abc-1:pg-1"), None);
        assert_eq!(parse_pg_shared_helper_gid("cotx", "cotx.h0x10:n1.abc-1"), None);
        assert_eq!(parse_pg_shared_helper_gid("cotx", "cotx.h1x10:nodot"), None);
        let longest = pg_shared_helper_gid(
            &"p".repeat(PREFIX_MAX),
            i32::MAX,
            64,
            &new_gtid(&"n".repeat(NODE_MAX), u64::MAX, u64::MAX),
        );
        assert!(longest.len() <= PG_GID_MAX);
    }
}
