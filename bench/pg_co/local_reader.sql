-- pgbench script: a local (non-2PC) serializable reader of a few accounts, the reader of
-- rule C. Not declared READ ONLY (docs/pg_co.md: READ ONLY readers escape rule C).
\set aid1 random(1, :nrows)
\set aid2 random(1, :nrows)
\set aid3 random(1, :nrows)
\set aid4 random(1, :nrows)
\set aid5 random(1, :nrows)
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT abalance FROM pgbench_accounts WHERE aid IN (:aid1, :aid2, :aid3, :aid4, :aid5);
COMMIT;
