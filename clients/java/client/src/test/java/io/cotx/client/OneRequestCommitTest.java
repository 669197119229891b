package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The one-request commit ({@link Coordinator.Builder#oneRequest(boolean)}, LeasedGtids)
 * against the real daemon and servers with pg_co / mysql_co: transactions commit with one
 * request each (cotx_requests_total, one lease), a daemon killed (-9) and restarted under
 * load leads to retries on a fresh lease with nothing left prepared and nothing split, and
 * client mode always takes the begin. As the Go client's onerequest_test.go. */
class OneRequestCommitTest {
    /** One global transaction inserting {@code key} in savings and checking, through run(). */
    static void transfer(Coordinator coord, Connection pc, Connection mc, String key, int retries) {
        coord.run(tx -> {
            Branch b = tx.branch(pc, "savings");
            try (PreparedStatement st = pc.prepareStatement("INSERT INTO savings VALUES (?, 1, '')")) {
                st.setString(1, key);
                st.execute();
            } catch (SQLException e) {
                throw b.fail(e);
            }
            b = tx.branch(mc, "checking");
            try (PreparedStatement st = mc.prepareStatement("INSERT INTO checking VALUES (?, 1, '')")) {
                st.setString(1, key);
                st.execute();
            } catch (SQLException e) {
                throw b.fail(e);
            }
            return null;
        }, retries);
    }

    static boolean present(Servers s, boolean onPg, String key) throws SQLException {
        try (Connection c = onPg ? s.pg() : s.my();
                PreparedStatement st = c.prepareStatement("SELECT count(*) FROM " + (onPg ? "savings" : "checking") + " WHERE u = ?")) {
            st.setString(1, key);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getInt(1) == 1;
            }
        }
    }

    static void clear(Servers s, String prefix) throws SQLException {
        s.createTables();
        s.exec(true, "DELETE FROM savings WHERE u LIKE '" + prefix + "%'");
        s.exec(false, "DELETE FROM checking WHERE u LIKE '" + prefix + "%'");
    }

    static double metric(LocalDaemon d, String name) throws Exception {
        return ReadOnlyCommitTest.metric(d, name);
    }

    @Test
    void oneRequestEach() throws Exception {
        Servers s = Servers.engine();
        clear(s, "j-one-");
        try (LocalDaemon d = s.daemon("j-one", "engine").start(); Connection pc = s.pg(); Connection mc = s.my()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            Coordinator coord = d.client().oneRequest(true).decisionTimeout(Duration.ofSeconds(60)).build();
            transfer(coord, pc, mc, "j-one-first", 5); // learns the resources' modes (on the begin)
            int n = 20;
            double leases = metric(d, "cotx_gtid_leases_total");
            double begun = metric(d, "cotx_transactions_begun_total");
            double requests = metric(d, "cotx_requests_total");
            for (int i = 0; i < n; i++) {
                transfer(coord, pc, mc, "j-one-" + i, 5);
            }
            // The metrics read before is counted once answered; then one lease, one request each.
            assertEquals(n + 2, metric(d, "cotx_requests_total") - requests, "requests for " + n + " transactions");
            assertEquals(1, metric(d, "cotx_gtid_leases_total") - leases, "leases");
            assertEquals(n, metric(d, "cotx_transactions_begun_total") - begun, "transactions the daemon counted");
            for (int i = 0; i < n; i++) {
                assertTrue(present(s, true, "j-one-" + i) && present(s, false, "j-one-" + i), "j-one-" + i + " not committed in both");
            }
            coord.flushAcks();
        }
    }

    @Test
    void daemonRestartUnderLoad() throws Exception {
        Servers s = Servers.engine();
        try (LocalDaemon d = s.daemon("j-one-r", "engine").recoveryMs(300).start()) {
            restartUnderLoad(s, d, "j-one-r-", false);
        }
    }

    /** 4 threads of 25 transfers each (keys {@code pre}…, the decision in the PostgreSQL branch
     * when {@code dip}), the daemon killed -9 and restarted after the first 10 commits: every
     * transfer commits in the end (after retries), none split, nothing left prepared. */
    static void restartUnderLoad(Servers s, LocalDaemon d, String pre, boolean dip) throws Exception {
        clear(s, pre);
        d.awaitModes("engine", Duration.ofSeconds(15));
        AtomicInteger retries = new AtomicInteger();
        Coordinator coord = d.client().oneRequest(true).decisionTimeout(Duration.ofSeconds(60)).build()
                .addListener(new TransactionListener() {
                    @Override
                    public void retrying(int attempt, TransactionAbortedException why, Duration delay) {
                        retries.incrementAndGet();
                    }
                });
        try (Connection pc = s.pg(); Connection mc = s.my()) {
            transfer(coord, pc, mc, pre + "first", 5);
        }
        int workers = 4;
        int each = 25;
        AtomicInteger committed = new AtomicInteger();
        ConcurrentLinkedQueue<String> failures = new ConcurrentLinkedQueue<>();
        List<Thread> threads = new ArrayList<>();
        for (int w = 0; w < workers; w++) {
            int worker = w;
            Thread t = new Thread(() -> {
                try (Connection pc = s.pg(); Connection mc = s.my()) {
                    for (int i = 0; i < each; i++) {
                        String key = pre + worker + "-" + i;
                        try {
                            if (dip) {
                                DecisionInParticipantTest.transfer(coord, pc, mc, key, 30);
                            } else {
                                transfer(coord, pc, mc, key, 30);
                            }
                            committed.incrementAndGet();
                        } catch (RuntimeException e) {
                            failures.add(key + ": " + e);
                        }
                    }
                } catch (SQLException e) {
                    failures.add("worker " + worker + ": " + e);
                }
            });
            t.start();
            threads.add(t);
        }
        while (committed.get() < 10) {
            Thread.sleep(5);
        }
        d.restart();
        for (Thread t : threads) {
            t.join();
        }
        assertTrue(failures.isEmpty(), "failed: " + failures);
        assertTrue(retries.get() > 0, "no transaction was run again across the restart");
        assertTrue(metric(d, "cotx_gtid_leases_total") >= 1, "the restarted daemon leased no range");
        assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(30)), "left prepared");
        for (int w = 0; w < workers; w++) {
            for (int i = 0; i < each; i++) {
                String key = pre + w + "-" + i;
                boolean pg = present(s, true, key);
                assertEquals(pg, present(s, false, key), key + " split");
                assertTrue(pg, key + " told committed, not there");
            }
        }
    }

    /** Client mode: the helper and slot come with the registration, so its transactions take
     * the begin — never a one-request commit the daemon would refuse. */
    @Test
    void clientModeTakesTheBegin() throws Exception {
        Servers s = Servers.bare();
        clear(s, "j-one-cm-");
        try (LocalDaemon d = s.daemon("j-one-cm", "client").start(); Connection pc = s.pg(); Connection mc = s.my()) {
            d.awaitModes("client", Duration.ofSeconds(15));
            Coordinator coord = d.client().oneRequest(true).decisionTimeout(Duration.ofSeconds(60)).build();
            double begun = metric(d, "cotx_transactions_begun_total");
            for (int i = 0; i < 3; i++) {
                transfer(coord, pc, mc, "j-one-cm-" + i, 5);
            }
            assertEquals(0, metric(d, "cotx_gtid_leases_total"), "gtid leases in client mode");
            assertEquals(3, metric(d, "cotx_transactions_begun_total") - begun);
            for (int i = 0; i < 3; i++) {
                assertTrue(present(s, true, "j-one-cm-" + i) && present(s, false, "j-one-cm-" + i));
            }
            assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(15)), "left prepared");
        }
    }
}
