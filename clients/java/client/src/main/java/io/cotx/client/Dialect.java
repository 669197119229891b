package io.cotx.client;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.regex.Pattern;

/** The SQL each engine is driven with, as the Python client's {@code cotx/dialect.py} and the
 * Go client's {@code tx.go} spell it. PostgreSQL (pgjdbc): the session in autocommit,
 * {@code BEGIN ISOLATION LEVEL …}, {@code PREPARE TRANSACTION '<gid>'}, {@code COMMIT PREPARED} /
 * {@code ROLLBACK PREPARED}. MariaDB (Connector/J): {@code SET TRANSACTION ISOLATION LEVEL …},
 * {@code XA START / END / PREPARE / COMMIT / ROLLBACK} on the daemon's xid. No statement knows
 * about the coordinator or the branch's state. */
enum Dialect {
    POSTGRES("postgres") {
        @Override
        void begin(Connection c, String id, Isolation iso, boolean readOnly) throws SQLException {
            // Explicit BEGIN / PREPARE TRANSACTION / COMMIT PREPARED: in autocommit the driver
            // wraps none of them in a transaction block of its own (COMMIT PREPARED may not run
            // inside one).
            if (!c.getAutoCommit()) {
                c.setAutoCommit(true);
            }
            exec(c, "BEGIN ISOLATION LEVEL " + iso.sql);
        }

        @Override
        boolean wroteNothing(Connection c) throws SQLException {
            // No transaction id assigned: the open transaction changed no row (PostgreSQL
            // assigns one at a transaction's first write).
            try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT pg_current_xact_id_if_assigned() IS NULL")) {
                return rs.next() && rs.getBoolean(1);
            }
        }

        @Override
        void shimTouch(Connection c, int key) throws SQLException {
            // Client mode: the write of the slot the daemon's prepared helper read: the edge
            // helper -rw-> branch that makes SSI refuse a commitment-ordering violation
            // (sql/client_mode/postgres.sql, docs/client-mode.md).
            exec(c, "SELECT cotx.shim_touch(" + key + ")");
        }

        @Override
        void prepare(Connection c, String id) throws SQLException {
            exec(c, "PREPARE TRANSACTION " + id);
        }

        @Override
        void commitOnePhase(Connection c, String id) throws SQLException {
            exec(c, "COMMIT");
        }

        @Override
        void finish(Connection c, String id, boolean commit) throws SQLException {
            exec(c, (commit ? "COMMIT PREPARED " : "ROLLBACK PREPARED ") + id);
        }

        @Override
        void rollbackUnprepared(Connection c, String id) throws SQLException {
            exec(c, "ROLLBACK");
        }

        @Override
        boolean alreadyFinished(SQLException e) {
            return "42704".equals(e.getSQLState()); // the prepared gid is gone
        }
    },
    MARIADB("mariadb") {
        @Override
        void begin(Connection c, String id, Isolation iso, boolean readOnly) throws SQLException {
            // XA START refuses a session with a local transaction open; autocommit has none.
            if (!c.getAutoCommit()) {
                c.setAutoCommit(true);
            }
            // READ ONLY (a read-only branch in engine mode): InnoDB refuses the branch's
            // writes (error 1792), so "wrote nothing" needs no look; its SERIALIZABLE reads
            // still lock until XA COMMIT.
            exec(c, "SET TRANSACTION ISOLATION LEVEL " + iso.sql + (readOnly ? ", READ ONLY" : ""));
            exec(c, "XA START " + id);
        }

        @Override
        void setSerializableVerified(Connection c) throws SQLException {
            // Client mode, once per physical connection (ClientModeChecks): the session runs
            // SERIALIZABLE, checked by reading the level back rather than assumed (a proxy or
            // an init_connect may change it), and the server's start is read in the same round
            // trip, as the daemon's restart gate computes it (UNIX_TIMESTAMP() - Uptime), into
            // the session variable @cotx_started. Later branches on the connection send that
            // start with their registration (the daemon then asks the server nothing) and their
            // slot write checks @cotx_started. Each branch still sets SERIALIZABLE for its own
            // transaction (begin), so a session level changed later by a pool's reset or the
            // application does not reach a branch. MariaDB spells the variable tx_isolation
            // (from 11.1 also transaction_isolation); MySQL 8 only transaction_isolation and
            // keeps no GLOBAL_STATUS in information_schema: there the start is not read (the
            // daemon looks itself).
            exec(c, "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE");
            String level;
            Long started = null;
            try (Statement st = c.createStatement();
                    ResultSet rs = st.executeQuery("SELECT @@session.tx_isolation, @cotx_started := UNIX_TIMESTAMP() - "
                            + "CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'")) {
                if (!rs.next()) {
                    throw new SQLException("no Uptime status");
                }
                level = rs.getString(1);
                long v = rs.getLong(2);
                started = rs.wasNull() ? null : v;
            } catch (SQLException e) {
                try {
                    level = scalar(c, "SELECT @@session.tx_isolation");
                } catch (SQLException e2) {
                    level = scalar(c, "SELECT @@session.transaction_isolation");
                }
                exec(c, "SET @cotx_started = NULL");
            }
            if (!"SERIALIZABLE".equals(level)) {
                throw new ClientModeIsolationException("client mode needs SERIALIZABLE branches; the session is " + level
                        + " after SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE");
            }
            ClientModeChecks.remember(c, started);
        }

        @Override
        void shimTouch(Connection c, int key) throws SQLException {
            // Client mode: a write that really changes a row (its own slot), so InnoDB
            // prepares the branch as read-write and keeps its SERIALIZABLE read locks until
            // the decision (sql/client_mode/mariadb.sql), in the session its connection's
            // check was made in: otherwise it changes nothing and the branch cannot prepare.
            Long started = ClientModeChecks.started(c);
            int changed;
            try (Statement st = c.createStatement()) {
                st.setQueryTimeout(PROTOCOL_TIMEOUT_S);
                changed = st.executeUpdate("UPDATE cotx_shim SET v = v + 1 WHERE k = " + key + " AND @cotx_started <=> "
                        + (started == null ? "NULL" : started.toString()));
            }
            if (changed != 1) {
                ClientModeChecks.forget(c);
                throw new ClientModeChecks.SessionNotCheckedException(key, changed);
            }
        }

        @Override
        void prepare(Connection c, String id) throws SQLException {
            exec(c, "XA END " + id);
            exec(c, "XA PREPARE " + id);
        }

        @Override
        void commitOnePhase(Connection c, String id) throws SQLException {
            exec(c, "XA END " + id);
            exec(c, "XA COMMIT " + id + " ONE PHASE");
        }

        @Override
        void finish(Connection c, String id, boolean commit) throws SQLException {
            exec(c, (commit ? "XA COMMIT " : "XA ROLLBACK ") + id);
        }

        @Override
        void rollbackUnprepared(Connection c, String id) throws SQLException {
            try {
                exec(c, "XA END " + id);
            } catch (SQLException e) {
                // already ended, or the branch failed
            }
            exec(c, "XA ROLLBACK " + id);
        }

        @Override
        boolean alreadyFinished(SQLException e) {
            return e.getErrorCode() == 1397; // XAER_NOTA: the xid is gone
        }
    };

    /** The daemon's name of the kind (a registration's {@code kind}). */
    final String wire;

    Dialect(String wire) {
        this.wire = wire;
    }

    /** Bound on one protocol statement (PREPARE, COMMIT, ROLLBACK), in seconds. */
    static final int PROTOCOL_TIMEOUT_S = 30;

    /** {@code readOnly}: run the branch as a READ ONLY transaction (MariaDB in engine mode). */
    abstract void begin(Connection c, String id, Isolation iso, boolean readOnly) throws SQLException;

    /** Did the open transaction change no row? MariaDB cannot tell without a READ ONLY
     * transaction (InnoDB's INNODB_TRX rows are a cache refreshed at most every 0.1 s):
     * never claimed there. */
    boolean wroteNothing(Connection c) throws SQLException {
        return false;
    }

    void setSerializableVerified(Connection c) throws SQLException {
        // PostgreSQL: BEGIN ISOLATION LEVEL SERIALIZABLE itself sets it, per transaction.
    }

    abstract void shimTouch(Connection c, int key) throws SQLException;

    abstract void prepare(Connection c, String id) throws SQLException;

    abstract void commitOnePhase(Connection c, String id) throws SQLException;

    abstract void finish(Connection c, String id, boolean commit) throws SQLException;

    abstract void rollbackUnprepared(Connection c, String id) throws SQLException;

    abstract boolean alreadyFinished(SQLException e);

    static Dialect ofWire(String kind) {
        for (Dialect d : values()) {
            if (d.wire.equals(kind)) {
                return d;
            }
        }
        throw new CotxException("the coordinator answered an unknown resource kind " + kind);
    }

    /** The dialect of a JDBC connection, from its driver's product name. */
    static Dialect of(Connection c) throws SQLException {
        String p = c.getMetaData().getDatabaseProductName().toLowerCase(java.util.Locale.ROOT);
        if (p.contains("postgres")) {
            return POSTGRES;
        }
        if (p.contains("mariadb") || p.contains("mysql")) {
            return MARIADB;
        }
        throw new CotxException("unsupported database " + p + ": use pgjdbc or MariaDB Connector/J");
    }

    /** The connection's database session as the daemon's deadlock detector knows it
     * (PostgreSQL's backend pid, MariaDB's connection id), from the driver's own handshake
     * (no round trip): pgjdbc's {@code PGConnection.getBackendPID()}, MariaDB Connector/J's
     * {@code Connection.getThreadId()}, reached by unwrap (a pool's proxy included) and by name,
     * so that neither driver is needed to compile against; null when neither answers. */
    static Long session(Connection c) {
        for (String[] api : new String[][] {{"org.postgresql.PGConnection", "getBackendPID"}, {"org.mariadb.jdbc.Connection", "getThreadId"}}) {
            try {
                Class<?> type = Class.forName(api[0], false, c.getClass().getClassLoader());
                if (c.isWrapperFor(type)) {
                    Object id = type.getMethod(api[1]).invoke(c.unwrap(type));
                    long v = ((Number) id).longValue();
                    return v > 0 ? v : null;
                }
            } catch (ClassNotFoundException e) {
                // not this driver
            } catch (ReflectiveOperationException | SQLException | RuntimeException e) {
                return null; // an older driver: the daemon then cannot see this branch's lock waits
            }
        }
        return null;
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.setQueryTimeout(PROTOCOL_TIMEOUT_S);
            st.execute(sql);
        }
    }

    static String scalar(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            return rs.next() ? rs.getString(1) : null;
        }
    }

    /** PostgreSQL's longest gid (GIDSIZE 200 with its NUL): the daemon's naming::PG_GID_MAX. */
    static final int GID_MAX = 199;
    private static final Pattern ID_CHARS = Pattern.compile("^[A-Za-z0-9._:-]{1," + GID_MAX + "}$");

    /** An id the daemon handed out, as an SQL literal. It only hands out [A-Za-z0-9._:-];
     * checking again here means a misbehaving coordinator still cannot make us run its text as
     * SQL. */
    static String literal(String s) {
        if (s == null || !ID_CHARS.matcher(s).matches()) {
            throw new CotxException("refusing unexpected id " + s);
        }
        return "'" + s + "'";
    }
}
