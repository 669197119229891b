-- Install pg_co in a database (psql -f sql/install_pg_co.sql).
-- Prerequisite, in postgresql.conf, then restart:
--   shared_preload_libraries = 'pg_co'
--   max_prepared_transactions = 100          -- 2PC needs > 0
--   default_transaction_isolation = 'serializable'   -- optional: makes every branch SERIALIZABLE
-- CREATE EXTENSION fails with a clear error when the library is not preloaded.
CREATE EXTENSION IF NOT EXISTS pg_co;
SELECT co.preloaded() AS preloaded, current_setting('pg_co.enabled') AS enabled,
       current_setting('pg_co.conflict_action') AS conflict_action;
-- Monitoring: refusals and waits, and in-doubt transactions with what they hold up.
SELECT * FROM co.stats;
SELECT gid, age, peer_pid, rule, effect FROM co.in_doubt;
