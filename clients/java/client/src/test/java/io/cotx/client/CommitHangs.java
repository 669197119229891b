package io.cotx.client;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/** Holds every PostgreSQL COMMIT after its local flush, as a synchronous standby that never
 * answers would (synchronous_standby_names names one that does not exist): the COMMIT is
 * durable but its client gets no answer. Armed once a probe's COMMIT is seen waiting (then
 * cancelled: a cancel ends the wait, the COMMIT stands; neither a statement timeout, off
 * during a COMMIT, nor a transaction that wrote no WAL would show it). {@link #loseTheWaiter}
 * ends the first session seen waiting (pg_terminate_backend), so that its client loses its
 * connection during a COMMIT that did commit, and lifts the hold; {@link #close} lifts it
 * whatever happened. As the Go client's commitHangs and the Python tests' CommitHangs. */
final class CommitHangs implements AutoCloseable {
    private final Servers s;

    CommitHangs(Servers s) throws Exception {
        this.s = s;
        s.exec(true, "ALTER SYSTEM SET synchronous_standby_names = 'cotx_no_such_standby'");
        s.exec(true, "SELECT pg_reload_conf()");
        for (int attempt = 0; attempt < 50; attempt++) {
            if (probeWaited()) {
                return;
            }
        }
        close();
        throw new IllegalStateException("synchronous_standby_names never held a COMMIT");
    }

    private boolean probeWaited() throws Exception {
        try (Connection probe = s.pg()) {
            int pid = intOf(probe, "SELECT pg_backend_pid()");
            CompletableFuture<Void> commit = CompletableFuture.runAsync(() -> {
                try (Statement st = probe.createStatement()) {
                    st.execute("SET synchronous_commit = on");
                    st.execute("SELECT pg_logical_emit_message(true, 'cotx', 'probe')");
                } catch (SQLException e) {
                    throw new IllegalStateException(e);
                }
            });
            boolean waited = false;
            for (int i = 0; i < 20 && !commit.isDone(); i++) {
                Thread.sleep(50);
                if (waiting("pid = " + pid) != 0) {
                    waited = true;
                    s.exec(true, "SELECT pg_cancel_backend(" + pid + ")");
                    break;
                }
            }
            commit.get(30, TimeUnit.SECONDS);
            return waited;
        }
    }

    /** The pid of a session whose COMMIT waits for the standby (filtered by {@code where}), 0 if none. */
    private int waiting(String where) throws SQLException {
        try (Connection c = s.pg()) {
            return intOf(c, "SELECT coalesce(min(pid), 0) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND " + where);
        }
    }

    private static int intOf(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            rs.next();
            return rs.getInt(1);
        }
    }

    /** Waits (up to 30 s) for a COMMIT held by the standby, terminates its session and lifts
     * the hold; the terminated pid, 0 if none waited. */
    int loseTheWaiter() throws Exception {
        try {
            for (int i = 0; i < 600; i++) {
                int pid = waiting("true");
                if (pid != 0) {
                    s.exec(true, "SELECT pg_terminate_backend(" + pid + ")");
                    return pid;
                }
                Thread.sleep(50);
            }
            return 0;
        } finally {
            close();
        }
    }

    @Override
    public void close() throws SQLException {
        s.exec(true, "ALTER SYSTEM RESET synchronous_standby_names");
        s.exec(true, "SELECT pg_reload_conf()");
    }
}
