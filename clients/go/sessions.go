package cotx

import (
	"context"
	"database/sql"
	"sync"
)

// The database session a branch runs on (PostgreSQL's backend pid, MariaDB's connection
// id), sent with its registration: the daemon maps lock waits to global transactions by
// it, breaks deadlocks across databases in seconds, and cancels an aborted transaction's
// waiting statement. database/sql does not expose it, so it is asked once per physical
// connection (a pool keeps its connections: one round trip when a connection is made, none
// per branch after) and remembered by the driver's connection.
var sessionIDs = struct {
	sync.Mutex
	of map[interface{}]int64
}{of: map[interface{}]int64{}}

// The remembered ids keep their driver connections reachable: past this many (a pool that
// churns connections), the memory is dropped and ids are asked again.
const sessionIDsKept = 4096

// sessionOf: conn's session id, or 0 when it cannot be had (the branch then still works;
// only deadlock detection and the cancel of its waiting statement do not reach it).
func sessionOf(ctx context.Context, conn *sql.Conn, kind Kind) int64 {
	var key interface{}
	if err := conn.Raw(func(dc interface{}) error { key = dc; return nil }); err != nil || key == nil {
		return 0
	}
	sessionIDs.Lock()
	id, ok := sessionIDs.of[key]
	sessionIDs.Unlock()
	if ok {
		return id
	}
	query := "SELECT pg_backend_pid()"
	if kind == MariaDB {
		query = "SELECT CONNECTION_ID()"
	}
	if err := conn.QueryRowContext(ctx, query).Scan(&id); err != nil {
		return 0
	}
	sessionIDs.Lock()
	if len(sessionIDs.of) >= sessionIDsKept {
		sessionIDs.of = map[interface{}]int64{}
	}
	sessionIDs.of[key] = id
	sessionIDs.Unlock()
	return id
}

// Client mode on MariaDB: the connections checked once (setSerializableVerified) and the
// server's start each check read (invalid: not read, MySQL 8), by driver connection as
// the session ids: a driver connection is one server session for its whole life.
var checks = struct {
	sync.Mutex
	of map[interface{}]sql.NullInt64
}{of: map[interface{}]sql.NullInt64{}}

func driverConn(conn *sql.Conn) interface{} {
	var key interface{}
	if err := conn.Raw(func(dc interface{}) error { key = dc; return nil }); err != nil {
		return nil
	}
	return key
}

// checkedStart: the start conn's check read, and whether conn was checked.
func checkedStart(conn *sql.Conn) (sql.NullInt64, bool) {
	key := driverConn(conn)
	if key == nil {
		return sql.NullInt64{}, false
	}
	checks.Lock()
	defer checks.Unlock()
	s, ok := checks.of[key]
	return s, ok
}

// rememberCheck: conn was checked and read `started`. Past sessionIDsKept connections
// (a pool that churns them) the memory is dropped and connections are checked again.
func rememberCheck(conn *sql.Conn, started sql.NullInt64) {
	key := driverConn(conn)
	if key == nil {
		return
	}
	checks.Lock()
	defer checks.Unlock()
	if len(checks.of) >= sessionIDsKept {
		checks.of = map[interface{}]sql.NullInt64{}
	}
	checks.of[key] = started
}

// forgetCheck: conn is checked again at its next client-mode branch.
func forgetCheck(conn *sql.Conn) {
	if key := driverConn(conn); key != nil {
		checks.Lock()
		delete(checks.of, key)
		checks.Unlock()
	}
}

// registration: a branch's registration body; on MariaDB with the server's start its
// connection's client-mode check read (the daemon then need not ask the server).
func (b *Branch) registration(ctx context.Context) map[string]interface{} {
	reg := map[string]interface{}{"resource": b.Resource, "branch_id": b.ID}
	if s := sessionOf(ctx, b.Conn, b.Kind); s != 0 {
		reg["session"] = s
	}
	if b.Kind == MariaDB {
		if started, ok := checkedStart(b.Conn); ok && started.Valid {
			reg["server_started"] = started.Int64
		}
	}
	return reg
}
