/*
 * co_ssi.c: reads PostgreSQL's SSI state (SERIALIZABLEXACT and its rw-conflict lists).
 *
 * Supported: PostgreSQL 15, 16, 17 and 18. Only the list walks differ between majors: 15 links the SSI lists with SHM_QUEUE, 16+
 * with dlist. Each implementation is one fenced section below with the same pieces (the
 * two walks, the first two free pool entries, where the pool of SERIALIZABLEXACTs lives);
 * everything else is shared. docs/pg_co.md ("What the shim reads, per major") lists the
 * fields read and why each is safe. No ereport here: errors are raised from Rust, under
 * #[pg_guard].
 */
#include "postgres.h"

#include "storage/lwlock.h"
#include "storage/predicate.h"
#include "storage/predicate_internals.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "access/twophase.h"
#include "miscadmin.h"

#include "co_ssi.h"

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 190000
#error "pg_co's SSI shim knows PostgreSQL 15 to 18; check predicate_internals.h of this major and add it"
#endif

/* The copies below assume these widths; a major that changes one must fail here. */
StaticAssertDecl(sizeof(SerCommitSeqNo) == sizeof(uint64_t), "SerCommitSeqNo is copied into a uint64_t");
StaticAssertDecl(sizeof(TransactionId) == sizeof(uint32_t), "TransactionId is copied into a uint32_t");
StaticAssertDecl(sizeof(((SERIALIZABLEXACT *) 0)->flags) == sizeof(uint32_t), "SERIALIZABLEXACT.flags is copied into a uint32_t");
StaticAssertDecl(sizeof(((SERIALIZABLEXACT *) 0)->pid) == sizeof(int32_t), "SERIALIZABLEXACT.pid is copied into an int32_t");
StaticAssertDecl(sizeof(((SERIALIZABLEXACT *) 0)->pgprocno) == sizeof(int32_t), "SERIALIZABLEXACT.pgprocno is copied into an int32_t");

/*
 * The layout of everything read below, per major, as reviewed against that major's
 * predicate_internals.h (docs/pg_co.md, "What the shim reads, per major"): the size of
 * SERIALIZABLEXACT (of PredXactListElementData in 15, whose pool entries those are), the
 * offsets of the fields copied and of the lists walked, RWConflictData's, and the size and
 * fields of the "PredXactList" struct (checked: 15.18, 16.15, 17.11, 18.6; 16 to 18 have
 * the same numbers). Headers of a minor release that moved any of them fail the build
 * here, before the start-up layout check (which compares only two sizes with the running
 * server) would have to catch it: review that release's predicate_internals.h and
 * predicate.c, then add its numbers.
 */
#define CO_REVIEWED(what, expr, value) \
	StaticAssertDecl((expr) == (value), "PostgreSQL " PG_MAJORVERSION ": " what " differs from the layout pg_co was reviewed against")
#if PG_VERSION_NUM < 160000
CO_REVIEWED("sizeof(PredXactListElementData)", sizeof(PredXactListElementData), 168);
CO_REVIEWED("offsetof(PredXactListElementData, sxact)", offsetof(PredXactListElementData, sxact), 16);
#define CO_SX_SIZE 152
#define CO_SX_TAIL 128			/* topXid; flags, pid, pgprocno follow */
#else
CO_REVIEWED("offsetof(SERIALIZABLEXACT, xactLink)", offsetof(SERIALIZABLEXACT, xactLink), 96);
#define CO_SX_SIZE 168
#define CO_SX_TAIL 144
#endif
CO_REVIEWED("sizeof(SERIALIZABLEXACT)", sizeof(SERIALIZABLEXACT), CO_SX_SIZE);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, topXid)", offsetof(SERIALIZABLEXACT, topXid), CO_SX_TAIL);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, flags)", offsetof(SERIALIZABLEXACT, flags), CO_SX_TAIL + 12);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, pid)", offsetof(SERIALIZABLEXACT, pid), CO_SX_TAIL + 16);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, pgprocno)", offsetof(SERIALIZABLEXACT, pgprocno), CO_SX_TAIL + 20);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, prepareSeqNo)", offsetof(SERIALIZABLEXACT, prepareSeqNo), 8);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, SeqNo)", offsetof(SERIALIZABLEXACT, SeqNo), 24);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, outConflicts)", offsetof(SERIALIZABLEXACT, outConflicts), 32);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, inConflicts)", offsetof(SERIALIZABLEXACT, inConflicts), 48);
CO_REVIEWED("sizeof(RWConflictData)", sizeof(RWConflictData), 48);
CO_REVIEWED("offsetof(RWConflictData, outLink)", offsetof(RWConflictData, outLink), 0);
CO_REVIEWED("offsetof(RWConflictData, inLink)", offsetof(RWConflictData, inLink), 16);
CO_REVIEWED("offsetof(RWConflictData, sxactOut)", offsetof(RWConflictData, sxactOut), 32);
CO_REVIEWED("offsetof(RWConflictData, sxactIn)", offsetof(RWConflictData, sxactIn), 40);
CO_REVIEWED("PredXactListDataSize", PredXactListDataSize, 88);
CO_REVIEWED("offsetof(PredXactListData, availableList)", offsetof(PredXactListData, availableList), 0);
CO_REVIEWED("offsetof(PredXactListData, activeList)", offsetof(PredXactListData, activeList), 16);
CO_REVIEWED("offsetof(PredXactListData, LastSxactCommitSeqNo)", offsetof(PredXactListData, LastSxactCommitSeqNo), 48);
/* Rule S (summarized readers): the dummy's list of read locks. */
CO_REVIEWED("offsetof(PredXactListData, OldCommittedSxact)", offsetof(PredXactListData, OldCommittedSxact), 72);
CO_REVIEWED("offsetof(SERIALIZABLEXACT, predicateLocks)", offsetof(SERIALIZABLEXACT, predicateLocks), 64);
CO_REVIEWED("offsetof(PREDICATELOCK, xactLink)", offsetof(PREDICATELOCK, xactLink), 32);
CO_REVIEWED("offsetof(PREDICATELOCK, commitSeqNo)", offsetof(PREDICATELOCK, commitSeqNo), 48);

/* Called once per transaction at the other end of an edge, or per active transaction. */
typedef void (*co_visit_fn) (const SERIALIZABLEXACT *sx, void *arg);

/*
 * walk_conflicts(x, out, fn, arg): fn(peer) for every rw-conflict of x in one direction:
 *   out: x -rw-> peer (x read a version that peer overwrote), peer = conflict->sxactIn;
 *   in:  peer -rw-> x (peer read a version that x overwrote), peer = conflict->sxactOut.
 * walk_active(px, fn, arg): fn(sxact) for every SERIALIZABLEXACT on PredXact->activeList.
 */
#if PG_VERSION_NUM < 160000
/* ---- PostgreSQL 15: SHM_QUEUE lists; activeList links PredXactListElementData ---------- */

static void
walk_conflicts(const SERIALIZABLEXACT *x, bool out, co_visit_fn fn, void *arg)
{
	const SHM_QUEUE *head = out ? &x->outConflicts : &x->inConflicts;
	Size		off = out ? offsetof(RWConflictData, outLink) : offsetof(RWConflictData, inLink);
	RWConflict	c = (RWConflict) SHMQueueNext(head, head, off);

	while (c)
	{
		fn(out ? c->sxactIn : c->sxactOut, arg);
		c = (RWConflict) SHMQueueNext(head, out ? &c->outLink : &c->inLink, off);
	}
}

/* The pool of SERIALIZABLEXACTs: PredXactListElementData entries, allocated apart. */
#define CO_SXACT_POOL_ELEMENT_SIZE sizeof(PredXactListElementData)
#define CO_PREDXACT_REQUEST_SIZE() PredXactListDataSize

/* The first two entries of availableList (consecutive pool elements at startup). */
static bool
first_two_available(const PredXactListData *px, const void **a, const void **b)
{
	const SHM_QUEUE *head = &px->availableList;
	Size		off = offsetof(PredXactListElementData, link);

	*a = SHMQueueNext(head, head, off);
	*b = *a ? SHMQueueNext(head, &((const PredXactListElementData *) *a)->link, off) : NULL;
	return *a && *b;
}

static void
walk_active(const PredXactListData *px, co_visit_fn fn, void *arg)
{
	const SHM_QUEUE *head = &px->activeList;
	Size		off = offsetof(PredXactListElementData, link);
	PredXactListElement e = (PredXactListElement) SHMQueueNext(head, head, off);

	while (e)
	{
		fn(&e->sxact, arg);
		e = (PredXactListElement) SHMQueueNext(head, &e->link, off);
	}
}

/* Whether any read lock on x's list has commitSeqNo > seq. */
static bool
any_lock_newer(const SERIALIZABLEXACT *x, SerCommitSeqNo seq)
{
	const SHM_QUEUE *head = &x->predicateLocks;
	Size		off = offsetof(PREDICATELOCK, xactLink);
	const PREDICATELOCK *l = (const PREDICATELOCK *) SHMQueueNext(head, head, off);

	while (l)
	{
		if (l->commitSeqNo > seq)
			return true;
		l = (const PREDICATELOCK *) SHMQueueNext(head, &l->xactLink, off);
	}
	return false;
}

static bool
no_locks(const SERIALIZABLEXACT *x)
{
	return SHMQueueEmpty(&x->predicateLocks);
}

#else
/* ---- PostgreSQL 16+: dlist; activeList links SERIALIZABLEXACT.xactLink ------------------ */

static void
walk_conflicts(const SERIALIZABLEXACT *x, bool out, co_visit_fn fn, void *arg)
{
	dlist_head *head = (dlist_head *) (out ? &x->outConflicts : &x->inConflicts);
	dlist_iter	it;

	dlist_foreach(it, head)
	{
		RWConflict	c = out ? dlist_container(RWConflictData, outLink, it.cur)
			: dlist_container(RWConflictData, inLink, it.cur);

		fn(out ? c->sxactIn : c->sxactOut, arg);
	}
}

/* The pool of SERIALIZABLEXACTs: an array of them. */
#define CO_SXACT_POOL_ELEMENT_SIZE sizeof(SERIALIZABLEXACT)
#if PG_VERSION_NUM >= 180000
/* 18 places the pool inside the "PredXactList" struct (InitPredicateLocks). */
#define CO_PREDXACT_REQUEST_SIZE() \
	add_size(PredXactListDataSize, \
			 mul_size((Size) (MaxBackends + max_prepared_xacts) * 10, sizeof(SERIALIZABLEXACT)))
#else
#define CO_PREDXACT_REQUEST_SIZE() PredXactListDataSize
#endif

static bool
first_two_available(const PredXactListData *px, const void **a, const void **b)
{
	dlist_head *head = (dlist_head *) &px->availableList;
	dlist_node *n1 = head->head.next;
	dlist_node *n2 = n1->next;

	if (n1 == &head->head || n2 == &head->head)
		return false;
	*a = dlist_container(SERIALIZABLEXACT, xactLink, n1);
	*b = dlist_container(SERIALIZABLEXACT, xactLink, n2);
	return true;
}

static void
walk_active(const PredXactListData *px, co_visit_fn fn, void *arg)
{
	dlist_iter	it;

	dlist_foreach(it, (dlist_head *) &px->activeList)
		fn(dlist_container(SERIALIZABLEXACT, xactLink, it.cur), arg);
}

/* Whether any read lock on x's list has commitSeqNo > seq. */
static bool
any_lock_newer(const SERIALIZABLEXACT *x, SerCommitSeqNo seq)
{
	dlist_iter	it;

	dlist_foreach(it, (dlist_head *) &x->predicateLocks)
	{
		if (dlist_container(PREDICATELOCK, xactLink, it.cur)->commitSeqNo > seq)
			return true;
	}
	return false;
}

static bool
no_locks(const SERIALIZABLEXACT *x)
{
	return dlist_is_empty(&x->predicateLocks);
}

#endif
/* ---- shared by every major --------------------------------------------------------------- */

void *
co_sxact_lock(void)
{
	return SerializableXactHashLock;
}

void *
co_addin_shmem_init_lock(void)
{
	return AddinShmemInitLock;
}

size_t
co_predxact_size(void)
{
	return CO_PREDXACT_REQUEST_SIZE();
}

/*
 * Whether the running server lays out SSI state as the headers pg_co was compiled with do.
 * Called once in the postmaster, right after PostgreSQL initialised SSI's shared memory
 * and before any transaction ran. Two facts are checked: the size the server registered
 * for "PredXactList" (ShmemInitStruct raises an error when ours differs), and the distance
 * between two consecutive entries of the untouched pool, which is the server's
 * sizeof(SERIALIZABLEXACT) (15: of PredXactListElementData). Returns NULL when both match,
 * else a message; *predxact receives the struct. skew (test only) is added to both
 * expectations, to show that a mismatch is caught.
 */
const char *
co_check_layout(void **predxact, int skew)
{
	static char msg[256];
	volatile bool size_ok = true;
	PredXactListData *volatile px = NULL;
	const void *a,
			   *b;
	bool		found;

	PG_TRY();
	{
		px = ShmemInitStruct("PredXactList", co_predxact_size() + skew, &found);
	}
	PG_CATCH();
	{
		FlushErrorState();
		size_ok = false;
	}
	PG_END_TRY();
	if (!size_ok || !found)
	{
		snprintf(msg, sizeof(msg), "the server's \"PredXactList\" shared struct is not %zu bytes as in the headers pg_co was built with",
				 co_predxact_size() + skew);
		return msg;
	}
	*predxact = px;
	if (first_two_available(px, &a, &b) &&
		(size_t) ((const char *) b - (const char *) a) != CO_SXACT_POOL_ELEMENT_SIZE + skew)
	{
		snprintf(msg, sizeof(msg), "the server's SERIALIZABLEXACT pool entries are %zd bytes apart, the headers pg_co was built with say %zu",
				 (ssize_t) ((const char *) b - (const char *) a), (size_t) CO_SXACT_POOL_ELEMENT_SIZE + skew);
		return msg;
	}
	return NULL;
}

int32_t
co_my_procno(void)
{
#if PG_VERSION_NUM >= 170000
	return MyProcNumber;		/* 17 dropped PGPROC.pgprocno */
#else
	return MyProc ? MyProc->pgprocno : -1;
#endif
}

static void
count_one(const SERIALIZABLEXACT *sx, void *arg)
{
	(*(int *) arg)++;
}

bool
co_read_self(co_self *out)
{
	SERIALIZABLEXACT *me = (SERIALIZABLEXACT *) ShareSerializableXact();

	if (me == InvalidSerializableXact)
		return false;
	out->sxact = me;
	out->flags = me->flags;
	out->xid = me->topXid;
	out->last_commit_before_snapshot = me->SeqNo.lastCommitBeforeSnapshot;
	out->n_out = 0;
	out->n_in = 0;
	walk_conflicts(me, true, count_one, &out->n_out);
	walk_conflicts(me, false, count_one, &out->n_in);
	return true;
}

typedef struct peer_buf
{
	co_peer    *buf;
	int			cap;
	int			n;
} peer_buf;

static void
copy_peer(const SERIALIZABLEXACT *s, void *arg)
{
	peer_buf   *pb = arg;

	if (pb->n < pb->cap)
	{
		co_peer    *p = &pb->buf[pb->n];

		p->sxact = s;
		p->xid = s->topXid;
		p->flags = s->flags;
		p->pid = s->pid;
		p->pgprocno = s->pgprocno;
		p->prepare_seq = s->prepareSeqNo;
	}
	pb->n++;
}

/* Copy up to cap peers of this backend's out-edges (or in-edges); return how many exist. */
int
co_read_edges(bool out_edges, co_peer *buf, int cap)
{
	SERIALIZABLEXACT *me = (SERIALIZABLEXACT *) ShareSerializableXact();
	peer_buf	pb = {buf, cap, 0};

	if (me == InvalidSerializableXact)
		return 0;
	walk_conflicts(me, out_edges, copy_peer, &pb);
	return pb.n;
}

typedef struct edge_buf
{
	co_edge    *buf;
	int			cap;
	int			n;
	const SERIALIZABLEXACT *prepared;
	int			prepared_is_reader;
} edge_buf;

static void
copy_edge(const SERIALIZABLEXACT *peer, void *arg)
{
	edge_buf   *eb = arg;

	if (eb->n < eb->cap)
	{
		co_edge    *e = &eb->buf[eb->n];

		e->prepared_xid = eb->prepared->topXid;
		e->prepared_flags = eb->prepared->flags;
		e->prepared_pid = eb->prepared->pid;
		e->peer_xid = peer->topXid;
		e->peer_pid = peer->pid;
		e->peer_flags = peer->flags;
		e->prepared_is_reader = eb->prepared_is_reader;
	}
	eb->n++;
}

static void
copy_edges_if_prepared(const SERIALIZABLEXACT *x, void *arg)
{
	edge_buf   *eb = arg;

	if (!(x->flags & SXACT_FLAG_PREPARED))
		return;
	eb->prepared = x;
	eb->prepared_is_reader = 0;
	walk_conflicts(x, false, copy_edge, eb);
	eb->prepared_is_reader = 1;
	walk_conflicts(x, true, copy_edge, eb);
}

/* Every rw edge of a transaction flagged PREPARED (Rust keeps the in-doubt ones). */
int
co_read_prepared_edges(const void *predxact, co_edge *buf, int cap)
{
	edge_buf	eb = {buf, cap, 0, NULL, 0};

	walk_active((const PredXactListData *) predxact, copy_edges_if_prepared, &eb);
	return eb.n;
}

/* ---- for rule C's READ ONLY readers (src/read_only.rs); need co_sxact_lock() ------------ */

/* PredXact->LastSxactCommitSeqNo: every commit sequence number handed out so far. */
uint64_t
co_last_commit_seq(const void *predxact)
{
	return ((const PredXactListData *) predxact)->LastSxactCommitSeqNo;
}

typedef struct prepared_seq_arg
{
	uint32_t	xid;
	uint64_t	seq;
	bool		found;
} prepared_seq_arg;

static void
find_prepared(const SERIALIZABLEXACT *sx, void *arg)
{
	prepared_seq_arg *a = arg;

	if (!a->found && sx->topXid == a->xid && (sx->flags & SXACT_FLAG_PREPARED))
	{
		a->seq = sx->prepareSeqNo;
		a->found = true;
	}
}

/* prepareSeqNo of the prepared transaction with top-level xid `xid`; false if none. */
bool
co_prepare_seq_of(const void *predxact, uint32_t xid, uint64_t *seq)
{
	prepared_seq_arg a = {xid, 0, false};

	walk_active((const PredXactListData *) predxact, find_prepared, &a);
	*seq = a.seq;
	return a.found;
}

/* ---- rule S, summarized readers (docs/pg_co.md); call WITHOUT co_sxact_lock() ------------ */

/*
 * Whether a committed reader that ran concurrently with this backend's transaction (it
 * committed after our snapshot: commitSeqNo > our lastCommitBeforeSnapshot) was
 * summarized and still holds a read lock. PostgreSQL's write-side check
 * (CheckTargetForConflictsIn) skips every read lock of the summarized dummy
 * OldCommittedSxact, whose finishedBefore is never set: our writes after that summarization
 * could not record "that reader -rw-> us". Summarization and the dummy's clean-up change its
 * list under SerializableFinishedListLock exclusive, page-split transfers under
 * SerializablePredicateListLock exclusive: both are taken shared here, in PostgreSQL's order
 * (before SerializableXactHashLock, which the caller must not hold). The unlocked look at
 * an empty list is enough when it says empty: a summarization that matters moved the lock
 * before our write's conflict check took that target's partition lock, after the mover
 * released it, so this backend already sees the lock.
 */
bool
co_summarized_concurrent_reader(const void *predxact)
{
	const PredXactListData *px = predxact;
	const SERIALIZABLEXACT *me = (const SERIALIZABLEXACT *) ShareSerializableXact();
	const SERIALIZABLEXACT *old = px->OldCommittedSxact;
	bool		found;

	if (me == InvalidSerializableXact || old == NULL || no_locks(old))
		return false;
	LWLockAcquire(SerializableFinishedListLock, LW_SHARED);
	LWLockAcquire(SerializablePredicateListLock, LW_SHARED);
	found = any_lock_newer(old, me->SeqNo.lastCommitBeforeSnapshot);
	LWLockRelease(SerializablePredicateListLock);
	LWLockRelease(SerializableFinishedListLock);
	return found;
}

/* ---- the commit-order repair (docs/pg_co.md, "Commit-order repair"); needs co_sxact_lock()
 * held EXCLUSIVE. The one place pg_co writes into SSI's state. ----------------------------- */

typedef struct repair_arg
{
	uint64_t	earliest;		/* smallest prepareSeqNo of a peer past its commit check */
	int			n;
} repair_arg;

static void
note_committing_peer(const SERIALIZABLEXACT *peer, void *arg)
{
	repair_arg *a = arg;

	/* Past PreCommit_CheckForSerializationFailure (or prepared), not yet committed for SSI. */
	if (!(peer->flags & SXACT_FLAG_PREPARED)
		|| (peer->flags & (SXACT_FLAG_COMMITTED | SXACT_FLAG_ROLLED_BACK | SXACT_FLAG_DOOMED)))
		return;
	if (a->n == 0 || peer->prepareSeqNo < a->earliest)
		a->earliest = peer->prepareSeqNo;
	a->n++;
}

/*
 * Called at XACT_EVENT_COMMIT of this backend's serializable transaction X: X is visible
 * (ProcArrayEndTransaction ran) and not yet committed for SSI (ReleasePredicateLocks, which
 * sets COMMITTED and commitSeqNo, comes later). If X read what a peer Y overwrote
 * (X -rw-> Y) and Y is past its own commit check but not committed for SSI, Y may already
 * be visible to new snapshots although SSI will number its commit after X's; Y's release
 * then drops the edge from the committed X without flagging X, and a reader that saw Y but
 * not X reads X's write unrefused (the cycle R -rw-> X -rw-> Y -wr-> R). So flag X now as
 * PostgreSQL flags a pivot whose out-peer committed first (ReleasePredicateLocks'
 * outConflicts loop): SXACT_FLAG_CONFLICT_OUT, earliestOutConflictCommit = the smallest
 * prepareSeqNo of those peers. X's own release keeps both (it only lowers the seqno) and
 * uses them to refuse readers of X's writes and to mark concurrent READ ONLY snapshots
 * unsafe. The seqno shares a union with X's lastCommitBeforeSnapshot, which PostgreSQL
 * reads only for READ ONLY transactions and, for a peer's release, to drop an edge early
 * (a smaller value keeps it): X wrote, so it is not READ ONLY. Returns how many peers.
 */
int
co_repair_commit_order(void)
{
	SERIALIZABLEXACT *me = (SERIALIZABLEXACT *) ShareSerializableXact();
	repair_arg	a = {0, 0};

	if (me == InvalidSerializableXact
		|| (me->flags & (SXACT_FLAG_COMMITTED | SXACT_FLAG_READ_ONLY | SXACT_FLAG_ROLLED_BACK))
		|| !(me->flags & SXACT_FLAG_PREPARED))
		return 0;
	walk_conflicts(me, true, note_committing_peer, &a);
	if (a.n == 0)
		return 0;
	if (!(me->flags & SXACT_FLAG_CONFLICT_OUT) || a.earliest < me->SeqNo.earliestOutConflictCommit)
		me->SeqNo.earliestOutConflictCommit = a.earliest;
	me->flags |= SXACT_FLAG_CONFLICT_OUT;
	return a.n;
}
