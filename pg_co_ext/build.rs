// Compiles csrc/co_ssi.c, the one file that reads PostgreSQL's SSI internals, against the
// server headers of the PostgreSQL that pgrx builds for; then compiles and runs
// csrc/co_layout.c, whose output ($OUT_DIR/co_layout.rs, included by src/ssi_ffi.rs) asserts
// at compile time that the Rust mirrors match the C structs and SXACT flag values, and that
// the functions of csrc/co_ssi.h and csrc/co_rust.h have the same signatures on both sides.
use std::path::PathBuf;
use std::process::Command;

/// The pg_config pgrx uses: PGRX_PG_CONFIG_PATH (set by scripts/build-pg-co.sh), else
/// PG_CONFIG, else the cotx layout $COTX_CACHE/pg/<major>/bin/pg_config of the one pgNN
/// feature enabled.
fn pg_config() -> String {
    for var in ["PGRX_PG_CONFIG_PATH", "PG_CONFIG"] {
        if let Ok(p) = std::env::var(var) {
            return p;
        }
    }
    let cache = std::env::var("COTX_CACHE").unwrap_or_else(|_| "/var/cache/cotx".into());
    for major in [15, 16, 17, 18] {
        if std::env::var(format!("CARGO_FEATURE_PG{major}")).is_ok() {
            return format!("{cache}/pg/{major}/bin/pg_config");
        }
    }
    "/usr/lib/postgresql/15/bin/pg_config".into()
}

fn main() {
    for f in ["csrc/co_ssi.c", "csrc/co_ssi.h", "csrc/co_rust.h", "csrc/co_layout.c", "csrc/co_gid_hook.c"] {
        println!("cargo:rerun-if-changed={f}");
    }
    for v in ["PGRX_PG_CONFIG_PATH", "PG_CONFIG", "COTX_CACHE"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let pg_config = pg_config();
    let out = Command::new(&pg_config)
        .arg("--includedir-server")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {pg_config}: {e} (set PG_CONFIG)"));
    let inc = String::from_utf8(out.stdout).expect("pg_config output").trim().to_string();
    let mut build = cc::Build::new();
    build
        .include(&inc)
        .include("csrc")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-missing-field-initializers")
        .flag_if_supported("-Wno-sign-compare");
    let probe_compiler = build.get_compiler();
    build.file("csrc/co_ssi.c").file("csrc/co_gid_hook.c").compile("co_ssi");

    // The layout probe runs on the build host, which is the target here (no cross builds).
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let probe = out_dir.join("co_layout_probe");
    let status = Command::new(probe_compiler.path())
        .args(["-I", &inc, "-I", "csrc", "csrc/co_layout.c", "-o"])
        .arg(&probe)
        .status()
        .expect("compile csrc/co_layout.c");
    assert!(status.success(), "compiling csrc/co_layout.c against {inc} failed");
    let out = Command::new(&probe).output().expect("run the layout probe");
    assert!(out.status.success(), "the layout probe failed");
    std::fs::write(out_dir.join("co_layout.rs"), out.stdout).expect("write co_layout.rs");
}
