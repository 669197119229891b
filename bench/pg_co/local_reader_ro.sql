-- pgbench script: the local serializable reader of local_reader.sql declared READ ONLY
-- (rule C for READ ONLY readers, pg_co.rule_c_read_only: docs/pg_co.md).
\set aid1 random(1, :nrows)
\set aid2 random(1, :nrows)
\set aid3 random(1, :nrows)
\set aid4 random(1, :nrows)
\set aid5 random(1, :nrows)
BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY;
SELECT abalance FROM pgbench_accounts WHERE aid IN (:aid1, :aid2, :aid3, :aid4, :aid5);
COMMIT;
