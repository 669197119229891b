"""pg_co single-database cost (pgbench)."""
