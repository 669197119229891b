package cotx

import (
	"context"
	"net/http"
)

// Header carries the gtid between services.
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
func GTIDFromRequest(r *http.Request) string { return r.Header.Get(Header) }

// Middleware puts an incoming request's gtid into its context (GTIDFromContext).
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g := GTIDFromRequest(r); g != "" {
			r = r.WithContext(WithGTID(r.Context(), g))
		}
		next.ServeHTTP(w, r)
	})
}

// Transport adds the gtid of each request's context (WithGTID) as a header, so calls
// made inside a global transaction carry it: &http.Client{Transport: &cotx.Transport{}}.
type Transport struct {
	Base http.RoundTripper // nil: http.DefaultTransport
}

func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if g := GTIDFromContext(req.Context()); g != "" && req.Header.Get(Header) == "" {
		req = req.Clone(req.Context())
		req.Header.Set(Header, g)
	}
	return base.RoundTrip(req)
}
