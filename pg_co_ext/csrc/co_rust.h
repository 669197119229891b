/*
 * co_rust.h: the functions that cross between C and Rust outside co_ssi.h: the hook
 * installer C gives to src/gids.rs, and the callbacks Rust gives to the hooks of
 * co_gid_hook.c (src/gids.rs, src/read_only.rs). None of the callbacks raises an error.
 *
 * Like co_ssi.h, tied to the Rust declarations at build time: csrc/co_layout.c checks
 * every function here and in co_ssi.h against its table of C and Rust signatures, and
 * prints a Rust assertion of the Rust half; a signature changed on one side only fails
 * the build.
 */
#ifndef CO_RUST_H
#define CO_RUST_H

#include <stdbool.h>

/* C, called once by Rust at load time (src/gids.rs). */
extern void co_install_utility_hook(void);

/* Rust, called by co_gid_hook.c. */
extern void co_gids_on_prepare_stmt(const char *gid);
extern void co_ro_commit_prepared_start(const char *gid);
extern void co_ro_commit_prepared_end(void);
extern void co_ro_executor_start(void);
extern void co_note_write(void);
extern bool co_refuse_upsert_reads(void);

#endif
