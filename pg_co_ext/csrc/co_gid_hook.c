/*
 * co_gid_hook.c: pg_co's ProcessUtility and ExecutorStart hooks. The utility hook hands
 * PREPARE TRANSACTION's gid to Rust (src/gids.rs, which records it with the xid) and
 * brackets COMMIT PREPARED (src/read_only.rs: rule C for READ ONLY readers); the executor
 * hook lets src/read_only.rs note a READ ONLY reader's snapshot position, and both tell
 * src/commit_points.rs that the transaction writes (a modifying statement, COPY FROM: the
 * commit-order repair applies only to writers). None of the Rust
 * callbacks raises an error. Then the statement runs. Written in C so that an error raised by the statement
 * itself passes through untouched (a Rust frame in between would turn it into a panic
 * and back, and replace its DETAIL). The hook's signature is the same in 15 to 18.
 */
#include "postgres.h"

#include "nodes/parsenodes.h"
#include "tcop/utility.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "nodes/plannodes.h"

#include "co_rust.h"

static ProcessUtility_hook_type prev_utility = NULL;
static ExecutorStart_hook_type prev_executor_start = NULL;

static void
co_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
		   ProcessUtilityContext context, ParamListInfo params,
		   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *n = pstmt->utilityStmt;
	bool		commit_prepared = false;

	if (n != NULL && IsA(n, CopyStmt) && ((CopyStmt *) n)->is_from)
		co_note_write();
	if (n != NULL && IsA(n, TransactionStmt))
	{
		TransactionStmt *s = (TransactionStmt *) n;

		if (s->kind == TRANS_STMT_PREPARE && s->gid != NULL)
			co_gids_on_prepare_stmt(s->gid);
		if (s->kind == TRANS_STMT_COMMIT_PREPARED && s->gid != NULL)
		{
			co_ro_commit_prepared_start(s->gid);
			commit_prepared = true;
		}
	}
	if (prev_utility)
		prev_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	/* Not reached when it failed: the abort callback clears what start set. */
	if (commit_prepared)
		co_ro_commit_prepared_end();
}

/*
 * An upsert that can read a row and leave it unchanged: ON CONFLICT DO NOTHING, or DO
 * UPDATE with a WHERE. PostgreSQL takes no SIREAD lock on that row (docs/pg_co.md, end of
 * "Rule S"). A ModifyTable is the top of the plan or of a data-modifying WITH's subplan.
 */
static bool
upsert_reads(const Plan *plan)
{
	const ModifyTable *mt = (const ModifyTable *) plan;

	return plan != NULL && IsA(plan, ModifyTable)
		&& (mt->onConflictAction == ONCONFLICT_NOTHING
			|| (mt->onConflictAction == ONCONFLICT_UPDATE && mt->onConflictWhere != NULL));
}

static bool
stmt_upsert_reads(const PlannedStmt *stmt)
{
	ListCell   *lc;

	if (upsert_reads(stmt->planTree))
		return true;
	foreach(lc, stmt->subplans)
	{
		if (upsert_reads((const Plan *) lfirst(lc)))
			return true;
	}
	return false;
}

static void
co_executor_start(QueryDesc *queryDesc, int eflags)
{
	/* pg_co.refuse_upsert_reads: make the documented gap an error instead of a silent risk. */
	if ((queryDesc->operation == CMD_INSERT || queryDesc->plannedstmt->hasModifyingCTE)
		&& IsolationIsSerializable() && stmt_upsert_reads(queryDesc->plannedstmt)
		&& co_refuse_upsert_reads())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("pg_co refuses INSERT ... ON CONFLICT DO NOTHING and ON CONFLICT DO UPDATE ... WHERE in a serializable transaction"),
				 errdetail("PostgreSQL takes no read lock on a conflicting row such an upsert leaves unchanged, so a later writer of that row can close a write skew that SERIALIZABLE does not refuse."),
				 errhint("Write the condition into the SET (SET col = CASE WHEN ... THEN ... ELSE t.col END), read the key first with SELECT, or set pg_co.refuse_upsert_reads = off.")));

	co_ro_executor_start();
	/* INSERT, UPDATE, DELETE, MERGE, and a SELECT with a modifying WITH (functions' and
	 * triggers' statements come through here too, by SPI). */
	if (queryDesc->operation != CMD_SELECT || queryDesc->plannedstmt->hasModifyingCTE)
		co_note_write();
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

void
co_install_utility_hook(void)
{
	prev_utility = ProcessUtility_hook;
	ProcessUtility_hook = co_utility;
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = co_executor_start;
}
