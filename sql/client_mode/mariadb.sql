-- cotx client mode on a MariaDB / MySQL without mysql_co (docs/client-mode.md).
-- In the database the branches use (the resource's DSN names it). The coordinator daemon
-- runs this itself when the table is missing; an operator may run it instead. Idempotent.
--
-- cotx_shim: one row per slot. The daemon gives each client-mode branch a slot k and the
-- branch runs `UPDATE cotx_shim SET v = v + 1 WHERE k = <k>` before XA END: a write that
-- really changes a row, so InnoDB prepares the branch as a read-write transaction (its
-- SERIALIZABLE read locks are kept until the decision; a branch with no undo would not
-- survive a server restart). Distinct slots: branches never wait on each other's row.
-- Applications' accounts need UPDATE on this table.
CREATE TABLE IF NOT EXISTS cotx_shim (
    k integer PRIMARY KEY,
    v bigint NOT NULL DEFAULT 0
) ENGINE = InnoDB;
