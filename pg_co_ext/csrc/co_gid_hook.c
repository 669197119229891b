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

#include "executor/executor.h"

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

static void
co_executor_start(QueryDesc *queryDesc, int eflags)
{
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
