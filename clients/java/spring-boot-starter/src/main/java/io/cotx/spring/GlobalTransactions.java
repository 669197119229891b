package io.cotx.spring;

import io.cotx.client.Transaction;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.LinkedHashMap;
import java.util.Map;

/** The global transaction of the current thread, as {@code @GlobalTransactional} binds it:
 * its {@link Transaction} (for {@code tx.gtid()}, {@code tx.headers()}), the attempt number,
 * and the branch connections taken from the resources' DataSources during it. Also the
 * incoming request's gtid and traceparent, which the Spring MVC interceptor puts here. */
public final class GlobalTransactions {
    private GlobalTransactions() {
    }

    /** What one attempt holds: its transaction and, per resource, the pooled connection its
     * branch runs on (given back when the transaction has ended here). */
    static final class Scope {
        final Transaction tx;
        final int attempt;
        final Map<String, Connection> connections = new LinkedHashMap<>();

        Scope(Transaction tx, int attempt) {
            this.tx = tx;
            this.attempt = attempt;
        }

        /** Gives every connection back to its pool. */
        void release() {
            for (Connection c : connections.values()) {
                try {
                    c.close();
                } catch (SQLException ignored) {
                    // a broken connection: the pool drops it
                }
            }
            connections.clear();
        }
    }

    /** An incoming request's {@code Cotx-Gtid} and {@code traceparent}. */
    record Incoming(String gtid, String traceparent) {
    }

    private static final ThreadLocal<Scope> SCOPE = new ThreadLocal<>();
    private static final ThreadLocal<Incoming> INCOMING = new ThreadLocal<>();

    /** The thread's global transaction, or null outside {@code @GlobalTransactional}. */
    public static Transaction current() {
        Scope s = SCOPE.get();
        return s == null ? null : s.tx;
    }

    /** The attempt of the current root transaction (1, then 2 after a retry, …); 0 outside. */
    public static int attempt() {
        Scope s = SCOPE.get();
        return s == null ? 0 : s.attempt;
    }

    /** The gtid of the request being served (its {@code Cotx-Gtid} header), or null. */
    public static String incomingGtid() {
        Incoming in = INCOMING.get();
        return in == null ? null : in.gtid();
    }

    static Scope scope() {
        return SCOPE.get();
    }

    static Scope bind(Transaction tx, int attempt) {
        Scope s = new Scope(tx, attempt);
        SCOPE.set(s);
        return s;
    }

    static void unbind() {
        SCOPE.remove();
    }

    static Incoming incoming() {
        return INCOMING.get();
    }

    static void setIncoming(Incoming in) {
        if (in == null) {
            INCOMING.remove();
        } else {
            INCOMING.set(in);
        }
    }
}
