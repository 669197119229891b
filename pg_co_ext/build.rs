// Compiles csrc/co_ssi.c, the one file that reads PostgreSQL's SSI internals, against the
// server headers of the PostgreSQL that pgrx builds for.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=csrc/co_ssi.c");
    println!("cargo:rerun-if-changed=csrc/co_ssi.h");
    println!("cargo:rerun-if-env-changed=PG_CONFIG");
    let pg_config = std::env::var("PG_CONFIG").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".into());
    let out = Command::new(&pg_config)
        .arg("--includedir-server")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {pg_config}: {e} (set PG_CONFIG)"));
    let inc = String::from_utf8(out.stdout).expect("pg_config output").trim().to_string();
    cc::Build::new()
        .file("csrc/co_ssi.c")
        .include(&inc)
        .include("csrc")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-missing-field-initializers")
        .flag_if_supported("-Wno-sign-compare")
        .compile("co_ssi");
}
