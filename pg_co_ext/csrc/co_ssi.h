/*
 * co_ssi.h: the only window pg_co has onto PostgreSQL's SSI internals
 * (storage/predicate_internals.h, which pgrx's bindings do not include).
 * Plain copies out of shared memory, except co_repair_commit_order (the one write, done as
 * PostgreSQL's ReleasePredicateLocks would); no function here raises an error and none
 * decides a refusal: what a peer's flags and pid mean is decided in Rust
 * (pg_co_rules::classify).
 *
 * Mirrored by src/ssi_ffi.rs. The build ties the two: build.rs runs csrc/co_layout.c,
 * which prints Rust const assertions of every size, offset and SXACT flag value below as
 * the C compiler sees them (against the real server headers); a mismatch fails the build.
 */
#ifndef CO_SSI_H
#define CO_SSI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One rw-conflict peer of this backend's transaction. */
typedef struct co_peer
{
	const void *sxact;			/* identity, for pg_co's marker table */
	uint64_t	prepare_seq;
	uint32_t	xid;
	uint32_t	flags;
	int32_t		pid;
	int32_t		pgprocno;
} co_peer;

/* This backend's serializable transaction. */
typedef struct co_self
{
	const void *sxact;
	uint64_t	last_commit_before_snapshot;
	uint32_t	flags;
	uint32_t	xid;
	int32_t		n_out;
	int32_t		n_in;
} co_self;

/*
 * An rw edge of a transaction that has SXACT_FLAG_PREPARED set (a superset of the in-doubt
 * ones: the Rust side keeps the edges whose prepared side is in doubt and whose peer is not
 * finished), for the co.in_doubt view.
 */
typedef struct co_edge
{
	uint32_t	prepared_xid;
	uint32_t	prepared_flags;
	int32_t		prepared_pid;
	uint32_t	peer_xid;
	int32_t		peer_pid;
	uint32_t	peer_flags;
	int32_t		prepared_is_reader; /* 1: prepared -rw-> peer (peer waits, rule B) */
} co_edge;

/* The lock that guards every SSI list and flag (and pg_co's markers). */
extern void *co_sxact_lock(void);
extern void *co_addin_shmem_init_lock(void);
/* Size of the "PredXactList" shared struct, to look it up with ShmemInitStruct. */
extern size_t co_predxact_size(void);
/* In the postmaster after SSI's shared memory is set up: NULL when the server's layout is
 * that of pg_co's headers (and *predxact is set), else what differs. */
extern const char *co_check_layout(void **predxact, int skew);
/* This backend's PGPROC number (the index SERIALIZABLEXACT.pgprocno holds), -1 if none. */
extern int32_t co_my_procno(void);

/* The rest need co_sxact_lock() held. */
extern bool co_read_self(co_self *out);
extern int	co_read_edges(bool out_edges, co_peer *buf, int cap);
extern int	co_read_prepared_edges(const void *predxact, co_edge *buf, int cap);
extern uint64_t co_last_commit_seq(const void *predxact);
extern bool co_prepare_seq_of(const void *predxact, uint32_t xid, uint64_t *seq);

/* Rule S: takes SSI's finished-list and predicate-list locks itself; call without
 * co_sxact_lock(). */
extern bool co_summarized_concurrent_reader(const void *predxact);

/* The commit-order repair at XACT_EVENT_COMMIT (the one write into SSI's state); needs
 * co_sxact_lock() held exclusive. Returns the number of peers that made it flag us. */
extern int	co_repair_commit_order(void);

#endif
