package io.cotx.client;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;

/** The test servers scripts/test-java.sh started: a PostgreSQL and a MariaDB with pg_co and
 * mysql_co ({@code -Dcotx.pg.port}, {@code -Dcotx.my.port}) and a pair without them
 * ({@code -Dcotx.bare.pg.port}, {@code -Dcotx.bare.my.port}), as a managed database gives them. */
record Servers(int pgPort, int myPort) {
    static Servers engine() {
        return new Servers(port("cotx.pg.port"), port("cotx.my.port"));
    }

    static Servers bare() {
        return new Servers(port("cotx.bare.pg.port"), port("cotx.bare.my.port"));
    }

    private static int port(String prop) {
        String v = System.getProperty(prop);
        if (v == null) {
            throw new IllegalStateException("-D" + prop + " is not set: run scripts/test-java.sh (it starts the servers)");
        }
        return Integer.parseInt(v);
    }

    Connection pg() throws SQLException {
        return DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + pgPort + "/postgres?user=postgres");
    }

    Connection my() throws SQLException {
        return DriverManager.getConnection("jdbc:mariadb://127.0.0.1:" + myPort + "/test?user=root");
    }

    String pgDsn() {
        return "host=127.0.0.1 port=" + pgPort + " user=postgres dbname=postgres";
    }

    String myDsn() {
        return "mysql://root@127.0.0.1:" + myPort + "/test";
    }

    /** A daemon of the test's own over these servers: savings (PostgreSQL) and checking
     * (MariaDB) at {@code enforcement}, under node id {@code node} (another daemon's branches
     * on the same servers are left alone by each). */
    LocalDaemon.Builder daemon(String node, String enforcement) {
        return LocalDaemon.builder().node(node).resource("savings", "postgres", pgDsn(), enforcement)
                .resource("checking", "mariadb", myDsn(), enforcement);
    }

    void createTables() throws SQLException {
        exec(true, "CREATE TABLE IF NOT EXISTS savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')");
        exec(false, "CREATE TABLE IF NOT EXISTS checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, log text NOT NULL) ENGINE=InnoDB");
    }

    void exec(boolean onPg, String sql) throws SQLException {
        try (Connection c = onPg ? pg() : my(); Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    /** Transactions prepared on the two servers (pg_prepared_xacts, XA RECOVER): branches, and
     * in client mode the daemon's helpers too. */
    int prepared() throws SQLException {
        int n = 0;
        try (Connection c = pg(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*) FROM pg_prepared_xacts")) {
            rs.next();
            n += rs.getInt(1);
        }
        try (Connection c = my(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("XA RECOVER")) {
            while (rs.next()) {
                n++;
            }
        }
        return n;
    }

    /** Waits until nothing is prepared (participants finish in the background); the count left. */
    int awaitNothingPrepared(Duration within) throws SQLException, InterruptedException {
        Instant deadline = Instant.now().plus(within);
        int n;
        while ((n = prepared()) != 0 && Instant.now().isBefore(deadline)) {
            Thread.sleep(50);
        }
        return n;
    }

    /** pg_co.enabled and mysql_co_enabled on or off (servers with the extensions), waited for. */
    void setChecks(boolean on) throws SQLException, InterruptedException {
        exec(true, "ALTER SYSTEM SET pg_co.enabled = " + (on ? "on" : "off"));
        exec(true, "SELECT pg_reload_conf()");
        exec(false, "SET GLOBAL mysql_co_enabled = " + (on ? "ON" : "OFF"));
        // The reload reaches sessions asynchronously: wait until a new session sees it.
        for (int i = 0; i < 200; i++) {
            try (Connection c = pg(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SHOW pg_co.enabled")) {
                rs.next();
                if (rs.getString(1).equals(on ? "on" : "off")) {
                    return;
                }
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("pg_co.enabled did not change");
    }
}
