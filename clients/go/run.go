package cotx

import (
	"context"
	"errors"
	"math/rand"
	"sync"
	"time"
)

// RunMaxRetryAfter: a Retry-After longer than this is waited only this long (the daemon
// sends 1 s).
const RunMaxRetryAfter = 5 * time.Second

// RunOption changes how Run retries (Retries, Backoff, MaxWait, TxTimeout, OnRetry,
// WithClock).
type RunOption func(*runConfig)

type runConfig struct {
	retries            int
	base, max, maxWait time.Duration
	timeoutMs          int
	onRetry            func(retries int, err error, delay time.Duration)
	sleep              func(context.Context, time.Duration) error
	rand               func() float64
}

// Retries: how many more times a transaction the retry rules call "retry_transaction" is
// run (default 5).
func Retries(n int) RunOption { return func(c *runConfig) { c.retries = n } }

// Backoff: the jittered wait before retry n is random in [0, min(max, base·2ⁿ))
// (defaults 20 ms and 1 s).
func Backoff(base, max time.Duration) RunOption {
	return func(c *runConfig) { c.base, c.max = base, max }
}

// MaxWait bounds the total of the waits after "retry_request" answers (default 30 s):
// after it, the daemon's answer is returned.
func MaxWait(d time.Duration) RunOption { return func(c *runConfig) { c.maxWait = d } }

// TxTimeout: each attempt's transaction timeout at the coordinator (ms; 0: the daemon's).
func TxTimeout(ms int) RunOption { return func(c *runConfig) { c.timeoutMs = ms } }

// OnRetry is called before each wait with the retries used so far, the error and the wait.
func OnRetry(f func(retries int, err error, delay time.Duration)) RunOption {
	return func(c *runConfig) { c.onRetry = f }
}

// WithClock replaces the waits and the random draws (tests, callers with their own clock).
func WithClock(sleep func(context.Context, time.Duration) error, random func() float64) RunOption {
	return func(c *runConfig) { c.sleep, c.rand = sleep, random }
}

var (
	runRandMu sync.Mutex
	runRand   = rand.New(rand.NewSource(time.Now().UnixNano()))
)

func defaultRand() float64 {
	runRandMu.Lock()
	defer runRandMu.Unlock()
	return runRand.Float64()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func backoff(attempt int, base, max time.Duration, random func() float64) time.Duration {
	w := max
	if attempt < 30 && base<<uint(attempt) < max {
		w = base << uint(attempt)
	}
	return time.Duration(random() * float64(w))
}

// Run runs fn in a new global transaction rooted here (Transaction, then Commit when fn
// returns nil; Rollback when it returns an error) and runs it again as the retry rules
// (clients/retry-rules.json, RetryAction) say:
//
//   - ActionRetryTransaction (IsRetryable: a refused prepare, a serialization failure, a
//     deadlock, a prepared-transaction limit; an abort after a crash, a takeover, a
//     timeout; the daemon lost during a registration): again after the jittered backoff,
//     at most Retries more times;
//   - ActionRetryRequest (the daemon said "not now" before any decision — a 503 such as
//     lease_unconfirmed, resource_busy, restart_gate, resource_unavailable,
//     too_many_connections, or 429 too_many_transactions — or was unreachable at the
//     begin): again after its Retry-After (at most RunMaxRetryAfter, spread by up to a
//     quarter; without one the backoff), not counted against Retries, all such waits
//     together at most MaxWait;
//   - anything else is returned at once, and so is an outcome that may be a commit
//     (*OutcomeUnknownError): such a transaction is never run again.
//
// fn must do all its work in the transaction's branches, so that running it again is safe.
func (c *Coordinator) Run(ctx context.Context, fn func(ctx context.Context, tx *Tx) error, opts ...RunOption) error {
	cfg := runConfig{retries: 5, base: 20 * time.Millisecond, max: time.Second, maxWait: 30 * time.Second,
		sleep: sleepCtx, rand: defaultRand}
	for _, o := range opts {
		o(&cfg)
	}
	attempt, waits := 0, 0
	var waited time.Duration
	for {
		committed, err := c.runOnce(ctx, fn, cfg.timeoutMs)
		if err == nil || committed || ctx.Err() != nil {
			return err // committed: a branch's completion failed, never run again
		}
		act := RetryAction(err)
		if act == ActionFail && IsRetryableDBError(err) {
			// fn returned the driver's error without Branch.Fail; the transaction was
			// rolled back.
			act = ActionRetryTransaction
		}
		var delay time.Duration
		switch {
		case act == ActionRetryRequest:
			delay = backoff(waits, cfg.base, cfg.max, cfg.rand)
			var ce *CoordinatorError
			if errors.As(err, &ce) && ce.RetryAfter > 0 {
				after := ce.RetryAfter
				if after > RunMaxRetryAfter {
					after = RunMaxRetryAfter
				}
				delay = after + time.Duration(0.25*cfg.rand()*float64(after))
			}
			if waited+delay > cfg.maxWait {
				return err
			}
			waits++
			waited += delay
		case act == ActionRetryTransaction && attempt < cfg.retries:
			delay = backoff(attempt, cfg.base, cfg.max, cfg.rand)
			attempt++
		default:
			return err
		}
		if cfg.onRetry != nil {
			cfg.onRetry(attempt, err, delay)
		}
		if serr := cfg.sleep(ctx, delay); serr != nil {
			return err
		}
	}
}

// runOnce is one attempt: fn in a new transaction, committed or rolled back; committed
// tells that the transaction committed (whatever the error).
func (c *Coordinator) runOnce(ctx context.Context, fn func(ctx context.Context, tx *Tx) error, timeoutMs int) (committed bool, err error) {
	tx := c.Transaction(timeoutMs)
	if err = fn(ctx, tx); err != nil {
		if tx.Outcome == "" {
			tx.Rollback(ctx, "fn failed: "+trunc(err.Error(), 800))
		}
		return false, err
	}
	err = tx.Commit(ctx)
	return tx.Outcome == "commit", err
}
