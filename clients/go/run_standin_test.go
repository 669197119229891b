package cotx_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	cotx "cotx.io/client"
)

// Run's bounds against a stand-in daemon (httptest): "not now" answers waited on for
// Retry-After and bounded in total by MaxWait, retryable aborts bounded by Retries, an
// outcome that may be a commit never run again. The real daemon: run_test.go.

// standIn answers begins with `busy` 503 lease_unconfirmed first, then 201; commits with
// commitStatus (200: committed).
func standIn(t *testing.T, busy int32, commitStatus int) (*cotx.Coordinator, *int32) {
	var begins int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/transactions" && atomic.AddInt32(&begins, 1) <= busy:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			_, _ = w.Write([]byte(`{"error":{"code":"lease_unconfirmed","message":"no new work"}}`))
		case r.URL.Path == "/v1/transactions":
			w.WriteHeader(201)
			_, _ = w.Write([]byte(`{"gtid":"n1.a-1","state":"active","timeout_ms":1000}`))
		case commitStatus == 200:
			_, _ = w.Write([]byte(`{"decision":"commit"}`))
		default:
			w.WriteHeader(commitStatus)
			_, _ = w.Write([]byte(`{"error":{"code":"outcome_forgotten","message":"purged"}}`))
		}
	}))
	t.Cleanup(srv.Close)
	c, err := cotx.New(srv.URL, "t")
	if err != nil {
		t.Fatal(err)
	}
	return c, &begins
}

func begin(ctx context.Context, tx *cotx.Tx) error {
	_, err := tx.GTID(ctx)
	return err
}

func TestRunWaitsRetryAfterWithinMaxWait(t *testing.T) {
	var waits []time.Duration
	clock := cotx.WithClock(func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil },
		func() float64 { return 1 })
	c, begins := standIn(t, 2, 200)
	if err := c.Run(context.Background(), begin, clock); err != nil {
		t.Fatal(err)
	}
	if *begins != 3 || len(waits) != 2 || waits[0] != 1250*time.Millisecond {
		t.Fatalf("begins %d, waits %v: want 3 begins and two waits of Retry-After spread by a quarter", *begins, waits)
	}
	// Past MaxWait the daemon's answer is returned.
	waits = nil
	c, _ = standIn(t, 100, 200)
	err := c.Run(context.Background(), begin, clock, cotx.MaxWait(3*time.Second))
	var ce *cotx.CoordinatorError
	if !errors.As(err, &ce) || ce.Code != "lease_unconfirmed" || ce.Phase != "begin" || len(waits) != 2 {
		t.Fatalf("err %v after waits %v: want lease_unconfirmed after two waits (2.5 s of 3)", err, waits)
	}
}

func TestRunRetriesAbortsUpToRetriesAndNeverAPossibleCommit(t *testing.T) {
	clock := cotx.WithClock(func(context.Context, time.Duration) error { return nil }, func() float64 { return 0 })
	c, _ := standIn(t, 0, 200)
	calls := 0
	aborted := func(ctx context.Context, tx *cotx.Tx) error {
		calls++
		return &cotx.AbortedError{GTID: "g", Reason: "recorded abort (takeover)", Retryable: true}
	}
	if err := c.Run(context.Background(), aborted, clock, cotx.Retries(3)); !cotx.IsRetryable(err) || calls != 4 {
		t.Fatalf("err %v after %d calls: want the abort after 1 + 3 calls", err, calls)
	}
	c, _ = standIn(t, 0, 410)
	calls = 0
	err := c.Run(context.Background(), func(ctx context.Context, tx *cotx.Tx) error { calls++; return begin(ctx, tx) }, clock)
	var ou *cotx.OutcomeUnknownError
	if !errors.As(err, &ou) || calls != 1 {
		t.Fatalf("err %v after %d calls: want outcome unknown, never run again", err, calls)
	}
}
