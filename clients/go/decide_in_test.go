package cotx_test

import (
	"context"
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

func TestDecisionInParticipant(t *testing.T) {
	for _, p := range dipPaths {
		t.Run(p.name, func(t *testing.T) {
			d, coord := dipDaemon(t, "g-dip-"+p.name[:3], true, p.oneRequest)
			pre := "go-dip-" + p.name + "-"
			clearKeys(t, pre)
			ctx := context.Background()
			pc, mc := bothConns(t, ctx)
			// The first transaction learns the resources' modes (on the one-request path
			// from its registrations: a begin).
			if err := transferOne(ctx, coord, pc, mc, pre+"first"); err != nil {
				t.Fatal(err)
			}
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
			_, coord := dipDaemon(t, "g-dipn-"+p.name[:3], false, p.oneRequest)
			pre := "go-dip-none-" + p.name + "-"
			clearKeys(t, pre)
			ctx := context.Background()
			pc, mc := bothConns(t, ctx)
			if err := transferOne(ctx, coord, pc, mc, pre+"first"); err != nil {
				t.Fatal(err)
			}
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
