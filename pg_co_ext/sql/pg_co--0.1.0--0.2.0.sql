-- pg_co 0.1.0 -> 0.2.0 (ALTER EXTENSION pg_co UPDATE). The SQL surface is unchanged: this
-- release changed only the library (pg_co.max_wait defaults to 5 ms), which a server
-- restart takes. regress/pytest/engine/test_pg_co_upgrade.py checks that 0.1.0 plus this script
-- is exactly what CREATE EXTENSION pg_co makes.
\echo Use "ALTER EXTENSION pg_co UPDATE TO '0.2.0'" to load this file. \quit
