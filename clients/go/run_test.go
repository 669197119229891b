package cotx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	cotx "cotx.io/client"
)

// Coordinator.Run against the real daemon: a begin refused with 429 too_many_transactions
// and one refused with 503 resource_unavailable are run again after Retry-After and
// commit, as the retry rules say (clients/retry-rules.json; the rows themselves:
// rules_test.go). The waits are injected (WithClock): the first wait ends the refusal's
// cause, so nothing depends on timing.

// deposit is a Run body that adds 1 to user's balance in one branch: the fixture's
// savings table on PostgreSQL, its checking table on MariaDB.
func deposit(db *sql.DB, kind cotx.Kind, user string) func(ctx context.Context, tx *cotx.Tx) error {
	resource, stmt := "savings", "UPDATE savings SET bal = bal + 1 WHERE u = $1"
	if kind == cotx.MariaDB {
		resource, stmt = "checking", "UPDATE checking SET bal = bal + 1 WHERE u = ?"
	}
	return func(ctx context.Context, tx *cotx.Tx) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		b, err := tx.Branch(ctx, conn, kind, resource, "")
		if err != nil {
			conn.Close()
			return err
		}
		// The session stays open until the transaction ends: closed after Run returns.
		runConns = append(runConns, conn)
		if _, err := conn.ExecContext(ctx, stmt, user); err != nil {
			return b.Fail(err)
		}
		return nil
	}
}

var runConns []*sql.Conn

func closeRunConns() {
	for _, c := range runConns {
		c.Close()
	}
	runConns = nil
}

func balance(t *testing.T, db *sql.DB, user string) int {
	t.Helper()
	var bal int
	if err := db.QueryRow("SELECT bal FROM savings WHERE u = $1", user).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	return bal
}

// refusals records what Run retried.
type refusals struct{ errs []error }

func (r *refusals) option() cotx.RunOption {
	return cotx.OnRetry(func(_ int, err error, _ time.Duration) { r.errs = append(r.errs, err) })
}

// one checks that exactly one refusal was retried, of that status and code, at the begin.
func (r *refusals) one(t *testing.T, status int, code string) {
	t.Helper()
	var ce *cotx.CoordinatorError
	if len(r.errs) != 1 || !errors.As(r.errs[0], &ce) || ce.Status != status || ce.Code != code || ce.Phase != "begin" {
		t.Fatalf("retried %v, want one %d %s at the begin", r.errs, status, code)
	}
}

func TestRunRetriesA429AtBegin(t *testing.T) {
	needServers(t)
	ctx := context.Background()
	mustExec(t, env.pg, "INSERT INTO savings(u, bal) VALUES ('run-429', 0) ON CONFLICT (u) DO UPDATE SET bal = 0")
	d, err := startDaemonConf(bankResources(os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), ""), "g-run", 2000,
		"[limits]\nmax_active = 1\n")
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	coord, err := cotx.New(d.url, d.token)
	if err != nil {
		t.Fatal(err)
	}
	other, err := coord.Begin(ctx, 0) // the one undecided transaction allowed
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	sleep := func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return coord.Abort(ctx, other, "test: make room")
	}
	var seen refusals
	err = coord.Run(ctx, deposit(env.pg, cotx.Postgres, "run-429"), cotx.WithClock(sleep, func() float64 { return 0 }), seen.option())
	closeRunConns()
	if err != nil {
		t.Fatal(err)
	}
	seen.one(t, 429, "too_many_transactions")
	if len(waits) != 1 || waits[0] != time.Second {
		t.Errorf("waits %v: want the daemon's Retry-After, 1 s", waits)
	}
	if b := balance(t, env.pg, "run-429"); b != 1 {
		t.Errorf("balance %d, want 1", b)
	}
}

// Client mode on the PostgreSQL without pg_co, every prepared-transaction slot taken: the
// daemon cannot prepare the branch's helper and answers the begin 503
// resource_unavailable. The slots are freed during Run's wait; the rerun commits.
func TestRunRetriesA503AtBegin(t *testing.T) {
	coord := bareDaemon(t, cotx.EnforcementClient)
	ctx := context.Background()
	mustExec(t, bare.pg, "INSERT INTO savings(u, bal) VALUES ('run-503', 0) ON CONFLICT (u) DO UPDATE SET bal = 0")
	var max, used int
	if err := bare.pg.QueryRow("SELECT current_setting('max_prepared_transactions')::int, (SELECT count(*) FROM pg_prepared_xacts)").Scan(&max, &used); err != nil {
		t.Fatal(err)
	}
	blocker, err := bare.pg.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	var gids []string
	release := func() {
		for _, g := range gids {
			_, _ = blocker.ExecContext(ctx, "ROLLBACK PREPARED '"+g+"'")
		}
		gids = nil
	}
	defer release()
	for i := used; i < max; i++ {
		g := fmt.Sprintf("run-503-blocker-%d", i)
		if _, err := blocker.ExecContext(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := blocker.ExecContext(ctx, "PREPARE TRANSACTION '"+g+"'"); err != nil {
			t.Fatal(err)
		}
		gids = append(gids, g)
	}
	var seen refusals
	sleep := func(context.Context, time.Duration) error { release(); return nil }
	err = coord.Run(ctx, deposit(bare.pg, cotx.Postgres, "run-503"), cotx.WithClock(sleep, func() float64 { return 0 }), seen.option())
	closeRunConns()
	if err != nil {
		t.Fatal(err)
	}
	seen.one(t, 503, "resource_unavailable")
	if b := balance(t, bare.pg, "run-503"); b != 1 {
		t.Errorf("balance %d, want 1", b)
	}
}
