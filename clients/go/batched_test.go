package cotx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	cotx "cotx.io/client"
)

// The batched calls on real servers and the real daemon: acknowledgements carried by the
// next begin (Coordinator.CarryAcks, FlushAcks) and every branch registered with the begin
// (Tx.Branches). A counting transport records which requests the client really sends.

// counter counts the client's requests by method and path.
type counter struct {
	mu   sync.Mutex
	seen []string
	next http.RoundTripper
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.seen = append(c.seen, r.Method+" "+r.URL.Path)
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

// count: requests so far whose "METHOD path" satisfies match.
func (c *counter) count(match func(string) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.seen {
		if match(s) {
			n++
		}
	}
	return n
}

func isAck(s string) bool   { return strings.HasSuffix(s, "/finished") }
func isBegin(s string) bool { return s == "POST /v1/transactions" }

func counted(t *testing.T, c *cotx.Coordinator) *counter {
	t.Helper()
	k := &counter{next: c.HTTP.Transport}
	c.HTTP = &http.Client{Transport: k}
	return k
}

func key(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// branchStates: the daemon's view of gtid's branches, "state/finished_by" each.
func branchStates(t *testing.T, c *cotx.Coordinator, gtid string) []string {
	t.Helper()
	tx, err := c.Get(context.Background(), gtid)
	if err != nil {
		t.Fatalf("GET %s: %v", gtid, err)
	}
	var out []string
	bs, _ := tx["branches"].([]interface{})
	for _, x := range bs {
		b, _ := x.(map[string]interface{})
		s, _ := b["state"].(string)
		if by, ok := b["finished_by"].(string); ok && by != "" {
			s += "/" + by
		}
		out = append(out, s)
	}
	return out
}

func all(states []string, want string, n int) bool {
	if len(states) != n {
		return false
	}
	for _, s := range states {
		if s != want {
			return false
		}
	}
	return true
}

// transfer: one two-phase transaction inserting u into savings (PostgreSQL) and checking
// (MariaDB), on branches registered one by one or (upFront) with the begin.
func transfer(t *testing.T, c *cotx.Coordinator, u string, upFront bool) string {
	t.Helper()
	ctx := context.Background()
	pc, mc := bothConns(t, ctx)
	tx := c.Transaction(0)
	if upFront {
		bs, err := tx.Branches(ctx,
			cotx.BranchSpec{Conn: pc, Kind: cotx.Postgres, Resource: "savings"},
			cotx.BranchSpec{Conn: mc, Kind: cotx.MariaDB, Resource: "checking"})
		if err != nil || len(bs) != 2 {
			t.Fatalf("Branches: %v (%d branches)", err, len(bs))
		}
	} else {
		if _, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pc.ExecContext(ctx, "INSERT INTO savings(u, bal) VALUES ($1, 1)", u); err != nil {
		t.Fatal(err)
	}
	if !upFront {
		if _, err := tx.Branch(ctx, mc, cotx.MariaDB, "checking", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mc.ExecContext(ctx, "INSERT INTO checking(u, bal, log) VALUES (?, 1, '')", u); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	g, _ := tx.GTID(ctx)
	var n int
	if err := env.pg.QueryRow("SELECT count(*) FROM savings WHERE u = $1", u).Scan(&n); err != nil || n != 1 {
		t.Fatalf("savings row %s: %d (%v)", u, n, err)
	}
	if err := env.my.QueryRow("SELECT count(*) FROM checking WHERE u = ?", u).Scan(&n); err != nil || n != 1 {
		t.Fatalf("checking row %s: %d (%v)", u, n, err)
	}
	return g
}

// A daemon of its own (node g2) with a long owner grace period: it never confirms the
// branches itself during the test, so what it shows is what the client told it.
func graceDaemon(t *testing.T) *cotx.Coordinator {
	t.Helper()
	needServers(t)
	d, err := startDaemonAs(bankResources(os.Getenv("PG_PORT"), os.Getenv("MY_PORT"), ""), "g2", 600000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	c, err := cotx.New(d.url, d.token)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAcknowledgementsCarriedByTheNextBegin(t *testing.T) {
	c := graceDaemon(t)
	c.CarryAcks = true
	k := counted(t, c)

	g1 := transfer(t, c, key("ack"), false)
	// Committed at both databases, its acknowledgement held: the daemon has not heard.
	if s := branchStates(t, c, g1); !all(s, "prepared", 2) {
		t.Fatalf("%s after its commit: %v, want both prepared (acknowledgement held)", g1, s)
	}
	if n := k.count(isAck); n != 0 {
		t.Fatalf("%d acknowledgements sent on their own, want 0", n)
	}
	g2 := transfer(t, c, key("ack"), false)
	if s := branchStates(t, c, g1); !all(s, "finished/owner", 2) {
		t.Fatalf("%s after the next begin: %v, want both finished by their owner", g1, s)
	}
	if s := branchStates(t, c, g2); !all(s, "prepared", 2) {
		t.Fatalf("%s after its commit: %v, want both prepared (acknowledgement held)", g2, s)
	}
	if n := k.count(isAck); n != 0 {
		t.Fatalf("%d acknowledgements sent on their own, want 0", n)
	}
	if err := c.FlushAcks(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := branchStates(t, c, g2); !all(s, "finished/owner", 2) {
		t.Fatalf("%s after FlushAcks: %v, want both finished by their owner", g2, s)
	}
	if n := k.count(isAck); n != 1 {
		t.Fatalf("FlushAcks sent %d requests, want 1", n)
	}
	if err := c.FlushAcks(context.Background()); err != nil || k.count(isAck) != 1 {
		t.Fatalf("a second FlushAcks: %v, %d requests in all, want nothing sent", err, k.count(isAck))
	}

	// At most MaxHeldAcks held: the one that fills the queue sends them all on their own.
	// Every transaction is begun before the first commits (a begin carries what is held).
	ctx := context.Background()
	var txs []*cotx.Tx
	for i := 0; i < cotx.MaxHeldAcks; i++ {
		pc, err := env.pg.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		tx := c.Transaction(0)
		if _, err := tx.Branch(ctx, pc, cotx.Postgres, "savings", ""); err != nil {
			t.Fatal(err)
		}
		if _, err = pc.ExecContext(ctx, "INSERT INTO savings(u, bal) VALUES ($1, 1)", key("held")); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	for i, tx := range txs {
		if err := tx.Commit(ctx); err != nil { // one phase
			t.Fatal(err)
		}
		if n := k.count(isAck) - 1; i < len(txs)-1 && n != 0 {
			t.Fatalf("%d held: %d sent on their own, want none yet", i+1, n)
		}
	}
	if n := k.count(isAck) - 1; n != cotx.MaxHeldAcks {
		t.Fatalf("%d held: %d sent on their own, want %d", cotx.MaxHeldAcks, n, cotx.MaxHeldAcks)
	}
	for _, tx := range []*cotx.Tx{txs[0], txs[len(txs)-1]} {
		g, _ := tx.GTID(ctx)
		if s := branchStates(t, c, g); !all(s, "finished/owner", 1) {
			t.Fatalf("%s: %v, want finished by its owner", g, s)
		}
	}
}

// Without CarryAcks (the default) the acknowledgement is sent at once, as before.
func TestAcknowledgementSentAtOnceByDefault(t *testing.T) {
	c := graceDaemon(t)
	k := counted(t, c)
	g := transfer(t, c, key("ack"), false)
	if s := branchStates(t, c, g); !all(s, "finished/owner", 2) {
		t.Fatalf("%s after its commit: %v, want both finished by their owner", g, s)
	}
	if n := k.count(isAck); n != 1 {
		t.Fatalf("%d acknowledgements, want 1", n)
	}
}

// Tx.Branches: both branches registered with the begin, one request, no registration of
// its own; the transaction commits as with Branch.
func TestBranchesRegisteredWithTheBegin(t *testing.T) {
	c := graceDaemon(t)
	k := counted(t, c)
	g := transfer(t, c, key("up"), true)
	if n := k.count(isBegin); n != 1 {
		t.Fatalf("%d begins, want 1", n)
	}
	if n := k.count(func(s string) bool { return strings.HasSuffix(s, "/branches") }); n != 0 {
		t.Fatalf("%d registrations of their own, want 0", n)
	}
	if s := branchStates(t, c, g); !all(s, "finished/owner", 2) {
		t.Fatalf("%s: %v, want both finished by their owner", g, s)
	}
}
