package io.cotx.tm;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.RollbackException;
import java.sql.SQLException;
import javax.transaction.xa.XAException;
import org.junit.jupiter.api.Test;

/** The classification alone (no servers): also what bootstrap runs to fetch surefire's providers. */
class RetryTest {
    @Test
    void pgjdbcRefusalBuriedUnderRmfailIsRetryable() {
        // pgjdbc: XAException(XAER_RMFAIL) caused by PSQLException 40001, suppressed in
        // Narayana's RollbackException. Built from a PSQLException-like class name check:
        SQLException refused = new org.postgresql.util.PSQLException("pg_co refused PREPARE TRANSACTION",
                org.postgresql.util.PSQLState.SERIALIZATION_FAILURE);
        XAException xa = new XAException(XAException.XAER_RMFAIL);
        xa.initCause(refused);
        RollbackException rb = new RollbackException("ARJUNA016053");
        rb.addSuppressed(xa);
        assertTrue(Retry.isRetryable(rb));
    }

    @Test
    void mariadbRollbackCodeIsRetryable() {
        assertTrue(Retry.isRetryable(new XAException(XAException.XA_RBROLLBACK)));
        assertTrue(Retry.isRetryable(new SQLException("Deadlock found", "40001", 1213)));
    }

    @Test
    void outageIsNotRetryable() {
        XAException xa = new XAException(XAException.XAER_RMFAIL);
        xa.initCause(new SQLException("Connection refused", "08001"));
        RollbackException rb = new RollbackException("x");
        rb.addSuppressed(xa);
        assertFalse(Retry.isRetryable(rb));
    }
}
