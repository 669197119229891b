package io.cotx.client;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.Collections;
import java.util.Map;
import java.util.WeakHashMap;

/** Client mode on MariaDB: the connections checked once (SERIALIZABLE read back, the
 * server's start read; {@link Dialect#setSerializableVerified}), by physical connection: the
 * driver's own connection object, reached by unwrap through a pool's proxy (HikariCP hands
 * out a new proxy per borrow, over the same physical connection), and its connection id, so a
 * driver that reconnects under the same object is checked again. Weak keys: a closed
 * connection's entry goes with it. A connection whose driver cannot be unwrapped is checked
 * at every branch, as before. */
final class ClientModeChecks {
    private ClientModeChecks() {
    }

    /** The connection id and the start read (null: not read, MySQL 8). */
    private record Check(Long session, Long started) {
    }

    private static final Map<Object, Check> CHECKS = Collections.synchronizedMap(new WeakHashMap<>());

    /** Thrown by the slot write when the branch ran in a session its connection's check was
     * not made in (or its slot row is missing): it cannot prepare; running the transaction
     * again checks the connection anew (retryable). */
    static final class SessionNotCheckedException extends SQLException {
        SessionNotCheckedException(int key, int changed) {
            super("client mode: the slot write changed " + changed + " rows, not 1 (slot " + key
                    + "): this session is not the one checked (reconnected or reset) or the slot is missing; "
                    + "the next branch checks the connection again");
        }
    }

    private static Object physical(Connection c) {
        try {
            Class<?> type = Class.forName("org.mariadb.jdbc.Connection", false, c.getClass().getClassLoader());
            return c.isWrapperFor(type) ? c.unwrap(type) : null;
        } catch (ClassNotFoundException | SQLException | RuntimeException e) {
            return null;
        }
    }

    static void remember(Connection c, Long started) {
        Object p = physical(c);
        if (p != null) {
            CHECKS.put(p, new Check(Dialect.session(c), started));
        }
    }

    static void forget(Connection c) {
        Object p = physical(c);
        if (p != null) {
            CHECKS.remove(p);
        }
    }

    private static Check check(Connection c) {
        Object p = physical(c);
        Check k = p == null ? null : CHECKS.get(p);
        return k != null && java.util.Objects.equals(k.session, Dialect.session(c)) ? k : null;
    }

    static boolean isChecked(Connection c) {
        return check(c) != null;
    }

    /** The start this connection's check read, sent with the registration (null: unchecked
     * or not read). */
    static Long started(Connection c) {
        Check k = check(c);
        return k == null ? null : k.started;
    }
}
