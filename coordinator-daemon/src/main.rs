//! cotx-coordinator: a thin binary over the `coordinator_daemon` library (src/lib.rs).

fn main() {
    coordinator_daemon::cli::main()
}
