/*
 * co_gid_hook.c: pg_co's ProcessUtility hook. It only looks at PREPARE TRANSACTION's gid
 * (handed to Rust, src/gids.rs, which records it with the xid and cannot raise errors)
 * and then runs the statement. Written in C so that an error raised by the statement
 * itself passes through untouched (a Rust frame in between would turn it into a panic
 * and back, and replace its DETAIL). The hook's signature is the same in 15 to 18.
 */
#include "postgres.h"

#include "nodes/parsenodes.h"
#include "tcop/utility.h"

extern void co_gids_on_prepare_stmt(const char *gid);

static ProcessUtility_hook_type prev_utility = NULL;

static void
co_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
		   ProcessUtilityContext context, ParamListInfo params,
		   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *n = pstmt->utilityStmt;

	if (n != NULL && IsA(n, TransactionStmt))
	{
		TransactionStmt *s = (TransactionStmt *) n;

		if (s->kind == TRANS_STMT_PREPARE && s->gid != NULL)
			co_gids_on_prepare_stmt(s->gid);
	}
	if (prev_utility)
		prev_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
}

void
co_install_utility_hook(void)
{
	prev_utility = ProcessUtility_hook;
	ProcessUtility_hook = co_utility;
}
