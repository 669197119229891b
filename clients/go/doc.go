// Package cotx is the Go client of the cotx coordinator (docs/coordinator.md): global
// transactions whose branches run on the application's own database/sql connections,
// PostgreSQL through pgx (v5, stdlib) and MariaDB through go-sql-driver/mysql.
//
// The root service:
//
//	tx := coord.Transaction(0)
//	conn, _ := db.Conn(ctx)                       // one session per branch, kept until the end
//	b, err := tx.Branch(ctx, conn, cotx.Postgres, "savings", "")
//	... conn.QueryContext(...) / conn.ExecContext(...) ...   (b.Fail(err) on an error)
//	ctx, _ = tx.Context(ctx)                       // gtid + trace context for other services (Transport / Middleware)
//	err = tx.Commit(ctx)                           // prepare, durable decision, completion
//	if cotx.IsRetryable(err) { ... run the whole transaction again ... }
//
// Coordinator.Run is that loop, and also rides through the daemon's "not now" answers
// (503, 429: again after Retry-After) and restarts, as the retry rules
// (clients/retry-rules.json, RetryAction) say:
//
//	err := coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error { ... branches ... }, cotx.Retries(5))
//
// A participant joins by gtid, runs its branch, then Prepare (prepares and reports) and
// Finish (waits for the root's decision and completes the branch on the same session):
//
//	tx := coord.Join(gtid)
//	b, err := tx.Branch(ctx, conn, cotx.MariaDB, "checking", "")
//	...
//	if err := tx.Prepare(ctx); err != nil { ... }
//	go func() { tx.Finish(context.Background()); conn.Close() }()   // keep conn until then
//
// Branches are SERIALIZABLE (BEGIN ISOLATION LEVEL SERIALIZABLE; SET TRANSACTION
// ISOLATION LEVEL SERIALIZABLE + XA START): pg_co and mysql_co only protect serializable
// READ WRITE branches. A branch alone in its global transaction commits in one phase.
//
// Where pg_co / mysql_co are not installed (managed databases) the daemon may run a
// resource in client mode: the registration's answer says so (Branch.Enforcement ==
// EnforcementClient, Branch.ShimKey its slot). The branch then must be SERIALIZABLE
// (anything else is refused before it runs: ErrClientModeIsolation); on MariaDB the
// session is set SERIALIZABLE and read back before XA START; just before its prepare the
// branch writes its slot (PostgreSQL: SELECT cotx.shim_touch(key), MariaDB: UPDATE
// cotx_shim SET v = v + 1 WHERE k = key). A transaction's only branch commits in one
// phase after that write where the daemon allows it (docs/client-mode.md, "One phase");
// otherwise branches are prepared. Refusals then come from PostgreSQL's SSI (40001) or InnoDB's locks
// (deadlock, lock wait) and are retryable like the engines' own.
//
// A branch opened WithReadOnly writes nothing: checked before it prepares (PostgreSQL: no
// transaction id assigned; MariaDB in engine mode and plain 2PC: a READ ONLY transaction;
// MariaDB in client mode: never claimed), and when every branch wrote nothing the daemon
// commits without a store sync (readonly.go). In plain 2PC such a branch of the root's
// two-phase commit is not prepared: it commits in one phase at its vote (readonly.go).
//
// Errors worth retrying the whole global transaction for (a prepare refused by pg_co or
// mysql_co, a serialization failure, deadlock or lock timeout, a retryable abort such as
// a timeout) satisfy IsRetryable.
//
// Fewer requests (opt-in): with Coordinator.CarryAcks a committed transaction's
// acknowledgement rides with the next begin instead of a request of its own (FlushAcks
// sends what is held); Tx.Branches registers every branch with the begin in one request;
// with Coordinator.OneRequest a transaction on known engine-mode or plain-2PC resources
// draws its gtid from a leased range and its commit is its only request (leased.go).
//
// Every request of a transaction carries a W3C traceparent: the context's
// (WithTraceparent, Middleware) or one trace id per transaction (Tx.TraceID). A `421
// wrong_node` answer (another daemon of the deployment owns the gtid) is followed to the
// owner's URL, at most twice.
package cotx
