package cotx

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Coordinator is a handle on a cotx-coordinator daemon. Safe for concurrent use.
type Coordinator struct {
	base  string
	token string
	// HTTP carries every request (keep-alive); its Timeout is unset: each call has its own.
	HTTP *http.Client
	// RequestTimeout bounds one ordinary API call (default 10 s).
	RequestTimeout time.Duration
	// DecisionTimeout bounds the wait for the root's decision (default 120 s); after it a
	// participant gets OutcomeUnknownError and its branches stay prepared.
	DecisionTimeout time.Duration
	// CarryAcks (default off; set before use): a committed transaction's "finished"
	// acknowledgement is not a request of its own but is held and sent with the next
	// begin (`finished` in POST /v1/transactions): one request fewer per transaction. At
	// most MaxHeldAcks are held; then they are sent on their own. A process that stops
	// beginning transactions should call FlushAcks; one that never does leaves the daemon
	// to confirm those branches itself after its owner grace period (the outcome is
	// durable and the branches completed: nothing is lost, the daemon does more work).
	CarryAcks bool
	// OneRequest (default off; set before use): a root transaction whose branches are all
	// on resources known to be in engine mode or plain 2PC draws its gtid from a range
	// leased from the daemon (POST /v1/gtid-leases, LeaseCount at a time), prepares its
	// branches under the names the lease gives and sends them with its commit: one request
	// per transaction (leased.go; docs/coordinator.md, "One request per transaction").
	// Acknowledgements are then carried by the next commit or begin, as with CarryAcks.
	// Off by default: the daemon's cross-database deadlock detector sees only begun
	// transactions, so a deadlock between two leased ones is broken by the databases' lock
	// timeouts only. A resource is known from its first registration (a transaction on
	// the begin), and a client-mode one always takes the begin.
	OneRequest bool
	// LeaseCount: gtids per lease (0: DefaultLeaseCount).
	LeaseCount int

	acksMu sync.Mutex
	acks   []finishedAck

	leases     leaser
	modes      sync.Map // resource -> resourceMode, from the registrations' answers
	beginAfter sync.Map // resource -> propagated (bool): a transaction starting there needed the begin
}

// MaxHeldAcks bounds the acknowledgements held for the next begin (CarryAcks).
const MaxHeldAcks = 64

// finishedAck is one transaction's acknowledgement: its branches finished on their
// owner's sessions with outcome ("commit" or "abort").
type finishedAck struct {
	GTID     string   `json:"gtid"`
	Outcome  string   `json:"outcome"`
	Branches []string `json:"branches"`
}

// holdAck keeps an acknowledgement for the next begin when CarryAcks is on (false: it is
// off, the caller sends the acknowledgement itself). The MaxHeldAcks-th is sent at once
// with the others held, on their own requests.
func (c *Coordinator) holdAck(ctx context.Context, gtid, outcome string, branches []string) bool {
	if !c.CarryAcks && !c.OneRequest {
		return false
	}
	if len(branches) == 0 {
		return true
	}
	c.acksMu.Lock()
	c.acks = append(c.acks, finishedAck{GTID: gtid, Outcome: outcome, Branches: append([]string(nil), branches...)})
	full := len(c.acks) >= MaxHeldAcks
	c.acksMu.Unlock()
	if full {
		_ = c.FlushAcks(ctx)
	}
	return true
}

// carryAcks adds the held acknowledgements to a begin's body (they leave the queue: if
// the begin is lost, the daemon confirms those branches after its owner grace period).
func (c *Coordinator) carryAcks(body map[string]interface{}) {
	c.acksMu.Lock()
	defer c.acksMu.Unlock()
	if len(c.acks) > 0 {
		body["finished"] = c.acks
		c.acks = nil
	}
}

// FlushAcks sends every held acknowledgement (CarryAcks) on its own request,
// POST /v1/transactions/{gtid}/finished, and returns the first error. One that is lost
// is not retried: the daemon confirms those branches after its owner grace period.
func (c *Coordinator) FlushAcks(ctx context.Context) error {
	c.acksMu.Lock()
	held := c.acks
	c.acks = nil
	c.acksMu.Unlock()
	var first error
	for _, a := range held {
		err := c.do(ctx, "POST", "/v1/transactions/"+q(a.GTID)+"/finished",
			map[string]interface{}{"outcome": a.Outcome, "branches": a.Branches}, nil, 0)
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// New: New("http://127.0.0.1:7420", token).
func New(baseURL, token string) (*Coordinator, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("coordinator url must be http://host:port, got %q", baseURL)
	}
	tr := &http.Transport{
		Proxy:               nil, // loopback or a private network: never through a proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
	}
	return &Coordinator{base: strings.TrimRight(baseURL, "/"), token: token, HTTP: &http.Client{Transport: tr},
		RequestTimeout: 10 * time.Second, DecisionTimeout: 120 * time.Second}, nil
}

func q(s string) string { return url.PathEscape(s) }

// maxRedirects bounds how many `421 wrong_node` answers one call follows. The owner named
// in the answer serves the gtid itself, so one hop is the usual case; a second covers an
// ownership that moved between the two requests (a takeover handed back). More would be a
// misconfiguration (two daemons naming each other), which must end in an error, not a loop.
const maxRedirects = 2

// apiError is the body of every refusal, as the daemon writes it (ErrorDetail in
// coordinator-daemon/src/api/mod.rs): owner_url is set with 421 wrong_node only.
type apiError struct {
	Error struct {
		Code     string `json:"code"`
		Message  string `json:"message"`
		OwnerURL string `json:"owner_url"`
	} `json:"error"`
}

// do sends one JSON request; out (may be nil) receives the answer's body. A `421
// wrong_node` (another daemon owns the gtid) is sent again, the same request with the same
// token, to the owner's advertised URL (error.owner_url), as the Python client does.
func (c *Coordinator) do(ctx context.Context, method, path string, body, out interface{}, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = c.RequestTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return err
		}
	}
	// One traceparent for the whole call, redirects included: they are one operation.
	tp := traceparentFor(ctx)
	base := c.base
	phase := phaseOf(method, path, body)
	for hop := 0; ; hop++ {
		status, raw, retryAfter, err := c.send(ctx, base, method, path, data, tp)
		if err != nil {
			return &UnavailableError{Phase: phase, Err: err}
		}
		if status < 400 {
			if out != nil && len(raw) > 0 {
				return json.Unmarshal(raw, out)
			}
			return nil
		}
		var e apiError
		if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
			e.Error.Code, e.Error.Message = "unknown", string(raw)
		}
		if status == http.StatusMisdirectedRequest && e.Error.Code == "wrong_node" && hop < maxRedirects {
			if owner, ok := ownerBase(e.Error.OwnerURL); ok && owner != base {
				base = owner
				continue
			}
		}
		return &CoordinatorError{Status: status, Code: e.Error.Code, Message: e.Error.Message, Phase: phase, RetryAfter: retryAfter}
	}
}

// ownerBase checks an owner_url before any request is sent there: http(s) with a host.
func ownerBase(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false
	}
	return strings.TrimRight(s, "/"), true
}

// send is one HTTP exchange with the daemon at base: its status, body and Retry-After.
func (c *Coordinator) send(ctx context.Context, base, method, path string, data []byte, traceparent string) (int, []byte, time.Duration, error) {
	var rd io.Reader
	if data != nil {
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if traceparent != "" {
		req.Header.Set(TraceparentHeader, traceparent)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, 0, fmt.Errorf("%w: %s %s: %v", ErrCoordinatorUnavailable, method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, nil, 0, fmt.Errorf("%w: %s %s: reading the answer: %v", ErrCoordinatorUnavailable, method, path, err)
	}
	var after time.Duration
	if n, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && n >= 0 {
		after = time.Duration(n) * time.Second // seconds: the daemon never sends an HTTP date
	}
	return resp.StatusCode, raw, after, nil
}

// Begin starts a global transaction and returns its gtid (timeoutMs 0: the daemon's default).
func (c *Coordinator) Begin(ctx context.Context, timeoutMs int) (string, error) {
	body := map[string]interface{}{}
	if timeoutMs > 0 {
		body["timeout_ms"] = timeoutMs
	}
	c.carryAcks(body)
	var r struct {
		GTID string `json:"gtid"`
	}
	err := c.do(ctx, "POST", "/v1/transactions", body, &r, 0)
	return r.GTID, err
}

// Get returns the coordinator's view of a transaction (state, decision, branches).
func (c *Coordinator) Get(ctx context.Context, gtid string) (map[string]interface{}, error) {
	var r map[string]interface{}
	err := c.do(ctx, "GET", "/v1/transactions/"+q(gtid), nil, &r, 0)
	return r, err
}

// List returns the transactions in a state ("" for all).
func (c *Coordinator) List(ctx context.Context, state string) ([]map[string]interface{}, error) {
	path := "/v1/transactions"
	if state != "" {
		path += "?state=" + url.QueryEscape(state)
	}
	var r struct {
		Transactions []map[string]interface{} `json:"transactions"`
	}
	err := c.do(ctx, "GET", path, nil, &r, 0)
	return r.Transactions, err
}

// Health calls /healthz.
func (c *Coordinator) Health(ctx context.Context) error {
	return c.do(ctx, "GET", "/healthz", nil, nil, 0)
}

// Decision is the answer of GET …/decision.
type Decision struct {
	Decision    *string `json:"decision"` // "commit", "abort", "one_phase" or nil (undecided)
	Retryable   bool    `json:"retryable"`
	AbortReason string  `json:"abort_reason"`
}

// GetDecision long-polls the decision for up to wait.
func (c *Coordinator) GetDecision(ctx context.Context, gtid string, wait time.Duration) (*Decision, error) {
	var d Decision
	path := fmt.Sprintf("/v1/transactions/%s/decision?wait_ms=%d", q(gtid), wait.Milliseconds())
	err := c.do(ctx, "GET", path, nil, &d, c.RequestTimeout+wait)
	return &d, err
}

// Abort aborts a global transaction (the branches' owners roll back theirs).
func (c *Coordinator) Abort(ctx context.Context, gtid, reason string) error {
	return c.do(ctx, "POST", "/v1/transactions/"+q(gtid)+"/abort", map[string]string{"reason": trunc(reason, 900)}, nil, 0)
}

// Transaction starts a new global transaction whose root is this process: it decides it
// in Commit. It is begun at the coordinator together with its first branch (one round
// trip), or when GTID is first called. timeoutMs 0: the daemon's default.
func (c *Coordinator) Transaction(timeoutMs int) *Tx {
	return &Tx{coord: c, root: true, timeoutMs: timeoutMs}
}

// Join takes part in a global transaction begun elsewhere (its gtid, propagated as a string).
func (c *Coordinator) Join(gtid string) *Tx {
	return &Tx{coord: c, gtid: gtid}
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
