-- pg_co 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_co UPDATE). New co.stats columns: observe-only
-- counts (pg_co.observe_only: observed_rule_a ... observed_read_only) and rule S
-- (refused_rule_s, observed_rule_s). The view is made again from the library's counter
-- list, exactly as CREATE EXTENSION makes it; regress/pytest/engine/test_pg_co_upgrade.py checks
-- that the result is what a fresh CREATE EXTENSION pg_co gives.
\echo Use "ALTER EXTENSION pg_co UPDATE TO '0.3.0'" to load this file. \quit

DROP VIEW co.stats;
DO $$ BEGIN EXECUTE 'CREATE VIEW co.stats AS ' || co.stats_view_sql(); END $$;
