package io.cotx.client;

import java.sql.SQLException;
import java.util.HashSet;
import java.util.Set;

/** What an engine error means for a global transaction: retrying may cure it or not, and
 * which rule or mechanism raised it, by the engine rows of the retry rules
 * ({@link RetryRules}, the table every client shares: codes first, SQLSTATE for PostgreSQL,
 * the error number for MariaDB; the message picks the pg_co / mysql_co rule, since both
 * report every refusal of a kind under one code). */
public final class Refusals {
    private Refusals() {
    }

    /** kind: a short stable label (an engine row's kind of the retry rules, or "other"); engine "postgres", "mariadb" or null. */
    public record Refusal(String kind, boolean retryable, String engine) {
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
     * error number, and the message (null codes: unknown; text alone is matched by the rows'
     * messages). */
    public static Refusal classify(String sqlstate, Integer errno, String message) {
        RetryRules.EngineRule r = RetryRules.engineRule(sqlstate, errno, message);
        return new Refusal(r.kind(), r.retryable(), r.engine());
    }
}
