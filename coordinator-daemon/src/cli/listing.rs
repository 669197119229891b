//! Operator commands that list what a daemon knows: its transactions (`transactions`),
//! the branches that did not reach their decided outcome (`incidents`), and the node
//! leases of the deployment (`nodes`). Each prints text, or the daemon's JSON with
//! `--json`; the daemon's answers are those of `GET /v1/transactions`, `/v1/incidents`
//! and `/v1/nodes` (docs/coordinator.md, the API table).

use super::client::{age, check, http, print_tx, Target};
use serde_json::Value;

/// The values `transactions --state` takes: the daemon's own state filter
/// (`state::StateFilter`; a unit test below checks that each one parses there).
pub const STATES: [&str; 7] = ["active", "committing", "committed", "aborted", "one_phase", "deciding", "in_doubt"];

pub fn transactions(t: &Target, state: Option<&str>, json: bool) -> Result<(), String> {
    // Only values of STATES reach here (clap checks them), so no escaping is needed.
    let path = match state {
        Some(s) => format!("/v1/transactions?state={s}"),
        None => "/v1/transactions".to_string(),
    };
    let v = check(http(t, "GET", &path, None))?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let list = v["transactions"].as_array().cloned().unwrap_or_default();
    // The daemon holds a transaction in memory while it is undecided, and a decided one
    // until its branches are finished and its outcome retention ran out.
    let what = state.map(|s| format!(" {s}")).unwrap_or_default();
    println!("{}{what} transaction(s) in the daemon's memory, oldest first", list.len());
    for tx in &list {
        print_tx(tx);
    }
    Ok(())
}

pub fn incidents(t: &Target, json: bool) -> Result<(), String> {
    let v = check(http(t, "GET", "/v1/incidents", None))?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let list = v["incidents"].as_array().cloned().unwrap_or_default();
    // Incidents are kept in the daemon's memory only: a restart starts the list again
    // (the error log keeps each one, and cotx_incidents_total counts them).
    println!("{} incident(s) since the daemon started (branches that did not reach the decided outcome)", list.len());
    let now = now_unix_ms();
    for i in &list {
        let at = i["at_unix_ms"].as_u64().unwrap_or(0);
        println!(
            "{}  ({} ago)  {}  branch {} on {}: {}",
            utc(at),
            age(now.saturating_sub(at)),
            i["gtid"].as_str().unwrap_or("?"),
            i["branch_id"].as_str().unwrap_or("?"),
            i["resource"].as_str().unwrap_or("?"),
            i["message"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

pub fn nodes(t: &Target, json: bool) -> Result<(), String> {
    let v = check(http(t, "GET", "/v1/nodes", None))?;
    if json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "this daemon: node {} (holder {}), lease {}",
        v["node_id"].as_str().unwrap_or("?"),
        v["holder"].as_str().unwrap_or("?"),
        if v["lease_valid"].as_bool() == Some(true) {
            "valid"
        } else {
            "UNCONFIRMED: it acts on nothing until a renewal succeeds"
        }
    );
    let adopted: Vec<&str> = v["adopted"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !adopted.is_empty() {
        println!("taken over by this daemon: {}", adopted.join(", "));
    }
    let leases = v["nodes"].as_array().cloned().unwrap_or_default();
    println!("{} node lease(s) in the decision store", leases.len());
    for l in &leases {
        println!("  {}", lease_line(l));
    }
    Ok(())
}

/// One lease: who holds it, where it serves, and how long it has left.
fn lease_line(l: &Value) -> String {
    let holder = l["holder"].as_str().unwrap_or("");
    let left = l["expires_in_ms"].as_i64().unwrap_or(0);
    let expiry = if left > 0 {
        format!("expires in {}", age(left as u64))
    } else {
        format!("ran out {} ago", age(left.unsigned_abs()))
    };
    let who = if holder.is_empty() {
        "released (no holder)".to_string()
    } else {
        format!("held by {holder} at {}", l["url"].as_str().filter(|u| !u.is_empty()).unwrap_or("(no url)"))
    };
    let mine = if l["mine"].as_bool() == Some(true) { ", this daemon" } else { "" };
    format!("{}: {who}, {expiry}{mine}", l["node"].as_str().unwrap_or("?"))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `2026-11-29T04:10:00Z` from Unix milliseconds, to match the daemon's log lines (UTC).
/// Days to a civil date by H. Hinnant's `civil_from_days` (proleptic Gregorian).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_the_cli_offers_is_one_the_daemon_filters_on() {
        for s in STATES {
            assert!(crate::state::StateFilter::parse(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_012_345_678), "2026-11-30T04:19:05Z");
    }

    #[test]
    fn a_lease_says_who_holds_it_and_how_long_it_has() {
        let l = serde_json::json!({"node": "a", "holder": "a@h/1/2", "url": "http://h:1", "expires_in_ms": 4200, "mine": true});
        assert_eq!(lease_line(&l), "a: held by a@h/1/2 at http://h:1, expires in 4.2s, this daemon");
        let l = serde_json::json!({"node": "b", "holder": "", "url": "", "expires_in_ms": -90_000, "mine": false});
        assert_eq!(lease_line(&l), "b: released (no holder), ran out 90.0s ago");
    }
}
