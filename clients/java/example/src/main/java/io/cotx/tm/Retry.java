package io.cotx.tm;

import java.sql.SQLException;
import java.util.ArrayDeque;
import java.util.Collections;
import java.util.Deque;
import java.util.IdentityHashMap;
import java.util.Set;
import javax.transaction.xa.XAException;

/**
 * Which failures of a global transaction are worth retrying.
 *
 * <p>A refusal by pg_co is SQLSTATE 40001, by mysql_co MariaDB error 1402 (XA_RBROLLBACK).
 * Through a JTA transaction manager they rarely arrive as such: Narayana wraps the
 * XAException of a failed prepare into the RollbackException that {@code commit()} throws
 * (as a suppressed exception), and pgjdbc maps every SQLSTATE at {@code prepare()} except
 * class 23 to {@code XAER_RMFAIL}, so the 40001 is only found as the XAException's cause.
 * This walks the whole cause/suppressed graph and looks for the database's own code.
 */
public final class Retry {
    /** PostgreSQL: serialization failure (pg_co rules A/B/C, SSI), deadlock, lock not available. */
    static final Set<String> PG_SQLSTATES = Set.of("40001", "40P01", "55P03");
    /** MariaDB: XA_RBROLLBACK (mysql_co refusal), deadlock, lock wait timeout, XA_RBTIMEOUT, XA_RBDEADLOCK. */
    static final Set<Integer> MARIADB_CODES = Set.of(1402, 1213, 1205, 1613, 1614);

    /** In mysql_co's refusal of a branch that did not run SERIALIZABLE. */
    static final String NOT_SERIALIZABLE_MARKER = "refused: this XA branch ran at";

    private Retry() {}

    /** True when some exception in t's cause/suppressed graph says "refused or conflicted, retry". */
    public static boolean isRetryable(Throwable t) {
        return reason(t) != null;
    }

    /** The message of the database error that makes t retryable, or null. */
    public static String reason(Throwable t) {
        for (Throwable e : graph(t)) {
            // mysql_co refuses a non-SERIALIZABLE branch with 1402 (XA_RBROLLBACK) too, but
            // running it again at the same level is refused again: a configuration error.
            if (String.valueOf(e.getMessage()).contains(NOT_SERIALIZABLE_MARKER)) {
                return null;
            }
        }
        for (Throwable e : graph(t)) {
            if (e instanceof SQLException s) {
                String state = s.getSQLState();
                if (state != null && PG_SQLSTATES.contains(state) && isPostgres(s)) {
                    return "PostgreSQL " + state + ": " + firstLine(s.getMessage());
                }
                if (isMariaDb(s) && MARIADB_CODES.contains(s.getErrorCode())) {
                    return "MariaDB " + s.getErrorCode() + ": " + firstLine(s.getMessage());
                }
                // Connector/J maps XA errors itself; some versions leave the code in SQLSTATE XA102 only.
                if ("XA102".equals(state) || "40001".equals(state)) {
                    return "SQLSTATE " + state + ": " + firstLine(s.getMessage());
                }
            }
            if (e instanceof XAException x && x.errorCode >= XAException.XA_RBBASE && x.errorCode <= XAException.XA_RBEND) {
                // The resource manager rolled its branch back by itself (MariaDB XA_RB*, or
                // pgjdbc's XA_RBINTEGRITY): the transaction is gone everywhere, a retry is safe.
                return "XA rollback code " + x.errorCode + ": " + firstLine(String.valueOf(x.getMessage()));
            }
        }
        return null;
    }

    private static boolean isPostgres(SQLException s) {
        return s.getClass().getName().startsWith("org.postgresql.");
    }

    private static boolean isMariaDb(SQLException s) {
        return s.getClass().getName().startsWith("org.mariadb.") || s.getClass().getName().startsWith("java.sql.");
    }

    private static String firstLine(String m) {
        if (m == null) {
            return "";
        }
        int i = m.indexOf('\n');
        return i < 0 ? m : m.substring(0, i);
    }

    /** Every throwable reachable through getCause() and getSuppressed(), each once. */
    static Iterable<Throwable> graph(Throwable root) {
        Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());
        Deque<Throwable> todo = new ArrayDeque<>();
        if (root != null) {
            todo.add(root);
        }
        while (!todo.isEmpty()) {
            Throwable e = todo.poll();
            if (!seen.add(e)) {
                continue;
            }
            if (e.getCause() != null) {
                todo.add(e.getCause());
            }
            if (e instanceof SQLException s && s.getNextException() != null) {
                todo.add(s.getNextException());
            }
            Collections.addAll(todo, e.getSuppressed());
        }
        return seen;
    }
}
