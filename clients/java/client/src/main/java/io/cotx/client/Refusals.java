package io.cotx.client;

import java.sql.SQLException;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/** What an engine error means for a global transaction: retrying may cure it or not, and
 * which rule or mechanism raised it. The same classification as the Python client's
 * {@code cotx.refusals} (codes first: SQLSTATE for PostgreSQL, the error number for MariaDB;
 * the message only picks the pg_co / mysql_co rule, since both report every refusal of a kind
 * under one code). */
public final class Refusals {
    private Refusals() {
    }

    /** kind: a short stable label (a key of {@link #KINDS}); engine "postgres", "mariadb" or null. */
    public record Refusal(String kind, boolean retryable, String engine) {
    }

    /** kind -> retryable. Retryable: a conflict with concurrent transactions, which a new
     * attempt may not meet again. Not retryable: the transaction's own setup is wrong
     * (isolation level, READ ONLY) or it was cancelled. */
    public static final Map<String, Boolean> KINDS = Map.ofEntries(
            Map.entry("pg_co rule A", true), Map.entry("pg_co rule A (summarized)", true),
            Map.entry("pg_co rule B", true), Map.entry("pg_co rule B wait timeout", true),
            Map.entry("pg_co rule C", true), Map.entry("pg_co rule S", true),
            Map.entry("pg_co already decided", true), Map.entry("pg_co not serializable", false),
            Map.entry("pg_co read only", false), Map.entry("pg concurrent update", true),
            Map.entry("pg serialization failure", true), Map.entry("pg deadlock", true),
            Map.entry("pg lock timeout", true), Map.entry("pg cancelled", false),
            Map.entry("mysql_co restart gate", true), Map.entry("mysql_co isolation", false),
            Map.entry("my deadlock", true), Map.entry("my lock wait timeout", true),
            Map.entry("my XA rollback", true), Map.entry("my interrupted", false),
            Map.entry("other", false));

    static final int ER_LOCK_WAIT_TIMEOUT = 1205;
    static final int ER_LOCK_DEADLOCK = 1213;
    static final int ER_QUERY_INTERRUPTED = 1317;
    static final int ER_XA_RBROLLBACK = 1402; // also every mysql_co refusal
    static final int ER_XA_RBTIMEOUT = 1613;
    static final int ER_XA_RBDEADLOCK = 1614;

    private static Refusal of(String kind) {
        String engine = kind.startsWith("pg") ? "postgres" : kind.startsWith("my") ? "mariadb" : null;
        return new Refusal(kind, KINDS.get(kind), engine);
    }

    /** Whether retrying the whole global transaction may cure {@code e}. */
    public static boolean retryable(Throwable e) {
        return classify(e).retryable();
    }

    /** The classification of {@code e}: its cause chain is followed down to the first
     * {@link SQLException} with a code (a wrapper's message counts too). MariaDB Connector/J's
     * errors carry the server's error number ({@code getErrorCode()}); pgjdbc's have error code
     * 0 and the SQLSTATE. */
    public static Refusal classify(Throwable e) {
        StringBuilder text = new StringBuilder();
        Set<Throwable> seen = new HashSet<>();
        String state = null;
        Integer errno = null;
        while (e != null && seen.add(e)) {
            text.append(' ').append(e.getMessage());
            if (e instanceof SQLException s && (s.getSQLState() != null || s.getErrorCode() != 0)) {
                if (isMariaDb(s)) {
                    errno = s.getErrorCode();
                } else {
                    state = s.getSQLState();
                }
                break;
            }
            e = e.getCause();
        }
        return classify(state, errno, text.toString());
    }

    // MariaDB Connector/J reports the server's error number; pgjdbc none (0). The package
    // name settles the few where MariaDB answered without a number.
    private static boolean isMariaDb(SQLException s) {
        return s.getErrorCode() != 0 || s.getClass().getName().startsWith("org.mariadb");
    }

    /** The classification of an error given by its codes: a SQLSTATE (PostgreSQL), a MariaDB
     * error number, and the message (null codes: unknown). */
    public static Refusal classify(String sqlstate, Integer errno, String message) {
        String low = message == null ? "" : message.toLowerCase(Locale.ROOT);
        Refusal r = errno == null ? postgres(sqlstate, low) : null;
        if (r == null && sqlstate == null) {
            r = mariadb(errno, low);
        }
        if (r == null && sqlstate == null && errno == null) {
            r = byMessage(low);
        }
        return r == null ? of("other") : r;
    }

    // Only for text without codes (an abort reason the coordinator recorded): the server's
    // own wording of the code-classified errors.
    private static Refusal byMessage(String low) {
        String[][] messages = {
            {"could not serialize access due to concurrent update", "pg concurrent update"},
            {"could not serialize access", "pg serialization failure"},
            {"deadlock detected", "pg deadlock"},
            {"canceling statement due to lock timeout", "pg lock timeout"},
            {"deadlock found when trying to get lock", "my deadlock"},
            {"lock wait timeout exceeded", "my lock wait timeout"},
        };
        for (String[] m : messages) {
            if (low.contains(m[0])) {
                return of(m[1]);
            }
        }
        return null;
    }

    private static Refusal postgres(String state, String low) {
        if (low.contains("pg_co refused")) {
            if (low.contains("rule a (summarized")) {
                return of("pg_co rule A (summarized)");
            }
            for (String rule : new String[] {"a", "b", "c"}) {
                if (low.contains("commitment ordering rule " + rule)) {
                    return of("pg_co rule " + rule.toUpperCase(Locale.ROOT));
                }
            }
            if (low.contains("rule s (a reader postgresql summarized)")) {
                return of("pg_co rule S");
            }
            if (low.contains("is already decided")) {
                return of("pg_co already decided");
            }
            if (low.contains("not serializable")) {
                return of("pg_co not serializable");
            }
            if (low.contains("read only")) {
                return of("pg_co read only");
            }
        }
        if (low.contains("pg_co: lock_timeout expired while waiting")) {
            return of("pg_co rule B wait timeout");
        }
        if ("40001".equals(state)) {
            return of(low.contains("concurrent update") ? "pg concurrent update" : "pg serialization failure");
        }
        if ("40P01".equals(state)) {
            return of("pg deadlock");
        }
        if ("55P03".equals(state)) {
            return of("pg lock timeout");
        }
        if ("57014".equals(state)) {
            return of("pg cancelled");
        }
        return null;
    }

    private static Refusal mariadb(Integer errno, String low) {
        if (low.contains("mysql_co:") && (errno == null || errno == ER_XA_RBROLLBACK)) {
            if (low.contains("restart gate")) {
                return of("mysql_co restart gate");
            }
            if (low.contains("refused: this xa branch ran at")) {
                return of("mysql_co isolation");
            }
        }
        if (errno == null) {
            return null;
        }
        switch (errno) {
            case ER_LOCK_DEADLOCK:
                return of("my deadlock");
            case ER_LOCK_WAIT_TIMEOUT:
                return of("my lock wait timeout");
            case ER_XA_RBROLLBACK:
            case ER_XA_RBTIMEOUT:
            case ER_XA_RBDEADLOCK:
                return of("my XA rollback");
            case ER_QUERY_INTERRUPTED:
                return of("my interrupted");
            default:
                return null;
        }
    }
}
