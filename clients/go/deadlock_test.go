package cotx_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	cotx "cotx.io/client"
)

// A deadlock across databases through the Go client: T1 updates a row on PostgreSQL then
// one on MariaDB, T2 the same rows in the other order. Neither engine sees the cycle; the
// daemon does, because each branch's registration carries its session (sessions.go), and
// aborts the younger (T2) in about a second: T1 commits. Without the sessions the pair
// waited for MariaDB's lock wait timeout (10 s on the suite's servers, 50 s by default)
// and then lost a transaction to it.

// crossedStep: one global transaction's two updates, the second after `go` is closed.
func crossedStep(ctx context.Context, coord *cotx.Coordinator, first, second func(*sql.Conn) error,
	firstKind, secondKind cotx.Kind, firstRes, secondRes string, started chan<- struct{}, goOn <-chan struct{}) (err error) {
	conns := map[cotx.Kind]*sql.Conn{}
	for _, k := range []cotx.Kind{cotx.Postgres, cotx.MariaDB} {
		db := env.pg
		if k == cotx.MariaDB {
			db = env.my
		}
		c, cerr := db.Conn(ctx)
		if cerr != nil {
			return cerr
		}
		defer c.Close()
		conns[k] = c
	}
	tx := coord.Transaction(0)
	step := func(kind cotx.Kind, res string, f func(*sql.Conn) error) error {
		b, err := tx.Branch(ctx, conns[kind], kind, res, "")
		if err != nil {
			return err
		}
		if err := f(conns[kind]); err != nil {
			return b.Fail(err)
		}
		return nil
	}
	if err = step(firstKind, firstRes, first); err != nil {
		return err
	}
	close(started)
	<-goOn
	if err = step(secondKind, secondRes, second); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func TestDeadlockAcrossDatabasesIsBroken(t *testing.T) {
	needServers(t)
	waitEngines(t)
	ctx := context.Background()
	mustExec(t, env.pg, "CREATE TABLE IF NOT EXISTS dl_go(k text PRIMARY KEY, v int NOT NULL)")
	mustExec(t, env.my, "CREATE TABLE IF NOT EXISTS dl_go(k varchar(16) PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
	mustExec(t, env.pg, "DELETE FROM dl_go")
	mustExec(t, env.my, "DELETE FROM dl_go")
	mustExec(t, env.pg, "INSERT INTO dl_go VALUES ('a', 0)")
	mustExec(t, env.my, "INSERT INTO dl_go VALUES ('b', 0)")
	upd := func(kind cotx.Kind) func(*sql.Conn) error {
		q := "UPDATE dl_go SET v = v + 1 WHERE k = 'a'"
		if kind == cotx.MariaDB {
			q = "UPDATE dl_go SET v = v + 1 WHERE k = 'b'"
		}
		return func(c *sql.Conn) error { _, err := c.ExecContext(ctx, q); return err }
	}
	goOn := make(chan struct{})
	var goAt time.Time // set before goOn is closed: read by each after its second step
	errs, took := make([]error, 2), make([]time.Duration, 2)
	var wg sync.WaitGroup
	orders := [][2]cotx.Kind{{cotx.Postgres, cotx.MariaDB}, {cotx.MariaDB, cotx.Postgres}}
	res := map[cotx.Kind]string{cotx.Postgres: "savings", cotx.MariaDB: "checking"}
	for i, o := range orders {
		started := make(chan struct{})
		wg.Add(1)
		go func(i int, o [2]cotx.Kind) {
			defer wg.Done()
			errs[i] = crossedStep(ctx, env.coord, upd(o[0]), upd(o[1]), o[0], o[1], res[o[0]], res[o[1]], started, goOn)
			took[i] = time.Since(goAt)
		}(i, o)
		select {
		case <-started:
		case <-time.After(15 * time.Second):
			t.Fatalf("T%d did not take its first lock", i+1)
		}
	}
	goAt = time.Now()
	close(goOn)
	wg.Wait()
	t.Logf("T1: %v after %v; T2: %v after %v", errs[0], took[0], errs[1], took[1])
	if errs[0] != nil {
		t.Fatalf("T1 (the older) did not commit: %v", errs[0])
	}
	if errs[1] == nil || !cotx.IsRetryable(errs[1]) {
		t.Fatalf("T2 (the younger) was not the retryable victim: %v", errs[1])
	}
	// The engines' limits on the suite's servers are 10 s: a cycle left to them fails this.
	if took[1] > 8*time.Second {
		t.Fatalf("the cycle lasted %v: not broken by the daemon", took[1])
	}
	var a, b int
	if err := env.pg.QueryRow("SELECT v FROM dl_go WHERE k = 'a'").Scan(&a); err != nil {
		t.Fatal(err)
	}
	if err := env.my.QueryRow("SELECT v FROM dl_go WHERE k = 'b'").Scan(&b); err != nil {
		t.Fatal(err)
	}
	if a != 1 || b != 1 {
		t.Fatalf("rows a=%d b=%d, want T1's updates only (1, 1)", a, b)
	}
	if pg, my := preparedLeft(t); pg+my != 0 {
		t.Fatalf("left prepared: %d on PostgreSQL, %d on MariaDB", pg, my)
	}
}
