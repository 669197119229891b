package cotx

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// CoordinatorError: the coordinator refused a request (4xx) or failed (5xx). Phase names
// the request as the retry rules do ("begin", "register", "commit", "one_phase",
// "decision", "prepared", "report", "other"); RetryAfter is its Retry-After header (0
// without one).
type CoordinatorError struct {
	Status     int
	Code       string
	Message    string
	Phase      string
	RetryAfter time.Duration
}

func (e *CoordinatorError) Error() string {
	return fmt.Sprintf("coordinator: %d %s: %s", e.Status, e.Code, e.Message)
}

// ErrCoordinatorUnavailable: the coordinator could not be reached (wrapped with details,
// in an *UnavailableError: errors.Is(err, ErrCoordinatorUnavailable) holds).
var ErrCoordinatorUnavailable = errors.New("coordinator unavailable")

// UnavailableError: the coordinator could not be reached, or its answer not read, in a
// request of Phase (as CoordinatorError's).
type UnavailableError struct {
	Phase string
	Err   error // ErrCoordinatorUnavailable wrapped with the request and the cause
}

func (e *UnavailableError) Error() string { return e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// AbortedError: the global transaction was aborted and every local branch rolled back.
// Retryable is set when running it again may succeed (a refused prepare, a serialization
// failure, deadlock or lock timeout, an abort the coordinator marked retryable such as a
// timeout); Refused when an engine refused one of our prepares (or a one-phase commit).
type AbortedError struct {
	GTID      string
	Reason    string
	Retryable bool
	Refused   bool
	Err       error // the driver's error, when there is one
}

func (e *AbortedError) Error() string {
	r := e.Reason
	if r == "" {
		r = "no reason given"
	}
	return fmt.Sprintf("global transaction %s aborted: %s", e.GTID, r)
}

func (e *AbortedError) Unwrap() error { return e.Err }

// OutcomeUnknownError: the decision could not be learned in time (coordinator unreachable).
// The branches stay prepared; the coordinator completes them when it is back.
type OutcomeUnknownError struct {
	GTID string
	// Reason, when set, says why in place of the default (the decision not learned in
	// time, the branches prepared): e.g. a session lost during a one-phase COMMIT.
	Reason string
	Err    error
}

func (e *OutcomeUnknownError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("outcome of %s unknown: %s: %v", e.GTID, e.Reason, e.Err)
	}
	return fmt.Sprintf("outcome of %s unknown: branches stay prepared until the coordinator finishes them: %v", e.GTID, e.Err)
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// IsRetryable reports whether err means "run the whole global transaction again".
func IsRetryable(err error) bool {
	var a *AbortedError
	if errors.As(err, &a) {
		return a.Retryable
	}
	return IsRetryableDBError(err)
}

// RetryAction is what the retry rules (clients/retry-rules.json) say to do after err
// ended a transaction's attempt: ActionRetryTransaction (an *AbortedError marked
// Retryable), ActionRetryRequest ("not now" from the daemon before any decision, or the
// daemon unreachable at the begin), ActionOutcomeUnknown, or ActionFail (and the table's
// other actions for a *CoordinatorError the client handles itself). Run acts on it.
func RetryAction(err error) string {
	var a *AbortedError
	var ou *OutcomeUnknownError
	var ce *CoordinatorError
	var ue *UnavailableError
	switch {
	case errors.As(err, &a):
		if a.Retryable {
			return ActionRetryTransaction
		}
		return ActionFail
	case errors.As(err, &ou):
		return ActionOutcomeUnknown
	case errors.As(err, &ce):
		return daemonAction(ce.Phase, ce.Status, ce.Code)
	case errors.As(err, &ue):
		return transportAction(ue.Phase)
	}
	return ActionFail
}

// IsRefused reports whether an engine refused a prepare of this transaction (pg_co rule
// A/B, mysql_co), a subset of IsRetryable.
func IsRefused(err error) bool {
	var a *AbortedError
	return errors.As(err, &a) && a.Refused
}

const (
	pgNoSuchPrepared = "42704" // COMMIT/ROLLBACK PREPARED of a gid that is gone
	myXAERNOTA       = 1397    // XA COMMIT/ROLLBACK of an unknown xid
)

// IsRetryableDBError: the engine rows of the retry rules say "retry_transaction":
// PostgreSQL 40001/40P01/55P03 (pg_co refusals are 40001, but not its READ ONLY / not
// SERIALIZABLE ones), 53200 "maximum number of prepared transactions reached"; MariaDB
// 1402 (XA_RBROLLBACK: a mysql_co refusal, but not its isolation one: a configuration
// error, refused again), 1213 (deadlock), 1205 (lock wait), 1613/1614.
func IsRetryableDBError(err error) bool {
	return dbRule(err).Action == ActionRetryTransaction
}

// RefusalKind labels a database error as the retry rules' engine rows do ("pg_co rule A",
// "pg serialization failure", "my deadlock", …; "other"): the same kinds as the Python
// client's cotx.refusals.
func RefusalKind(err error) string {
	return dbRule(err).Kind
}

func dbRule(err error) engineRule {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return engineRuleFor(pe.Code, 0, pe.Message)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return engineRuleFor("", me.Number, me.Message)
	}
	return otherRule
}

func pgState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func myCode(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// describeDBError is err's text plus, for PostgreSQL, its DETAIL: pg_co names the rule in
// the message and the peer transaction (xid, state, gid when in doubt) in the DETAIL.
func describeDBError(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Detail != "" {
		return err.Error() + " DETAIL: " + pe.Detail
	}
	return err.Error()
}
