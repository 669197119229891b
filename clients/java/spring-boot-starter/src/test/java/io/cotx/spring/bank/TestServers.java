package io.cotx.spring.bank;

import io.cotx.client.LocalDaemon;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;

/** The servers scripts/test-java.sh started (-Dcotx.pg.port … with pg_co / mysql_co,
 * -Dcotx.bare.pg.port … without), as the services and the test reach them. */
record TestServers(int pgPort, int myPort) {
    static TestServers engine() {
        return new TestServers(Integer.parseInt(need("cotx.pg.port")), Integer.parseInt(need("cotx.my.port")));
    }

    static TestServers bare() {
        return new TestServers(Integer.parseInt(need("cotx.bare.pg.port")), Integer.parseInt(need("cotx.bare.my.port")));
    }

    static String need(String prop) {
        String v = System.getProperty(prop);
        if (v == null) {
            throw new IllegalStateException("-D" + prop + " is not set: run scripts/test-java.sh (it starts the servers)");
        }
        return v;
    }

    String pgUrl() {
        return "jdbc:postgresql://127.0.0.1:" + pgPort + "/postgres";
    }

    String myUrl() {
        return "jdbc:mariadb://127.0.0.1:" + myPort + "/test";
    }

    Connection connect(boolean pg) throws SQLException {
        return pg ? DriverManager.getConnection(pgUrl() + "?user=postgres") : DriverManager.getConnection(myUrl() + "?user=root");
    }

    void exec(boolean pg, String sql) throws SQLException {
        try (Connection c = connect(pg); Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    int scalar(boolean pg, String sql) throws SQLException {
        try (Connection c = connect(pg); Statement s = c.createStatement(); ResultSet rs = s.executeQuery(sql)) {
            rs.next();
            return rs.getInt(1);
        }
    }

    LocalDaemon daemon(String node, String enforcement) throws Exception {
        return builder(node, enforcement).start();
    }

    LocalDaemon.Builder builder(String node, String enforcement) {
        return LocalDaemon.builder().node(node)
                .resource("savings", "postgres", "host=127.0.0.1 port=" + pgPort + " user=postgres dbname=postgres", enforcement)
                .resource("checking", "mariadb", "mysql://root@127.0.0.1:" + myPort + "/test", enforcement);
    }

    int prepared() throws SQLException {
        int n = scalar(true, "SELECT count(*) FROM pg_prepared_xacts");
        try (Connection c = connect(false); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("XA RECOVER")) {
            while (rs.next()) {
                n++;
            }
        }
        return n;
    }

    int awaitNothingPrepared(Duration within) throws Exception {
        Instant deadline = Instant.now().plus(within);
        int n;
        while ((n = prepared()) != 0 && Instant.now().isBefore(deadline)) {
            Thread.sleep(50);
        }
        return n;
    }

    /** pg_co.enabled and mysql_co_enabled (servers with the extensions), waited for. */
    void setChecks(boolean on) throws Exception {
        exec(true, "ALTER SYSTEM SET pg_co.enabled = " + (on ? "on" : "off"));
        exec(true, "SELECT pg_reload_conf()");
        exec(false, "SET GLOBAL mysql_co_enabled = " + (on ? "ON" : "OFF"));
        for (int i = 0; i < 200; i++) {
            try (Connection c = connect(true); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SHOW pg_co.enabled")) {
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
