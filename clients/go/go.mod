module cotx.io/client

// go 1.19: Debian 12's golang-go builds it; pgx v5.5.5 and go-sql-driver/mysql v1.8.1 are the
// newest releases that still build with it (pgx >= 5.5.4 has the 2024 protocol fixes).
go 1.19

require (
	github.com/go-sql-driver/mysql v1.8.1
	github.com/jackc/pgx/v5 v5.5.5
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20221227161230-091c0ba34f0a // indirect
	github.com/jackc/puddle/v2 v2.2.1 // indirect
	golang.org/x/crypto v0.17.0 // indirect
	golang.org/x/sync v0.1.0 // indirect
	golang.org/x/text v0.14.0 // indirect
)
