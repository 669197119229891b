#![cfg(test)]
use super::*;

const GOOD: &str = r#"
node_id = "n1"
listen = "127.0.0.1:7000"
token = "0123456789abcdef"

[store]
kind = "sqlite"
path = "/tmp/x.db"

[[resources]]
name = "pg1"
kind = "postgres"
dsn = "host=127.0.0.1 port=5432 user=postgres"

[[resources]]
name = "m1"
kind = "mariadb"
dsn = "mysql://root@127.0.0.1:3306/test"
pool_size = 4
"#;

#[test]
fn good_config() {
    let c = parse(GOOD, None).unwrap();
    assert_eq!(c.resources.len(), 2);
    assert_eq!(c.resources[1].pool_size, 4);
    assert_eq!(c.node_id, "n1");
}

fn err(src: &str) -> ConfigError {
    parse(src, None).unwrap_err()
}

#[test]
fn commit_delay_is_bounded_and_needs_group_commit() {
    let delay = |v: &str| GOOD.replace("path = \"/tmp/x.db\"", &format!("path = \"/tmp/x.db\"\n{v}"));
    let c = parse(&delay("commit_delay_us = 500"), None).unwrap();
    assert!(matches!(c.store, StoreConfig::Sqlite { commit_delay_us: 500, .. }), "{:?}", c.store);
    assert!(
        matches!(parse(GOOD, None).unwrap().store, StoreConfig::Sqlite { commit_delay_us: 0, .. }),
        "off by default"
    );
    let e = err(&delay("commit_delay_us = 100001"));
    assert_eq!(e.field, "store.commit_delay_us", "{e}");
    let e = err(&delay("group_commit = false\ncommit_delay_us = 500"));
    assert!(e.field == "store.commit_delay_us" && e.message.contains("group_commit"), "{e}");
}

#[test]
fn decision_resources_are_postgres_only() {
    let c = parse(&GOOD.replace("user=postgres\"", "user=postgres\"\ndecisions = true"), None).unwrap();
    assert!(c.resources[0].decisions && !c.resources[1].decisions);
    let e = err(&GOOD.replace("pool_size = 4", "pool_size = 4\ndecisions = true"));
    assert_eq!(e.field, "resources[1].decisions", "{e}");
}

#[test]
fn errors_name_line_and_field() {
    let e = err(&GOOD.replace("kind = \"mariadb\"", "kind = \"mysql\""));
    assert_eq!(e.line, Some(17), "{e}");
    assert_eq!(e.field, "kind");
    assert!(e.to_string().contains("mysql"), "{e}");
    let e = err(&GOOD.replace("pool_size = 4", "pool_size = 0"));
    assert_eq!((e.line, e.field.as_str()), (Some(19), "resources[1].pool_size"));
    let e = err(&GOOD.replace("127.0.0.1:7000", "0.0.0.0:7000"));
    assert_eq!((e.line, e.field.as_str()), (Some(3), "listen"));
    // allow_non_loopback alone is not enough: plain HTTP is for loopback only.
    let e = err(&GOOD.replace("127.0.0.1:7000\"", "0.0.0.0:7000\"\nallow_non_loopback = true"));
    assert!(e.message.contains("[tls]"), "{e}");
    let e = err(&GOOD.replace("name = \"m1\"", "name = \"pg1\""));
    assert_eq!(e.field, "resources[1].name");
    let e = err(&GOOD.replace("pool_size = 4", "pool_sise = 4"));
    assert_eq!(e.line, Some(19), "{e}");
    assert!(e.to_string().contains("pool_sise"), "{e}");
    let e = err(&GOOD.replace("token = \"0123456789abcdef\"", ""));
    assert_eq!(e.field, "token");
    let e = err(&GOOD.replace("mysql://root@127.0.0.1:3306/test", "nonsense"));
    assert_eq!(e.field, "resources[1].dsn");
    let e = err("node_id = \"a.b\"\nallow_no_auth = true\n");
    assert_eq!((e.line, e.field.as_str()), (Some(1), "node_id"));
    // No silent default node id.
    let e = err(&GOOD.replace("node_id = \"n1\"", ""));
    assert_eq!(e.field, "node_id");
    assert!(e.message.contains("required"), "{e}");
    let e = err(&format!("{GOOD}\n[lease]\nttl_ms = 2000\nrenew_ms = 1500\n"));
    assert_eq!(e.field, "lease.renew_ms");
}

/// The store's DSN and a resource's are read in one place (check::dsn_error): the same
/// driver's reason and hint for the TLS keys, each under its own field and words; a good
/// store DSN is kept as given.
#[test]
fn a_dsn_is_read_in_one_place_for_the_store_and_the_resources() {
    let bad = "host=127.0.0.1 sslmode=verify-full";
    let sqlite = "kind = \"sqlite\"\npath = \"/tmp/x.db\"";
    let e = err(&GOOD.replace(sqlite, &format!("kind = \"postgres\"\ndsn = \"{bad}\"")));
    assert_eq!(e.field, "store.dsn", "{e}");
    assert!(e.message.starts_with("not a PostgreSQL connection string: ") && e.message.contains("tls_ca_file"), "{e}");
    let r = err(&GOOD.replace("host=127.0.0.1 port=5432 user=postgres", bad));
    assert_eq!(r.field, "resources[0].dsn", "{r}");
    assert!(r.message.starts_with("not a valid postgres DSN: "), "{r}");
    assert_eq!(e.message.split_once(": ").unwrap().1, r.message.split_once(": ").unwrap().1);
    let good = "host=127.0.0.1 user=postgres";
    let c = parse(&GOOD.replace(sqlite, &format!("kind = \"postgres\"\ndsn = \"{good}\"")), None).unwrap();
    assert!(matches!(&c.store, StoreConfig::Postgres { dsn, .. } if dsn == good), "{:?}", c.store);
}

#[test]
fn worker_threads_default_to_one_and_are_bounded() {
    assert_eq!(parse(GOOD, None).unwrap().limits.worker_threads, 1);
    let with = |v: &str| GOOD.replace("[store]", &format!("[limits]\nworker_threads = {v}\n\n[store]"));
    assert_eq!(parse(&with("4"), None).unwrap().limits.worker_threads, 4);
    for bad in ["0", "257"] {
        let e = err(&with(bad));
        assert!(e.field == "limits.worker_threads" && e.message.contains("between 1 and 256"), "{e}");
    }
}

/// `kind = "log"`: a path as SQLite's (required, not empty, relative to the config file),
/// the batching keys, its witness beside it; PostgreSQL's keys refused; an unknown kind's
/// error lists the three.
#[test]
fn the_log_store_kind() {
    let sqlite = "kind = \"sqlite\"\npath = \"/tmp/x.db\"";
    let log = |rest: &str| GOOD.replace(sqlite, &format!("kind = \"log\"\n{rest}"));
    let c = parse(&log("path = \"d.log\"\ncommit_delay_us = 200"), Some(std::path::Path::new("/etc/cotx"))).unwrap();
    assert!(
        matches!(&c.store, StoreConfig::Log { path, group_commit: true, max_batch: 1024, commit_delay_us: 200, sync_method: SyncMethod::Direct }
            if path == "/etc/cotx/d.log"),
        "{:?}",
        c.store
    );
    assert_eq!(c.witness_file.as_deref(), Some("/etc/cotx/d.log.witness"));
    let e = err(&log(""));
    assert_eq!((e.field.as_str(), e.message.as_str()), ("store.path", "required for kind = \"log\""), "{e}");
    let e = err(&log("path = \"\""));
    assert_eq!((e.field.as_str(), e.message.as_str()), ("store.path", "must not be empty"), "{e}");
    let e = err(&log("path = \"d.log\"\ndsn = \"host=x\""));
    assert_eq!(e.field, "store.dsn", "{e}");
    let e = err(&GOOD.replace("kind = \"sqlite\"", "kind = \"lsm\""));
    assert_eq!(e.field, "store.kind", "{e}");
    assert!(e.message.contains("expected \"sqlite\", \"postgres\" or \"log\""), "{e}");
}

/// `store.sync_method` (the log only): direct by default, fdatasync by choice; an unknown
/// method names both, and the key is refused on the other kinds.
#[test]
fn the_log_sync_method() {
    let sqlite = "kind = \"sqlite\"\npath = \"/tmp/x.db\"";
    let log = |rest: &str| GOOD.replace(sqlite, &format!("kind = \"log\"\npath = \"d.log\"\n{rest}"));
    let method = |toml: &str| match parse(toml, None).unwrap().store {
        StoreConfig::Log { sync_method, .. } => sync_method,
        other => panic!("{other:?}"),
    };
    assert_eq!(method(&log("")), SyncMethod::Direct);
    assert_eq!(method(&log("sync_method = \"direct\"")), SyncMethod::Direct);
    assert_eq!(method(&log("sync_method = \"fdatasync\"")), SyncMethod::Fdatasync);
    let e = err(&log("sync_method = \"fsync\""));
    assert_eq!(e.field, "store.sync_method", "{e}");
    assert!(e.message.contains("\"fsync\"") && e.message.contains("\"direct\" or \"fdatasync\""), "{e}");
    let e = err(&GOOD.replace(sqlite, &format!("{sqlite}\nsync_method = \"direct\"")));
    assert_eq!((e.field.as_str(), e.message.contains("only for kind = \"log\"")), ("store.sync_method", true), "{e}");
}
