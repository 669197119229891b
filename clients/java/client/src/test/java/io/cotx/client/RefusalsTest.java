package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.SQLException;
import org.junit.jupiter.api.Test;

/** The classification alone, no servers: codes as the drivers carry them (pgjdbc: SQLSTATE,
 * error code 0; MariaDB Connector/J: the server's error number), the pg_co / mysql_co rule
 * from the message, wrappers followed down their causes. */
class RefusalsTest {
    static SQLException pg(String state, String msg) {
        return new SQLException(msg, state, 0);
    }

    static SQLException my(int errno, String msg) {
        return new SQLException(msg, "HY000", errno);
    }

    @Test
    void postgresCodesAndRules() {
        assertEquals("pg_co rule A", Refusals.classify(pg("40001", "ERROR: pg_co refused PREPARE: commitment ordering rule A ...")).kind());
        assertEquals("pg serialization failure", Refusals.classify(pg("40001", "could not serialize access due to read/write dependencies")).kind());
        assertEquals("pg deadlock", Refusals.classify(pg("40P01", "deadlock detected")).kind());
        assertTrue(Refusals.retryable(pg("55P03", "lock timeout")));
        assertFalse(Refusals.retryable(pg("57014", "canceling statement due to user request")));
        assertFalse(Refusals.retryable(pg("23505", "duplicate key")));
        assertFalse(Refusals.retryable(pg("40001", "pg_co refused PREPARE: transaction is not serializable")));
    }

    @Test
    void mariadbNumbersAndRules() {
        assertEquals("my deadlock", Refusals.classify(my(1213, "Deadlock found when trying to get lock")).kind());
        assertEquals("my XA rollback", Refusals.classify(my(1402, "XA_RBROLLBACK: Transaction branch was rolled back")).kind());
        assertEquals("mysql_co isolation",
                Refusals.classify(my(1402, "mysql_co: refused: this XA branch ran at REPEATABLE READ")).kind());
        assertFalse(Refusals.retryable(my(1402, "mysql_co: refused: this XA branch ran at REPEATABLE READ")));
        assertTrue(Refusals.retryable(my(1205, "Lock wait timeout exceeded")));
        assertFalse(Refusals.retryable(my(1062, "Duplicate entry")));
    }

    @Test
    void wrappersAndBareMessages() {
        assertTrue(Refusals.retryable(new RuntimeException("wrapped", my(1213, "deadlock"))));
        assertEquals("pg serialization failure", Refusals.classify(null, null, "could not serialize access due to ...").kind());
        assertEquals("other", Refusals.classify(new IllegalStateException("boom")).kind());
    }
}
