package cotx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	cotx "cotx.io/client"
)

// The decision in a participant (decide_in.go) against the real daemon and servers with
// pg_co / mysql_co, on the begin path and on the one-request path: the PostgreSQL
// branch's COMMIT carries the decision (no PREPARE there, no store write); a CO refusal
// of that COMMIT aborts everything retryably; a resource not declared a decision
// resource is a configuration error, not retried.

var dipPaths = []struct {
	name       string
	oneRequest bool
}{{"begin", false}, {"one_request", true}}

// dipDaemon: a daemon of its own in engine mode, savings declared a decision resource
// (decisions = true) when decisions, and a client on the path.
func dipDaemon(t *testing.T, node string, decisions, oneRequest bool) (*daemon, *cotx.Coordinator) {
	t.Helper()
	needServers(t)
	mustExec(t, env.pg, "CREATE EXTENSION IF NOT EXISTS pg_co")
	res := bankResources(os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), cotx.EnforcementEngine)
	extra := ""
	if decisions {
		s := res[0]
		extra = fmt.Sprintf("[[resources]]\nname = %q\nkind = %q\ndsn = %q\npool_size = 2\nenforcement = %q\ndecisions = true\n",
			s.name, s.kind, s.dsn, s.enforcement)
		res = res[1:]
	}
	d, err := startDaemonRecovering(res, node, 2000, 500, extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	coord := readyClient(t, d, cotx.EnforcementEngine)
	coord.OneRequest = oneRequest
	return d, coord
}

// dipSetup: dipDaemon, the keys with prefix pre cleared, a session on each server, and a
// first transfer, which learns the resources' modes (on the one-request path from its
// registrations: a begin).
func dipSetup(t *testing.T, node, pre string, decisions, oneRequest bool) (*daemon, *cotx.Coordinator, context.Context, *sql.Conn, *sql.Conn) {
	t.Helper()
	d, coord := dipDaemon(t, node, decisions, oneRequest)
	clearKeys(t, pre)
	ctx := context.Background()
	pc, mc := bothConns(t, ctx)
	if err := transferOne(ctx, coord, pc, mc, pre+"first"); err != nil {
		t.Fatal(err)
	}
	return d, coord, ctx, pc, mc
}

func TestDecisionInParticipant(t *testing.T) {
	for _, p := range dipPaths {
		t.Run(p.name, func(t *testing.T) {
			pre := "go-dip-" + p.name + "-"
			d, coord, ctx, pc, mc := dipSetup(t, "g-dip-"+p.name[:3], pre, true, p.oneRequest)
			decided, leases := metricOf(t, d, "cotx_decided_in_participant_total"), metricOf(t, d, "cotx_gtid_leases_total")
			const n = 5
			for i := 0; i < n; i++ {
				if err := transferWith(ctx, coord, pc, mc, fmt.Sprintf("%s%d", pre, i), true, cotx.Retries(0)); err != nil {
					t.Fatal(err)
				}
			}
			if got := metricOf(t, d, "cotx_decided_in_participant_total") - decided; got != n {
				t.Fatalf("%v of %d transactions decided in the participant", got, n)
			}
			want := 0.0
			if p.oneRequest {
				want = 1 // one range for all of them, no begin
			}
			if got := metricOf(t, d, "cotx_gtid_leases_total") - leases; got != want {
				t.Fatalf("%v leases for %d transactions, want %v", got, n, want)
			}
			for i := 0; i < n; i++ {
				if pg, my := present(t, fmt.Sprintf("%s%d", pre, i)); !pg || !my {
					t.Fatalf("%s%d: committed in PostgreSQL %v, MariaDB %v", pre, i, pg, my)
				}
			}
			if err := coord.FlushAcks(ctx); err != nil {
				t.Fatal(err)
			}
			if pg, my := preparedLeft(t); pg != 0 || my != 0 {
				t.Fatalf("prepared left: PostgreSQL %d, MariaDB %d", pg, my)
			}

			// rule A at the decision commit: the PostgreSQL branch read a row, then an
			// in-doubt 2PC writer overwrote it. The COMMIT is refused: nothing commits
			// anywhere, and the error is retryable (refused by the engine).
			key, w := pre+"a", pre+"w"
			mustExec(t, env.pg, "INSERT INTO savings VALUES ($1, 100, '')", key)
			wc, err := env.pg.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer wc.Close()
			err = coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
				tx.DecideInParticipant = true
				if _, err := tx.Branch(ctx, mc, cotx.MariaDB, "checking", ""); err != nil {
					return err
				}
				if _, err := mc.ExecContext(ctx, "INSERT INTO checking VALUES (?, 1, '')", key); err != nil {
					return err
				}
				if _, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", ""); err != nil {
					return err
				}
				var bal int
				if err := pc.QueryRowContext(ctx, "SELECT bal FROM savings WHERE u = $1", key).Scan(&bal); err != nil {
					return err
				}
				if _, err := pc.ExecContext(ctx, "INSERT INTO savings VALUES ($1, 1, '')", key+"-r"); err != nil {
					return err
				}
				for _, q := range []string{"BEGIN ISOLATION LEVEL SERIALIZABLE",
					"UPDATE savings SET bal = bal + 1 WHERE u = '" + key + "'", "PREPARE TRANSACTION '" + w + "'"} {
					if _, err := wc.ExecContext(ctx, q); err != nil {
						return err
					}
				}
				return nil
			}, cotx.Retries(0))
			mustExec(t, env.pg, "COMMIT PREPARED '"+w+"'")
			if err == nil || !cotx.IsRetryable(err) || !strings.Contains(err.Error(), "rule A") {
				t.Fatalf("want a retryable rule A refusal of the decision commit, got %v", err)
			}
			if pg, _ := present(t, key+"-r"); pg {
				t.Fatal("the refused decision branch committed")
			}
			if _, my := present(t, key); my {
				t.Fatal("the MariaDB branch committed although the decision branch was refused")
			}
			if pg, my := preparedLeft(t); pg != 0 || my != 0 {
				t.Fatalf("prepared left after the refusal: PostgreSQL %d, MariaDB %d", pg, my)
			}
		})
	}
}

// TestDecisionInParticipantWithoutDecisions: the daemon refuses the hand-over
// (not_a_decision_resource): configuration, which running again does not cure. The
// error names it and is not retryable, on both paths; nothing commits or stays prepared.
func TestDecisionInParticipantWithoutDecisions(t *testing.T) {
	for _, p := range dipPaths {
		t.Run(p.name, func(t *testing.T) {
			pre := "go-dip-none-" + p.name + "-"
			_, coord, ctx, pc, mc := dipSetup(t, "g-dipn-"+p.name[:3], pre, false, p.oneRequest)
			retried := 0
			err := transferWith(ctx, coord, pc, mc, pre+"0", true,
				cotx.OnRetry(func(int, error, time.Duration) { retried++ }))
			if err == nil || cotx.IsRetryable(err) || !strings.Contains(err.Error(), "not_a_decision_resource") || retried != 0 {
				t.Fatalf("want a non-retryable error naming not_a_decision_resource, not retried; got %v (%d retries)", err, retried)
			}
			if pg, my := present(t, pre+"0"); pg || my {
				t.Fatalf("committed in PostgreSQL %v, MariaDB %v", pg, my)
			}
			if pg, my := preparedLeft(t); pg != 0 || my != 0 {
				t.Fatalf("prepared left: PostgreSQL %d, MariaDB %d", pg, my)
			}
		})
	}
}

// TestDecisionInParticipantDaemonRestartUnderLoad: the one-request path with the decision
// in the PostgreSQL branch, the daemon killed -9 and restarted under 4 goroutines' load.
// A decision branch that committed while the daemon was down leaves its MariaDB branch
// prepared under the old epoch's gtid: the restarted daemon reads the decision in
// PostgreSQL (co.resolve) and commits it there; one that did not commit is aborted.
// Every transfer commits in the end, none split, nothing left prepared.
func TestDecisionInParticipantDaemonRestartUnderLoad(t *testing.T) {
	d, coord := dipDaemon(t, "g-dip-r", true, true)
	restartUnderLoad(t, d, coord, "go-dip-r-", true)
	if metricOf(t, d, "cotx_decided_in_participant_total") == 0 {
		t.Error("no transaction was decided in the participant after the restart")
	}
}

// commitHangs holds every PostgreSQL COMMIT after its local flush, as a synchronous standby
// that never answers would (synchronous_standby_names names one that does not exist): the
// COMMIT is durable but its client gets no answer. Armed once a probe's COMMIT is seen
// waiting (then cancelled: a cancel ends the wait, the COMMIT stands). The returned
// function ends the first session seen waiting (pg_terminate_backend), so that its client
// loses its connection during a COMMIT that did commit, and lifts the hold; the hold is
// lifted at the test's end whatever happened.
func commitHangs(t *testing.T, ctx context.Context) (loseTheWaiter func() int) {
	t.Helper()
	lift := func() {
		env.pg.Exec("ALTER SYSTEM RESET synchronous_standby_names")
		env.pg.Exec("SELECT pg_reload_conf()")
	}
	t.Cleanup(lift)
	mustExec(t, env.pg, "ALTER SYSTEM SET synchronous_standby_names = 'cotx_no_such_standby'")
	mustExec(t, env.pg, "SELECT pg_reload_conf()")
	waiting := func(pid int) bool {
		var n int
		if err := env.pg.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	armed := false
	for try := 0; try < 50 && !armed; try++ {
		probe, err := env.pg.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := probe.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := probe.ExecContext(ctx, "SET synchronous_commit = on")
			if err == nil {
				_, err = probe.ExecContext(ctx, "SELECT pg_logical_emit_message(true, 'cotx', 'probe')")
			}
			done <- err
		}()
	poll:
		for i := 0; i < 20; i++ {
			select {
			case <-done:
				done <- nil
				break poll
			case <-time.After(50 * time.Millisecond):
			}
			if waiting(pid) {
				armed = true
				break
			}
		}
		// Cancelled whatever the watch saw: the hold may take effect just after it, and
		// nothing may wait on a held COMMIT (a cancel ends the wait; the COMMIT stands).
		select {
		case <-done:
		default:
			mustExec(t, env.pg, "SELECT pg_cancel_backend($1)", pid)
			<-done
		}
		probe.Close()
	}
	if !armed {
		t.Fatal("synchronous_standby_names never held a COMMIT")
	}
	return func() int {
		for i := 0; i < 600; i++ {
			var pid int
			err := env.pg.QueryRow("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' LIMIT 1").Scan(&pid)
			if err == nil {
				env.pg.Exec("SELECT pg_terminate_backend($1)", pid)
				lift()
				return pid
			}
			time.Sleep(50 * time.Millisecond)
		}
		lift()
		return 0
	}
}

// TestDecisionCommitSessionLost: the decision branch's session is lost during the COMMIT
// that carries the decision, after PostgreSQL committed it. Whether it committed is the
// database's to say: the client must not read the lost session as a refusal (rolling
// back and reporting the branch failed would have the daemon abort the MariaDB branch, a
// split, and Run would run the transfer again). It waits for the daemon, which reads the
// decision in PostgreSQL (co.resolve) after the owner's grace period: Run returns nil,
// both rows are there, nothing is left prepared. On both paths.
func TestDecisionCommitSessionLost(t *testing.T) {
	for _, p := range dipPaths {
		t.Run(p.name, func(t *testing.T) {
			pre := "go-dip-lost-" + p.name + "-"
			_, coord, ctx, pc, mc := dipSetup(t, "g-dipl-"+p.name[:3], pre, true, p.oneRequest)
			lose := commitHangs(t, ctx)
			lost := make(chan int, 1)
			go func() { lost <- lose() }()
			runs := 0
			err := coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
				runs++
				return transferBody(ctx, tx, pc, mc, pre+"0", true)
			}, cotx.Retries(0))
			if pid := <-lost; pid == 0 {
				t.Fatal("the decision COMMIT never waited")
			}
			if err != nil || runs != 1 {
				t.Fatalf("want the transfer committed once, got %v after %d runs", err, runs)
			}
			if pg, my := present(t, pre+"0"); !pg || !my {
				t.Fatalf("split: committed in PostgreSQL %v, MariaDB %v", pg, my)
			}
			if err := coord.FlushAcks(ctx); err != nil {
				t.Fatal(err)
			}
			waitNothingPreparedOn(t, env.pg, env.my, 30*time.Second)
		})
	}
}

// TestDecisionCommitSessionLostBeforeItTookEffect: the decision branch's session is lost
// while its decision is still open (co.decide waits on another session's lock of
// co.decisions; the waiting backend is terminated, then that lock released): nothing
// committed anywhere. The daemon resolves abort in PostgreSQL (co.resolve),
// and that abort is "safe to run again": Run runs the transfer again (a fresh session, as
// from a pool) and it commits once. On both paths.
func TestDecisionCommitSessionLostBeforeItTookEffect(t *testing.T) {
	for _, p := range dipPaths {
		t.Run(p.name, func(t *testing.T) {
			pre := "go-dip-lostb-" + p.name + "-"
			_, coord, ctx, _, mc := dipSetup(t, "g-dipb-"+p.name[:3], pre, true, p.oneRequest)
			blocker, err := env.pg.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Close()
			lost := make(chan int, 1)
			loseTheDecider := func() {
				for i := 0; i < 600; i++ {
					var pid int
					err := env.pg.QueryRow("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%co.decide(%' LIMIT 1").Scan(&pid)
					if err == nil {
						env.pg.Exec("SELECT pg_terminate_backend($1)", pid)
						blocker.ExecContext(ctx, "ROLLBACK")
						lost <- pid
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				blocker.ExecContext(ctx, "ROLLBACK")
				lost <- 0
			}
			runs := 0
			err = coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
				runs++
				conn, err := env.pg.Conn(ctx) // a fresh session per attempt, as from a pool
				if err != nil {
					return err
				}
				t.Cleanup(func() { conn.Close() })
				if err := transferBody(ctx, tx, conn, mc, pre+"0", true); err != nil {
					return err
				}
				if runs == 1 {
					for _, q := range []string{"BEGIN", "LOCK TABLE co.decisions IN SHARE MODE"} {
						if _, err := blocker.ExecContext(ctx, q); err != nil {
							return err
						}
					}
					go loseTheDecider()
				}
				return nil
			}, cotx.Retries(2))
			if pid := <-lost; pid == 0 {
				t.Fatal("co.decide never waited")
			}
			if err != nil || runs != 2 {
				t.Fatalf("want the transfer run again and committed, got %v after %d runs", err, runs)
			}
			if pg, my := present(t, pre+"0"); !pg || !my {
				t.Fatalf("split: committed in PostgreSQL %v, MariaDB %v", pg, my)
			}
		})
	}
}

// TestOnePhaseCommitSessionLost: a single-branch transaction commits in one phase (no
// PREPARE, no decision record); its session is lost during that COMMIT, after PostgreSQL
// committed it. Only the database knows whether it committed: Run returns an
// *OutcomeUnknownError naming the loss, does not run it again, and the daemon records no
// abort. Before, the client rolled back on the dead session, acknowledged "abort" and
// returned an *AbortedError while the row had committed.
func TestOnePhaseCommitSessionLost(t *testing.T) {
	_, coord := dipDaemon(t, "g-1pl", false, false)
	pre := "go-1p-lost-"
	clearKeys(t, pre)
	ctx := context.Background()
	pc, _ := bothConns(t, ctx)
	if _, err := pc.ExecContext(ctx, "SET synchronous_commit = on"); err != nil { // the test servers run it off: no wait
		t.Fatal(err)
	}
	lose := commitHangs(t, ctx)
	lost := make(chan int, 1)
	var gtids []string
	err := coord.Run(ctx, func(ctx context.Context, tx *cotx.Tx) error {
		b, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", "")
		if err != nil {
			return err
		}
		g, err := tx.GTID(ctx)
		if err != nil {
			return err
		}
		gtids = append(gtids, g)
		if _, err := pc.ExecContext(ctx, "INSERT INTO savings VALUES ($1, 1, '')", pre+"0"); err != nil {
			return b.Fail(err)
		}
		go func() { lost <- lose() }()
		return nil
	}, cotx.Retries(2))
	if pid := <-lost; pid == 0 {
		t.Fatal("the one-phase COMMIT never waited")
	}
	var ou *cotx.OutcomeUnknownError
	if !errors.As(err, &ou) || !strings.Contains(err.Error(), "lost during the one-phase COMMIT") || len(gtids) != 1 {
		t.Fatalf("want an OutcomeUnknownError naming the lost session, run once; got %v after %d runs", err, len(gtids))
	}
	if pg, _ := present(t, pre+"0"); !pg {
		t.Fatal("the row did not commit: the test held nothing")
	}
	got, err := coord.Get(ctx, gtids[0])
	if err != nil {
		t.Fatal(err)
	}
	if got["abort_reason"] != nil || got["decision"] == "abort" {
		t.Fatalf("the daemon recorded an abort: %v", got)
	}
}
