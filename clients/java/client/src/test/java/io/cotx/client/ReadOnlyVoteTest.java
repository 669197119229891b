package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** The read-only vote of plain 2PC (Branch.votesReadOnly): on resources with enforcement
 * "none" a declared read-only branch that wrote nothing is committed in one phase at its vote,
 * never prepared, on the begin path and on the one-request path; the daemon still decides an
 * all-read-only transaction in memory and nothing is left prepared. A declared read-only
 * branch that wrote is prepared, and in engine mode nothing changes. What each server saw is
 * read from the server itself: PostgreSQL's statement log (log_statement = 'all' on the
 * branch's session; the log is the backend's stderr) and MariaDB's session counters
 * (Com_xa_prepare). As the Go client's readonly_vote_test.go. */
class ReadOnlyVoteTest {
    /** What the servers saw of one transaction: the PostgreSQL branch's PREPARE TRANSACTION in
     * the server's log; XA PREPAREs and XA COMMITs in the MariaDB branch's session. */
    record Seen(boolean pgPrepared, long myPrepares, long myCommits) {
    }

    static long counter(Connection c, String name) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SHOW SESSION STATUS LIKE '" + name + "'")) {
            rs.next();
            return rs.getLong(2);
        }
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.execute(sql);
        }
    }

    /** One global transaction: a PostgreSQL branch running {@code pgSql} and a MariaDB branch
     * reading, both declared read-only. */
    static Seen run(Servers s, Coordinator coord, String pgSql) throws Exception {
        try (Connection pc = s.pg(); Connection mc = s.my()) {
            long pid;
            try (Statement st = pc.createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
                rs.next();
                pid = rs.getLong(1);
            }
            exec(pc, "SET log_statement = 'all'");
            long prepares = counter(mc, "Com_xa_prepare");
            long commits = counter(mc, "Com_xa_commit");
            Transaction tx = coord.transaction();
            Branch pb = tx.readOnlyBranch(pc, "savings");
            try {
                // The branch id in a statement of the branch: the log shows it was written to.
                exec(pc, pgSql + " AND '" + pb.id() + "' <> ''");
            } catch (SQLException e) {
                throw pb.fail(e);
            }
            Branch mb = tx.readOnlyBranch(mc, "checking");
            try {
                exec(mc, "SELECT bal FROM checking WHERE u = 'j-vote'");
            } catch (SQLException e) {
                throw mb.fail(e);
            }
            tx.commit();
            // The backend's stderr is the server's log file (pg_ctl -l; the tests run as root).
            String log = Files.readString(Path.of("/proc/" + pid + "/fd/2"));
            assertTrue(log.contains(pb.id()), "the branch's statements are not in the server's log");
            boolean prepared = log.lines().anyMatch(l -> l.contains("PREPARE TRANSACTION") && l.contains(pb.id()));
            return new Seen(prepared, counter(mc, "Com_xa_prepare") - prepares, counter(mc, "Com_xa_commit") - commits);
        }
    }

    static final String READ = "SELECT bal FROM savings WHERE u = 'j-vote'";

    static void reset(Servers s) throws SQLException {
        s.createTables();
        s.exec(true, "INSERT INTO savings VALUES ('j-vote', 0, '') ON CONFLICT (u) DO UPDATE SET bal = 0");
        s.exec(false, "INSERT INTO checking VALUES ('j-vote', 0, '') ON DUPLICATE KEY UPDATE bal = 0");
    }

    static double metric(LocalDaemon d, String name) throws Exception {
        return ReadOnlyCommitTest.metric(d, name);
    }

    @Test
    void plain2pc() throws Exception {
        Servers s = Servers.bare();
        reset(s);
        try (LocalDaemon d = s.daemon("j-vote", "none").start()) {
            d.awaitModes("none", Duration.ofSeconds(15));
            // The first transaction takes the begin (and teaches the one-request path the modes).
            Coordinator coord = d.client().oneRequest(true).decisionTimeout(Duration.ofSeconds(60)).build();
            for (String path : new String[] {"begin", "one request"}) {
                double ro = metric(d, "cotx_read_only_commits_total");
                double leases = metric(d, "cotx_gtid_leases_total");
                Seen seen = run(s, coord, READ);
                assertEquals(new Seen(false, 0, 1), seen, path + ": a read-only branch of plain 2PC was prepared");
                assertEquals(1, metric(d, "cotx_read_only_commits_total") - ro, path + ": not decided in memory");
                assertEquals(path.equals("one request") ? 1 : 0, metric(d, "cotx_gtid_leases_total") - leases, path + ": leases");
                assertEquals(0, s.prepared(), path + ": left prepared");
            }

            // Declared read-only, yet it wrote: prepared (and committed), not counted read-only.
            double ro = metric(d, "cotx_read_only_commits_total");
            Seen seen = run(s, coord, "UPDATE savings SET bal = bal + 1 WHERE u = 'j-vote'");
            assertTrue(seen.pgPrepared(), "a declared read-only branch that wrote was not prepared");
            assertEquals(0, seen.myPrepares(), "the MariaDB read-only branch was prepared");
            assertEquals(ro, metric(d, "cotx_read_only_commits_total"));
            try (Connection c = s.pg(); Statement st = c.createStatement();
                    ResultSet rs = st.executeQuery("SELECT bal FROM savings WHERE u = 'j-vote'")) {
                rs.next();
                assertEquals(1, rs.getInt(1), "the write");
            }
            assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(15)), "left prepared");
            coord.flushAcks();
        }
    }

    /** In engine mode read-only branches still prepare (pg_co's rule C, mysql_co's read locks). */
    @Test
    void engineModeStillPrepares() throws Exception {
        Servers s = Servers.engine();
        reset(s);
        try (LocalDaemon d = s.daemon("j-vote", "engine").start()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            Coordinator coord = d.client().decisionTimeout(Duration.ofSeconds(60)).build();
            Seen seen = run(s, coord, READ);
            assertTrue(seen.pgPrepared(), "engine mode: the PostgreSQL read-only branch was not prepared");
            assertEquals(1, seen.myPrepares(), "engine mode: the MariaDB read-only branch was not prepared");
            assertFalse(s.awaitNothingPrepared(Duration.ofSeconds(15)) > 0, "left prepared");
        }
    }
}
