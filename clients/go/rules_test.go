package cotx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// The embedded copy is clients/retry-rules.json byte for byte (go:embed cannot reach it).
func TestRetryRulesCopyIsTheTable(t *testing.T) {
	orig, err := os.ReadFile("../retry-rules.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig, rulesJSON) {
		t.Fatal("clients/go/retry-rules.json differs from clients/retry-rules.json: cp ../retry-rules.json .")
	}
}

// Every daemon row: an answer it is the most specific row for, in each of its phases, as
// the client sees it (a *CoordinatorError from the request of that phase), gets its action.
func TestRetryRulesDaemonRows(t *testing.T) {
	for _, r := range rules.Daemon {
		phases := r.Phases
		if len(phases) == 1 && phases[0] == "*" {
			phases = []string{"other"}
		}
		for _, p := range phases {
			status, code := r.Status, r.Code
			if code == "*" {
				code = "a_code_of_no_row"
				if status == 0 {
					status = 418
				}
			}
			err := fmt.Errorf("wrapped: %w", &CoordinatorError{Status: status, Code: code, Phase: p})
			if got := RetryAction(err); got != r.Action {
				t.Errorf("%s %d %s: %s, the table says %s", p, status, code, got, r.Action)
			}
		}
	}
}

func TestRetryRulesTransportRows(t *testing.T) {
	for _, r := range rules.Transport {
		for _, p := range r.Phases {
			err := &UnavailableError{Phase: p, Err: fmt.Errorf("%w: connection refused", ErrCoordinatorUnavailable)}
			if got := RetryAction(err); got != r.Action {
				t.Errorf("transport in %s: %s, the table says %s", p, got, r.Action)
			}
		}
	}
}

func TestRetryRulesAbortRows(t *testing.T) {
	for _, r := range rules.Aborts {
		retryable, reason := false, (*string)(nil)
		switch {
		case r.Retryable != nil && *r.Retryable:
			retryable = true
			s := "branch b1 failed: prepare refused: could not serialize access"
			reason = &s
		case r.HasReason:
		default:
			s := *r.ReasonPrefix + "…"
			reason = &s
		}
		if got := abortAction(retryable, reason); got != r.Action {
			t.Errorf("abort %v %v: %s, the table says %s", retryable, reason, got, r.Action)
		}
	}
}

// Every engine row's example, raised by the driver as it would be, gets the row's kind and
// action (IsRetryableDBError, RefusalKind); as text alone (an abort reason) the same kind.
func TestRetryRulesEngineRows(t *testing.T) {
	for _, r := range rules.Engine {
		var err error
		if r.Engine == "postgres" {
			code := r.SQLState
			if code == "" {
				code = "40001" // pg_co raises its rules under 40001 (its preconditions under 25000)
				if strings.Contains(r.Kind, "not serializable") || strings.Contains(r.Kind, "read only") {
					code = "25000"
				}
			}
			err = fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: r.Example})
		} else {
			err = &mysql.MySQLError{Number: r.Errno, Message: r.Example}
		}
		if got := RefusalKind(err); got != r.Kind {
			t.Errorf("%v: kind %q, the table says %q", err, got, r.Kind)
		}
		if got := IsRetryableDBError(err); got != (r.Action == ActionRetryTransaction) {
			t.Errorf("%v: retryable %v, the table says %s", err, got, r.Action)
		}
		if len(r.Message) > 0 || r.Text != "" {
			if got := engineRuleFor("", 0, r.Example).Kind; got != r.Kind {
				t.Errorf("text %q: kind %q, the table says %q", r.Example, got, r.Kind)
			}
		}
	}
}

// The Python client's kinds and the Go client's come from the same rows: every kind of the
// table is reachable, and "other" is the rest.
func TestRetryRulesOtherErrors(t *testing.T) {
	for _, err := range []error{&pgconn.PgError{Code: "23505", Message: "duplicate key"}, &mysql.MySQLError{Number: 1062},
		fmt.Errorf("not a database error")} {
		if RefusalKind(err) != "other" || IsRetryableDBError(err) {
			t.Errorf("%v: %s", err, RefusalKind(err))
		}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(rulesJSON, &raw); err != nil || raw["actions"] == nil {
		t.Fatalf("retry-rules.json: %v", err)
	}
}

func TestPhaseOf(t *testing.T) {
	cases := []struct {
		method, path string
		body         interface{}
		want         string
	}{
		{"POST", "/v1/transactions", map[string]interface{}{}, "begin"},
		{"POST", "/v1/transactions/n1.a-1/branches", map[string]string{}, "register"},
		{"POST", "/v1/transactions/n1.a-1/commit", map[string]interface{}{"prepared": []string{}}, "commit"},
		{"POST", "/v1/transactions/n1.a-1/commit", map[string]string{"one_phase_branch": "b"}, "one_phase"},
		{"GET", "/v1/transactions/n1.a-1/decision?wait_ms=10", nil, "decision"},
		{"POST", "/v1/transactions/n1.a-1/branches/b/prepared", struct{}{}, "prepared"},
		{"POST", "/v1/transactions/n1.a-1/branches/b/failed", nil, "report"},
		{"POST", "/v1/transactions/n1.a-1/abort", nil, "report"},
		{"GET", "/v1/transactions/n1.a-1", nil, "other"},
	}
	for _, c := range cases {
		if got := phaseOf(c.method, c.path, c.body); got != c.want {
			t.Errorf("%s %s: %s, want %s", c.method, c.path, got, c.want)
		}
	}
}
