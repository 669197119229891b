package cotx_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"

	cotx "cotx.io/client"
)

// The read-only vote of plain 2PC (readonly.go): on resources with enforcement "none" a
// declared read-only branch that wrote nothing is committed in one phase at its vote, never
// prepared, on the begin path and on the one-request path; the daemon still decides an
// all-read-only transaction in memory and nothing is left prepared. A declared read-only
// branch that wrote is prepared, and in engine mode nothing changes. What each server saw
// is read from the server itself: PostgreSQL's statement log (log_statement = 'all' on the
// branch's session; the log is the backend's stderr) and MariaDB's session counters
// (Com_xa_prepare).

// voteSeen: what the servers saw of one transaction's branches.
type voteSeen struct {
	pgPrepared bool // PREPARE TRANSACTION of the PostgreSQL branch's gid in the server's log
	myPrepares int  // XA PREPAREs in the MariaDB branch's session
	myCommits  int  // XA COMMITs there (one phase or not)
}

// serverLog: the PostgreSQL server's log as its backend pid writes it (stderr, which
// pg_ctl -l points at the log file; the tests run as root).
func serverLog(t *testing.T, pid int) string {
	t.Helper()
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/fd/2", pid))
	if err != nil {
		t.Fatal(err)
	}
	return string(text)
}

func sessionCounter(t *testing.T, conn *sql.Conn, name string) int {
	t.Helper()
	var n string
	var v int
	if err := conn.QueryRowContext(context.Background(), "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// voteRun: one global transaction of a PostgreSQL branch running pgStmt and a MariaDB
// branch reading, both declared read-only, on pg / my; the commit's error and what the
// servers saw.
func voteRun(t *testing.T, coord *cotx.Coordinator, pg, my *sql.DB, pgStmt string) (voteSeen, error) {
	t.Helper()
	ctx := context.Background()
	pc, err := pg.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	mc, err := my.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	var pid int
	if err := pc.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustConnExec(t, pc, "SET log_statement = 'all'")
	prepares, commits := sessionCounter(t, mc, "Com_xa_prepare"), sessionCounter(t, mc, "Com_xa_commit")

	tx := coord.Transaction(0)
	pb, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", "", cotx.WithReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	// The gid in a statement of the branch: the log shows it was written to.
	if _, err := pc.ExecContext(ctx, pgStmt+" AND "+pb.GID+" <> ''"); err != nil {
		return voteSeen{}, pb.Fail(err)
	}
	mb, err := tx.Branch(ctx, mc, cotx.MariaDB, "checking", "", cotx.WithReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mc.ExecContext(ctx, "SELECT bal FROM checking WHERE u = 'go-vote'"); err != nil {
		return voteSeen{}, mb.Fail(err)
	}
	cerr := tx.Commit(ctx)

	log := serverLog(t, pid)
	if !strings.Contains(log, pb.GID) {
		t.Fatalf("the branch's statements are not in the server's log (/proc/%d/fd/2)", pid)
	}
	return voteSeen{
		pgPrepared: strings.Contains(log, "PREPARE TRANSACTION "+pb.GID),
		myPrepares: sessionCounter(t, mc, "Com_xa_prepare") - prepares,
		myCommits:  sessionCounter(t, mc, "Com_xa_commit") - commits,
	}, cerr
}

const (
	voteRead  = "SELECT bal FROM savings WHERE u = 'go-vote'"
	voteWrite = "UPDATE savings SET bal = bal + 1 WHERE u = 'go-vote'"
)

func TestReadOnlyVotePlain2PC(t *testing.T) {
	if bare.err != nil {
		t.Fatal(bare.err)
	}
	d, coord := roDaemon(t, bare.pgPort, bare.myPort, cotx.EnforcementNone)
	mustExec(t, bare.pg, "INSERT INTO savings VALUES ('go-vote', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0")
	mustExec(t, bare.my, "INSERT INTO checking VALUES ('go-vote', 0, '') ON DUPLICATE KEY UPDATE bal = 0")
	// The first transaction takes the begin (and teaches the one-request path the modes).
	coord.OneRequest = true
	for _, path := range []string{"begin", "one request"} {
		ro, leases := metricOf(t, d, "cotx_read_only_commits_total"), metricOf(t, d, "cotx_gtid_leases_total")
		seen, err := voteRun(t, coord, bare.pg, bare.my, voteRead)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if seen.pgPrepared || seen.myPrepares != 0 || seen.myCommits != 1 {
			t.Errorf("%s: a read-only branch of plain 2PC was prepared: %+v (want PostgreSQL not prepared, MariaDB XA COMMIT ONE PHASE only)", path, seen)
		}
		if got := metricOf(t, d, "cotx_read_only_commits_total") - ro; got != 1 {
			t.Errorf("%s: read-only commits counted %v, want 1 (decided in memory)", path, got)
		}
		if got := metricOf(t, d, "cotx_gtid_leases_total") - leases; (path == "one request") != (got == 1) {
			t.Errorf("%s: %v gtid leases", path, got)
		}
		if pg, my := preparedOn(t, bare.pg, bare.my); pg+my != 0 {
			t.Errorf("%s: left prepared: pg %d, mariadb %d", path, pg, my)
		}
	}

	// Declared read-only, yet it wrote: prepared (and committed), the decision synced.
	coord.OneRequest = false
	ro := metricOf(t, d, "cotx_read_only_commits_total")
	seen, err := voteRun(t, coord, bare.pg, bare.my, voteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if !seen.pgPrepared || seen.myPrepares != 0 {
		t.Errorf("a declared read-only branch that wrote: %+v (want PostgreSQL prepared, MariaDB not)", seen)
	}
	if got := metricOf(t, d, "cotx_read_only_commits_total"); got != ro {
		t.Errorf("a transaction that wrote was counted read-only: %v -> %v", ro, got)
	}
	var bal int
	if err := bare.pg.QueryRow("SELECT bal FROM savings WHERE u = 'go-vote'").Scan(&bal); err != nil || bal != 1 {
		t.Errorf("the write: bal %d (%v), want 1", bal, err)
	}
	waitSettled(t)
}

// In engine mode read-only branches still prepare (pg_co's rule C, mysql_co's read locks).
func TestReadOnlyVoteNotInEngineMode(t *testing.T) {
	needServers(t)
	_, coord := roDaemon(t, os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), cotx.EnforcementEngine)
	mustExec(t, env.pg, "INSERT INTO savings VALUES ('go-vote', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0")
	mustExec(t, env.my, "INSERT INTO checking VALUES ('go-vote', 0, '') ON DUPLICATE KEY UPDATE bal = 0")
	seen, err := voteRun(t, coord, env.pg, env.my, voteRead)
	if err != nil {
		t.Fatal(err)
	}
	if !seen.pgPrepared || seen.myPrepares != 1 {
		t.Errorf("engine mode: read-only branches not prepared: %+v", seen)
	}
}
