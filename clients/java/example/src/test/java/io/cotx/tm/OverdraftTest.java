package io.cotx.tm;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.TransactionManager;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BrokenBarrierException;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.mariadb.jdbc.MariaDbDataSource;
import org.postgresql.xa.PGXADataSource;

/**
 * The overdraft through Narayana on real servers (scripts/test-java.sh starts them and
 * passes -Dcotx.pg.port / -Dcotx.my.port). Each round gives a new user 50 + 50 and runs two
 * concurrent withdrawals of 80, one from savings (PostgreSQL) and one from checking
 * (MariaDB). With the checks off (pg_co.enabled = off, mysql_co_enabled = OFF, the MariaDB
 * branch REPEATABLE READ) the total goes negative; with them on it never does. Both modes
 * also check that nothing stays prepared and that every "committed" the TM told the
 * application is in the databases, and every "rolled back" is not.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class OverdraftTest {
    static final int START = 50;
    static final int AMOUNT = 80;
    static int pgPort;
    static int myPort;
    static int rounds;
    static TransactionManager tm;
    static PGXADataSource pgxa;
    static MariaDbDataSource myxa;
    static com.arjuna.ats.arjuna.recovery.RecoveryManager recovery;

    @BeforeAll
    static void setUp() throws Exception {
        pgPort = Integer.parseInt(need("cotx.pg.port"));
        myPort = Integer.parseInt(need("cotx.my.port"));
        rounds = Integer.getInteger("cotx.rounds", 6);
        Path store = Files.createTempDirectory("cotx-narayana-");
        tm = Narayana.configure("cotx-jta-test", store, 30);
        pgxa = new PGXADataSource();
        pgxa.setServerNames(new String[] {"127.0.0.1"});
        pgxa.setPortNumbers(new int[] {pgPort});
        pgxa.setDatabaseName("postgres");
        pgxa.setUser("postgres");
        myxa = new MariaDbDataSource("jdbc:mariadb://127.0.0.1:" + myPort + "/test?user=root");
        // Test only: recovery may roll back an orphaned branch 3 s after it was prepared
        // (default 20 s, which protects in-flight transactions on a loaded machine).
        com.arjuna.common.internal.util.propertyservice.BeanPopulator
                .getDefaultInstance(com.arjuna.ats.jta.common.JTAEnvironmentBean.class).setOrphanSafetyInterval(3000);
        // At start: refused unless pg_co and mysql_co enforce (EngineEnforcementTest shows the refusal).
        recovery = Narayana.startRecovery(Map.of("savings", pgxa, "checking", myxa));
        try (Connection c = pgAdmin(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE IF NOT EXISTS savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')");
        }
        try (Connection c = myAdmin(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE IF NOT EXISTS checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, log text NOT NULL) ENGINE=InnoDB");
        }
        System.out.printf("pgjdbc %s, MariaDB Connector/J %s, Narayana %s%n",
                org.postgresql.util.DriverInfo.DRIVER_VERSION, new org.mariadb.jdbc.Driver().getMajorVersion() + "."
                        + new org.mariadb.jdbc.Driver().getMinorVersion() + " (" + org.mariadb.jdbc.Driver.class.getPackage().getImplementationVersion() + ")",
                com.arjuna.ats.arjuna.common.arjPropertyManager.class.getPackage().getImplementationVersion());
    }

    @AfterAll
    static void tearDown() {
        Narayana.stopRecovery();
    }

    @Test
    @Order(1)
    void checksOffShowTheOverdraft() throws Exception {
        Stats st = run("off", false);
        assertTrue(st.negative > 0, "plain 2PC should overdraw at least once: " + st);
        st.assertConsistent();
    }

    @Test
    @Order(2)
    void checksOnPreventIt() throws Exception {
        Stats st = run("on", true);
        assertEquals(0, st.negative, "with pg_co and mysql_co no round may end below 0: " + st);
        assertTrue(st.withdrawn > 0, "something must still be withdrawn: " + st);
        st.assertConsistent();
    }

    /**
     * A refusal on the MariaDB side: with mysql_co on, a REPEATABLE READ branch is refused at
     * XA PREPARE with 1402, which Connector/J hands to Narayana as XA_RBROLLBACK (a rollback,
     * not an outage). The application gets a RollbackException that is not retryable, the
     * debit is not in the database, and nothing stays prepared.
     */
    @Test
    @Order(3)
    void mariadbRefusalArrivesAsRollback() throws Exception {
        setChecks(true);
        String user = "rr-u1";
        try (Connection c = pgAdmin(); Statement s = c.createStatement()) {
            s.execute("INSERT INTO savings VALUES ('" + user + "', " + START + ", '')");
        }
        try (Connection c = myAdmin(); Statement s = c.createStatement()) {
            s.execute("INSERT INTO checking VALUES ('" + user + "', " + START + ", '')");
        }
        Bank bank = new Bank(tm, pgxa, myxa, Connection.TRANSACTION_REPEATABLE_READ, 5);
        Bank.Result res = bank.withdraw("checking", user, 10, "rr", null);
        System.out.println("[mariadb refusal] " + res.outcome + ": " + res.attempts.get(0).detail());
        assertEquals("failed", res.outcome);
        assertEquals(1, res.attempts.size(), "a configuration error is not retried");
        assertEquals(Bank.Told.ROLLED_BACK, res.attempts.get(0).told());
        assertTrue(res.attempts.get(0).detail().contains("XA_RBROLLBACK") || res.attempts.get(0).detail().contains("ran at"),
                res.attempts.get(0).detail());
        Map<String, Object> fin = finalState(user);
        assertEquals(START, fin.get("checking"));
        assertEquals(0, count(pgAdmin(), "SELECT count(*) FROM pg_prepared_xacts"));
        assertEquals(0, count(myAdmin(), "XA RECOVER"));
    }

    /**
     * Why branch connections must not be marked read-only, and why recovery must be set up.
     * pgjdbc 42.7.9 to 42.7.14 answer XA_RDONLY at prepare for a read-only connection, but
     * only after PREPARE TRANSACTION succeeded (XA's BEGIN is not READ ONLY, so
     * pg_co lets it prepare): the TM never commits a "read-only" branch, and it stays
     * prepared, an in-doubt peer that pg_co makes every writer of its reads wait for or
     * refuses (rule B). Narayana's recovery rolls it back as an orphan (no log record for
     * it); without a recovery manager it would stay until an operator acts.
     */
    @Test
    @Order(4)
    void readOnlyBranchLeftPreparedIsRecovered() throws Exception {
        setChecks(true);
        javax.sql.XAConnection px = pgxa.getXAConnection();
        javax.sql.XAConnection mx = myxa.getXAConnection();
        String told;
        long leftBefore;
        try {
            Connection pc = px.getConnection();
            Connection mc = mx.getConnection();
            pc.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
            pc.setReadOnly(true); // what the application must not do
            mc.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
            tm.begin();
            tm.getTransaction().enlistResource(px.getXAResource());
            tm.getTransaction().enlistResource(mx.getXAResource());
            try (Statement s = pc.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*) FROM savings")) {
                rs.next();
            }
            try (Statement s = mc.createStatement()) {
                s.executeUpdate("UPDATE checking SET bal = bal WHERE u = 'rr-u1'");
            }
            try {
                tm.commit();
                told = "committed";
            } catch (Exception e) {
                told = Bank.describe(e);
            }
            leftBefore = count(pgAdmin(), "SELECT count(*) FROM pg_prepared_xacts");
        } finally {
            px.close();
            mx.close();
        }
        // Recovery rolls back prepared branches of this node that have no log record once
        // they are older than orphanSafetyInterval (set short for this test in setUp).
        long left = leftBefore;
        for (int i = 0; i < 40 && left > 0; i++) {
            Thread.sleep(500);
            recovery.scan();
            left = count(pgAdmin(), "SELECT count(*) FROM pg_prepared_xacts");
        }
        System.out.printf("[read-only branch] pgjdbc %s told the application: %s; left prepared: %d, after recovery: %d%n",
                org.postgresql.util.DriverInfo.DRIVER_VERSION, told, leftBefore, left);
        assertEquals(0, left, "recovery must roll back the orphaned prepared branch");
        assertEquals(0, count(myAdmin(), "XA RECOVER"));
    }

    static final class Stats {
        final String mode;
        int negative;
        int withdrawn;
        int declined;
        int refusals;
        int gaveUp;
        int heuristic;
        int failed;
        int toldCommittedButRolledBack;
        int toldRolledBackButCommitted;
        long preparedLeftPg;
        long preparedLeftMy;
        final List<String> notes = new ArrayList<>();

        Stats(String mode) {
            this.mode = mode;
        }

        void assertConsistent() {
            assertEquals(0, toldCommittedButRolledBack, "TM said committed, databases rolled back: " + this);
            assertEquals(0, toldRolledBackButCommitted, "TM said rolled back, databases committed: " + this);
            assertEquals(0, heuristic, "heuristic outcomes: " + this);
            assertEquals(0, failed, "failed withdrawals: " + this);
            assertEquals(0, preparedLeftPg, "left in pg_prepared_xacts: " + this);
            assertEquals(0, preparedLeftMy, "left in XA RECOVER: " + this);
        }

        @Override
        public String toString() {
            return String.format("[checks %s] negative rounds=%d withdrawn=%d declined=%d refusals(retried)=%d gave_up=%d "
                            + "heuristic=%d failed=%d told_committed_but_rolled_back=%d told_rolled_back_but_committed=%d "
                            + "prepared_left pg=%d mariadb=%d%s",
                    mode, negative, withdrawn, declined, refusals, gaveUp, heuristic, failed, toldCommittedButRolledBack,
                    toldRolledBackButCommitted, preparedLeftPg, preparedLeftMy, notes.isEmpty() ? "" : " notes=" + notes);
        }
    }

    static Stats run(String mode, boolean checksOn) throws Exception {
        setChecks(checksOn);
        int iso = checksOn ? Connection.TRANSACTION_SERIALIZABLE : Connection.TRANSACTION_REPEATABLE_READ;
        Bank bank = new Bank(tm, pgxa, myxa, iso, 5);
        Stats st = new Stats(mode);
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            for (int r = 1; r <= rounds; r++) {
                String user = mode + "-u" + r;
                try (Connection c = pgAdmin(); Statement s = c.createStatement()) {
                    s.execute("INSERT INTO savings VALUES ('" + user + "', " + START + ", '')");
                }
                try (Connection c = myAdmin(); Statement s = c.createStatement()) {
                    s.execute("INSERT INTO checking VALUES ('" + user + "', " + START + ", '')");
                }
                // Both withdrawals read before either writes: the race the overdraft needs,
                // made certain instead of left to timing. A barrier that breaks (one side
                // blocked in a lock wait) just lets the other go on.
                CyclicBarrier bothRead = new CyclicBarrier(2);
                Bank.Hook hook = () -> {
                    try {
                        bothRead.await(5, TimeUnit.SECONDS);
                    } catch (TimeoutException | BrokenBarrierException e) {
                        bothRead.reset();
                    }
                };
                String tag = mode + "-r" + r;
                Future<Bank.Result> fs = pool.submit(() -> bank.withdraw("savings", user, AMOUNT, tag + "-s", hook));
                Future<Bank.Result> fc = pool.submit(() -> bank.withdraw("checking", user, AMOUNT, tag + "-c", hook));
                List<Bank.Result> results = List.of(fs.get(120, TimeUnit.SECONDS), fc.get(120, TimeUnit.SECONDS));
                Map<String, Object> fin = finalState(user);
                int total = (int) fin.get("savings") + (int) fin.get("checking");
                @SuppressWarnings("unchecked")
                Set<String> committed = (Set<String>) fin.get("tids");
                if (total < 0) {
                    st.negative++;
                }
                StringBuilder line = new StringBuilder();
                for (Bank.Result res : results) {
                    switch (res.outcome) {
                        case "withdrawn" -> st.withdrawn++;
                        case "declined" -> st.declined++;
                        case "gave_up" -> st.gaveUp++;
                        case "heuristic" -> st.heuristic++;
                        default -> st.failed++;
                    }
                    st.refusals += res.refusals.size();
                    for (Bank.Attempt a : res.attempts) {
                        boolean inDb = committed.contains(a.tid());
                        if (a.told() == Bank.Told.COMMITTED && !inDb) {
                            st.toldCommittedButRolledBack++;
                        }
                        if (a.told() == Bank.Told.ROLLED_BACK && inDb) {
                            st.toldRolledBackButCommitted++;
                        }
                        if (a.told() == Bank.Told.HEURISTIC || (a.told() == Bank.Told.ROLLED_BACK && a.detail().startsWith("not retryable"))) {
                            st.notes.add(a.tid() + ": " + a.detail());
                        }
                    }
                    line.append(String.format(" %s=%s(%d attempt(s))", res.attempts.get(0).account(), res.outcome, res.attempts.size()));
                }
                System.out.printf("[checks %s] round %d: savings %d + checking %d = %d;%s%n", mode, r,
                        fin.get("savings"), fin.get("checking"), total, line);
                if (r == 1 && !results.get(0).refusals.isEmpty()) {
                    System.out.println("  refusal seen by the application: " + results.get(0).refusals.get(0));
                } else if (r == 1 && !results.get(1).refusals.isEmpty()) {
                    System.out.println("  refusal seen by the application: " + results.get(1).refusals.get(0));
                }
            }
        } finally {
            pool.shutdownNow();
        }
        st.preparedLeftPg = count(pgAdmin(), "SELECT count(*) FROM pg_prepared_xacts");
        st.preparedLeftMy = count(myAdmin(), "XA RECOVER");
        System.out.println(st);
        return st;
    }

    static Map<String, Object> finalState(String user) throws SQLException {
        Set<String> tids = new HashSet<>();
        int sb;
        int cb;
        try (Connection c = pgAdmin(); Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT bal, log FROM savings WHERE u = '" + user + "'")) {
            rs.next();
            sb = rs.getInt(1);
            tids.addAll(List.of(rs.getString(2).trim().split("\\s+")));
        }
        try (Connection c = myAdmin(); Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT bal, log FROM checking WHERE u = '" + user + "'")) {
            rs.next();
            cb = rs.getInt(1);
            tids.addAll(List.of(rs.getString(2).trim().split("\\s+")));
        }
        return Map.of("savings", sb, "checking", cb, "tids", tids);
    }

    static void setChecks(boolean on) throws Exception {
        try (Connection c = pgAdmin(); Statement s = c.createStatement()) {
            s.execute("ALTER SYSTEM SET pg_co.enabled = " + (on ? "on" : "off"));
            s.execute("SELECT pg_reload_conf()");
        }
        try (Connection c = myAdmin(); Statement s = c.createStatement()) {
            s.execute("SET GLOBAL mysql_co_enabled = " + (on ? "ON" : "OFF"));
        }
        // The reload reaches new sessions asynchronously: wait until one sees it.
        for (int i = 0; i < 200; i++) {
            try (Connection c = pgAdmin(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SHOW pg_co.enabled")) {
                rs.next();
                if (rs.getString(1).equals(on ? "on" : "off")) {
                    return;
                }
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("pg_co.enabled did not change");
    }

    static long count(Connection c, String sql) throws SQLException {
        try (c; Statement s = c.createStatement(); ResultSet rs = s.executeQuery(sql)) {
            if (sql.startsWith("XA")) {
                long n = 0;
                while (rs.next()) {
                    n++;
                }
                return n;
            }
            rs.next();
            return rs.getLong(1);
        }
    }

    static Connection pgAdmin() throws SQLException {
        return DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + pgPort + "/postgres?user=postgres");
    }

    static Connection myAdmin() throws SQLException {
        return DriverManager.getConnection("jdbc:mariadb://127.0.0.1:" + myPort + "/test?user=root");
    }

    static String need(String prop) {
        String v = System.getProperty(prop);
        if (v == null) {
            throw new IllegalStateException("-D" + prop + " is not set: run scripts/test-java.sh (it starts the servers)");
        }
        return v;
    }
}
