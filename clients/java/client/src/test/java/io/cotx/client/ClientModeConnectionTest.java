package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** Client mode on MariaDB, checked once per physical connection (docs/client-mode.md): a
 * session level the application sets later does not reach a branch (each branch still sets
 * SERIALIZABLE for its own transaction), and a branch in a session the check was not made in
 * (its @cotx_started not the check's, as after a reset or a reconnect) cannot prepare,
 * retryably (its slot write before the one-phase commit refused); the next branch checks the
 * connection again. A lone branch commits in one phase after its slot write. */
class ClientModeConnectionTest {
    /** One branch on {@code c}: a write, then its transaction's level as InnoDB has it. */
    static String branch(Coordinator coord, Connection c) throws SQLException {
        Transaction tx = coord.transaction();
        Branch b = tx.branch(c, "checking", Isolation.SERIALIZABLE, null);
        String level;
        try (Statement st = c.createStatement()) {
            st.executeUpdate("UPDATE checking SET bal = bal + 1 WHERE u = 'j-cm'");
            try (ResultSet rs = st.executeQuery("SELECT trx_isolation_level FROM information_schema.INNODB_TRX "
                    + "WHERE trx_mysql_thread_id = CONNECTION_ID()")) {
                rs.next();
                level = rs.getString(1);
            }
        } catch (SQLException e) {
            throw b.fail(e);
        }
        assertEquals(Branch.Enforcement.CLIENT, b.enforcement());
        tx.commit();
        return level;
    }

    @Test
    void checkedOncePerConnectionEveryBranchStillSerializable() throws Exception {
        Servers servers = Servers.bare();
        servers.createTables();
        servers.exec(false, "INSERT IGNORE INTO checking VALUES ('j-cm', 0, '')");
        try (LocalDaemon d = servers.daemon("j-cm", "client").start(); Connection c = servers.my()) {
            d.awaitModes("client", Duration.ofSeconds(15));
            Coordinator coord = d.client().decisionTimeout(Duration.ofSeconds(60)).build();
            String onePhase = "cotx_transactions_total{outcome=\"one_phase\"}";
            double before = ReadOnlyCommitTest.metric(d, onePhase);
            assertEquals("SERIALIZABLE", branch(coord, c));
            assertEquals(before + 1, ReadOnlyCommitTest.metric(d, onePhase), "a lone client-mode branch commits in one phase");
            assertTrue(ClientModeChecks.isChecked(c) && ClientModeChecks.started(c) != null);
            try (Statement st = c.createStatement()) {
                st.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
            }
            assertEquals("SERIALIZABLE", branch(coord, c), "a session level set later must not reach the branch");
            try (Statement st = c.createStatement()) {
                st.execute("SET @cotx_started = 12345");
            }
            TransactionAbortedException e = assertThrows(TransactionAbortedException.class, () -> branch(coord, c));
            assertTrue(e.retryable() && e.getMessage().contains("not the one checked"), e.getMessage());
            assertEquals("SERIALIZABLE", branch(coord, c), "checked again");
        }
    }
}
