package cotx_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cotx "cotx.io/client"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// The overdraft (demo/overdraft.py in Go) on real servers and the real daemon: savings on
// PostgreSQL, checking on MariaDB, each owned by a service; a withdrawal is one global
// transaction rooted at the service debiting its account, which asks the other service
// for its balance over HTTP, propagating the gtid (the other service joins). Two
// withdrawals of 80 from 50 + 50 run at once. Checks off (pg_co.enabled = off,
// mysql_co_enabled = OFF, MariaDB branches REPEATABLE READ): the total goes negative.
// Checks on: never; refused prepares are retried and the second withdrawal is declined.
// Both modes: nothing stays prepared, and what the client told the application
// ("committed" / aborted) is what the databases did. clientmode_test.go runs the same
// overdraft on servers without pg_co and mysql_co: plain 2PC, then client mode.

const (
	start  = 50
	amount = 80
)

var env struct {
	pg, my *sql.DB
	d      *daemon
	coord  *cotx.Coordinator
	err    error
}

func TestMain(m *testing.M) {
	pgPort, myPort := os.Getenv("PG_PORT"), os.Getenv("MY_PORT")
	if pgPort == "" || myPort == "" {
		env.err = errors.New("PG_PORT / MY_PORT not set: run scripts/test-go.sh (it starts the servers)")
		os.Exit(m.Run())
	}
	env.pg, env.err = sql.Open("pgx", fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", pgPort))
	if env.err == nil {
		env.my, env.err = sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%s)/test", myPort))
	}
	if env.err == nil {
		env.d, env.err = startDaemon(bankResources(pgPort, myPort, ""))
	}
	if env.err == nil {
		env.coord, env.err = cotx.New(env.d.url, env.d.token)
	}
	if env.err == nil {
		env.coord.DecisionTimeout = 60 * time.Second
		env.err = createTables(env.pg, env.my)
	}
	setUpBare()
	code := m.Run()
	if env.d != nil {
		env.d.stop()
	}
	os.Exit(code)
}

// bankResources: the daemon's savings (PostgreSQL) and checking (MariaDB) on those ports;
// enforcement "" is the daemon's default (auto).
func bankResources(pgPort, myPort, enforcement string) []resource {
	return []resource{
		{"savings", "postgres", fmt.Sprintf("host=127.0.0.1 port=%s user=postgres dbname=postgres", pgPort), enforcement},
		{"checking", "mariadb", fmt.Sprintf("mysql://root@127.0.0.1:%s/test", myPort), enforcement},
	}
}

func createTables(pg, my *sql.DB) error {
	if _, err := pg.Exec("CREATE TABLE IF NOT EXISTS savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')"); err != nil {
		return err
	}
	_, err := my.Exec("CREATE TABLE IF NOT EXISTS checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, log text NOT NULL) ENGINE=InnoDB")
	return err
}

func needServers(t *testing.T) {
	t.Helper()
	if env.err != nil {
		t.Fatal(env.err)
	}
}

// service is one bank service: its own database, its coordinator client, its peer.
type service struct {
	name, peer string
	kind       cotx.Kind
	db         *sql.DB
	coord      *cotx.Coordinator
	peerURL    string
	client     *http.Client
}

func (s *service) table() string { return s.name }

func (s *service) branch(ctx context.Context, tx *cotx.Tx, conn *sql.Conn, mariaRR bool) (*cotx.Branch, error) {
	if s.kind == cotx.MariaDB && mariaRR {
		// Plain 2PC as usually deployed: MariaDB branches at REPEATABLE READ.
		return tx.Branch(ctx, conn, s.kind, s.name, "", cotx.WithIsolation(cotx.RepeatableRead))
	}
	return tx.Branch(ctx, conn, s.kind, s.name, "")
}

func (s *service) readRow(ctx context.Context, conn *sql.Conn, user string) (int, string, error) {
	var bal int
	var log string
	q := "SELECT bal, log FROM " + s.table() + " WHERE u = $1"
	if s.kind == cotx.MariaDB {
		q = "SELECT bal, log FROM " + s.table() + " WHERE u = ?"
	}
	err := conn.QueryRowContext(ctx, q, user).Scan(&bal, &log)
	return bal, log, err
}

// handleRead is the participant: join the gtid of the request, read the balance in a
// branch, prepare, answer; the decision is awaited and the branch finished in the
// background, on the same session, which is closed only then.
func (s *service) handleRead(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	gtid := cotx.GTIDFromContext(ctx)
	user := r.URL.Query().Get("user")
	mariaRR := r.URL.Query().Get("rr") == "1"
	conn, err := s.db.Conn(ctx)
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	tx := s.coord.Join(gtid)
	fail := func(err error) {
		conn.Close()
		code := 500
		if cotx.IsRetryable(err) {
			code = 409
		}
		http.Error(w, err.Error(), code)
	}
	b, err := s.branch(ctx, tx, conn, mariaRR)
	if err != nil {
		fail(err)
		return
	}
	bal, _, err := s.readRow(ctx, conn, user)
	if err != nil {
		fail(b.Fail(err))
		return
	}
	if err := tx.Prepare(ctx); err != nil {
		fail(err)
		return
	}
	go func() {
		defer conn.Close()
		_ = tx.Finish(context.Background()) // the coordinator finishes what we could not
	}()
	_ = json.NewEncoder(w).Encode(map[string]int{"balance": bal})
}

// lineup lets n withdrawals meet between their reads and their writes.
type lineup struct {
	arrived sync.WaitGroup
	all     chan struct{}
}

func newLineup(n int) *lineup {
	l := &lineup{all: make(chan struct{})}
	l.arrived.Add(n)
	go func() { l.arrived.Wait(); close(l.all) }()
	return l
}

// side: arriveAndWait for the first attempt's hook, leave (idempotent) when it is over.
func (l *lineup) side() (arriveAndWait func(), leave func()) {
	var once sync.Once
	leave = func() { once.Do(l.arrived.Done) }
	return func() {
		leave()
		select {
		case <-l.all:
		case <-time.After(5 * time.Second):
		}
	}, leave
}

type attempt struct {
	tid     string
	told    string // committed, aborted, declined, error
	refused bool
	err     error
}

type result struct {
	outcome  string // withdrawn, declined, gave_up, failed
	attempts []attempt
}

var errDeclined = errors.New("declined")

// withdraw is the root: up to 5 attempts, retrying when cotx.IsRetryable.
func (s *service) withdraw(user, tag string, mariaRR bool, lu *lineup) result {
	var res result
	wait, leave := lu.side()
	defer leave()
	for i := 1; i <= 5; i++ {
		a := s.once(user, fmt.Sprintf("%s.%d", tag, i), mariaRR, wait)
		wait = nil
		leave()
		res.attempts = append(res.attempts, a)
		switch {
		case a.told == "committed":
			res.outcome = "withdrawn"
			return res
		case a.told == "declined":
			res.outcome = "declined"
			return res
		case !cotx.IsRetryable(a.err):
			res.outcome = "failed"
			return res
		}
	}
	res.outcome = "gave_up"
	return res
}

func (s *service) once(user, tid string, mariaRR bool, afterReads func()) attempt {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return attempt{tid: tid, told: "error", err: err}
	}
	defer conn.Close() // only after Commit returned
	tx := s.coord.Transaction(0)
	b, err := s.branch(ctx, tx, conn, mariaRR)
	if err != nil {
		return attempt{tid: tid, told: "error", err: err}
	}
	mine, _, err := s.readRow(ctx, conn, user)
	if err != nil {
		return attempt{tid: tid, told: "aborted", err: b.Fail(err)}
	}
	gtid, err := tx.GTID(ctx)
	if err != nil {
		tx.Rollback(ctx, "")
		return attempt{tid: tid, told: "error", err: err}
	}
	peer, err := s.askPeer(cotx.WithGTID(ctx, gtid), user, mariaRR)
	if err != nil {
		tx.Rollback(ctx, "peer: "+err.Error())
		return attempt{tid: tid, told: "aborted", err: err}
	}
	if afterReads != nil {
		afterReads()
	}
	if mine+peer-amount < 0 {
		tx.Rollback(ctx, "declined")
		return attempt{tid: tid, told: "declined", err: errDeclined}
	}
	upd := "UPDATE " + s.table() + " SET bal = bal - $1, log = log || ' ' || $2 WHERE u = $3"
	if s.kind == cotx.MariaDB {
		upd = "UPDATE " + s.table() + " SET bal = bal - ?, log = CONCAT(log, ' ', ?) WHERE u = ?"
	}
	if _, err := conn.ExecContext(ctx, upd, amount, tid, user); err != nil {
		return attempt{tid: tid, told: "aborted", err: b.Fail(err)}
	}
	if err := tx.Commit(ctx); err != nil {
		var ab *cotx.AbortedError
		if errors.As(err, &ab) {
			return attempt{tid: tid, told: "aborted", refused: cotx.IsRefused(err), err: err}
		}
		return attempt{tid: tid, told: "error", err: err}
	}
	return attempt{tid: tid, told: "committed"}
}

type retryableHTTP struct{ msg string }

func (e *retryableHTTP) Error() string { return e.msg }

func (s *service) askPeer(ctx context.Context, user string, mariaRR bool) (int, error) {
	rr := "0"
	if mariaRR {
		rr = "1"
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", s.peerURL+"/read?user="+user+"&rr="+rr, nil)
	resp, err := s.client.Do(req) // cotx.Transport adds the gtid header from ctx
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == 409 {
		// The peer's branch was refused or conflicted: as retryable as our own.
		return 0, &cotx.AbortedError{Reason: "peer refused", Retryable: true}
	}
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("peer answered %s", resp.Status)
	}
	var r struct {
		Balance int `json:"balance"`
	}
	err = json.NewDecoder(resp.Body).Decode(&r)
	return r.Balance, err
}

func setChecks(t *testing.T, on bool) {
	t.Helper()
	v, m := "off", "OFF"
	if on {
		v, m = "on", "ON"
	}
	mustExec(t, env.pg, "ALTER SYSTEM SET pg_co.enabled = "+v)
	mustExec(t, env.pg, "SELECT pg_reload_conf()")
	mustExec(t, env.my, "SET GLOBAL mysql_co_enabled = "+m)
	// The reload reaches sessions asynchronously: wait until a new session sees it.
	for i := 0; i < 200; i++ {
		conn, err := env.pg.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = conn.QueryRowContext(context.Background(), "SHOW pg_co.enabled").Scan(&got)
		conn.Close()
		if err == nil && got == v {
			if on {
				waitEngines(t)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("pg_co.enabled did not change")
}

// bothConns: a PostgreSQL and a MariaDB session of the test's, closed when it ends.
func bothConns(t *testing.T, ctx context.Context) (*sql.Conn, *sql.Conn) {
	t.Helper()
	pc, err := env.pg.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	mc, err := env.my.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	return pc, mc
}

// waitEngines waits until the shared daemon (enforcement auto) says both resources are in
// engine mode again. It probes them at every recovery pass (500 ms): a pass while checks
// were off put them in client mode, and a test that registers its branches before the
// next pass would run in client mode, not the engine mode it tests.
func waitEngines(t *testing.T) {
	t.Helper()
	if env.d == nil {
		return
	}
	var m map[string]string
	var err error
	for i := 0; i < 200; i++ {
		if m, err = env.d.modes(); err == nil && m["savings"] == "engine" && m["checking"] == "engine" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the daemon does not see the engines enforce again: %v %v", m, err)
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...interface{}) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func preparedLeft(t *testing.T) (pg, my int) {
	t.Helper()
	return preparedOn(t, env.pg, env.my)
}

// preparedOn: transactions prepared on the two servers (pg_prepared_xacts, XA RECOVER):
// branches, and in client mode the daemon's helpers too.
func preparedOn(t *testing.T, pgDB, myDB *sql.DB) (pg, my int) {
	t.Helper()
	if err := pgDB.QueryRow("SELECT count(*) FROM pg_prepared_xacts").Scan(&pg); err != nil {
		t.Fatal(err)
	}
	rows, err := myDB.Query("XA RECOVER")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		my++
	}
	rows.Close()
	return pg, my
}

type stats struct {
	negative, withdrawn, declined, refusals, gaveUp, failed int
	toldCommittedRolledBack, toldAbortedCommitted           int
	preparedPG, preparedMy                                  int
	notes                                                   []string
}

// overdraftRun: where and how the overdraft runs.
type overdraftRun struct {
	mode    string // off, on (pg_co / mysql_co), none, client (servers without them): in logs and user names
	pg, my  *sql.DB
	coord   *cotx.Coordinator
	mariaRR bool // MariaDB branches REPEATABLE READ (plain 2PC as usually deployed)
}

// label: "checks on" (pg_co / mysql_co), "enforcement client" (the daemon's, no extension).
func (r overdraftRun) label() string {
	if r.mode == "off" || r.mode == "on" {
		return "checks " + r.mode
	}
	return "enforcement " + r.mode
}

// engineServersDaemon starts a daemon of the test's own over the servers with pg_co and
// mysql_co, both resources at enforcement, under a node id of its own (the shared daemon
// leaves its branches alone, and it those of the shared one); it stops when the test ends.
func engineServersDaemon(t *testing.T, enforcement string) *cotx.Coordinator {
	t.Helper()
	d, err := startDaemonAs(bankResources(os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), enforcement), "g-"+enforcement, 2000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	return readyClient(t, d, enforcement)
}

func overdraft(t *testing.T, run overdraftRun) stats {
	mode, label := run.mode, run.label()
	rounds := 6
	if v, err := strconv.Atoi(os.Getenv("GO_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	savings := &service{name: "savings", peer: "checking", kind: cotx.Postgres, db: run.pg, coord: run.coord,
		client: &http.Client{Transport: &cotx.Transport{}}}
	checking := &service{name: "checking", peer: "savings", kind: cotx.MariaDB, db: run.my, coord: run.coord,
		client: &http.Client{Transport: &cotx.Transport{}}}
	for _, s := range []*service{savings, checking} {
		mux := http.NewServeMux()
		mux.HandleFunc("/read", s.handleRead)
		srv := httptest.NewServer(cotx.Middleware(mux))
		defer srv.Close()
		if s == savings {
			checking.peerURL = srv.URL
		} else {
			savings.peerURL = srv.URL
		}
	}
	var st stats
	for r := 1; r <= rounds; r++ {
		user := fmt.Sprintf("go-%s-u%d", mode, r)
		// A run again on the same servers (-count=N, a second suite) starts the user afresh.
		mustExec(t, run.pg, "DELETE FROM savings WHERE u = $1", user)
		mustExec(t, run.my, "DELETE FROM checking WHERE u = ?", user)
		mustExec(t, run.pg, "INSERT INTO savings VALUES ($1, $2, '')", user, start)
		mustExec(t, run.my, "INSERT INTO checking VALUES (?, ?, '')", user, start)
		// Both withdrawals read both balances before either writes: the race the overdraft
		// needs, made certain instead of left to timing. An attempt that ends before its
		// reads are done (a refused peer) leaves the line-up; a side stuck in a lock wait
		// lets the other go on after 5 s.
		lu := newLineup(2)
		t0 := time.Now()
		results := make([]result, 2)
		var wg sync.WaitGroup
		for i, s := range []*service{savings, checking} {
			wg.Add(1)
			go func(i int, s *service) {
				defer wg.Done()
				results[i] = s.withdraw(user, fmt.Sprintf("%s-r%d-%s", mode, r, s.name[:1]), run.mariaRR, lu)
			}(i, s)
		}
		wg.Wait()
		// Participants finish in the background: wait until nothing is prepared any more.
		deadline := time.Now().Add(30 * time.Second)
		for {
			pg, my := preparedOn(t, run.pg, run.my)
			if (pg == 0 && my == 0) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		var sb, cb int
		var slog, clog string
		if err := run.pg.QueryRow("SELECT bal, log FROM savings WHERE u = $1", user).Scan(&sb, &slog); err != nil {
			t.Fatal(err)
		}
		if err := run.my.QueryRow("SELECT bal, log FROM checking WHERE u = ?", user).Scan(&cb, &clog); err != nil {
			t.Fatal(err)
		}
		inDB := map[string]bool{}
		for _, tid := range strings.Fields(slog + " " + clog) {
			inDB[tid] = true
		}
		if sb+cb < 0 {
			st.negative++
		}
		line := ""
		for i, res := range results {
			switch res.outcome {
			case "withdrawn":
				st.withdrawn++
			case "declined":
				st.declined++
			case "gave_up":
				st.gaveUp++
			default:
				st.failed++
			}
			for _, a := range res.attempts {
				if a.refused || (a.told == "aborted" && cotx.IsRetryable(a.err)) {
					st.refusals++
				}
				if a.told == "committed" && !inDB[a.tid] {
					st.toldCommittedRolledBack++
				}
				if a.told != "committed" && inDB[a.tid] {
					st.toldAbortedCommitted++
				}
				if a.told == "error" || (a.told == "aborted" && !cotx.IsRetryable(a.err)) {
					st.notes = append(st.notes, fmt.Sprintf("%s: %v", a.tid, a.err))
				}
				if r == 1 && a.refused {
					t.Logf("[%s] refusal told to the application: %v", label, a.err)
				}
			}
			line += fmt.Sprintf(" %s=%s(%d attempt(s))", []string{"savings", "checking"}[i], res.outcome, len(res.attempts))
		}
		t.Logf("[%s] round %d: savings %d + checking %d = %d;%s [%.1f s]", label, r, sb, cb, sb+cb, line, time.Since(t0).Seconds())
	}
	st.preparedPG, st.preparedMy = preparedOn(t, run.pg, run.my)
	t.Logf("[%s] %+v", label, st)
	if st.toldCommittedRolledBack != 0 || st.toldAbortedCommitted != 0 {
		t.Errorf("the client's answer differs from the databases: %+v", st)
	}
	if st.preparedPG != 0 || st.preparedMy != 0 {
		t.Errorf("prepared transactions left: %+v", st)
	}
	if st.failed != 0 {
		t.Errorf("failed withdrawals: %v", st.notes)
	}
	return st
}

// TestOverdraftChecksOff is plain 2PC on the servers with pg_co and mysql_co switched off,
// through a daemon of its own at enforcement "none". Not the shared daemon: it runs its
// resources at auto and probes them every recovery pass (500 ms); a pass while the checks
// are off moves them to client mode, which refuses this test's REPEATABLE READ branches
// (round 6 once failed so, with "peer answered 500"). At "none" nothing is probed, so the
// baseline cannot change mode under the test, however long its rounds take (GO_ROUNDS).
func TestOverdraftChecksOff(t *testing.T) {
	needServers(t)
	coord := engineServersDaemon(t, "none")
	setChecks(t, false)
	// Checks back on whatever happens here: the tests after this one expect the engines.
	t.Cleanup(func() { setChecks(t, true) })
	st := overdraft(t, overdraftRun{mode: "off", pg: env.pg, my: env.my, coord: coord, mariaRR: true})
	if st.negative == 0 {
		t.Errorf("plain 2PC should overdraw at least once: %+v", st)
	}
}

func TestOverdraftChecksOn(t *testing.T) {
	needServers(t)
	setChecks(t, true)
	st := overdraft(t, overdraftRun{mode: "on", pg: env.pg, my: env.my, coord: env.coord})
	if st.negative != 0 {
		t.Errorf("with pg_co and mysql_co no round may end below 0: %+v", st)
	}
	if st.withdrawn == 0 || st.refusals == 0 {
		t.Errorf("expected withdrawals and engine refusals (retried): %+v", st)
	}
}

// A branch alone in its global transaction commits in one phase: no prepare, no record.
func TestOnePhase(t *testing.T) {
	needServers(t)
	setChecks(t, true)
	ctx := context.Background()
	mustExec(t, env.pg, "INSERT INTO savings VALUES ('go-1pc', 10, '')")
	conn, err := env.pg.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx := env.coord.Transaction(0)
	b, err := tx.Branch(ctx, conn, cotx.Postgres, "savings", "")
	if err != nil {
		t.Fatal(err)
	}
	if b.Enforcement != cotx.EnforcementEngine || b.ShimKey != 0 {
		t.Errorf("enforcement %q, slot %d: want engine (pg_co) and no slot", b.Enforcement, b.ShimKey)
	}
	if _, err := conn.ExecContext(ctx, "UPDATE savings SET bal = bal + 1 WHERE u = 'go-1pc'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	gtid, _ := tx.GTID(ctx)
	info, err := env.coord.Get(ctx, gtid)
	if err != nil {
		t.Fatal(err)
	}
	var bal int
	if err := env.pg.QueryRow("SELECT bal FROM savings WHERE u = 'go-1pc'").Scan(&bal); err != nil || bal != 11 {
		t.Fatalf("balance %d (%v), want 11", bal, err)
	}
	if info["decision"] != "one_phase" && info["state"] != "committed" {
		t.Logf("coordinator view: %v", info)
	}
	if pg, my := preparedLeft(t); pg+my != 0 {
		t.Fatalf("one phase left prepared transactions: pg %d, mariadb %d", pg, my)
	}
}

// A MariaDB branch that is not SERIALIZABLE is refused by mysql_co at XA PREPARE (1402):
// the global transaction aborts everywhere, not retryable, nothing stays prepared.
func TestMariaDBRefusesNonSerializableBranch(t *testing.T) {
	needServers(t)
	setChecks(t, true)
	ctx := context.Background()
	mustExec(t, env.pg, "INSERT INTO savings VALUES ('go-rr', 10, '')")
	mustExec(t, env.my, "INSERT INTO checking VALUES ('go-rr', 10, '')")
	pc, mc := bothConns(t, ctx)
	tx := env.coord.Transaction(0)
	if _, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Branch(ctx, mc, cotx.MariaDB, "checking", "", cotx.WithIsolation(cotx.RepeatableRead)); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.ExecContext(ctx, "UPDATE savings SET bal = bal - 1 WHERE u = 'go-rr'"); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.ExecContext(ctx, "UPDATE checking SET bal = bal - 1 WHERE u = 'go-rr'"); err != nil {
		t.Fatal(err)
	}
	err := tx.Commit(ctx)
	var ab *cotx.AbortedError
	if !errors.As(err, &ab) || cotx.IsRetryable(err) {
		t.Fatalf("want a non-retryable abort, got %v", err)
	}
	t.Logf("told the application: %v", err)
	var sb, cb int
	_ = env.pg.QueryRow("SELECT bal FROM savings WHERE u = 'go-rr'").Scan(&sb)
	_ = env.my.QueryRow("SELECT bal FROM checking WHERE u = 'go-rr'").Scan(&cb)
	if sb != 10 || cb != 10 {
		t.Fatalf("balances %d / %d, want 10 / 10 (rolled back everywhere)", sb, cb)
	}
	if pg, my := preparedLeft(t); pg+my != 0 {
		t.Fatalf("prepared transactions left: pg %d, mariadb %d", pg, my)
	}
}
