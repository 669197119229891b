package cotx_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	cotx "cotx.io/client"
)

// stub is a stand-in daemon that records the requests it gets and answers the few calls a
// transaction without branches makes (begin, abort, decision).
type stub struct {
	mu   sync.Mutex
	reqs []*http.Request
	srv  *httptest.Server
	// answer, if set, replaces the default answers.
	answer func(w http.ResponseWriter, r *http.Request)
}

func newStub(t *testing.T) *stub {
	s := &stub{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r.Clone(context.Background()))
		s.mu.Unlock()
		if s.answer != nil {
			s.answer(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/transactions":
			w.WriteHeader(201)
			fmt.Fprint(w, `{"gtid":"g1.ab12-1","state":"active","timeout_ms":30000}`)
		case strings.HasSuffix(r.URL.Path, "/abort"):
			fmt.Fprint(w, `{"decision":"abort"}`)
		default:
			fmt.Fprint(w, `{"decision":null,"retryable":false,"abort_reason":""}`)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stub) requests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.reqs...)
}

// wrongNode answers as a daemon that does not own the gtid. The body is what the daemon
// writes for the refusal built in coordinator-daemon/src/coordinator/mod.rs (code "wrong_node",
// its message, owner_url: the owner's advertised URL), serialized by error_reply in
// coordinator-daemon/src/api/mod.rs ({"error": {code, message, owner_url}}, status 421).
func wrongNode(owner string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(421)
		fmt.Fprintf(w, `{"error":{"code":"wrong_node","message":"g1.ab12-1 belongs to node g1, served at %s","owner_url":%q}}`, owner, owner)
	}
}

func TestWrongNodeIsFollowedToTheOwner(t *testing.T) {
	owner, other := newStub(t), newStub(t)
	other.answer = wrongNode(owner.srv.URL)
	c, err := cotx.New(other.srv.URL, "secret-token-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := cotx.WithTraceparent(context.Background(), tp)
	if err := c.Abort(ctx, "g1.ab12-1", "test"); err != nil {
		t.Fatalf("abort through the wrong daemon: %v", err)
	}
	got := owner.requests()
	if len(got) != 1 {
		t.Fatalf("the owner got %d requests, want 1", len(got))
	}
	r := got[0]
	if r.Method != "POST" || r.URL.Path != "/v1/transactions/g1.ab12-1/abort" {
		t.Errorf("the owner got %s %s", r.Method, r.URL.Path)
	}
	if r.Header.Get("Authorization") != "Bearer secret-token-0123456789" {
		t.Errorf("the token was not sent to the owner: %q", r.Header.Get("Authorization"))
	}
	if r.Header.Get("traceparent") != tp || other.requests()[0].Header.Get("traceparent") != tp {
		t.Errorf("traceparent not kept across the redirect")
	}
}

func TestWrongNodeRedirectsAreBounded(t *testing.T) {
	a, b := newStub(t), newStub(t)
	a.answer, b.answer = wrongNode(b.srv.URL), wrongNode(a.srv.URL) // two daemons naming each other
	c, _ := cotx.New(a.srv.URL, "")
	_, err := c.GetDecision(context.Background(), "g1.ab12-1", 0)
	var ce *cotx.CoordinatorError
	if !errors.As(err, &ce) || ce.Status != 421 || ce.Code != "wrong_node" {
		t.Fatalf("want the last 421 as a CoordinatorError, got %v", err)
	}
	if n := len(a.requests()) + len(b.requests()); n != 3 {
		t.Fatalf("%d requests: want the first and 2 redirects", n)
	}
	// An owner_url that is not http(s) is not followed.
	a.answer = wrongNode("file:///etc/passwd")
	if _, err := c.GetDecision(context.Background(), "g1.ab12-1", 0); !errors.As(err, &ce) || ce.Status != 421 {
		t.Fatalf("want 421, got %v", err)
	}
}

func traceparents(t *testing.T, reqs []*http.Request) []string {
	t.Helper()
	var out []string
	for _, r := range reqs {
		tp := r.Header.Get("traceparent")
		if !cotx.ValidTraceparent(tp) {
			t.Fatalf("%s %s: traceparent %q is not one the daemon accepts", r.Method, r.URL.Path, tp)
		}
		out = append(out, tp)
	}
	return out
}

func TestTraceparentGeneratedPerTransaction(t *testing.T) {
	s := newStub(t)
	c, _ := cotx.New(s.srv.URL, "")
	ctx := context.Background()
	tx := c.Transaction(0)
	if _, err := tx.GTID(ctx); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx, "test")
	tps := traceparents(t, s.requests())
	if len(tps) < 2 {
		t.Fatalf("want begin and abort, got %v", tps)
	}
	spans := map[string]bool{}
	for _, tp := range tps {
		if tp[3:35] != tx.TraceID() {
			t.Errorf("%s: not the transaction's trace id %s", tp, tx.TraceID())
		}
		spans[tp[36:52]] = true
	}
	if len(spans) != len(tps) {
		t.Errorf("span ids repeat: %v", tps)
	}
	if c.Transaction(0).TraceID() == tx.TraceID() {
		t.Errorf("two transactions share a trace id")
	}
}

func TestTraceparentFromTheCallersContext(t *testing.T) {
	s := newStub(t)
	c, _ := cotx.New(s.srv.URL, "")
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx := cotx.WithTraceparent(context.Background(), tp)
	tx := c.Transaction(0)
	if _, err := tx.GTID(ctx); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx, "test")
	for _, got := range traceparents(t, s.requests()) {
		if got != tp {
			t.Errorf("sent %s, want the caller's %s", got, tp)
		}
	}
	if cotx.TraceparentFromContext(cotx.WithTraceparent(context.Background(), "00-zz-1-01")) != "" {
		t.Errorf("a malformed traceparent was kept")
	}
}

// The root's Tx.Context carries gtid and trace context through Transport; the called
// service's Middleware gives both to its handler.
func TestTxContextThroughTransportAndMiddleware(t *testing.T) {
	s := newStub(t)
	c, _ := cotx.New(s.srv.URL, "")
	var gtid, tp string
	svc := httptest.NewServer(cotx.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gtid, tp = cotx.GTIDFromContext(r.Context()), cotx.TraceparentFromContext(r.Context())
	})))
	defer svc.Close()
	tx := c.Transaction(0)
	ctx, err := tx.Context(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", svc.URL, nil)
	resp, err := (&http.Client{Transport: &cotx.Transport{}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if gtid != "g1.ab12-1" || len(tp) != 55 || tp[3:35] != tx.TraceID() {
		t.Fatalf("the called service saw gtid %q traceparent %q (trace id %s)", gtid, tp, tx.TraceID())
	}
}

// Cross-language: regress/pytest/clients/test_client_propagation.py runs this test binary with the
// headers the Python client produced (COTX_PY_HEADERS, a JSON object) and what they carry
// (COTX_PY_GTID, COTX_PY_TRACEPARENT), and reads back in Python the headers Go's
// Transport produced (written to COTX_GO_HEADERS_OUT). Skipped when run alone.
func TestHeadersAcrossLanguages(t *testing.T) {
	raw := os.Getenv("COTX_PY_HEADERS")
	if raw == "" {
		t.Skip("COTX_PY_HEADERS not set: run by regress/pytest/clients/test_client_propagation.py")
	}
	var hs map[string]string
	if err := json.Unmarshal([]byte(raw), &hs); err != nil {
		t.Fatal(err)
	}
	in := httptest.NewRequest("POST", "/read", nil)
	for k, v := range hs {
		in.Header.Set(k, v)
	}
	var gtid, tp string
	cotx.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gtid, tp = cotx.GTIDFromContext(r.Context()), cotx.TraceparentFromContext(r.Context())
	})).ServeHTTP(httptest.NewRecorder(), in)
	if gtid != os.Getenv("COTX_PY_GTID") || tp != os.Getenv("COTX_PY_TRACEPARENT") {
		t.Fatalf("Go read gtid %q traceparent %q from the Python headers %v", gtid, tp, hs)
	}
	// The other way: what Go's Transport puts on an outgoing request.
	var sent http.Header
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent = r.Header.Clone() }))
	defer svc.Close()
	ctx := cotx.WithTraceparent(cotx.WithGTID(context.Background(), "g7.go-1"), "00-11111111111111111111111111111111-2222222222222222-01")
	req, _ := http.NewRequestWithContext(ctx, "GET", svc.URL, nil)
	resp, err := (&http.Client{Transport: &cotx.Transport{}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	out := map[string]string{}
	for k := range sent {
		out[k] = sent.Get(k)
	}
	b, _ := json.Marshal(out)
	if err := os.WriteFile(os.Getenv("COTX_GO_HEADERS_OUT"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Live: regress/pytest/clients/test_client_propagation.py starts two daemons of one deployment
// (a shared PostgreSQL store), begins a transaction at A, and runs this with B's URL: the
// Go client, sent to B, must reach A by following 421 wrong_node. It reads the undecided
// decision, then aborts under the caller's traceparent (pytest checks A's log for it).
func TestLiveWrongNodeIsFollowed(t *testing.T) {
	url, gtid := os.Getenv("COTX_LIVE_URL"), os.Getenv("COTX_LIVE_GTID")
	if url == "" || gtid == "" {
		t.Skip("COTX_LIVE_URL not set: run by regress/pytest/clients/test_client_propagation.py")
	}
	c, err := cotx.New(url, os.Getenv("COTX_LIVE_TOKEN"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := cotx.WithTraceparent(context.Background(), os.Getenv("COTX_LIVE_TRACEPARENT"))
	d, err := c.GetDecision(ctx, gtid, 0)
	if err != nil || d.Decision != nil {
		t.Fatalf("decision of an undecided transaction through a non-owner: %v %v", d.Decision, err)
	}
	if err := c.Abort(ctx, gtid, "aborted by the Go client through a non-owner"); err != nil {
		t.Fatalf("abort through a non-owner: %v", err)
	}
}

// Live: a transaction begun and rolled back by the Go client without any trace context;
// it writes its gtid and trace id to COTX_LIVE_OUT and pytest looks for them in the
// daemon's log.
func TestLiveTraceparentReachesTheDaemon(t *testing.T) {
	url, outPath := os.Getenv("COTX_LIVE_URL"), os.Getenv("COTX_LIVE_OUT")
	if url == "" || outPath == "" {
		t.Skip("COTX_LIVE_URL / COTX_LIVE_OUT not set: run by regress/pytest/clients/test_client_propagation.py")
	}
	c, err := cotx.New(url, os.Getenv("COTX_LIVE_TOKEN"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx := c.Transaction(0)
	gtid, err := tx.GTID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx, "trace test")
	b, _ := json.Marshal(map[string]string{"gtid": gtid, "trace_id": tx.TraceID()})
	if err := os.WriteFile(outPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
