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

	"github.com/jackc/pgx/v5/pgconn"
)

// Client mode: servers without pg_co and mysql_co, as a managed database gives them
// (scripts/test-go.sh starts a second pair: BARE_PG_PORT, BARE_MY_PORT), and the daemon's
// `enforcement` per resource. The overdraft twice on them, with SERIALIZABLE branches both
// times: plain 2PC (enforcement = "none") overdraws; client mode never does (PostgreSQL's
// SSI refuses against the daemon's prepared helper, InnoDB keeps the read locks of a branch
// that wrote its slot), the refused withdrawal is retried and declined. Then what a branch
// does differently in client mode: its slot written before it prepares (alone, before its
// one-phase commit), a branch that is not SERIALIZABLE refused before it runs.

var bare struct {
	pg, my         *sql.DB
	pgPort, myPort string
	err            error
}

func setUpBare() {
	bare.pgPort, bare.myPort = os.Getenv("BARE_PG_PORT"), os.Getenv("BARE_MY_PORT")
	if bare.pgPort == "" || bare.myPort == "" {
		bare.err = errors.New("BARE_PG_PORT / BARE_MY_PORT not set: run scripts/test-go.sh (it starts servers without pg_co / mysql_co too)")
		return
	}
	bare.pg, bare.err = sql.Open("pgx", fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", bare.pgPort))
	if bare.err == nil {
		bare.my, bare.err = sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%s)/test", bare.myPort))
	}
	if bare.err == nil {
		bare.err = createTables(bare.pg, bare.my)
	}
}

// bareDaemon starts a daemon over the servers without extensions, both resources at
// enforcement, for this test only: it stops once nothing is prepared there any more (no
// branch, no helper).
func bareDaemon(t *testing.T, enforcement string) *cotx.Coordinator {
	t.Helper()
	c, _ := bareDaemonProcess(t, enforcement)
	return c
}

// bareDaemonProcess: bareDaemon, and the daemon itself (its metrics).
func bareDaemonProcess(t *testing.T, enforcement string) (*cotx.Coordinator, *daemon) {
	t.Helper()
	if bare.err != nil {
		t.Fatal(bare.err)
	}
	d, err := startDaemon(bankResources(bare.pgPort, bare.myPort, enforcement))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		waitSettled(t)
		d.stop()
	})
	return readyClient(t, d, enforcement), d
}

// readyClient waits until both resources are in mode enforcement (the daemon probes them,
// and creates the shim's objects, at start and again while they are not), then returns a
// client of d.
func readyClient(t *testing.T, d *daemon, enforcement string) *cotx.Coordinator {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		m, err := d.modes()
		if err == nil && m["savings"] == enforcement && m["checking"] == enforcement {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resources are not in %s mode after 15 s: %v %v", enforcement, m, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c, err := cotx.New(d.url, d.token)
	if err != nil {
		t.Fatal(err)
	}
	c.DecisionTimeout = 60 * time.Second
	return c
}

func waitSettled(t *testing.T) {
	t.Helper()
	waitNothingPreparedOn(t, bare.pg, bare.my, 15*time.Second)
}

// waitNothingPreparedOn waits until nothing is prepared on the two servers (branches, or
// client mode's helpers): participants are finished in the background, by their owners or
// the daemon's recovery. Fails the test after `within`.
func waitNothingPreparedOn(t *testing.T, pgDB, myDB *sql.DB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		pg, my := preparedOn(t, pgDB, myDB)
		if pg+my == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still prepared after %v: PostgreSQL %d, MariaDB %d (branches or helpers)", within, pg, my)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestClientModeOverdraftEnforcementNone(t *testing.T) {
	coord := bareDaemon(t, cotx.EnforcementNone)
	b, tx := openBranch(t, coord, bare.pg, cotx.Postgres, "savings")
	if b.Enforcement != cotx.EnforcementNone || b.ShimKey != 0 {
		t.Errorf("enforcement %q, slot %d: want none and no slot", b.Enforcement, b.ShimKey)
	}
	tx.Rollback(context.Background(), "")
	st := overdraft(t, overdraftRun{mode: "none", pg: bare.pg, my: bare.my, coord: coord})
	if st.negative == 0 {
		t.Errorf("plain 2PC should overdraw at least once, SERIALIZABLE branches or not: %+v", st)
	}
}

func TestClientModeOverdraft(t *testing.T) {
	coord := bareDaemon(t, cotx.EnforcementClient)
	st := overdraft(t, overdraftRun{mode: "client", pg: bare.pg, my: bare.my, coord: coord})
	if st.negative != 0 {
		t.Errorf("in client mode no round may end below 0: %+v", st)
	}
	if st.withdrawn == 0 || st.refusals == 0 {
		t.Errorf("expected withdrawals and refusals (retried): %+v", st)
	}
}

// openBranch: a new root transaction with one branch on a fresh session of db.
func openBranch(t *testing.T, coord *cotx.Coordinator, db *sql.DB, kind cotx.Kind, resource string, opts ...cotx.BranchOption) (*cotx.Branch, *cotx.Tx) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	tx := coord.Transaction(0)
	b, err := tx.Branch(ctx, conn, kind, resource, "", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b, tx
}

func TestClientModeBranches(t *testing.T) {
	coord, d := bareDaemonProcess(t, cotx.EnforcementClient)
	ctx := context.Background()
	mustExec(t, bare.pg, "INSERT INTO savings VALUES ('go-cm', 10, '')")
	mustExec(t, bare.my, "INSERT INTO checking VALUES ('go-cm', 10, '')")
	slot := map[cotx.Kind]string{cotx.Postgres: "SELECT v FROM cotx.shim WHERE k = $1", cotx.MariaDB: "SELECT v FROM cotx_shim WHERE k = ?"}
	update := map[cotx.Kind]string{cotx.Postgres: "UPDATE savings SET bal = bal + 1 WHERE u = 'go-cm'",
		cotx.MariaDB: "UPDATE checking SET bal = bal + 1 WHERE u = 'go-cm'"}
	dbs := map[cotx.Kind]*sql.DB{cotx.Postgres: bare.pg, cotx.MariaDB: bare.my}
	names := map[cotx.Kind]string{cotx.Postgres: "savings", cotx.MariaDB: "checking"}

	t.Run("alone it commits in one phase, its slot written first", func(t *testing.T) {
		for _, kind := range []cotx.Kind{cotx.Postgres, cotx.MariaDB} {
			b, tx := openBranch(t, coord, dbs[kind], kind, names[kind])
			if b.Enforcement != cotx.EnforcementClient || b.ShimKey < 1 {
				t.Fatalf("%s: enforcement %q, slot %d: want client and a slot", kind, b.Enforcement, b.ShimKey)
			}
			var before, after int64
			if err := dbs[kind].QueryRow(slot[kind], b.ShimKey).Scan(&before); err != nil {
				t.Fatal(err)
			}
			if kind == cotx.MariaDB {
				var level string
				if err := b.Conn.QueryRowContext(ctx, "SELECT @@session.tx_isolation").Scan(&level); err != nil || level != "SERIALIZABLE" {
					t.Fatalf("MariaDB session at %q (%v), want SERIALIZABLE", level, err)
				}
			}
			if _, err := b.Conn.ExecContext(ctx, update[kind]); err != nil {
				t.Fatal(err)
			}
			onePhase := `cotx_transactions_total{outcome="one_phase"}`
			counted := metricOf(t, d, onePhase)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := dbs[kind].QueryRow(slot[kind], b.ShimKey).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if now := metricOf(t, d, onePhase); now != counted+1 || after != before+1 {
				t.Errorf("%s: one-phase commits %v -> %v (want one more), slot %d -> %d (want written once)", kind, counted, now, before, after)
			}
		}
		var sb, cb int
		_ = bare.pg.QueryRow("SELECT bal FROM savings WHERE u = 'go-cm'").Scan(&sb)
		_ = bare.my.QueryRow("SELECT bal FROM checking WHERE u = 'go-cm'").Scan(&cb)
		if sb != 11 || cb != 11 {
			t.Errorf("balances %d / %d, want 11 / 11", sb, cb)
		}
	})

	t.Run("MariaDB: a connection is checked once, every branch still SERIALIZABLE", func(t *testing.T) {
		conn, err := bare.my.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// run: one branch on conn; returns its transaction's isolation as InnoDB has it.
		run := func() (string, error) {
			tx := coord.Transaction(0)
			b, err := tx.Branch(ctx, conn, cotx.MariaDB, "checking", "")
			if err != nil {
				return "", err
			}
			if _, err := b.Conn.ExecContext(ctx, update[cotx.MariaDB]); err != nil {
				return "", b.Fail(err)
			}
			var level string
			if err := b.Conn.QueryRowContext(ctx, "SELECT trx_isolation_level FROM information_schema.INNODB_TRX "+
				"WHERE trx_mysql_thread_id = CONNECTION_ID()").Scan(&level); err != nil {
				return "", b.Fail(err)
			}
			return level, tx.Commit(ctx)
		}
		if level, err := run(); err != nil || level != "SERIALIZABLE" {
			t.Fatalf("first branch: %q %v", level, err)
		}
		// The application (or a pool's reset) sets the session's level: not checked
		// again, but the branch's own transaction is still SERIALIZABLE.
		mustConnExec(t, conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
		if level, err := run(); err != nil || level != "SERIALIZABLE" {
			t.Fatalf("after SET SESSION ... READ COMMITTED: the branch ran at %q (%v), want SERIALIZABLE", level, err)
		}
		// A session the check was not made in (here: its variable cleared, as a reset
		// does): the branch cannot prepare, retryably; the next one checks again.
		mustConnExec(t, conn, "SET @cotx_started = 12345")
		_, err = run()
		var ae *cotx.AbortedError
		if !errors.Is(err, cotx.ErrSessionNotChecked) || !errors.As(err, &ae) || !ae.Retryable {
			t.Fatalf("want a retryable ErrSessionNotChecked, got %v", err)
		}
		if level, err := run(); err != nil || level != "SERIALIZABLE" {
			t.Fatalf("checked again: %q %v", level, err)
		}
	})

	t.Run("not SERIALIZABLE is refused before it runs", func(t *testing.T) {
		for _, kind := range []cotx.Kind{cotx.Postgres, cotx.MariaDB} {
			conn, err := dbs[kind].Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tx := coord.Transaction(0)
			_, err = tx.Branch(ctx, conn, kind, names[kind], "", cotx.WithIsolation(cotx.RepeatableRead))
			if !errors.Is(err, cotx.ErrClientModeIsolation) || !strings.Contains(err.Error(), `resource "`+names[kind]+`" runs in client mode`) {
				t.Errorf("%s: want ErrClientModeIsolation naming the resource, got %v", kind, err)
			} else {
				t.Logf("told the application: %v", err)
			}
			tx.Rollback(ctx, "")
			// Nothing ran: the session is not inside a transaction.
			if kind == cotx.Postgres {
				// Refused outside a transaction block (25P01), accepted inside one.
				_, err = conn.ExecContext(ctx, "SAVEPOINT go_cm_probe")
				var pe *pgconn.PgError
				if err == nil {
					err = errors.New("the session is inside a transaction")
				} else if errors.As(err, &pe) && pe.Code == "25P01" {
					err = nil
				}
			} else {
				_, err = conn.ExecContext(ctx, "XA START 'go-cm-probe'")
				if err == nil {
					_, err = conn.ExecContext(ctx, "XA END 'go-cm-probe'")
					if err == nil {
						_, err = conn.ExecContext(ctx, "XA ROLLBACK 'go-cm-probe'")
					}
				}
			}
			if err != nil {
				t.Errorf("%s: the refused branch's session: %v", kind, err)
			}
			conn.Close()
		}
	})
}

func mustConnExec(t *testing.T, conn *sql.Conn, q string) {
	t.Helper()
	if _, err := conn.ExecContext(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}
