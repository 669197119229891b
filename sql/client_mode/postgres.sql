-- cotx client mode on a PostgreSQL without pg_co (docs/client-mode.md).
-- The coordinator daemon runs this itself when it finds the objects missing; an operator
-- may run it instead (psql -f), as the database's owner (or a role with CREATE on it),
-- when the daemon's role may not create a schema. Idempotent. Run this way, the daemon's
-- role needs nothing on these objects: it only calls the functions (granted to PUBLIC).
--
-- cotx.shim: one row per slot. The daemon gives each client-mode branch a slot k; its
-- helper transaction (daemon side) reads row k with cotx.shim_hold(k) and is prepared,
-- and the branch itself writes row k with cotx.shim_touch(k) before PREPARE TRANSACTION.
-- That read-write pair is the edge helper -rw-> branch that makes PostgreSQL's SSI refuse
-- whatever would break commitment ordering (docs/client-mode.md, "Why it works").
--
-- fillfactor 50: room on each page for HOT updates, so a touch adds no index entry (an
-- index insert would meet other helpers' page-level SIREAD locks: false conflicts).
-- Both functions pin an index scan: a sequential scan would take a relation-wide SIREAD
-- lock and make every client-mode branch conflict with every other.
CREATE SCHEMA IF NOT EXISTS cotx;
CREATE TABLE IF NOT EXISTS cotx.shim (
    k integer PRIMARY KEY,
    v bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

CREATE OR REPLACE FUNCTION cotx.shim_hold(key integer) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET enable_bitmapscan = off
    AS $$ SELECT v FROM cotx.shim WHERE k = key $$;

CREATE OR REPLACE FUNCTION cotx.shim_touch(key integer) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET enable_bitmapscan = off
    AS $$ UPDATE cotx.shim SET v = v + 1 WHERE k = key $$;

-- The daemon counts the slots with this, so that its role needs no privilege on the table.
CREATE OR REPLACE FUNCTION cotx.shim_slots() RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT count(*) FROM cotx.shim $$;

-- How many of a helper's block of slots (first .. first+n-1) are write-locked now: by a
-- branch that wrote its slot and whose transaction has not ended (open, or prepared).
-- A helper whose block has one may still be needed (a branch committing in one phase on
-- its client's session after the daemon's answer): the daemon keeps it prepared. Called
-- in a READ COMMITTED transaction rolled back at once; SKIP LOCKED never waits.
CREATE OR REPLACE FUNCTION cotx.shim_locked(first integer, n integer) RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET enable_bitmapscan = off
    AS $$ SELECT n - count(*)::integer FROM (SELECT 1 FROM cotx.shim WHERE k >= first AND k < first + n
                                            FOR SHARE SKIP LOCKED) AS free $$;

-- The slots (the daemon's SHIM_SLOTS rows), filled here so that a daemon whose role may not
-- insert finds them; ANALYZE so that the planner knows the table is not empty.
INSERT INTO cotx.shim (k) SELECT generate_series(1, 4096) ON CONFLICT DO NOTHING;
ANALYZE cotx.shim;

-- Applications' roles call cotx.shim_touch inside their branches, the daemon's role
-- cotx.shim_hold, cotx.shim_slots and cotx.shim_locked: they need the schema, not the table (the functions
-- run as their owner).
GRANT USAGE ON SCHEMA cotx TO PUBLIC;
GRANT EXECUTE ON FUNCTION cotx.shim_hold(integer), cotx.shim_touch(integer), cotx.shim_slots(),
    cotx.shim_locked(integer, integer) TO PUBLIC;
