package cotx

import (
	"context"
	"strings"
)

// TraceparentHeader is the W3C trace context header. The client sends it on every request
// of a transaction, so the daemon logs (and, with [telemetry] otlp_endpoint, exports) its
// part of the workflow under the caller's trace id (docs/coordinator.md, "Logs and traces").
const TraceparentHeader = "traceparent"

type traceKey struct{}

// txTraceKey carries a transaction's own trace id (see Tx.traced) when the caller gave none.
type txTraceKey struct{}

// WithTraceparent returns ctx carrying a W3C traceparent (e.g. the one the caller's
// instrumentation injected into a header carrier). Requests to the coordinator made with
// ctx send it as is, so the daemon's spans are children of the caller's span; Transport
// forwards it to other services. A malformed value is ignored.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if !ValidTraceparent(traceparent) {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, traceparent)
}

// TraceparentFromContext returns the traceparent put there by WithTraceparent or
// Middleware ("" if none).
func TraceparentFromContext(ctx context.Context) string {
	s, _ := ctx.Value(traceKey{}).(string)
	return s
}

// ValidTraceparent applies the daemon's rule (api::traceparent in coordinator-daemon): version
// 00-fe, a 32-hex trace id and a 16-hex parent id that are not all zeros, 2-hex flags,
// lowercase. A header the daemon would ignore is not worth sending.
func ValidTraceparent(s string) bool {
	p := strings.Split(s, "-")
	if len(p) != 4 || !lowerHex(p[0], 2) || p[0] == "ff" || !lowerHex(p[1], 32) || !lowerHex(p[2], 16) || !lowerHex(p[3], 2) {
		return false
	}
	return strings.Trim(p[1], "0") != "" && strings.Trim(p[2], "0") != ""
}

func lowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// TraceID returns the trace id of the transaction's generated trace context: the one its
// requests carry when the caller's context has no traceparent. It is drawn once per Tx.
func (t *Tx) TraceID() string {
	if t.traceID == "" {
		t.traceID = randomHex(16)
	}
	return t.traceID
}

// traced is ctx as the transaction's requests use it: the caller's traceparent if ctx
// carries one, otherwise the transaction's own trace id, so that every request of one
// global transaction lands in one trace even without any tracing in the application.
func (t *Tx) traced(ctx context.Context) context.Context {
	if TraceparentFromContext(ctx) != "" {
		return ctx
	}
	return context.WithValue(ctx, txTraceKey{}, t.TraceID())
}

// traceparentFor is the header one request sends: the caller's as given (its span is the
// parent of the daemon's), or, under a transaction's own trace id, a new span id per
// request (there is no client span to point at; a fresh id keeps the daemon's spans
// distinct). The flags say "sampled": the caller asked for nothing, and a collector that
// honours the flag should keep the daemon's spans. Outside a transaction and without a
// caller's traceparent (Health, List), nothing is sent.
func traceparentFor(ctx context.Context) string {
	if tp := TraceparentFromContext(ctx); tp != "" {
		return tp
	}
	if id, _ := ctx.Value(txTraceKey{}).(string); id != "" {
		return "00-" + id + "-" + randomHex(8) + "-01"
	}
	return ""
}
