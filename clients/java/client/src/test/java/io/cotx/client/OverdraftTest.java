package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import org.junit.jupiter.api.Test;

/** The overdraft (Bank) on real servers and the real daemon (a daemon of each test's own):
 * in engine mode (pg_co / mysql_co) and in client mode (servers without them: the daemon's
 * helpers and the branches' slot writes) no round ends below zero; plain 2PC on the same
 * servers (enforcement "none", SERIALIZABLE branches) does, which shows the test can see it.
 * Every run: what the client told the application is what the databases did, nothing is left
 * prepared, no withdrawal failed. */
class OverdraftTest {
    static final int ROUNDS = Integer.getInteger("cotx.java.rounds", 4);

    static Bank.Stats overdraft(Servers servers, String node, String enforcement, String mode) throws Exception {
        try (LocalDaemon d = servers.daemon(node, enforcement).start()) {
            d.awaitModes(enforcement, Duration.ofSeconds(15));
            Coordinator coord = d.client().decisionTimeout(Duration.ofSeconds(60)).build();
            Bank.Stats st;
            try (Bank bank = new Bank(servers, coord, false)) {
                st = bank.run(mode, ROUNDS);
            }
            assertEquals(0, st.toldCommittedRolledBack + st.toldAbortedCommitted, "the client's answers differ from the databases: " + st);
            assertEquals(0, st.prepared, "prepared transactions left: " + st);
            assertEquals(0, st.failed, "failed withdrawals: " + st);
            return st;
        }
    }

    @Test
    void engineModeNeverOverdraws() throws Exception {
        Servers s = Servers.engine();
        s.setChecks(true);
        Bank.Stats st = overdraft(s, "j-engine", "engine", "engine");
        assertEquals(0, st.negative, "with pg_co and mysql_co no round may end below 0: " + st);
        assertTrue(st.withdrawn > 0 && st.refusals > 0, "expected withdrawals and engine refusals (retried): " + st);
    }

    @Test
    void clientModeNeverOverdraws() throws Exception {
        Bank.Stats st = overdraft(Servers.bare(), "j-client", "client", "client");
        assertEquals(0, st.negative, "client mode: no round may end below 0: " + st);
        assertTrue(st.withdrawn > 0 && st.refusals > 0, "expected withdrawals and refusals (retried): " + st);
    }

    @Test
    void plainTwoPhaseCommitOverdraws() throws Exception {
        Bank.Stats st = overdraft(Servers.bare(), "j-none", "none", "none");
        assertTrue(st.negative > 0, "plain 2PC should overdraw at least once, SERIALIZABLE branches or not: " + st);
    }
}
