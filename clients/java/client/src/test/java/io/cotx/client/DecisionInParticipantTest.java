package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** The decision in a participant ({@link Transaction#decideInParticipant(boolean)}) against the
 * real daemon and servers with pg_co / mysql_co, on the begin path and on the one-request
 * path: the PostgreSQL branch's COMMIT carries the decision (no PREPARE there, no store
 * write); pg_co refusing that COMMIT aborts everything retryably; a resource not declared
 * a decision resource is a configuration error, not retried. As the Go client's
 * decide_in_test.go. */
class DecisionInParticipantTest {
    /** One transfer of {@code key} into savings and checking, the decision in savings. */
    static void transfer(Coordinator coord, Connection pc, Connection mc, String key, int retries) {
        coord.run(tx -> {
            tx.decideInParticipant(true);
            insert(tx.branch(pc, "savings"), pc, "INSERT INTO savings VALUES (?, 1, '')", key);
            insert(tx.branch(mc, "checking"), mc, "INSERT INTO checking VALUES (?, 1, '')", key);
            return null;
        }, retries);
    }

    static void insert(Branch b, Connection c, String sql, String key) {
        try (PreparedStatement st = c.prepareStatement(sql)) {
            st.setString(1, key);
            st.execute();
        } catch (SQLException e) {
            throw b.fail(e);
        }
    }

    static LocalDaemon daemon(Servers s, String node, boolean decisions) throws Exception {
        s.exec(true, "CREATE EXTENSION IF NOT EXISTS pg_co");
        LocalDaemon.Builder b = s.daemon(node, "engine");
        if (decisions) {
            b.decisions("savings");
        }
        LocalDaemon d = b.start();
        d.awaitModes("engine", Duration.ofSeconds(15));
        return d;
    }

    @ParameterizedTest(name = "one request: {0}")
    @ValueSource(booleans = {false, true})
    void decidedInThePostgresqlBranch(boolean oneRequest) throws Exception {
        Servers s = Servers.engine();
        String pre = "j-dip-" + oneRequest + "-";
        OneRequestCommitTest.clear(s, pre);
        try (LocalDaemon d = daemon(s, "j-dip-" + oneRequest, true); Connection pc = s.pg(); Connection mc = s.my()) {
            Coordinator coord = d.client().oneRequest(oneRequest).decisionTimeout(Duration.ofSeconds(60)).build();
            OneRequestCommitTest.transfer(coord, pc, mc, pre + "first", 5); // learns the resources' modes
            double decided = OneRequestCommitTest.metric(d, "cotx_decided_in_participant_total");
            double leases = OneRequestCommitTest.metric(d, "cotx_gtid_leases_total");
            int n = 5;
            for (int i = 0; i < n; i++) {
                transfer(coord, pc, mc, pre + i, 0);
            }
            assertEquals(n, OneRequestCommitTest.metric(d, "cotx_decided_in_participant_total") - decided, "decided in the participant");
            // One range for all of them on the one-request path (no begin), none on the begin.
            assertEquals(oneRequest ? 1 : 0, OneRequestCommitTest.metric(d, "cotx_gtid_leases_total") - leases, "leases");
            for (int i = 0; i < n; i++) {
                assertTrue(OneRequestCommitTest.present(s, true, pre + i) && OneRequestCommitTest.present(s, false, pre + i),
                        pre + i + " not committed in both");
            }
            coord.flushAcks();
            assertEquals(0, s.prepared(), "prepared left");

            // pg_co's rule A at the decision commit: the PostgreSQL branch read a row, then an
            // in-doubt 2PC writer overwrote it. Nothing commits anywhere; retryable, refused.
            String key = pre + "a";
            String w = pre + "w";
            s.exec(true, "INSERT INTO savings VALUES ('" + key + "', 100, '')");
            try (Connection wc = s.pg()) {
                TransactionAbortedException e = assertThrows(TransactionAbortedException.class, () -> coord.run(tx -> {
                    tx.decideInParticipant(true);
                    insert(tx.branch(mc, "checking"), mc, "INSERT INTO checking VALUES (?, 1, '')", key);
                    Branch p = tx.branch(pc, "savings");
                    try (Statement st = pc.createStatement(); Statement ws = wc.createStatement()) {
                        try (ResultSet rs = st.executeQuery("SELECT bal FROM savings WHERE u = '" + key + "'")) {
                            rs.next();
                        }
                        st.execute("INSERT INTO savings VALUES ('" + key + "-r', 1, '')");
                        ws.execute("BEGIN ISOLATION LEVEL SERIALIZABLE");
                        ws.execute("UPDATE savings SET bal = bal + 1 WHERE u = '" + key + "'");
                        ws.execute("PREPARE TRANSACTION '" + w + "'");
                    } catch (SQLException x) {
                        throw p.fail(x);
                    }
                    return null;
                }, 0));
                s.exec(true, "COMMIT PREPARED '" + w + "'");
                assertTrue(e.retryable() && e.refused() && e.getMessage().contains("rule A"), "want a retryable rule A refusal: " + e);
            }
            assertFalse(OneRequestCommitTest.present(s, true, key + "-r"), "the refused decision branch committed");
            assertFalse(OneRequestCommitTest.present(s, false, key), "the MariaDB branch committed");
            assertEquals(0, s.prepared(), "prepared left after the refusal");
        }
    }

    /** The one-request path with the decision in the PostgreSQL branch, the daemon killed -9
     * and restarted under 4 threads' load: every transfer commits in the end, none split,
     * nothing left prepared (a decision branch committed while the daemon was down: the
     * restarted daemon reads the decision there, co.resolve). */
    @Test
    void daemonRestartUnderLoad() throws Exception {
        Servers s = Servers.engine();
        try (LocalDaemon d = daemon(s, "j-dip-r", true)) {
            OneRequestCommitTest.restartUnderLoad(s, d, "j-dip-r-", true);
            assertTrue(OneRequestCommitTest.metric(d, "cotx_decided_in_participant_total") > 0, "none decided in the participant");
        }
    }

    @ParameterizedTest(name = "one request: {0}")
    @ValueSource(booleans = {false, true})
    void aResourceWithoutDecisionsIsAConfigurationError(boolean oneRequest) throws Exception {
        Servers s = Servers.engine();
        String pre = "j-dip-none-" + oneRequest + "-";
        OneRequestCommitTest.clear(s, pre);
        try (LocalDaemon d = daemon(s, "j-dip-none-" + oneRequest, false); Connection pc = s.pg(); Connection mc = s.my()) {
            AtomicInteger retried = new AtomicInteger();
            Coordinator coord = d.client().oneRequest(oneRequest).decisionTimeout(Duration.ofSeconds(60)).build()
                    .addListener(new TransactionListener() {
                        @Override
                        public void retrying(int attempt, TransactionAbortedException why, Duration delay) {
                            retried.incrementAndGet();
                        }
                    });
            OneRequestCommitTest.transfer(coord, pc, mc, pre + "first", 5);
            TransactionAbortedException e = assertThrows(TransactionAbortedException.class, () -> transfer(coord, pc, mc, pre + "0", 5));
            assertTrue(!e.retryable() && e.getMessage().contains("not_a_decision_resource") && retried.get() == 0,
                    "want a non-retryable error naming not_a_decision_resource, not run again: " + e + " (" + retried.get() + " retries)");
            assertFalse(OneRequestCommitTest.present(s, true, pre + "0") || OneRequestCommitTest.present(s, false, pre + "0"), "committed");
            assertEquals(0, s.prepared(), "prepared left");
        }
    }

    /** The decision branch's session is lost during the COMMIT that carries the decision,
     * after PostgreSQL committed it. Whether it committed is the database's to say: the client
     * must not read the lost session as a refusal (rolling back and reporting the branch
     * failed would have the daemon abort the MariaDB branch, a split, and run() would run the
     * transfer again). It waits for the daemon, which reads the decision in PostgreSQL
     * (co.resolve) after the owner's grace period: run() returns, once, both rows are there,
     * nothing is left prepared. On both paths; as the Go client's TestDecisionCommitSessionLost. */
    @ParameterizedTest(name = "one request: {0}")
    @ValueSource(booleans = {false, true})
    void sessionLostDuringTheDecisionCommit(boolean oneRequest) throws Exception {
        Servers s = Servers.engine();
        String pre = "j-dip-lost-" + oneRequest + "-";
        OneRequestCommitTest.clear(s, pre);
        try (LocalDaemon d = daemon(s, "j-dip-lost-" + oneRequest, true); Connection pc = s.pg(); Connection mc = s.my()) {
            Coordinator coord = d.client().oneRequest(oneRequest).decisionTimeout(Duration.ofSeconds(60)).build();
            OneRequestCommitTest.transfer(coord, pc, mc, pre + "first", 5);
            AtomicInteger runs = new AtomicInteger();
            try (CommitHangs hold = new CommitHangs(s)) {
                CompletableFuture<Integer> lost = CompletableFuture.supplyAsync(() -> {
                    try {
                        return hold.loseTheWaiter();
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                });
                coord.run(tx -> {
                    runs.incrementAndGet();
                    tx.decideInParticipant(true);
                    insert(tx.branch(pc, "savings"), pc, "INSERT INTO savings VALUES (?, 1, '')", pre + "0");
                    insert(tx.branch(mc, "checking"), mc, "INSERT INTO checking VALUES (?, 1, '')", pre + "0");
                    return null;
                }, 0);
                assertTrue(lost.get(60, TimeUnit.SECONDS) != 0, "the decision COMMIT never waited");
            }
            assertEquals(1, runs.get(), "runs");
            assertFalse(pc.isValid(1), "the decision branch's session was not lost");
            assertTrue(OneRequestCommitTest.present(s, true, pre + "0") && OneRequestCommitTest.present(s, false, pre + "0"),
                    "split: not committed in both");
            coord.flushAcks();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (s.prepared() != 0 && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            assertEquals(0, s.prepared(), "prepared left");
        }
    }

    /** The decision branch's session is lost while its decision is still open (co.decide waits
     * on another session's lock of co.decisions; the waiting backend is terminated, then the
     * lock released): nothing committed anywhere. The daemon resolves abort in PostgreSQL
     * (co.resolve), and that abort is "safe to run again": run() runs the transfer again (a
     * fresh session, as from a pool) and it commits once. On both paths; as the Go client's
     * TestDecisionCommitSessionLostBeforeItTookEffect. */
    @ParameterizedTest(name = "one request: {0}")
    @ValueSource(booleans = {false, true})
    void sessionLostBeforeTheDecisionCommitTookEffect(boolean oneRequest) throws Exception {
        Servers s = Servers.engine();
        String pre = "j-dip-lostb-" + oneRequest + "-";
        OneRequestCommitTest.clear(s, pre);
        try (LocalDaemon d = daemon(s, "j-dlb-" + oneRequest, true); Connection pc = s.pg(); Connection mc = s.my();
                Connection blocker = s.pg()) {
            Coordinator coord = d.client().oneRequest(oneRequest).decisionTimeout(Duration.ofSeconds(60)).build();
            OneRequestCommitTest.transfer(coord, pc, mc, pre + "first", 5);
            AtomicInteger runs = new AtomicInteger();
            java.util.List<Connection> opened = new java.util.ArrayList<>();
            CompletableFuture<Integer> lost = new CompletableFuture<>();
            Runnable loseTheDecider = () -> {
                int pid = 0;
                try {
                    for (int i = 0; i < 600 && pid == 0; i++) {
                        try (Connection c = s.pg(); Statement st = c.createStatement(); ResultSet rs = st.executeQuery(
                                "SELECT coalesce(min(pid), 0) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%co.decide(%'")) {
                            rs.next();
                            pid = rs.getInt(1);
                        }
                        if (pid == 0) {
                            Thread.sleep(50);
                        }
                    }
                    if (pid != 0) {
                        s.exec(true, "SELECT pg_terminate_backend(" + pid + ")");
                    }
                    blocker.rollback();
                } catch (Exception e) {
                    lost.completeExceptionally(e);
                }
                lost.complete(pid);
            };
            coord.run(tx -> {
                runs.incrementAndGet();
                Connection fresh;
                try {
                    fresh = s.pg(); // a fresh session per attempt, as from a pool
                    opened.add(fresh);
                } catch (SQLException e) {
                    throw new IllegalStateException(e);
                }
                tx.decideInParticipant(true);
                insert(tx.branch(fresh, "savings"), fresh, "INSERT INTO savings VALUES (?, 1, '')", pre + "0");
                insert(tx.branch(mc, "checking"), mc, "INSERT INTO checking VALUES (?, 1, '')", pre + "0");
                if (runs.get() == 1) {
                    try (Statement st = blocker.createStatement()) {
                        blocker.setAutoCommit(false);
                        st.execute("LOCK TABLE co.decisions IN SHARE MODE");
                    } catch (SQLException e) {
                        throw new IllegalStateException(e);
                    }
                    CompletableFuture.runAsync(loseTheDecider);
                }
                return null;
            }, 2);
            assertTrue(lost.get(60, TimeUnit.SECONDS) != 0, "co.decide never waited");
            for (Connection c : opened) {
                c.close();
            }
            assertEquals(2, runs.get(), "runs");
            assertTrue(OneRequestCommitTest.present(s, true, pre + "0") && OneRequestCommitTest.present(s, false, pre + "0"),
                    "split: not committed in both");
        }
    }

    /** A single-branch transaction commits in one phase (no PREPARE, no decision record); its
     * session is lost during that COMMIT, after PostgreSQL committed it. Only the database
     * knows whether it committed: run() throws {@link OutcomeUnknownException} naming the
     * loss, does not run it again, and the daemon records no abort. Before, the client rolled
     * back on the dead session, acknowledged "abort" and threw TransactionAbortedException
     * while the row had committed. As the Go client's TestOnePhaseCommitSessionLost. */
    @Test
    void sessionLostDuringAOnePhaseCommit() throws Exception {
        Servers s = Servers.engine();
        String pre = "j-1p-lost-";
        OneRequestCommitTest.clear(s, pre);
        try (LocalDaemon d = daemon(s, "j-1p-lost", false); Connection pc = s.pg()) {
            Coordinator coord = d.client().oneRequest(false).decisionTimeout(Duration.ofSeconds(60)).build();
            try (Statement st = pc.createStatement()) {
                st.execute("SET synchronous_commit = on"); // the test servers run it off: no wait
            }
            java.util.List<String> gtids = new java.util.ArrayList<>();
            OutcomeUnknownException e;
            try (CommitHangs hold = new CommitHangs(s)) {
                CompletableFuture<Integer> lost = new CompletableFuture<>();
                e = assertThrows(OutcomeUnknownException.class, () -> coord.run(tx -> {
                    insert(tx.branch(pc, "savings"), pc, "INSERT INTO savings VALUES (?, 1, '')", pre + "0");
                    gtids.add(tx.gtid());
                    CompletableFuture.runAsync(() -> {
                        try {
                            lost.complete(hold.loseTheWaiter());
                        } catch (Exception x) {
                            lost.completeExceptionally(x);
                        }
                    });
                    return null;
                }, 2));
                assertTrue(lost.get(60, TimeUnit.SECONDS) != 0, "the one-phase COMMIT never waited");
            }
            assertTrue(e.getMessage().contains("lost during the one-phase COMMIT"), e.getMessage());
            assertEquals(1, gtids.size(), "runs");
            assertTrue(OneRequestCommitTest.present(s, true, pre + "0"), "the row did not commit: the test held nothing");
            com.fasterxml.jackson.databind.JsonNode got = coord.get(gtids.get(0));
            assertFalse(got.path("decision").asText("").equals("abort") || got.hasNonNull("abort_reason"), "the daemon recorded an abort: " + got);
        }
    }
}
