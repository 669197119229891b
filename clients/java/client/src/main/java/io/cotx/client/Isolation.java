package io.cotx.client;

/** The isolation level a branch runs at. Only SERIALIZABLE is protected by pg_co / mysql_co
 * (which refuse to prepare the others by default) and by client mode (which refuses the others
 * before they run); the others exist to compare with plain 2PC. */
public enum Isolation {
    SERIALIZABLE("SERIALIZABLE"), REPEATABLE_READ("REPEATABLE READ"), READ_COMMITTED("READ COMMITTED");

    /** As spelled in SQL: only these exact strings are ever spelled into a statement. */
    public final String sql;

    Isolation(String sql) {
        this.sql = sql;
    }
}
