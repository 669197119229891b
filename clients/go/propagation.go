package cotx

import (
	"context"
	"net/http"
	"strings"
)

// Header carries the gtid between services. Every client uses this name (Python:
// cotx.GTID_HEADER); docs/coordinator.md, "Propagating a transaction between services".
// The W3C traceparent travels beside it (TraceparentHeader).
const Header = "Cotx-Gtid"

type ctxKey struct{}

// WithGTID returns ctx carrying gtid (Transport and SetGTID read it from there).
func WithGTID(ctx context.Context, gtid string) context.Context {
	return context.WithValue(ctx, ctxKey{}, gtid)
}

// GTIDFromContext returns the gtid put there by WithGTID or Middleware ("" if none).
func GTIDFromContext(ctx context.Context) string {
	g, _ := ctx.Value(ctxKey{}).(string)
	return g
}

// SetGTID sets the gtid header on an outgoing request.
func SetGTID(req *http.Request, gtid string) {
	if gtid != "" {
		req.Header.Set(Header, gtid)
	}
}

// GTIDFromRequest reads the gtid header of an incoming request ("" if none).
func GTIDFromRequest(r *http.Request) string { return strings.TrimSpace(r.Header.Get(Header)) }

// Middleware puts an incoming request's gtid into its context (GTIDFromContext), and its
// traceparent, if any and well formed (TraceparentFromContext): the participant's requests
// to the coordinator then join the caller's trace.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if g := GTIDFromRequest(r); g != "" {
			ctx = WithGTID(ctx, g)
		}
		if tp := r.Header.Get(TraceparentHeader); tp != "" && TraceparentFromContext(ctx) == "" {
			ctx = WithTraceparent(ctx, tp)
		}
		if ctx != r.Context() {
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

// Context returns ctx carrying the transaction's gtid and trace context, for calls to
// other services through Transport: they join the transaction (Middleware, Join) and the
// same trace. It begins the transaction at the coordinator if no branch did yet.
func (t *Tx) Context(ctx context.Context) (context.Context, error) {
	g, err := t.GTID(ctx)
	if err != nil {
		return ctx, err
	}
	ctx = WithGTID(ctx, g)
	if TraceparentFromContext(ctx) == "" {
		ctx = WithTraceparent(ctx, traceparentFor(t.traced(ctx)))
	}
	return ctx, nil
}

// Transport adds the gtid of each request's context (WithGTID) as a header, and its
// traceparent (WithTraceparent) unless the request has one (the caller's instrumentation
// wins), so calls made inside a global transaction carry both:
// &http.Client{Transport: &cotx.Transport{}}.
type Transport struct {
	Base http.RoundTripper // nil: http.DefaultTransport
}

func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	g, tp := GTIDFromContext(req.Context()), TraceparentFromContext(req.Context())
	addG := g != "" && req.Header.Get(Header) == ""
	addT := tp != "" && req.Header.Get(TraceparentHeader) == ""
	if addG || addT {
		// A RoundTripper must not modify the caller's request.
		req = req.Clone(req.Context())
		if addG {
			req.Header.Set(Header, g)
		}
		if addT {
			req.Header.Set(TraceparentHeader, tp)
		}
	}
	return base.RoundTrip(req)
}
