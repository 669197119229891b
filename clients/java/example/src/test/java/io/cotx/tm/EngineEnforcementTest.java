package io.cotx.tm;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.Statement;
import java.util.Map;
import javax.sql.XADataSource;
import org.junit.jupiter.api.Test;
import org.mariadb.jdbc.MariaDbDataSource;
import org.postgresql.xa.PGXADataSource;

/**
 * Narayana runs in engine mode only: at start a data source where pg_co / mysql_co does not
 * enforce is refused by name (servers without them: scripts/test-java.sh starts a second
 * pair and passes -Dcotx.bare.pg.port / -Dcotx.bare.my.port). With the extensions it
 * starts (OverdraftTest's setUp, and here), and an extension switched off or observe-only
 * is refused like a missing one.
 */
class EngineEnforcementTest {
    static PGXADataSource pg(int port) {
        PGXADataSource ds = new PGXADataSource();
        ds.setServerNames(new String[] {"127.0.0.1"});
        ds.setPortNumbers(new int[] {port});
        ds.setDatabaseName("postgres");
        ds.setUser("postgres");
        return ds;
    }

    static MariaDbDataSource my(int port) throws Exception {
        return new MariaDbDataSource("jdbc:mariadb://127.0.0.1:" + port + "/test?user=root");
    }

    static void assertRefused(Map<String, XADataSource> resources, String... words) {
        EngineEnforcement.Missing e = assertThrows(EngineEnforcement.Missing.class, () -> Narayana.startRecovery(resources));
        System.out.println("[engine enforcement] refused at start: " + e.getMessage());
        for (String w : words) {
            assertTrue(e.getMessage().contains(w), "'" + w + "' not in: " + e.getMessage());
        }
    }

    @Test
    void refusedWithoutTheExtensions() throws Exception {
        assertRefused(Map.of("savings", pg(port("cotx.bare.pg.port")), "checking", my(port("cotx.bare.my.port"))),
                "resource savings needs pg_co (engine mode), but pg_co is not in shared_preload_libraries",
                "resource checking needs mysql_co (engine mode), but mysql_co is not installed",
                "client mode is not implemented for Narayana; see docs/client-mode.md");
    }

    @Test
    void acceptedWithThemUnlessOffOrObserveOnly() throws Exception {
        int pgPort = port("cotx.pg.port");
        int myPort = port("cotx.my.port");
        Map<String, XADataSource> both = Map.of("savings", pg(pgPort), "checking", my(myPort));
        assertDoesNotThrow(() -> EngineEnforcement.require(both));
        try (Connection p = DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + pgPort + "/postgres?user=postgres");
             Connection m = DriverManager.getConnection("jdbc:mariadb://127.0.0.1:" + myPort + "/test?user=root");
             Statement ps = p.createStatement();
             Statement ms = m.createStatement()) {
            try {
                ps.execute("ALTER SYSTEM SET pg_co.enabled = off");
                ps.execute("SELECT pg_reload_conf()");
                ms.execute("SET GLOBAL mysql_co_observe_only = ON");
                // The reload reaches new sessions asynchronously.
                for (int i = 0; i < 200 && EngineEnforcement.missing(both.get("savings")) == null; i++) {
                    Thread.sleep(50);
                }
                assertRefused(both, "resource savings needs pg_co (engine mode), but pg_co.enabled = off",
                        "resource checking needs mysql_co (engine mode), but mysql_co_observe_only = ON");
            } finally {
                ps.execute("ALTER SYSTEM RESET pg_co.enabled");
                ps.execute("SELECT pg_reload_conf()");
                ms.execute("SET GLOBAL mysql_co_observe_only = OFF");
                for (int i = 0; i < 200 && EngineEnforcement.missing(both.get("savings")) != null; i++) {
                    Thread.sleep(50);
                }
            }
        }
    }

    static int port(String prop) {
        return Integer.parseInt(OverdraftTest.need(prop));
    }
}
