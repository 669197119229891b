package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** All-read-only global transactions (docs/coordinator.md, "All-read-only transactions"):
 * branches declared read-only that wrote nothing are listed with the commit, and when that is
 * every branch the daemon commits with no store sync (cotx_store_batches_total does not move,
 * cotx_read_only_commits_total does). A declared read-only PostgreSQL branch that wrote is not
 * listed (the decision syncs); MariaDB in engine mode refuses the write (READ ONLY
 * transaction, error 1792); MariaDB in client mode is never listed (its slot write). As the
 * Python client's regress/pytest/coordinator/test_read_only_commit.py and the Go client's
 * readonly_test.go. Each daemon here recovers rarely: every recovery pass queues a store
 * write, which the next store read flushes. */
class ReadOnlyCommitTest {
    static double metric(LocalDaemon d, String name) throws IOException, InterruptedException {
        HttpRequest req = HttpRequest.newBuilder(URI.create(d.url() + "/metrics")).header("Authorization", "Bearer " + d.token()).build();
        String text = HttpClient.newHttpClient().send(req, HttpResponse.BodyHandlers.ofString()).body();
        for (String line : text.split("\n")) {
            if (line.startsWith(name + " ") || line.startsWith(name + "{")) {
                return Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
            }
        }
        return 0;
    }

    /** The store's syncs once background writes (start-up, earlier finishes) are done:
     * unchanged for 1.2 s (the start-up recovery pass's held write lands about 0.4 s after
     * the daemon answers). */
    static double settledSyncs(LocalDaemon d) throws Exception {
        double last = metric(d, "cotx_store_batches_total");
        int same = 0;
        while (same < 4) {
            Thread.sleep(300);
            double now = metric(d, "cotx_store_batches_total");
            same = now == last ? same + 1 : 0;
            last = now;
        }
        return last;
    }

    record Spec(boolean onPg, boolean readOnly, String sql) {
    }

    /** One global transaction, a branch per spec on a fresh connection, each running its
     * statement. */
    static void run(Servers s, Coordinator coord, Spec... specs) throws Exception {
        Connection[] conns = new Connection[specs.length];
        try {
            Transaction tx = coord.transaction();
            for (int i = 0; i < specs.length; i++) {
                Spec sp = specs[i];
                conns[i] = sp.onPg ? s.pg() : s.my();
                Branch b = tx.branch(conns[i], sp.onPg ? "savings" : "checking", Isolation.SERIALIZABLE, null, sp.readOnly);
                try (Statement st = conns[i].createStatement()) {
                    st.execute(sp.sql);
                } catch (SQLException e) {
                    throw b.fail(e);
                }
            }
            tx.commit();
        } finally {
            for (Connection c : conns) {
                if (c != null) {
                    c.close();
                }
            }
        }
    }

    static int bal(Servers s, boolean onPg) throws SQLException {
        try (Connection c = onPg ? s.pg() : s.my(); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery("SELECT bal FROM " + (onPg ? "savings" : "checking") + " WHERE u = 'j-ro'")) {
            rs.next();
            return rs.getInt(1);
        }
    }

    static void reset(Servers s) throws SQLException {
        s.createTables();
        s.exec(true, "INSERT INTO savings VALUES ('j-ro', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0");
        s.exec(false, "INSERT INTO checking VALUES ('j-ro', 0, '') ON DUPLICATE KEY UPDATE bal = 0");
    }

    static final Spec PG_READ = new Spec(true, true, "SELECT bal FROM savings WHERE u = 'j-ro'");
    static final Spec MY_READ = new Spec(false, true, "SELECT bal FROM checking WHERE u = 'j-ro'");

    @Test
    void engineMode() throws Exception {
        Servers s = Servers.engine();
        reset(s);
        try (LocalDaemon d = s.daemon("j-ro", "engine").recoveryMs(3_600_000).start()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            Coordinator coord = d.client().decisionTimeout(Duration.ofSeconds(60)).build();
            double before = settledSyncs(d);
            double ro = metric(d, "cotx_read_only_commits_total");
            for (int i = 0; i < 3; i++) {
                run(s, coord, PG_READ, MY_READ);
            }
            assertEquals(before, settledSyncs(d), "all-read-only commits synced the store");
            assertEquals(3, metric(d, "cotx_read_only_commits_total") - ro);

            // Declared read-only, yet it wrote: not listed, the decision synced, the write there.
            before = settledSyncs(d);
            ro = metric(d, "cotx_read_only_commits_total");
            run(s, coord, new Spec(true, true, "UPDATE savings SET bal = bal + 1 WHERE u = 'j-ro'"), MY_READ);
            assertTrue(settledSyncs(d) > before, "a declared read-only branch that wrote committed without a sync");
            assertEquals(ro, metric(d, "cotx_read_only_commits_total"));
            assertEquals(1, bal(s, true));

            // MariaDB in engine mode: a READ ONLY transaction, the write refused (1792).
            TransactionAbortedException e = assertThrows(TransactionAbortedException.class,
                    () -> run(s, coord, PG_READ, new Spec(false, true, "UPDATE checking SET bal = bal + 1 WHERE u = 'j-ro'")));
            assertTrue(e.getCause() instanceof SQLException se && se.getErrorCode() == 1792, String.valueOf(e.getCause()));
            assertEquals(0, bal(s, false));
        }
    }

    @Test
    void clientMode() throws Exception {
        Servers s = Servers.bare();
        reset(s);
        try (LocalDaemon d = s.daemon("j-ro", "client").recoveryMs(3_600_000).start()) {
            d.awaitModes("client", Duration.ofSeconds(15));
            Coordinator coord = d.client().decisionTimeout(Duration.ofSeconds(60)).build();
            // Two PostgreSQL branches, both read-only (checked before the slot write).
            double before = settledSyncs(d);
            double ro = metric(d, "cotx_read_only_commits_total");
            run(s, coord, PG_READ, PG_READ);
            assertEquals(before, settledSyncs(d), "an all-read-only commit in client mode synced the store");
            assertEquals(1, metric(d, "cotx_read_only_commits_total") - ro);

            // A MariaDB branch declared read-only in client mode: not a READ ONLY transaction
            // (its slot write must go through), never listed: the decision syncs.
            for (String sql : new String[] {MY_READ.sql(), "UPDATE checking SET bal = bal + 1 WHERE u = 'j-ro'"}) {
                before = settledSyncs(d);
                ro = metric(d, "cotx_read_only_commits_total");
                run(s, coord, PG_READ, new Spec(false, true, sql));
                assertTrue(settledSyncs(d) > before, sql + ": a client-mode MariaDB branch committed without a sync");
                assertEquals(ro, metric(d, "cotx_read_only_commits_total"), sql);
            }
            assertEquals(1, bal(s, false));
            long deadline = System.currentTimeMillis() + 15_000;
            while (s.prepared() > 0 && System.currentTimeMillis() < deadline) {
                Thread.sleep(50);
            }
            assertFalse(s.prepared() > 0, "still prepared");
        }
    }
}
