/*
 * co_ssi.c: reads PostgreSQL 15's SSI state (SERIALIZABLEXACT and its rw-conflict lists).
 *
 * Version-specific on purpose: PostgreSQL 15 links these lists with SHM_QUEUE; 16+ uses
 * dlist. Another major version means another copy of the three list walks below, nothing
 * else. No ereport here: errors are raised from Rust, under #[pg_guard].
 */
#include "postgres.h"

#include "storage/lwlock.h"
#include "storage/predicate.h"
#include "storage/predicate_internals.h"
#include "storage/shmem.h"

#include "co_ssi.h"

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 160000
#error "co_ssi.c walks PostgreSQL 15's SHM_QUEUE conflict lists; port the list walks for this version"
#endif

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
	return PredXactListDataSize;
}

static void
fill_peer(co_peer *p, const SERIALIZABLEXACT *s)
{
	p->sxact = s;
	p->xid = s->topXid;
	p->flags = s->flags;
	p->pid = s->pid;
	p->pgprocno = s->pgprocno;
	p->prepare_seq = s->prepareSeqNo;
}

static int
queue_length(SHM_QUEUE *head, Size offset)
{
	int			n = 0;
	char	   *elem = (char *) SHMQueueNext(head, head, offset);

	while (elem)
	{
		n++;
		elem = (char *) SHMQueueNext(head, (SHM_QUEUE *) (elem + offset), offset);
	}
	return n;
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
	out->n_out = queue_length(&me->outConflicts, offsetof(RWConflictData, outLink));
	out->n_in = queue_length(&me->inConflicts, offsetof(RWConflictData, inLink));
	return true;
}

/* Copy up to cap peers of this backend's out-edges (or in-edges); return how many exist. */
int
co_read_edges(bool out_edges, co_peer *buf, int cap)
{
	SERIALIZABLEXACT *me = (SERIALIZABLEXACT *) ShareSerializableXact();
	SHM_QUEUE  *head;
	Size		offset;
	RWConflict	c;
	int			n = 0;

	if (me == InvalidSerializableXact)
		return 0;
	head = out_edges ? &me->outConflicts : &me->inConflicts;
	offset = out_edges ? offsetof(RWConflictData, outLink) : offsetof(RWConflictData, inLink);
	c = (RWConflict) SHMQueueNext(head, head, offset);
	while (c)
	{
		if (n < cap)
			fill_peer(&buf[n], out_edges ? c->sxactIn : c->sxactOut);
		n++;
		c = (RWConflict) SHMQueueNext(head, out_edges ? &c->outLink : &c->inLink, offset);
	}
	return n;
}

static bool
is_in_doubt(const SERIALIZABLEXACT *s)
{
	return (s->flags & SXACT_FLAG_PREPARED) && s->pid == 0 &&
		!(s->flags & (SXACT_FLAG_COMMITTED | SXACT_FLAG_ROLLED_BACK));
}

static bool
is_finished(const SERIALIZABLEXACT *s)
{
	return (s->flags & (SXACT_FLAG_COMMITTED | SXACT_FLAG_ROLLED_BACK)) != 0;
}

/* Every rw edge between an in-doubt transaction and a transaction not yet finished. */
int
co_read_prepared_edges(const void *predxact, co_edge *buf, int cap)
{
	PredXactList px = (PredXactList) predxact;
	PredXactListElement e;
	int			n = 0;

	e = (PredXactListElement) SHMQueueNext(&px->activeList, &px->activeList,
										   offsetof(PredXactListElementData, link));
	while (e)
	{
		SERIALIZABLEXACT *x = &e->sxact;

		if (is_in_doubt(x))
		{
			for (int dir = 0; dir < 2; dir++)
			{
				SHM_QUEUE  *head = dir ? &x->outConflicts : &x->inConflicts;
				Size		off = dir ? offsetof(RWConflictData, outLink) : offsetof(RWConflictData, inLink);
				RWConflict	c = (RWConflict) SHMQueueNext(head, head, off);

				while (c)
				{
					SERIALIZABLEXACT *peer = dir ? c->sxactIn : c->sxactOut;

					if (!is_finished(peer))
					{
						if (n < cap)
						{
							buf[n].prepared_xid = x->topXid;
							buf[n].peer_xid = peer->topXid;
							buf[n].peer_pid = peer->pid;
							buf[n].peer_flags = peer->flags;
							buf[n].prepared_is_reader = dir;
						}
						n++;
					}
					c = (RWConflict) SHMQueueNext(head, dir ? &c->outLink : &c->inLink, off);
				}
			}
		}
		e = (PredXactListElement) SHMQueueNext(&px->activeList, &e->link,
											   offsetof(PredXactListElementData, link));
	}
	return n;
}
