package cotx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cotx "cotx.io/client"
)

// The one-request commit (leased.go) against the real daemon and real servers with
// pg_co / mysql_co: transactions commit with one request each, and a daemon killed (-9)
// and restarted under load leads to retries, with nothing left prepared and no
// transaction split.

// oneRequestDaemon: a daemon of its own in engine mode (recovery every recoveryMs), and
// a client with the one-request commit on.
func oneRequestDaemon(t *testing.T, node string, recoveryMs int) (*daemon, *cotx.Coordinator) {
	t.Helper()
	needServers(t)
	d, err := startDaemonRecovering(bankResources(os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), cotx.EnforcementEngine),
		node, 2000, recoveryMs, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	coord := readyClient(t, d, cotx.EnforcementEngine)
	coord.OneRequest = true
	return d, coord
}

// transferOne: one global transaction inserting key in savings (PostgreSQL) and checking
// (MariaDB), through Run; the sessions stay open until it is committed.
func transferOne(ctx context.Context, coord *cotx.Coordinator, pc, mc *sql.Conn, key string, opts ...cotx.RunOption) error {
	return transferWith(ctx, coord, pc, mc, key, false, opts...)
}

// transferWith: transferOne, with the decision in the PostgreSQL branch when dip.
func transferWith(ctx context.Context, coord *cotx.Coordinator, pc, mc *sql.Conn, key string, dip bool, opts ...cotx.RunOption) error {
	return coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
		return transferBody(ctx, tx, pc, mc, key, dip)
	}, opts...)
}

// transferBody: transferWith's work in one run of the transaction.
func transferBody(ctx context.Context, tx *cotx.Tx, pc, mc *sql.Conn, key string, dip bool) error {
	tx.DecideInParticipant = dip
	b, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", "")
	if err != nil {
		return err
	}
	if _, err := pc.ExecContext(ctx, "INSERT INTO savings VALUES ($1, 1, '')", key); err != nil {
		return b.Fail(err)
	}
	b, err = tx.Branch(ctx, mc, cotx.MariaDB, "checking", "")
	if err != nil {
		return err
	}
	if _, err := mc.ExecContext(ctx, "INSERT INTO checking VALUES (?, 1, '')", key); err != nil {
		return b.Fail(err)
	}
	return nil
}

// present: key's row in savings and in checking.
func present(t *testing.T, key string) (pg, my bool) {
	t.Helper()
	var n int
	if err := env.pg.QueryRow("SELECT count(*) FROM savings WHERE u = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	pg = n == 1
	if err := env.my.QueryRow("SELECT count(*) FROM checking WHERE u = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return pg, n == 1
}

func clearKeys(t *testing.T, prefix string) {
	t.Helper()
	mustExec(t, env.pg, "DELETE FROM savings WHERE u LIKE $1", prefix+"%")
	mustExec(t, env.my, "DELETE FROM checking WHERE u LIKE ?", prefix+"%")
}

func TestOneRequestCommit(t *testing.T) {
	d, coord := oneRequestDaemon(t, "g-one", 500)
	clearKeys(t, "go-one-")
	ctx := context.Background()
	pc, mc := bothConns(t, ctx)
	// The first transaction learns the resources' modes from its registrations (begin).
	if err := transferOne(ctx, coord, pc, mc, "go-one-first"); err != nil {
		t.Fatal(err)
	}
	const n = 20
	leases, begun := metricOf(t, d, "cotx_gtid_leases_total"), metricOf(t, d, "cotx_transactions_begun_total")
	requests := metricOf(t, d, "cotx_requests_total")
	for i := 0; i < n; i++ {
		if err := transferOne(ctx, coord, pc, mc, fmt.Sprintf("go-one-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The metrics read before is counted once answered; then one lease, one request each.
	if got := metricOf(t, d, "cotx_requests_total") - requests; got != n+2 {
		t.Fatalf("%d transactions took %v requests (want %d: one each, one lease, the metrics read)", n, got, n+2)
	}
	if got := metricOf(t, d, "cotx_gtid_leases_total") - leases; got != 1 {
		t.Fatalf("%v leases for %d transactions, want 1", got, n)
	}
	if got := metricOf(t, d, "cotx_transactions_begun_total") - begun; got != n {
		t.Fatalf("the daemon counted %v transactions, want %d", got, n)
	}
	for i := 0; i < n; i++ {
		if pg, my := present(t, fmt.Sprintf("go-one-%d", i)); !pg || !my {
			t.Fatalf("go-one-%d: committed in PostgreSQL %v, MariaDB %v", i, pg, my)
		}
	}
	if err := coord.FlushAcks(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOneRequestDaemonRestartUnderLoad(t *testing.T) {
	d, coord := oneRequestDaemon(t, "g-one-r", 300)
	restartUnderLoad(t, d, coord, "go-one-r-", false)
}

// restartUnderLoad: 4 goroutines of 25 transfers each (keys pre…, the decision in the
// PostgreSQL branch when dip), the daemon killed -9 and restarted after the first 10
// commits: every transfer is committed in the end (after retries), none split, nothing
// left prepared.
func restartUnderLoad(t *testing.T, d *daemon, coord *cotx.Coordinator, pre string, dip bool) {
	t.Helper()
	clearKeys(t, pre)
	ctx := context.Background()
	pc, mc := bothConns(t, ctx)
	if err := transferOne(ctx, coord, pc, mc, pre+"first"); err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 25
	var committed, retries int64
	errs := make([]error, workers*each)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			pc, mc := bothConns(t, ctx)
			for i := 0; i < each; i++ {
				key := fmt.Sprintf("%s%d-%d", pre, w, i)
				errs[w*each+i] = transferWith(ctx, coord, pc, mc, key, dip, cotx.Retries(30), cotx.MaxWait(60*time.Second),
					cotx.OnRetry(func(int, error, time.Duration) { atomic.AddInt64(&retries, 1) }))
				if errs[w*each+i] == nil {
					atomic.AddInt64(&committed, 1)
				}
			}
		}(w)
	}
	for atomic.LoadInt64(&committed) < 10 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("%d committed, %d retries after the restart", committed, retries)
	for i, err := range errs {
		if err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
	}
	if retries == 0 {
		t.Error("no transaction was run again across the restart")
	}
	if metricOf(t, d, "cotx_gtid_leases_total") < 1 {
		t.Error("the restarted daemon leased no range")
	}
	// Recovery aborts (on record first) what the old epoch left prepared.
	waitNothingPreparedOn(t, env.pg, env.my, 30*time.Second)
	for w := 0; w < workers; w++ {
		for i := 0; i < each; i++ {
			key := fmt.Sprintf("%s%d-%d", pre, w, i)
			pg, my := present(t, key)
			if pg != my {
				t.Errorf("%s split: PostgreSQL %v, MariaDB %v", key, pg, my)
			}
			if errs[w*each+i] == nil && !pg {
				t.Errorf("%s: told committed, not there", key)
			}
		}
	}
}

// A resource not known yet in a transaction on a leased gtid: rolled back, run again on
// the begin (which learns it), then the leased path again.
func TestOneRequestLearnsAResourceOnTheBegin(t *testing.T) {
	d, coord := oneRequestDaemon(t, "g-one-l", 500)
	clearKeys(t, "go-one-l-")
	ctx := context.Background()
	pc, mc := bothConns(t, ctx)
	// Only savings is known: a transaction of its own, on the begin.
	if err := coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
		_, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", "")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var retried []error
	if err := transferOne(ctx, coord, pc, mc, "go-one-l-1", cotx.OnRetry(func(_ int, err error, _ time.Duration) {
		retried = append(retried, err)
	})); err != nil {
		t.Fatal(err)
	}
	if len(retried) != 1 || !errors.Is(retried[0], cotx.ErrLeasedFallback) {
		t.Fatalf("want one retry for the unknown resource, got %v", retried)
	}
	leases := metricOf(t, d, "cotx_gtid_leases_total")
	requests := metricOf(t, d, "cotx_requests_total")
	if err := transferOne(ctx, coord, pc, mc, "go-one-l-2"); err != nil {
		t.Fatal(err)
	}
	if got := metricOf(t, d, "cotx_requests_total") - requests; got != 2 {
		t.Fatalf("once both are known, %v requests (want 2: the commit, the metrics read)", got)
	}
	if metricOf(t, d, "cotx_gtid_leases_total") != leases {
		t.Fatal("a new lease for the second transaction")
	}
	for _, k := range []string{"go-one-l-1", "go-one-l-2"} {
		if pg, my := present(t, k); !pg || !my {
			t.Fatalf("%s: PostgreSQL %v, MariaDB %v", k, pg, my)
		}
	}
}

// Client mode: the helper and slot are handed out at registration, so its resources
// always take the begin — never a one-request commit that would be refused.
func TestOneRequestClientModeTakesTheBegin(t *testing.T) {
	coord, d := bareDaemonProcess(t, cotx.EnforcementClient)
	coord.OneRequest = true
	ctx := context.Background()
	mustExec(t, bare.pg, "DELETE FROM savings WHERE u LIKE 'go-one-cm-%'")
	mustExec(t, bare.my, "DELETE FROM checking WHERE u LIKE 'go-one-cm-%'")
	pc, err := bare.pg.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	mc, err := bare.my.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	begun := metricOf(t, d, "cotx_transactions_begun_total")
	for i := 0; i < 3; i++ {
		if err := transferOne(ctx, coord, pc, mc, fmt.Sprintf("go-one-cm-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := metricOf(t, d, "cotx_gtid_leases_total"); n != 0 {
		t.Fatalf("%v gtid leases in client mode", n)
	}
	if got := metricOf(t, d, "cotx_transactions_begun_total") - begun; got != 3 {
		t.Fatalf("%v transactions begun, want 3", got)
	}
	var n int
	if err := bare.my.QueryRow("SELECT count(*) FROM checking WHERE u LIKE 'go-one-cm-%'").Scan(&n); err != nil || n != 3 {
		t.Fatalf("MariaDB has %d of 3 rows (%v)", n, err)
	}
}

// A transaction that hands its gtid to another service cannot be leased (participants
// register with the daemon, which knows a leased gtid only at its commit): rolled back and
// run again on the begin, and the transactions starting on the same resource stay there.
func TestOneRequestPropagationTakesTheBegin(t *testing.T) {
	d, coord := oneRequestDaemon(t, "g-one-p", 500)
	clearKeys(t, "go-one-p-")
	ctx := context.Background()
	pc, mc := bothConns(t, ctx)
	if err := transferOne(ctx, coord, pc, mc, "go-one-p-first"); err != nil {
		t.Fatal(err)
	}
	propagating := func(key string) (retries int, err error) {
		err = coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
			b, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", "")
			if err != nil {
				return err
			}
			if _, err := pc.ExecContext(ctx, "INSERT INTO savings VALUES ($1, 1, '')", key); err != nil {
				return b.Fail(err)
			}
			if _, err := tx.GTID(ctx); err != nil { // as tx.Context before a call to a peer
				return err
			}
			b, err = tx.Branch(ctx, mc, cotx.MariaDB, "checking", "")
			if err != nil {
				return err
			}
			if _, err := mc.ExecContext(ctx, "INSERT INTO checking VALUES (?, 1, '')", key); err != nil {
				return b.Fail(err)
			}
			return nil
		}, cotx.OnRetry(func(_ int, err error, _ time.Duration) {
			if !errors.Is(err, cotx.ErrLeasedFallback) {
				t.Errorf("retried for %v", err)
			}
			retries++
		}))
		return retries, err
	}
	if n, err := propagating("go-one-p-1"); err != nil || n != 1 {
		t.Fatalf("first propagating transaction: %d retries, %v (want 1, nil)", n, err)
	}
	begun := metricOf(t, d, "cotx_transactions_begun_total")
	for i := 2; i <= 3; i++ {
		if n, err := propagating(fmt.Sprintf("go-one-p-%d", i)); err != nil || n != 0 {
			t.Fatalf("propagating transaction %d: %d retries, %v (want 0, nil)", i, n, err)
		}
	}
	if got := metricOf(t, d, "cotx_transactions_begun_total") - begun; got != 2 {
		t.Fatalf("%v transactions begun, want 2", got)
	}
	for i := 1; i <= 3; i++ {
		if pg, my := present(t, fmt.Sprintf("go-one-p-%d", i)); !pg || !my {
			t.Fatalf("go-one-p-%d: PostgreSQL %v, MariaDB %v", i, pg, my)
		}
	}
}
