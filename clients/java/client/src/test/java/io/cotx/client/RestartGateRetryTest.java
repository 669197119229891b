package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** Client mode on MariaDB: a daemon restarted with a branch of its last run prepared there
 * closes the restart gate at its first look (it cannot know whether MariaDB restarted
 * meanwhile) until its recovery has decided that branch. A registration in between is
 * answered 503 restart_gate, "not now"; {@link Retry#run} waits its Retry-After and runs the
 * work again, so the application sees no failure. MariaDB's global read lock holds the
 * recovery's XA ROLLBACK, so the registration surely comes in between; the end of the first
 * attempt lets go of it. (The same in Python and Go: test_client_mode.py,
 * restart_gate_test.go.) */
class RestartGateRetryTest {
    static void update(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.executeUpdate(sql);
        }
    }

    static int balance(Connection c, String table, String user) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT bal FROM " + table + " WHERE u = '" + user + "'")) {
            return rs.next() ? rs.getInt(1) : -1;
        }
    }

    @Test
    void runRetriesTheRestartGateOfARestartedDaemon() throws Exception {
        Servers servers = Servers.bare();
        servers.createTables();
        servers.exec(true, "INSERT INTO savings VALUES ('j-gate', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0");
        servers.exec(false, "INSERT INTO checking VALUES ('j-gate', 0, '') ON DUPLICATE KEY UPDATE bal = 0");
        servers.exec(false, "INSERT INTO checking VALUES ('j-gate-after', 0, '') ON DUPLICATE KEY UPDATE bal = 0");
        try (LocalDaemon d = servers.daemon("j-gate", "client").ownerGraceMs(300).start();
                Connection pc = servers.pg(); Connection mc = servers.my(); Connection hold = servers.my()) {
            d.awaitModes("client", Duration.ofSeconds(15));
            Coordinator coord = d.client().decisionTimeout(Duration.ofSeconds(60)).build();
            // A transfer prepared at both servers whose commit the daemon never reads: it is
            // stopped before the commit request, then killed.
            Transaction tx = coord.transaction();
            Branch bp = tx.branch(pc, "savings", Isolation.SERIALIZABLE, null);
            update(pc, "UPDATE savings SET bal = bal + 1 WHERE u = 'j-gate'");
            Branch bm = tx.branch(mc, "checking", Isolation.SERIALIZABLE, null);
            update(mc, "UPDATE checking SET bal = bal + 1 WHERE u = 'j-gate'");
            assertEquals(Branch.Enforcement.CLIENT, bp.enforcement());
            assertEquals(Branch.Enforcement.CLIENT, bm.enforcement());
            new ProcessBuilder("kill", "-STOP", Long.toString(d.pid())).inheritIO().start().waitFor();
            CompletableFuture<Void> first = CompletableFuture.runAsync(() -> {
                try {
                    tx.commit();
                } catch (RuntimeException e) {
                    // its outcome: the daemon that never read its commit presumed it aborted
                }
            });
            Instant deadline = Instant.now().plusSeconds(15);
            while (!myPrepared(hold)) {
                assertTrue(Instant.now().isBefore(deadline), "the MariaDB branch was not prepared within 15 s");
                Thread.sleep(20);
            }
            update(hold, "FLUSH TABLES WITH READ LOCK");
            d.restart();

            List<String> attempts = new ArrayList<>();
            try (Connection after = servers.my()) {
                Retry.run(coord, t -> {
                    t.branch(after, "checking", Isolation.SERIALIZABLE, null);
                    update(after, "UPDATE checking SET bal = bal + 1 WHERE u = 'j-gate-after'");
                    return null;
                }, Retry.Policy.ofRetries(5), 0, null, t -> {
                    attempts.add(t.gtidOrNull());
                    try {
                        update(hold, "UNLOCK TABLES");
                    } catch (SQLException e) {
                        throw new IllegalStateException(e);
                    }
                });
            }
            double refused = ReadOnlyCommitTest.metric(d, "cotx_branch_refusals_total{resource=\"checking\",code=\"restart_gate\"}");
            assertTrue(refused >= 1 && attempts.size() >= 2,
                    "no registration was refused (" + refused + ", attempts " + attempts + "): the gate was open at once, so this test shows nothing");
            first.get(30, TimeUnit.SECONDS);
            assertEquals(0, servers.awaitNothingPrepared(Duration.ofSeconds(15)), "nothing left prepared");
            try (Connection p = servers.pg(); Connection m = servers.my()) {
                assertEquals(balance(p, "savings", "j-gate"), balance(m, "checking", "j-gate"), "the first transfer: both or neither");
                assertEquals(1, balance(m, "checking", "j-gate-after"));
            }
        }
    }

    static boolean myPrepared(Connection c) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("XA RECOVER")) {
            return rs.next();
        }
    }
}
