package cotx_test

import (
	"context"
	"database/sql"
	"errors"
	"syscall"
	"testing"
	"time"

	cotx "cotx.io/client"
)

// Client mode on MariaDB: a daemon restarted with a branch of its last run prepared there
// closes the restart gate at its first look (it cannot know whether MariaDB restarted
// meanwhile) until its recovery has decided that branch. A registration in between is
// answered 503 restart_gate, "not now"; Run waits its Retry-After and runs the transaction
// again, so the application sees no failure. MariaDB's global read lock holds the
// recovery's XA ROLLBACK, so the registration surely comes in between; Run's wait lets go
// of it. (The Python client's test of the same: test_client_mode.py,
// test_a_registration_refused_while_a_restarted_daemon_recovers_is_admitted_by_the_retry_path.)
func TestRunRetriesTheRestartGateOfARestartedDaemon(t *testing.T) {
	coord, d := bareDaemonProcess(t, cotx.EnforcementClient)
	ctx := context.Background()
	mustExec(t, bare.pg, "INSERT INTO savings VALUES ('go-gate', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0")
	mustExec(t, bare.my, "INSERT INTO checking VALUES ('go-gate', 0, '') ON DUPLICATE KEY UPDATE bal = 0")
	mustExec(t, bare.my, "INSERT INTO checking VALUES ('go-gate-after', 0, '') ON DUPLICATE KEY UPDATE bal = 0")

	// A transfer prepared at both servers whose commit the daemon never reads: it is
	// stopped before the commit request, then killed.
	tx := coord.Transaction(0)
	for _, br := range []struct {
		db   *sql.DB
		kind cotx.Kind
		name string
		sql  string
	}{
		{bare.pg, cotx.Postgres, "savings", "UPDATE savings SET bal = bal + 1 WHERE u = 'go-gate'"},
		{bare.my, cotx.MariaDB, "checking", "UPDATE checking SET bal = bal + 1 WHERE u = 'go-gate'"},
	} {
		conn, err := br.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		b, err := tx.Branch(ctx, conn, br.kind, br.name, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Conn.ExecContext(ctx, br.sql); err != nil {
			t.Fatal(b.Fail(err))
		}
	}
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- tx.Commit(ctx) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, my := preparedOn(t, bare.pg, bare.my); my == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the MariaDB branch was not prepared within 15 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	hold, err := bare.my.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	mustConnExec(t, hold, "FLUSH TABLES WITH READ LOCK")
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}

	var seen refusals
	wait := func(ctx context.Context, delay time.Duration) error {
		mustConnExec(t, hold, "UNLOCK TABLES")
		time.Sleep(delay)
		return nil
	}
	err = coord.Run(ctx, deposit(bare.my, cotx.MariaDB, "go-gate-after"), cotx.WithClock(wait, func() float64 { return 0 }), seen.option())
	closeRunConns()
	if err != nil {
		t.Fatalf("Run: %v (retried %v)", err, seen.errs)
	}
	if len(seen.errs) == 0 {
		t.Fatal("no registration was refused: the gate was open at once, so this test shows nothing")
	}
	for _, e := range seen.errs {
		var ce *cotx.CoordinatorError
		if !errors.As(e, &ce) || ce.Status != 503 || ce.Code != "restart_gate" {
			t.Fatalf("retried %v, want only 503 restart_gate", seen.errs)
		}
	}
	select {
	case <-first: // its outcome: the daemon that never read its commit presumed it aborted
	case <-time.After(30 * time.Second):
		t.Fatal("the first transaction's commit did not return")
	}
	var sb, cb, after int
	_ = bare.pg.QueryRow("SELECT bal FROM savings WHERE u = 'go-gate'").Scan(&sb)
	_ = bare.my.QueryRow("SELECT bal FROM checking WHERE u = 'go-gate'").Scan(&cb)
	_ = bare.my.QueryRow("SELECT bal FROM checking WHERE u = 'go-gate-after'").Scan(&after)
	if sb != cb || after != 1 {
		t.Errorf("balances: the first transfer %d / %d (want both or neither), the one after %d (want 1)", sb, cb, after)
	}
}
