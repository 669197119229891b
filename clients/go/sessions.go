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

// registration: a branch's registration body.
func (b *Branch) registration(ctx context.Context) map[string]interface{} {
	reg := map[string]interface{}{"resource": b.Resource, "branch_id": b.ID}
	if s := sessionOf(ctx, b.Conn, b.Kind); s != 0 {
		reg["session"] = s
	}
	return reg
}
