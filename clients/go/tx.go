package cotx

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"
)

// Kind of a branch's database.
type Kind string

const (
	Postgres Kind = "postgres" // pgx v5 through database/sql (github.com/jackc/pgx/v5/stdlib)
	MariaDB  Kind = "mariadb"  // github.com/go-sql-driver/mysql
)

// Isolation levels a branch may run at. Only Serializable is protected by pg_co /
// mysql_co (which refuse to prepare the others by default); the others exist to compare
// with plain 2PC.
const (
	Serializable   = "SERIALIZABLE"
	RepeatableRead = "REPEATABLE READ"
	ReadCommitted  = "READ COMMITTED"
)

type branchState int

const (
	stActive branchState = iota // running the application's statements
	stPrepared
	stFinished
	stRolledBack
	stFailed
)

// protocolTimeout bounds one PREPARE/COMMIT/ROLLBACK statement. Those statements run on a
// context of their own: an application's cancelled context must not leave a branch half
// completed (the coordinator would finish it, but later).
const protocolTimeout = 30 * time.Second

// How the coordinator says commitment ordering is enforced at a branch's resource
// (Branch.Enforcement, from the registration's answer).
const (
	// EnforcementEngine: pg_co / mysql_co refuse what would break commitment ordering.
	EnforcementEngine = "engine"
	// EnforcementClient: neither is installed there (a managed database): Sonata's shims.
	// On PostgreSQL the daemon has prepared a helper transaction that read the branch's
	// slot; on MariaDB the session is SERIALIZABLE, set and read back. The branch writes
	// its slot just before it prepares (alone in its transaction: before its one-phase
	// commit, where the daemon allows it), and must be SERIALIZABLE.
	EnforcementClient = "client"
	// EnforcementNone: plain 2PC, configured so (comparisons).
	EnforcementNone = "none"
)

// ErrClientModeIsolation: a branch that is not SERIALIZABLE on a resource in client mode,
// refused before it runs (the shims protect SERIALIZABLE branches only).
var ErrClientModeIsolation = errors.New("client mode needs SERIALIZABLE branches")

// Branch is one database's part of a global transaction, on the owner's session.
type Branch struct {
	tx        *Tx
	Conn      *sql.Conn
	Kind      Kind
	Resource  string
	ID        string
	Isolation string
	GID       string // PostgreSQL
	xid       string // MariaDB, as SQL: 'gtrid','bqual',formatID
	state     branchState
	// Enforcement is EnforcementEngine, EnforcementClient or EnforcementNone, as the
	// coordinator answered the registration ("engine" from a daemon that does not say).
	Enforcement string
	// ShimKey is client mode's slot (1 and up; 0 in the other modes); shimOnePhase: the
	// daemon lets it commit in one phase when it is the transaction's only branch.
	ShimKey      int
	shimOnePhase bool
	// ReadOnly: declared by the application (WithReadOnly); wroteNothing: what the check
	// before PREPARE found (readonly.go). The commit lists the branches that wrote nothing.
	ReadOnly     bool
	wroteNothing bool
	// endedAtVote: committed in one phase at its vote instead of prepared (the read-only
	// vote of plain 2PC, readonly.go); it keeps stPrepared as its vote, and no statement
	// is run for it after the decision.
	endedAtVote bool
}

// BranchOption changes a branch (WithIsolation).
type BranchOption func(*Branch)

// WithIsolation runs the branch at another level (comparisons with plain 2PC only).
func WithIsolation(level string) BranchOption { return func(b *Branch) { b.Isolation = level } }

// Tx is a global transaction as seen by one service: the root (Coordinator.Transaction)
// or a participant (Coordinator.Join). Not safe for concurrent use.
type Tx struct {
	coord     *Coordinator
	gtid      string
	root      bool
	timeoutMs int
	branches  []*Branch
	traceID   string // TraceID: drawn once, so one transaction is one trace
	// leased: the gtid was drawn from a leased range (leased.go): the daemon hears of the
	// transaction only with its commit.
	leased bool
	lease  drawn
	// DecideInParticipant (root only, set before Commit): the last PostgreSQL branch in
	// engine mode is not prepared but commits in one phase with the global decision
	// written inside it (pg_co's co.decide; its resource needs decisions = true at the
	// daemon): a PREPARE, a COMMIT PREPARED and the daemon's store write fewer
	// (decide_in.go).
	DecideInParticipant bool
	// decidedIn: the branch whose COMMIT carried the decision, once it committed.
	decidedIn *Branch
	// Outcome after Commit/Finish/Rollback: "commit" or "abort".
	Outcome string
}

// GTID returns the global id to hand to other services, beginning the transaction at the
// coordinator if no branch did yet.
func (t *Tx) GTID(ctx context.Context) (string, error) {
	ctx = t.traced(ctx)
	if t.leased {
		// Other services' branches register with the daemon, which does not know a
		// leased gtid before its commit.
		return "", t.fallBack("the gtid of a one-request transaction was asked for (to propagate it)", true)
	}
	if t.gtid == "" {
		g, err := t.coord.Begin(ctx, t.timeoutMs)
		if err != nil {
			return "", err
		}
		t.gtid = g
	}
	return t.gtid, nil
}

type registered struct {
	Kind string `json:"kind"`
	GID  string `json:"gid"`
	XID  *struct {
		Gtrid    string `json:"gtrid"`
		Bqual    string `json:"bqual"`
		FormatID int64  `json:"format_id"`
	} `json:"xid"`
	Enforcement string `json:"enforcement"`
	Shim        *struct {
		Key int `json:"key"`
		// The daemon lets a transaction's only branch commit in one phase here (after
		// its slot write: docs/client-mode.md, "One phase").
		OnePhase bool `json:"one_phase"`
	} `json:"shim"`
}

// Branch registers a branch of kind on conn (resource: its name in the daemon's
// configuration; branchID "" = a random one) and opens it: BEGIN ISOLATION LEVEL
// SERIALIZABLE on PostgreSQL, SET TRANSACTION ISOLATION LEVEL SERIALIZABLE + XA START on
// MariaDB. Run the branch's statements on conn afterwards, and keep conn open until the
// transaction is finished (a MariaDB read-only branch dies with its session).
//
// On a resource in client mode (Enforcement == EnforcementClient) a branch that is not
// SERIALIZABLE is refused here (ErrClientModeIsolation), before it runs, and a MariaDB
// session is set to SERIALIZABLE and read back before XA START.
func (t *Tx) Branch(ctx context.Context, conn *sql.Conn, kind Kind, resource, branchID string, opts ...BranchOption) (*Branch, error) {
	ctx = t.traced(ctx)
	b, err := t.newBranch(BranchSpec{Conn: conn, Kind: kind, Resource: resource, ID: branchID, Options: opts})
	if err != nil {
		return nil, err
	}
	spec := BranchSpec{Resource: resource, Kind: kind}
	if t.leased && !t.coord.leasable(resource, kind) {
		return nil, t.fallBack(resource+": not known to be in engine mode or plain 2PC, in a one-request transaction", false)
	}
	if t.wantsLease(spec) {
		if err := t.startLeased(ctx); err != nil {
			return nil, err
		}
	}
	if t.leased {
		if err := b.opened(ctx, t.leasedRegistration(b)); err != nil {
			return nil, err
		}
		return b, nil
	}
	reg := b.registration(ctx)
	var r registered
	if t.gtid == "" {
		body := map[string]interface{}{"branch": reg}
		if t.timeoutMs > 0 {
			body["timeout_ms"] = t.timeoutMs
		}
		t.coord.carryAcks(body)
		var begun struct {
			GTID   string     `json:"gtid"`
			Branch registered `json:"branch"`
		}
		if err := t.coord.do(ctx, "POST", "/v1/transactions", body, &begun, 0); err != nil {
			return nil, err
		}
		t.gtid, r = begun.GTID, begun.Branch
	} else if err := t.coord.do(ctx, "POST", "/v1/transactions/"+q(t.gtid)+"/branches", reg, &r, 0); err != nil {
		var ce *CoordinatorError
		if errors.As(err, &ce) && daemonAction("register", ce.Status, ce.Code) == ActionAborted {
			// Aborted meanwhile, or presumed aborted (the daemon restarted): the abort's
			// own reason says whether running it again may work.
			t.rollbackLocal()
			return nil, t.abortError(ctx, b.Resource+": registration refused: "+ce.Error())
		}
		return nil, err
	}
	if err := b.opened(ctx, r); err != nil {
		return nil, err
	}
	return b, nil
}

// BranchSpec is one branch for Tx.Branches: the arguments of Tx.Branch.
type BranchSpec struct {
	Conn     *sql.Conn
	Kind     Kind
	Resource string
	ID       string // "" = a random one
	Options  []BranchOption
}

// Branches is Branch for several branches known up front, in order. A transaction not
// begun yet is begun with all of them registered in the same request (`branches` in
// POST /v1/transactions: one request instead of one per branch; all or nothing: a
// refused registration leaves no branch registered and the transaction aborted or never
// begun). A transaction already begun registers them one by one, as Branch does. The
// branches are then opened in order; if one cannot be, the error is returned with the
// branches opened before it (in the transaction, as after as many Branch calls), and the
// global transaction is aborted.
func (t *Tx) Branches(ctx context.Context, specs ...BranchSpec) ([]*Branch, error) {
	ctx = t.traced(ctx)
	if t.wantsLease(specs...) {
		if err := t.startLeased(ctx); err != nil {
			return nil, err
		}
	}
	if t.gtid != "" || len(specs) == 0 {
		var out []*Branch
		for _, s := range specs {
			b, err := t.Branch(ctx, s.Conn, s.Kind, s.Resource, s.ID, s.Options...)
			if err != nil {
				return out, err
			}
			out = append(out, b)
		}
		return out, nil
	}
	all := make([]*Branch, len(specs))
	regs := make([]map[string]interface{}, len(specs))
	for i, s := range specs {
		b, err := t.newBranch(s)
		if err != nil {
			return nil, err
		}
		all[i], regs[i] = b, b.registration(ctx)
	}
	body := map[string]interface{}{"branches": regs}
	if t.timeoutMs > 0 {
		body["timeout_ms"] = t.timeoutMs
	}
	t.coord.carryAcks(body)
	var begun struct {
		GTID     string       `json:"gtid"`
		Branches []registered `json:"branches"`
	}
	if err := t.coord.do(ctx, "POST", "/v1/transactions", body, &begun, 0); err != nil {
		return nil, err
	}
	if len(begun.Branches) != len(all) {
		t.gtid = begun.GTID
		_ = t.coord.Abort(ctx, t.gtid, "registration answer without every branch")
		t.Outcome = "abort"
		return nil, fmt.Errorf("cotx: the coordinator answered %d registrations for %d branches", len(begun.Branches), len(all))
	}
	t.gtid = begun.GTID
	var out []*Branch
	for i, b := range all {
		if err := b.opened(ctx, begun.Branches[i]); err != nil {
			return out, err
		}
		out = append(out, b)
	}
	return out, nil
}

// newBranch: a branch of t as spec describes it, not registered yet.
func (t *Tx) newBranch(s BranchSpec) (*Branch, error) {
	id := s.ID
	if id == "" {
		id = shorten(s.Resource, 24) + "-" + randomHex(8)
	}
	b := &Branch{tx: t, Conn: s.Conn, Kind: s.Kind, Resource: s.Resource, ID: id, Isolation: Serializable}
	for _, o := range s.Options {
		o(b)
	}
	if b.Isolation != Serializable && b.Isolation != RepeatableRead && b.Isolation != ReadCommitted {
		return nil, fmt.Errorf("cotx: unsupported isolation level %q", b.Isolation)
	}
	return b, nil
}

// opened: a registered branch (its answer r) is checked and opened, then joins the
// transaction; if it cannot be, the coordinator is told (the global transaction aborts).
func (b *Branch) opened(ctx context.Context, r registered) error {
	if Kind(r.Kind) != b.Kind {
		b.reportFailed(ctx, "resource kind mismatch", false)
		return fmt.Errorf("cotx: resource %q is %s at the coordinator but the branch is %s", b.Resource, r.Kind, b.Kind)
	}
	if !b.tx.leased {
		b.tx.coord.learnMode(b.Resource, b.Kind, r.Enforcement)
	}
	if err := b.open(ctx, r); err != nil {
		b.reportFailed(ctx, "begin failed: "+err.Error(), false)
		return fmt.Errorf("cotx: opening branch %s: %w", b.ID, err)
	}
	b.tx.branches = append(b.tx.branches, b)
	return nil
}

// open: the enforcement from the registration's answer r, then BEGIN / XA START.
func (b *Branch) open(ctx context.Context, r registered) error {
	if err := b.enforcementOf(ctx, r); err != nil {
		return err
	}
	if b.Kind == Postgres {
		gid, err := literal(r.GID)
		if err != nil {
			return err
		}
		b.GID = gid
		_, err = b.Conn.ExecContext(ctx, "BEGIN ISOLATION LEVEL "+b.Isolation)
		return err
	}
	if r.XID == nil {
		return errors.New("coordinator answered no xid")
	}
	g, err := literal(r.XID.Gtrid)
	if err != nil {
		return err
	}
	bq, err := literal(r.XID.Bqual)
	if err != nil {
		return err
	}
	b.xid = fmt.Sprintf("%s,%s,%d", g, bq, r.XID.FormatID)
	if _, err := b.Conn.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL "+b.Isolation+b.readOnlyClause()); err != nil {
		return err
	}
	_, err = b.Conn.ExecContext(ctx, "XA START "+b.xid)
	return err
}

// enforcementOf takes the enforcement and client mode's slot from the registration's
// answer; in client mode it refuses a branch that is not SERIALIZABLE and makes a MariaDB
// session SERIALIZABLE, verified.
func (b *Branch) enforcementOf(ctx context.Context, r registered) error {
	b.Enforcement = r.Enforcement
	if b.Enforcement == "" {
		b.Enforcement = EnforcementEngine
	}
	if b.Enforcement != EnforcementClient {
		return nil
	}
	if b.Isolation != Serializable {
		return fmt.Errorf("%w: resource %q runs in client mode (no pg_co / mysql_co there): its branches must be SERIALIZABLE, not %s",
			ErrClientModeIsolation, b.Resource, b.Isolation)
	}
	if r.Shim == nil || r.Shim.Key < 1 {
		return errors.New("the coordinator answered client mode without a shim slot")
	}
	b.ShimKey = r.Shim.Key
	b.shimOnePhase = r.Shim.OnePhase
	if _, checked := checkedStart(b.Conn); b.Kind == MariaDB && !checked {
		return setSerializableVerified(ctx, b.Conn)
	}
	return nil
}

// setSerializableVerified (client mode, MariaDB), once per physical connection: the
// session runs SERIALIZABLE, checked by reading the level back rather than assumed (a
// proxy or an init_connect may change it), and the server's start is read in the same
// round trip, as the daemon's restart gate computes it (UNIX_TIMESTAMP() - Uptime), into
// the session variable @cotx_started. Later branches on the connection send that start
// with their registration (the daemon then asks the server nothing) and their slot write
// checks @cotx_started (shimTouch). Each branch still sets SERIALIZABLE for its own
// transaction (open), so a session level changed later by a pool or the application does
// not reach a branch. MariaDB before 11.1 spells the variable only tx_isolation; MySQL 8
// keeps no GLOBAL_STATUS in information_schema: there the start is not read (the daemon
// looks itself).
func setSerializableVerified(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
		return err
	}
	var level string
	var started sql.NullInt64
	err := conn.QueryRowContext(ctx, "SELECT @@session.tx_isolation, @cotx_started := UNIX_TIMESTAMP() - "+
		"CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'").
		Scan(&level, &started)
	if err != nil {
		started = sql.NullInt64{}
		if err := conn.QueryRowContext(ctx, "SELECT @@session.transaction_isolation").Scan(&level); err != nil {
			if err := conn.QueryRowContext(ctx, "SELECT @@session.tx_isolation").Scan(&level); err != nil {
				return err
			}
		}
		if _, err := conn.ExecContext(ctx, "SET @cotx_started = NULL"); err != nil {
			return err
		}
	}
	if level != "SERIALIZABLE" {
		return fmt.Errorf("%w; the session is %s after SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE", ErrClientModeIsolation, level)
	}
	rememberCheck(conn, started)
	return nil
}

// ErrSessionNotChecked (client mode, MariaDB): the branch ran in a session its
// connection's check was not made in, or its slot row is missing: it cannot prepare. A
// new attempt checks the connection again (the AbortedError is Retryable).
var ErrSessionNotChecked = errors.New("client mode: the slot write did not change exactly the branch's slot in the checked session")

// shimTouch (client mode): the branch's write of its slot, just before it prepares. On
// PostgreSQL the slot the daemon's prepared helper transaction read: the edge helper -rw->
// branch that makes SSI refuse a commitment-ordering violation
// (sql/client_mode/postgres.sql); on MariaDB a write that really changes a row, so InnoDB
// prepares the branch as read-write and keeps its read locks until the decision
// (sql/client_mode/mariadb.sql), in the session its connection's check was made in.
func (b *Branch) shimTouch() error {
	if b.Kind == Postgres {
		return b.exec(fmt.Sprintf("SELECT cotx.shim_touch(%d)", b.ShimKey))
	}
	started, _ := checkedStart(b.Conn)
	want := "NULL"
	if started.Valid {
		want = fmt.Sprint(started.Int64)
	}
	ctx, cancel := context.WithTimeout(context.Background(), protocolTimeout)
	defer cancel()
	res, err := b.Conn.ExecContext(ctx, fmt.Sprintf("UPDATE cotx_shim SET v = v + 1 WHERE k = %d AND @cotx_started <=> %s", b.ShimKey, want))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		forgetCheck(b.Conn)
		return fmt.Errorf("%w (slot %d, %d rows changed)", ErrSessionNotChecked, b.ShimKey, n)
	}
	return nil
}

// Fail is for an error inside the branch: it rolls the branch back, tells the
// coordinator (the global transaction aborts) and returns an *AbortedError wrapping err,
// Retryable when err is a serialization failure, deadlock or lock timeout.
func (b *Branch) Fail(err error) error {
	b.rollbackUnprepared()
	retry := IsRetryableDBError(err)
	// The daemon says whether the abort is one a new attempt may cure though the error
	// does not (a statement it cancelled: a deadlock victim, a timeout).
	retry = b.reportFailed(b.tx.traced(context.Background()), describeDBError(err), retry) || retry
	b.state = stFailed
	for _, o := range b.tx.branches {
		if o != b {
			o.rollback()
		}
	}
	b.tx.Outcome = "abort"
	return &AbortedError{GTID: b.tx.gtid, Reason: b.Resource + ": " + describeDBError(err), Retryable: retry, Err: err}
}

func (b *Branch) exec(sqlText string) error {
	ctx, cancel := context.WithTimeout(context.Background(), protocolTimeout)
	defer cancel()
	_, err := b.Conn.ExecContext(ctx, sqlText)
	return err
}

func (b *Branch) path(suffix string) string {
	return "/v1/transactions/" + q(b.tx.gtid) + "/branches/" + q(b.ID) + suffix
}

// reportFailed tells the coordinator and returns whether its answer calls the abort
// retryable. Best effort: if the report is lost, the coordinator aborts on timeout
// (presumed abort).
func (b *Branch) reportFailed(ctx context.Context, reason string, retryable bool) bool {
	if b.tx.leased {
		return false // the daemon has not heard of the transaction: nothing to tell it
	}
	return b.postFailed(ctx, reason, retryable)
}

// postFailed is POST …/failed whatever the path: after a commit request the daemon knows a
// leased gtid too (the decision branch's refused commit, decide_in.go).
func (b *Branch) postFailed(ctx context.Context, reason string, retryable bool) bool {
	var ack struct {
		Retryable bool `json:"retryable"`
	}
	body := map[string]interface{}{"reason": trunc(reason, 900), "retryable": retryable}
	return b.tx.coord.do(ctx, "POST", b.path("/failed"), body, &ack, 0) == nil && ack.Retryable
}

// alive: whether the branch's session still answers (after a failed statement: refused by
// the engine, or lost with its connection).
func (b *Branch) alive() bool {
	ctx, cancel := context.WithTimeout(context.Background(), protocolTimeout)
	defer cancel()
	return b.Conn.PingContext(ctx) == nil
}

func (b *Branch) rollbackUnprepared() {
	if b.Kind == Postgres {
		_ = b.exec("ROLLBACK")
		return
	}
	_ = b.exec("XA END " + b.xid) // may already be ended
	_ = b.exec("XA ROLLBACK " + b.xid)
}

// prepare: PREPARE TRANSACTION / XA END + XA PREPARE, in client mode after the slot's
// write. A refusal rolls back and returns an *AbortedError (Refused and Retryable for the
// engines' CO refusals, and in client mode for PostgreSQL's serialization failures and
// InnoDB's deadlocks and lock timeouts).
//
// mayEnd: the root's two-phase commit through the daemon, where a read-only branch of
// plain 2PC ends at its vote instead (readonly.go, votesReadOnly).
func (b *Branch) prepare(mayEnd bool) error {
	if err := b.prepareStatements(mayEnd); err != nil {
		return b.refused(err, "prepare")
	}
	b.state = stPrepared
	return nil
}

// refused: a refusal before the branch is prepared (its PREPARE, or client mode's slot
// write before a one-phase commit): rolled back, reported, returned as retryable or not.
func (b *Branch) refused(err error, step string) error {
	b.rollbackUnprepared()
	b.state = stFailed
	retry := IsRetryableDBError(err) || errors.Is(err, ErrSessionNotChecked)
	b.reportFailed(b.tx.traced(context.Background()), step+" refused: "+describeDBError(err), retry)
	reason := b.Resource + ": " + step + " failed: " + describeDBError(err)
	if retry {
		reason = b.Resource + ": " + step + " refused: " + describeDBError(err)
	}
	return &AbortedError{GTID: b.tx.gtid, Reason: reason, Retryable: retry, Refused: retry, Err: err}
}

func (b *Branch) prepareStatements(mayEnd bool) error {
	if b.ReadOnly {
		// Before client mode's slot write, which is not the application's data.
		nothing, err := b.checkWroteNothing()
		if err != nil {
			return err
		}
		b.wroteNothing = nothing
	}
	if b.Enforcement == EnforcementClient {
		if err := b.shimTouch(); err != nil {
			return err
		}
	}
	if mayEnd && b.votesReadOnly() {
		if err := b.commitOnePhase(); err != nil {
			return err
		}
		b.endedAtVote = true
		return nil
	}
	if b.Kind == Postgres {
		return b.exec("PREPARE TRANSACTION " + b.GID)
	}
	if err := b.exec("XA END " + b.xid); err != nil {
		return err
	}
	return b.exec("XA PREPARE " + b.xid)
}

func (b *Branch) commitOnePhase() error {
	if b.Kind == Postgres {
		return b.exec("COMMIT")
	}
	if err := b.exec("XA END " + b.xid); err != nil {
		return err
	}
	return b.exec("XA COMMIT " + b.xid + " ONE PHASE")
}

// finish gives a prepared branch the decided outcome on the owner's session. A branch the
// coordinator already finished (its owner grace ran out) is fine. A branch that ended at
// its vote runs nothing: it wrote nothing, so commit and rollback are the same data (its
// acknowledgement still follows, so that the daemon does not try to finish it).
func (b *Branch) finish(outcome string) error {
	var err error
	switch {
	case b.endedAtVote:
	case b.Kind == Postgres:
		verb := "ROLLBACK PREPARED "
		if outcome == "commit" {
			verb = "COMMIT PREPARED "
		}
		err = b.exec(verb + b.GID)
	default:
		verb := "XA ROLLBACK "
		if outcome == "commit" {
			verb = "XA COMMIT "
		}
		err = b.exec(verb + b.xid)
	}
	if err != nil && pgState(err) != pgNoSuchPrepared && myCode(err) != myXAERNOTA {
		return err
	}
	if outcome == "commit" {
		b.state = stFinished
	} else {
		b.state = stRolledBack
	}
	return nil
}

func (b *Branch) rollback() {
	switch b.state {
	case stPrepared:
		if b.finish("abort") == nil && !b.tx.leased {
			b.ack("abort")
		} // else the coordinator's recovery rolls it back
	case stActive:
		b.rollbackUnprepared()
		b.state = stRolledBack
	}
}

func (b *Branch) ack(outcome string) {
	// Nobody waits on an acknowledgement: if it is lost, recovery confirms the branch.
	_ = b.tx.coord.do(b.tx.traced(context.Background()), "POST", b.path("/finished"), map[string]string{"outcome": outcome}, nil, 0)
}

// Commit (root only) decides the transaction: a single branch commits in one phase (not
// in client mode, whose protection is the slot written before the prepare); otherwise
// every local branch is prepared, the decision is made durable together with their
// "prepared" reports, and the branches are committed on their sessions. It returns nil
// once committed, an *AbortedError (IsRetryable) when aborted.
func (t *Tx) Commit(ctx context.Context) error {
	ctx = t.traced(ctx)
	if !t.root {
		return errors.New("cotx: Commit is for the root; a participant calls Prepare and Finish")
	}
	if t.gtid == "" && len(t.branches) == 0 {
		t.Outcome = "commit"
		return nil
	}
	t.relearned()
	if only := t.branches; !t.leased && len(only) == 1 && only[0].state == stActive && (only[0].Enforcement != EnforcementClient || only[0].shimOnePhase) {
		done, err := t.onePhase(ctx, t.branches[0])
		if done {
			return err
		}
	}
	// With the decision in a participant, that branch is not prepared, and no branch ends
	// at a read-only vote: the transaction is not two-phase throughout.
	dip := t.decider()
	var mine []string
	for _, b := range t.branches {
		if b.state != stActive || b == dip {
			continue
		}
		if err := b.prepare(dip == nil); err != nil {
			t.rollbackLocal()
			if !t.leased {
				_ = t.coord.Abort(ctx, t.gtid, err.Error())
			}
			t.Outcome = "abort"
			return err
		}
		mine = append(mine, b.ID)
	}
	if t.leased {
		var decision string
		var err error
		if dip != nil {
			decision, err = t.leasedDecideIn(ctx, dip)
		} else {
			decision, err = t.leasedCommit(ctx)
		}
		if err != nil {
			return err
		}
		return t.finishAll(ctx, decision)
	}
	if mine == nil {
		mine = []string{}
	}
	// Branches that wrote nothing (checked at their PREPARE): listed, so that the daemon
	// skips its store sync when that is every branch (readonly.go).
	readOnly := t.wroteNothing()
	if dip != nil {
		readOnly = nil // read_only goes with a two-phase commit only
	}
	decision := ""
	deadline := time.Now().Add(5 * time.Second)
	for decision == "" {
		var r struct {
			Decision string `json:"decision"`
		}
		body := map[string]interface{}{"prepared": mine}
		if dip != nil {
			body["decide_in"] = dip.ID
		}
		if len(readOnly) > 0 {
			body["read_only"] = readOnly
		}
		err := t.coord.do(ctx, "POST", "/v1/transactions/"+q(t.gtid)+"/commit", body, &r, 0)
		var ce *CoordinatorError
		if err == nil {
			decision = r.Decision
			break
		}
		if errors.As(err, &ce) && readOnlyRefused(ce, readOnly) {
			// A daemon older than the field, or one that will not take a branch listed:
			// the decision synced, as without the list.
			readOnly = nil
			continue
		}
		if !errors.As(err, &ce) { // unreachable: the decision may or may not be durable
			d, werr := t.waitDecision(ctx)
			if werr != nil {
				return werr
			}
			decision = d
			break
		}
		// Each refusal as the retry rules' "commit" rows say (clients/retry-rules.json).
		act := daemonAction("commit", ce.Status, ce.Code)
		switch {
		case ce.Code == "already_prepared" && len(mine) > 0:
			mine = []string{} // an earlier attempt got through
		case act == ActionRetryRequest && ce.Code != "already_prepared" && time.Now().Before(deadline):
			// A participant has not reported yet, or the request was not read.
			wait := 10 * time.Millisecond
			if ce.RetryAfter > 0 {
				wait = ce.RetryAfter
			}
			if left := time.Until(deadline); wait > left {
				wait = left
			}
			time.Sleep(wait)
		case act == ActionPollDecision:
			d, werr := t.waitDecision(ctx)
			if werr != nil {
				return werr
			}
			decision = d
		case act == ActionOutcomeUnknown:
			return &OutcomeUnknownError{GTID: t.gtid, Err: err}
		default:
			// Refused (a participant failed or never reported, the transaction timed
			// out): make sure it is aborted, then roll back our own branches.
			_ = t.coord.Abort(ctx, t.gtid, "commit refused: "+ce.Error())
			decision = "abort"
		}
	}
	if decision == "in_participant" && dip != nil {
		var err error
		if decision, err = t.commitDecisionBranch(ctx, dip); err != nil {
			return err
		}
	}
	return t.finishAll(ctx, decision)
}

// onePhase: done=false means other services joined and two-phase commit is needed.
func (t *Tx) onePhase(ctx context.Context, b *Branch) (done bool, err error) {
	if b.Enforcement == EnforcementClient {
		// Client mode: the slot write it would make before PREPARE, before the request
		// (docs/client-mode.md, "One phase"); refused, the transaction is aborted.
		if err := b.shimTouch(); err != nil {
			perr := b.refused(err, "slot write")
			_ = t.coord.Abort(ctx, t.gtid, perr.Error())
			t.Outcome = "abort"
			return true, perr
		}
	}
	cerr := t.coord.do(ctx, "POST", "/v1/transactions/"+q(t.gtid)+"/commit", map[string]string{"one_phase_branch": b.ID}, nil, 0)
	var ce *CoordinatorError
	if errors.As(cerr, &ce) && ce.Code == "not_single_branch" {
		return false, nil
	}
	var ue *UnavailableError
	if errors.As(cerr, &ue) || (ce != nil && daemonAction("one_phase", ce.Status, ce.Code) == ActionRetryTransaction) {
		// Not acted on ("not now") or no answer, and the branch commits only after one:
		// rolled back, safe to run again.
		t.abortLocal(ctx, "one-phase commit: "+cerr.Error())
		return true, &AbortedError{GTID: t.gtid, Reason: "one-phase commit: " + cerr.Error(), Retryable: true, Err: cerr}
	}
	if cerr != nil {
		t.abortLocal(ctx, "one-phase commit refused: "+cerr.Error())
		return true, t.abortError(ctx, "")
	}
	if err := b.commitOnePhase(); err != nil {
		b.rollbackUnprepared()
		if !b.alive() {
			// Lost during the COMMIT: it may have committed (the database's to say), so
			// neither an abort nor "run it again"; nothing acknowledged.
			b.state = stFailed
			return true, &OutcomeUnknownError{GTID: t.gtid, Err: err,
				Reason: b.Resource + ": the session was lost during the one-phase COMMIT; whether it committed is the database's to say"}
		}
		b.state = stRolledBack
		if !t.coord.holdAck(ctx, t.gtid, "abort", []string{b.ID}) {
			b.ack("abort")
		}
		t.Outcome = "abort"
		retry := IsRetryableDBError(err)
		return true, &AbortedError{GTID: t.gtid, Reason: b.Resource + ": commit refused: " + describeDBError(err), Retryable: retry, Refused: retry, Err: err}
	}
	b.state = stFinished
	if !t.coord.holdAck(ctx, t.gtid, "commit", []string{b.ID}) {
		b.ack("commit")
	}
	t.Outcome = "commit"
	return true, nil
}

// Prepare (participant) prepares every local branch and reports it. On any failure all
// local branches are rolled back, the transaction is aborted and the error returned.
func (t *Tx) Prepare(ctx context.Context) error {
	ctx = t.traced(ctx)
	for _, b := range t.branches {
		if b.state != stActive {
			continue
		}
		if err := b.prepare(false); err != nil {
			t.rollbackLocal()
			t.Outcome = "abort"
			return err
		}
		if err := t.coord.do(ctx, "POST", b.path("/prepared"), struct{}{}, nil, 0); err != nil {
			// Refused (aborted meanwhile, e.g. a timeout) or unreachable: never leave a
			// prepared branch behind for a transaction that may be aborted.
			t.abortLocal(ctx, "prepared report failed: "+err.Error())
			return t.abortError(ctx, err.Error())
		}
	}
	return nil
}

// Finish (participant, after Prepare) waits for the root's decision and completes the
// local branches on their sessions: nil when committed, *AbortedError when aborted,
// *OutcomeUnknownError when the coordinator stayed unreachable for DecisionTimeout.
func (t *Tx) Finish(ctx context.Context) error {
	ctx = t.traced(ctx)
	d, err := t.waitDecision(ctx)
	if err != nil {
		return err
	}
	return t.finishAll(ctx, d)
}

// Rollback aborts the global transaction (root or participant) and rolls back the local branches.
func (t *Tx) Rollback(ctx context.Context, reason string) {
	ctx = t.traced(ctx)
	if reason == "" {
		reason = "rolled back by the application"
	}
	if t.gtid == "" {
		t.rollbackLocal()
		t.Outcome = "abort"
		return
	}
	t.abortLocal(ctx, reason)
}

func (t *Tx) abortLocal(ctx context.Context, reason string) {
	if !t.leased { // a leased gtid the daemon has not heard of: nothing to tell it
		_ = t.coord.Abort(ctx, t.gtid, reason)
	}
	t.rollbackLocal()
	t.Outcome = "abort"
}

func (t *Tx) rollbackLocal() {
	for _, b := range t.branches {
		b.rollback()
	}
}

func (t *Tx) waitDecision(ctx context.Context) (string, error) {
	deadline := time.Now().Add(t.coord.DecisionTimeout)
	var last error
	for {
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return "", &OutcomeUnknownError{GTID: t.gtid, Err: last}
		}
		if remaining > 10*time.Second {
			remaining = 10 * time.Second
		}
		d, err := t.coord.GetDecision(ctx, t.gtid, remaining)
		var ce *CoordinatorError
		switch {
		case err == nil && d.Decision != nil:
			return *d.Decision, nil
		case err == nil:
		case errors.As(err, &ce) && daemonAction("decision", ce.Status, ce.Code) == ActionAborted:
			return "abort", nil // presumed abort: no record and no live transaction
		case errors.As(err, &ce) && daemonAction("decision", ce.Status, ce.Code) == ActionOutcomeUnknown:
			// Purged after the retention: not known any more (never "abort": it may have committed).
			return "", &OutcomeUnknownError{GTID: t.gtid, Err: err}
		default:
			last = err
			if ctx.Err() != nil {
				return "", &OutcomeUnknownError{GTID: t.gtid, Err: ctx.Err()}
			}
			time.Sleep(200 * time.Millisecond) // coordinator restarting: its recovery keeps our branches safe
		}
	}
}

func (t *Tx) finishAll(ctx context.Context, decision string) error {
	if decision == "commit" || decision == "one_phase" {
		t.Outcome = "commit"
		var done []string
		if t.decidedIn != nil {
			// First: a daemon that checks the list in order refuses the others' commit
			// while the transaction is still deciding.
			done = append(done, t.decidedIn.ID)
		}
		var firstErr error
		for _, b := range t.branches {
			if b.state != stPrepared {
				continue
			}
			if err := b.finish("commit"); err != nil {
				// Decided and durable: the coordinator commits it after the owner grace.
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			done = append(done, b.ID)
		}
		if len(done) > 0 && !t.coord.holdAck(ctx, t.gtid, "commit", done) {
			// One acknowledgement for all; recovery confirms the branches if it is lost.
			_ = t.coord.do(ctx, "POST", "/v1/transactions/"+q(t.gtid)+"/finished",
				map[string]interface{}{"outcome": "commit", "branches": done}, nil, 0)
		}
		if firstErr != nil {
			return fmt.Errorf("cotx: %s committed, but completing a local branch failed (the coordinator completes it): %w", t.gtid, firstErr)
		}
		return nil
	}
	t.rollbackLocal()
	return t.abortError(ctx, "")
}

// abortError is the abort of t as an *AbortedError, Retryable when the retry rules'
// "aborts" rows say running it again is safe and may work (the daemon marked it
// retryable, or a crash, a takeover or presumed abort ended it). The daemon's own reason
// decides; reason (the client's words) is shown, and decides only when the daemon cannot
// be asked.
func (t *Tx) abortError(ctx context.Context, reason string) error {
	t.Outcome = "abort"
	retryable := false
	var recorded *string
	if reason != "" {
		recorded = &reason
	}
	d, err := t.coord.GetDecision(ctx, t.gtid, 0)
	var ce *CoordinatorError
	switch {
	case err == nil && d.Decision != nil:
		retryable, recorded = d.Retryable, nil
		if d.AbortReason != "" {
			recorded = &d.AbortReason
		}
		if reason == "" {
			reason = d.AbortReason
		}
	case errors.As(err, &ce) && daemonAction("decision", ce.Status, ce.Code) == ActionAborted:
		recorded = nil // presumed abort: the daemon no longer knows it
	}
	return &AbortedError{GTID: t.gtid, Reason: reason, Retryable: abortAction(retryable, recorded) == ActionRetryTransaction}
}

// Ids handed out by the daemon are [A-Za-z0-9._:-]; checking again here means a
// misbehaving coordinator still cannot make us run its text as SQL.
// GIDMax is PostgreSQL's longest gid (GIDSIZE 200 with its NUL): the daemon's
// naming::PG_GID_MAX.
const GIDMax = 199

var idChars = regexp.MustCompile(fmt.Sprintf(`^[A-Za-z0-9._:-]{1,%d}$`, GIDMax))

func literal(s string) (string, error) {
	if !idChars.MatchString(s) {
		return "", fmt.Errorf("cotx: refusing unexpected id %q", s)
	}
	return "'" + s + "'", nil
}

func shorten(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

var randMu sync.Mutex

func randomHex(n int) string {
	randMu.Lock()
	defer randMu.Unlock()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
