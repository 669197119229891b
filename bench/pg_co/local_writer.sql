-- pgbench script: a local (non-2PC) serializable transaction, a few reads and one update:
-- the writer rule S checks at COMMIT (docs/pg_co.md, "Rule S").
\set aid1 random(1, :nrows)
\set aid2 random(1, :nrows)
\set aid3 random(1, :nrows)
\set aid random(1, :nrows)
\set delta random(-5000, 5000)
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid1;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid2;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid3;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
COMMIT;
