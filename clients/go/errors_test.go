package cotx_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	cotx "cotx.io/client"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestRetryableClassification(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40001", Message: "pg_co refused PREPARE TRANSACTION: commitment ordering rule A"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"}), true},
		{&pgconn.PgError{Code: "55000", Message: "pg_co refused PREPARE TRANSACTION: the transaction is READ ONLY"}, false},
		{&mysql.MySQLError{Number: 1402, Message: "XA_RBROLLBACK"}, true},
		{&mysql.MySQLError{Number: 1213}, true},
		{&mysql.MySQLError{Number: 1402, Message: "mysql_co: XA PREPARE refused: this XA branch ran at REPEATABLE-READ, but ..."}, false},
		{&mysql.MySQLError{Number: 1064}, false},
		{&cotx.AbortedError{Retryable: true}, true},
		{&cotx.AbortedError{Retryable: false, Err: &pgconn.PgError{Code: "40001"}}, false},
		{cotx.ErrCoordinatorUnavailable, false},
	}
	for _, c := range cases {
		if got := cotx.IsRetryable(c.err); got != c.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestGTIDPropagation(t *testing.T) {
	// The name every client uses is the one the docs give (the Python client is checked
	// against the same sentence in regress/pytest/clients/test_client_propagation.py).
	doc, err := os.ReadFile("../../docs/coordinator.md")
	if err != nil {
		t.Fatal(err)
	}
	section := strings.SplitN(string(doc), "## Propagating a transaction between services", 2)
	if len(section) != 2 || !strings.Contains(strings.SplitN(section[1], "\n## ", 2)[0], "header `"+cotx.Header+"`") {
		t.Fatalf("docs/coordinator.md does not document the header %q", cotx.Header)
	}
	var seen string
	srv := httptest.NewServer(cotx.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = cotx.GTIDFromContext(r.Context())
	})))
	defer srv.Close()
	client := &http.Client{Transport: &cotx.Transport{}}
	req, _ := http.NewRequestWithContext(cotx.WithGTID(context.Background(), "c1.ab12-7"), "GET", srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if seen != "c1.ab12-7" {
		t.Fatalf("gtid seen by the server: %q", seen)
	}
}
