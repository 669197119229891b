package cotx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// The one-request commit (docs/coordinator.md, "One request per transaction: leased
// gtids"): with Coordinator.OneRequest the client leases a range of gtids once, draws a
// gtid per transaction locally, opens and prepares the branches under the names the lease
// says, and sends them with the commit — the transaction's only request. Off by default:
// the daemon's cross-database deadlock detector sees only begun transactions.

// DefaultLeaseCount is the gtids leased at once when Coordinator.LeaseCount is 0.
const DefaultLeaseCount = 1000

// leaseDrawShare: a range is drawn from during this share of its lease only, so a
// transaction drawn last still has the rest (at least half of expires_in_ms) to commit
// before recovery may abort what is left prepared under it.
const leaseDrawShare = 0.5

// gtidRange is one leased range, as POST /v1/gtid-leases answered it.
type gtidRange struct {
	prefix    string
	next, end uint64 // next gtid to draw; end is one past the last
	until     time.Time
	gidPrefix string
	formatID  int64
}

// leaser hands out the leased gtids of one Coordinator to its goroutines.
type leaser struct {
	mu  sync.Mutex
	cur *gtidRange
}

// drawn is one leased gtid with what naming its branches needs.
type drawn struct {
	gtid, gidPrefix string
	formatID        int64
}

// draw returns the next gtid of the current range, leasing a new range when it is used up
// or its drawing time is over. A lease request's refusal or absence is returned as is
// (the retry rules' "begin" phase: nothing exists yet).
func (c *Coordinator) draw(ctx context.Context) (drawn, error) {
	l := &c.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.cur; r == nil || r.next >= r.end || !time.Now().Before(r.until) {
		count := c.LeaseCount
		if count <= 0 {
			count = DefaultLeaseCount
		}
		var a struct {
			Prefix      string `json:"prefix"`
			First       uint64 `json:"first"`
			Count       uint64 `json:"count"`
			ExpiresInMs int64  `json:"expires_in_ms"`
			GIDPrefix   string `json:"gid_prefix"`
			XAFormatID  int64  `json:"xa_format_id"`
		}
		asked := time.Now() // the lease runs from the daemon's answer: counted from before the ask
		if err := c.do(ctx, "POST", "/v1/gtid-leases", map[string]interface{}{"count": count}, &a, 0); err != nil {
			return drawn{}, err
		}
		if a.Count == 0 || a.Prefix == "" || a.ExpiresInMs <= 0 {
			return drawn{}, fmt.Errorf("cotx: the coordinator answered an empty gtid lease")
		}
		l.cur = &gtidRange{prefix: a.Prefix, next: a.First, end: a.First + a.Count, gidPrefix: a.GIDPrefix, formatID: a.XAFormatID,
			until: asked.Add(time.Duration(float64(a.ExpiresInMs)*leaseDrawShare) * time.Millisecond)}
	}
	r := l.cur
	g := r.prefix + strconv.FormatUint(r.next, 16)
	r.next++
	return drawn{gtid: g, gidPrefix: r.gidPrefix, formatID: r.formatID}, nil
}

// dropLease forgets the current range when gtid is one of it: the daemon no longer knows
// it (restarted, or another took the node over), so the next transaction leases anew.
func (c *Coordinator) dropLease(gtid string) {
	l := &c.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.cur; r != nil && len(gtid) > len(r.prefix) && gtid[:len(r.prefix)] == r.prefix {
		l.cur = nil
	}
}

// Each resource's enforcement as the last registration answered it: the leased path is
// taken only for resources known to be in engine mode or plain 2PC. Client mode's helper
// and slot are handed out at registration, so a client-mode resource is refused at the
// commit (resource_refused) — the client never sends that, it takes the begin.
func (c *Coordinator) learnMode(resource string, kind Kind, enforcement string) {
	c.modes.Store(resource, resourceMode{kind, enforcement})
}

type resourceMode struct {
	kind        Kind
	enforcement string
}

// leasable: resource (of kind) may be a branch of a leased transaction.
func (c *Coordinator) leasable(resource string, kind Kind) bool {
	m, ok := c.modes.Load(resource)
	if !ok {
		return false
	}
	rm := m.(resourceMode)
	return rm.kind == kind && (rm.enforcement == EnforcementEngine || rm.enforcement == EnforcementNone)
}

// ErrLeasedFallback: a transaction on a leased gtid met what the one-request commit
// cannot carry (a resource not known to be in engine mode or plain 2PC, or its gtid
// asked for to propagate it). Its branches are rolled back; it is returned inside a
// Retryable *AbortedError, and the next transactions that start with the same resource
// take the begin (Run runs it again).
var ErrLeasedFallback = errors.New("cotx: this transaction needs the begin, not the one-request commit")

// leasedOpen opens a branch under the leased gtid with the names the lease gave, as the
// registration's answer would have (registered), without a request.
func (t *Tx) leasedRegistration(b *Branch) registered {
	r := registered{Kind: string(b.Kind), Enforcement: EnforcementEngine}
	if m, ok := t.coord.modes.Load(b.Resource); ok {
		r.Enforcement = m.(resourceMode).enforcement
	}
	if b.Kind == Postgres {
		r.GID = t.lease.gidPrefix + ":" + t.gtid + ":" + b.ID
	} else {
		r.XID = &struct {
			Gtrid    string `json:"gtrid"`
			Bqual    string `json:"bqual"`
			FormatID int64  `json:"format_id"`
		}{t.gtid, b.ID, t.lease.formatID}
	}
	return r
}

// wantsLease: the first branch of a root transaction (resource, kind) takes the leased
// path.
func (t *Tx) wantsLease(specs ...BranchSpec) bool {
	if !t.coord.OneRequest || !t.root || t.gtid != "" || len(specs) == 0 {
		return false
	}
	if _, begin := t.coord.beginAfter.Load(specs[0].Resource); begin {
		return false
	}
	for _, s := range specs {
		if !t.coord.leasable(s.Resource, s.Kind) {
			return false
		}
	}
	return true
}

// startLeased draws the transaction's gtid.
func (t *Tx) startLeased(ctx context.Context) error {
	d, err := t.coord.draw(ctx)
	if err != nil {
		return err
	}
	t.gtid, t.lease, t.leased = d.gtid, d, true
	return nil
}

// fallBack: a leased transaction met what needs the begin (why; propagated: its gtid was
// asked for). Its branches are rolled back (nothing was sent for it: the daemon knows
// nothing of it), the transactions that start with its first branch's resource take the
// begin from now on, and the error is retryable.
func (t *Tx) fallBack(why string, propagated bool) error {
	if len(t.branches) > 0 {
		// A transaction that propagates its gtid does so each time: it keeps the begin. One
		// that met an unknown resource gets the leased path back once that is learnt.
		if old, ok := t.coord.beginAfter.Load(t.branches[0].Resource); !ok || !old.(bool) {
			t.coord.beginAfter.Store(t.branches[0].Resource, propagated)
		}
	}
	t.rollbackLocal()
	t.Outcome = "abort"
	return &AbortedError{GTID: t.gtid, Reason: why, Retryable: true, Err: ErrLeasedFallback}
}

// leasedCommit sends the prepared branches with the commit (the transaction's only
// request) and returns the decision. A refusal that means the daemon did not act (429,
// 503, no answer) sends it again — a commit is answered the same when sent twice — until
// a deadline, then asks for the decision. A gtid the daemon does not know or has aborted
// (restarted, a takeover, the lease ran out) or a resource it refuses (its mode changed)
// is rolled back and returned as a Retryable *AbortedError; the range is dropped.
func (t *Tx) leasedCommit(ctx context.Context) (decision string, err error) {
	branches := t.leasedBranches(ctx, nil)
	readOnly := t.wroteNothing()
	// Earlier transactions' acknowledgements ride along (held as with CarryAcks), the
	// same ones each time the request is sent again.
	held := map[string]interface{}{}
	t.coord.carryAcks(held)
	deadline := time.Now().Add(5 * time.Second)
	for {
		body := map[string]interface{}{"branches": branches}
		if acks, ok := held["finished"]; ok {
			body["finished"] = acks
		}
		if len(readOnly) > 0 {
			body["read_only"] = readOnly
		}
		var r struct {
			Decision string `json:"decision"`
		}
		err := t.coord.do(ctx, "POST", "/v1/transactions/"+q(t.gtid)+"/commit", body, &r, 0)
		if err == nil {
			return r.Decision, nil
		}
		var ce *CoordinatorError
		var ue *UnavailableError
		switch {
		case errors.As(err, &ce) && readOnlyRefused(ce, readOnly):
			readOnly = nil
			continue
		case errors.As(err, &ce) && (ce.Code == "unknown_transaction" || ce.Code == "transaction_aborted" || ce.Code == "resource_refused"):
			// Nothing recorded for it but an abort, and no commit can be recorded any more
			// (only the process that leased the range records one): rolled back here.
			t.coord.dropLease(t.gtid)
			if ce.Code == "resource_refused" {
				t.coord.modes.Range(func(k, _ interface{}) bool { t.coord.modes.Delete(k); return true })
			}
			t.rollbackLocal()
			t.Outcome = "abort"
			return "", &AbortedError{GTID: t.gtid, Reason: "one-request commit: " + ce.Error(), Retryable: true, Err: err}
		case errors.As(err, &ce) && (ce.Status == 429 || ce.Status == 503) && time.Now().Before(deadline),
			errors.As(err, &ue) && time.Now().Before(deadline):
			if ue != nil {
				// Perhaps restarted: the next transactions lease anew rather than meet an
				// epoch's range the daemon no longer knows.
				t.coord.dropLease(t.gtid)
			}
			wait := 50 * time.Millisecond
			if ce != nil && ce.RetryAfter > 0 {
				wait = ce.RetryAfter
			}
			if left := time.Until(deadline); wait > left {
				wait = left
			}
			time.Sleep(wait)
		case ce != nil && daemonAction("commit", ce.Status, ce.Code) == ActionOutcomeUnknown:
			return "", &OutcomeUnknownError{GTID: t.gtid, Err: err}
		case ce != nil && daemonAction("commit", ce.Status, ce.Code) == ActionAborted:
			// Aborted (a deadlock victim: the daemon's decision says whether to run it
			// again), or refused for the request itself (a bad branch id, an unknown
			// resource: the daemon wrote nothing, not retried). Our branches are rolled back.
			t.rollbackLocal()
			return "", t.abortError(ctx, "one-request commit refused: "+ce.Error())
		default:
			// Decided or being decided (committed, a 503 past the deadline, no answer):
			// the decision is asked for.
			return t.waitDecision(ctx)
		}
	}
}

// leasedBranches lists what the one-request commit carries: every prepared branch, and
// dip's decision branch d (nil: none).
func (t *Tx) leasedBranches(ctx context.Context, d *Branch) []map[string]interface{} {
	branches := make([]map[string]interface{}, 0, len(t.branches))
	for _, b := range t.branches {
		if b.state == stPrepared || b == d {
			branches = append(branches, b.leasedListing(ctx))
		}
	}
	return branches
}

// leasedListing is the branch as the commit with branches lists it.
func (b *Branch) leasedListing(ctx context.Context) map[string]interface{} {
	m := map[string]interface{}{"resource": b.Resource, "branch_id": b.ID}
	if s := sessionOf(ctx, b.Conn, b.Kind); s != 0 {
		m["session"] = s
	}
	return m
}

// relearned: a transaction on the begin whose branches all turned out leasable lets the
// transactions that start with its first resource take the leased path again.
func (t *Tx) relearned() {
	if !t.coord.OneRequest || t.leased || len(t.branches) == 0 {
		return
	}
	for _, b := range t.branches {
		if !t.coord.leasable(b.Resource, b.Kind) {
			return
		}
	}
	if sticky, ok := t.coord.beginAfter.Load(t.branches[0].Resource); ok && !sticky.(bool) {
		t.coord.beginAfter.Delete(t.branches[0].Resource)
	}
}
