-- cotx client mode on a MariaDB / MySQL without mysql_co (docs/client-mode.md).
-- In the database the branches use (the resource's DSN names it). The coordinator daemon
-- runs this itself when the table is missing; an operator may run it instead, as an account
-- with CREATE and INSERT on that database, when the daemon's account may not create it
-- (then the daemon's account needs only SELECT on it). Idempotent.
--
-- cotx_shim: one row per slot. The daemon gives each client-mode branch a slot k and the
-- branch runs `UPDATE cotx_shim SET v = v + 1 WHERE k = <k>` before XA END: a write that
-- really changes a row, so InnoDB prepares the branch as a read-write transaction (its
-- SERIALIZABLE read locks are kept until the decision; a branch with no undo would not
-- survive a server restart). Distinct slots: branches never wait on each other's row.
-- Applications' accounts need UPDATE on this table. Statements end with ';' at the end of
-- a line (the daemon splits the script there); no ';' inside a statement or a comment.
CREATE TABLE IF NOT EXISTS cotx_shim (
    k integer PRIMARY KEY,
    v bigint NOT NULL DEFAULT 0
) ENGINE = InnoDB;

-- The slots (the daemon's SHIM_SLOTS rows, 64 x 64), filled here so that a daemon whose
-- account may not insert finds them. A CTE of 64 rows crossed with itself: MySQL 8 stops a
-- recursive CTE at 1000 rows (cte_max_recursion_depth) and has no seq_1_to_N (MariaDB's).
INSERT IGNORE INTO cotx_shim (k)
SELECT k FROM (
    WITH RECURSIVE d(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 63)
    SELECT 1 + a.i + 64 * b.i AS k FROM d AS a CROSS JOIN d AS b
) AS slots;
