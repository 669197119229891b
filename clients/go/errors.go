package cotx

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// CoordinatorError: the coordinator refused a request (4xx) or failed (5xx).
type CoordinatorError struct {
	Status  int
	Code    string
	Message string
}

func (e *CoordinatorError) Error() string {
	return fmt.Sprintf("coordinator: %d %s: %s", e.Status, e.Code, e.Message)
}

// ErrCoordinatorUnavailable: the coordinator could not be reached (wrapped with details).
var ErrCoordinatorUnavailable = errors.New("coordinator unavailable")

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
	Err  error
}

func (e *OutcomeUnknownError) Error() string {
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

// IsRefused reports whether an engine refused a prepare of this transaction (pg_co rule
// A/B, mysql_co), a subset of IsRetryable.
func IsRefused(err error) bool {
	var a *AbortedError
	return errors.As(err, &a) && a.Refused
}

// Driver errors worth retrying the global transaction for.
var (
	pgRetryable = map[string]bool{"40001": true, "40P01": true, "55P03": true} // serialization failure, deadlock, lock not available
	myRetryable = map[uint16]bool{1402: true, 1213: true, 1205: true, 1613: true, 1614: true}
)

const (
	pgNoSuchPrepared = "42704" // COMMIT/ROLLBACK PREPARED of a gid that is gone
	myXAERNOTA       = 1397    // XA COMMIT/ROLLBACK of an unknown xid
)

// IsRetryableDBError: PostgreSQL 40001/40P01/55P03 (pg_co refusals are 40001), MariaDB
// 1402 (XA_RBROLLBACK: mysql_co refusal), 1213 (deadlock), 1205 (lock wait), 1613/1614.
func IsRetryableDBError(err error) bool {
	if s := pgState(err); s != "" {
		return pgRetryable[s]
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && strings.Contains(me.Message, "refused: this XA branch ran at") {
		// mysql_co refuses a non-SERIALIZABLE branch with 1402 too; running it again at
		// the same level is refused again: a configuration error, not a conflict.
		return false
	}
	return myRetryable[myCode(err)]
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
