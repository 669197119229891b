package cotx_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	cotx "cotx.io/client"

	"github.com/go-sql-driver/mysql"
)

// All-read-only global transactions (docs/coordinator.md, "All-read-only transactions"):
// branches opened WithReadOnly that wrote nothing are listed with the commit, and when
// that is every branch the daemon commits with no store sync (cotx_store_batches_total
// does not move, cotx_read_only_commits_total does). A declared read-only PostgreSQL branch
// that wrote is not listed (the decision syncs); MariaDB in engine mode refuses the write
// (READ ONLY transaction, error 1792); MariaDB in client mode is never listed (its slot
// write). As the Python client's regress/pytest/coordinator/test_read_only_commit.py.

// metricOf: one sample of the daemon's /metrics (its first line for name).
func metricOf(t *testing.T, d *daemon, name string) float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", d.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	return 0
}

// settledSyncs: the store's batches once background writes (start-up, earlier
// finishes) are done: unchanged for 1.2 s (the start-up recovery pass's held write lands
// about 0.4 s after the daemon answers).
func settledSyncs(t *testing.T, d *daemon) float64 {
	t.Helper()
	last, same := metricOf(t, d, "cotx_store_batches_total"), 0
	for same < 4 {
		time.Sleep(300 * time.Millisecond)
		now := metricOf(t, d, "cotx_store_batches_total")
		if now == last {
			same++
		} else {
			same = 0
		}
		last = now
	}
	return last
}

type roBranch struct {
	db       *sql.DB
	kind     cotx.Kind
	resource string
	readOnly bool
	stmt     string
}

// runRO: one global transaction, a branch per spec on a fresh session, each running its
// statement; the commit's error (or the first branch's).
func runRO(t *testing.T, coord *cotx.Coordinator, specs ...roBranch) error {
	t.Helper()
	ctx := context.Background()
	tx := coord.Transaction(0)
	for _, s := range specs {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var opts []cotx.BranchOption
		if s.readOnly {
			opts = append(opts, cotx.WithReadOnly())
		}
		b, err := tx.Branch(ctx, conn, s.kind, s.resource, "", opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, s.stmt); err != nil {
			return b.Fail(err)
		}
	}
	return tx.Commit(ctx)
}

// roDaemon: a daemon of its own over pgPort / myPort at enforcement, whose recovery
// passes (each queues a store write, flushed by the next read) are rare; its client.
func roDaemon(t *testing.T, pgPort, myPort, enforcement string) (*daemon, *cotx.Coordinator) {
	t.Helper()
	d, err := startDaemonRecovering(bankResources(pgPort, myPort, enforcement), "g-ro", 2000, 3_600_000, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	return d, readyClient(t, d, enforcement)
}

func TestReadOnlyCommitEngineMode(t *testing.T) {
	needServers(t)
	d, coord := roDaemon(t, os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), cotx.EnforcementEngine)
	mustExec(t, env.pg, "INSERT INTO savings VALUES ('go-ro', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0")
	mustExec(t, env.my, "INSERT INTO checking VALUES ('go-ro', 0, '') ON DUPLICATE KEY UPDATE bal = 0")
	pgRead := roBranch{env.pg, cotx.Postgres, "savings", true, "SELECT bal FROM savings WHERE u = 'go-ro'"}
	myRead := roBranch{env.my, cotx.MariaDB, "checking", true, "SELECT bal FROM checking WHERE u = 'go-ro'"}

	before, ro := settledSyncs(t, d), metricOf(t, d, "cotx_read_only_commits_total")
	for i := 0; i < 3; i++ {
		if err := runRO(t, coord, pgRead, myRead); err != nil {
			t.Fatal(err)
		}
	}
	if got := settledSyncs(t, d); got != before {
		t.Errorf("all-read-only commits synced the store: batches %v -> %v", before, got)
	}
	if got := metricOf(t, d, "cotx_read_only_commits_total") - ro; got != 3 {
		t.Errorf("read-only commits counted %v, want 3", got)
	}

	// Declared read-only, yet it wrote: not listed, the decision synced, the write there.
	before, ro = settledSyncs(t, d), metricOf(t, d, "cotx_read_only_commits_total")
	pgWrite := roBranch{env.pg, cotx.Postgres, "savings", true, "UPDATE savings SET bal = bal + 1 WHERE u = 'go-ro'"}
	if err := runRO(t, coord, pgWrite, myRead); err != nil {
		t.Fatal(err)
	}
	if got := settledSyncs(t, d); got <= before {
		t.Errorf("a declared read-only branch that wrote committed without a sync")
	}
	if got := metricOf(t, d, "cotx_read_only_commits_total"); got != ro {
		t.Errorf("counted as read-only: %v -> %v", ro, got)
	}
	var bal int
	if err := env.pg.QueryRow("SELECT bal FROM savings WHERE u = 'go-ro'").Scan(&bal); err != nil || bal != 1 {
		t.Errorf("the write of the declared read-only branch: bal %d (%v), want 1", bal, err)
	}

	// MariaDB in engine mode: a READ ONLY transaction, the write refused (1792).
	myWrite := roBranch{env.my, cotx.MariaDB, "checking", true, "UPDATE checking SET bal = bal + 1 WHERE u = 'go-ro'"}
	err := runRO(t, coord, pgRead, myWrite)
	var me *mysql.MySQLError
	if err == nil || !asMySQL(err, &me) || me.Number != 1792 {
		t.Errorf("a MariaDB read-only branch's write: %v, want error 1792 (READ ONLY transaction)", err)
	}
	if err := env.my.QueryRow("SELECT bal FROM checking WHERE u = 'go-ro'").Scan(&bal); err != nil || bal != 0 {
		t.Errorf("checking changed: %d (%v)", bal, err)
	}
}

func asMySQL(err error, me **mysql.MySQLError) bool {
	for e := err; e != nil; {
		if m, ok := e.(*mysql.MySQLError); ok {
			*me = m
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

func TestReadOnlyCommitClientMode(t *testing.T) {
	if bare.err != nil {
		t.Fatal(bare.err)
	}
	d, coord := roDaemon(t, bare.pgPort, bare.myPort, cotx.EnforcementClient)
	t.Cleanup(func() { waitSettled(t) })
	mustExec(t, bare.pg, "INSERT INTO savings VALUES ('go-ro', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0")
	mustExec(t, bare.my, "INSERT INTO checking VALUES ('go-ro', 0, '') ON DUPLICATE KEY UPDATE bal = 0")
	pgRead := roBranch{bare.pg, cotx.Postgres, "savings", true, "SELECT bal FROM savings WHERE u = 'go-ro'"}

	// Two PostgreSQL branches, both read-only (the check is made before the slot write).
	before, ro := settledSyncs(t, d), metricOf(t, d, "cotx_read_only_commits_total")
	if err := runRO(t, coord, pgRead, pgRead); err != nil {
		t.Fatal(err)
	}
	if got := settledSyncs(t, d); got != before {
		t.Errorf("an all-read-only commit in client mode synced the store: %v -> %v", before, got)
	}
	if got := metricOf(t, d, "cotx_read_only_commits_total") - ro; got != 1 {
		t.Errorf("read-only commits counted %v, want 1", got)
	}

	// A MariaDB branch declared read-only in client mode: not a READ ONLY transaction (the
	// slot write must go through), never listed: the decision syncs.
	for _, stmt := range []string{"SELECT bal FROM checking WHERE u = 'go-ro'", "UPDATE checking SET bal = bal + 1 WHERE u = 'go-ro'"} {
		before, ro = settledSyncs(t, d), metricOf(t, d, "cotx_read_only_commits_total")
		myRO := roBranch{bare.my, cotx.MariaDB, "checking", true, stmt}
		if err := runRO(t, coord, pgRead, myRO); err != nil {
			t.Fatal(fmt.Errorf("%s: %w", stmt, err))
		}
		if got := settledSyncs(t, d); got <= before {
			t.Errorf("%s: a client-mode MariaDB branch committed without a sync", stmt)
		}
		if got := metricOf(t, d, "cotx_read_only_commits_total"); got != ro {
			t.Errorf("%s: counted as read-only", stmt)
		}
	}
	var bal int
	if err := bare.my.QueryRow("SELECT bal FROM checking WHERE u = 'go-ro'").Scan(&bal); err != nil || bal != 1 {
		t.Errorf("the client-mode MariaDB branch's write: bal %d (%v), want 1", bal, err)
	}
}
