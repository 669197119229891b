package io.cotx.tm;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.RollbackException;
import java.util.Map;
import javax.transaction.xa.XAException;
import org.junit.jupiter.api.Test;

/** The benchmark driver's command line, DSNs, keys and failure kinds alone (no servers). */
class LoadTest {
    @Test
    void harnessCommandLineParses() {
        // What bench/harness/jta.py passes (micro_args of the default point).
        Load.Args a = Load.parse(new String[] {"--mode", "2pc", "--pg", "host=127.0.0.1 port=5 user=postgres dbname=postgres",
            "--my", "mysql://root@127.0.0.1:6/test", "--clients", "8", "--warmup", "1.0", "--seconds", "4.0",
            "--seed", "7920", "--sync-stdin", "--workload", "micro", "--S", "2", "--R", "6", "--W", "6",
            "--P", "0.5", "--N", "100000", "--K", "0"});
        assertEquals("2pc", a.mode());
        assertEquals(8, a.clients());
        assertEquals(7920, a.seed());
        assertTrue(a.syncStdin());
        assertEquals(100000, a.n());
        assertEquals("REPEATABLE READ", a.myIsolation());   // as the Rust driver's 2pc
        assertEquals("SERIALIZABLE", Load.parse(new String[] {"--mode", "co"}).myIsolation());
        assertEquals("SERIALIZABLE",
                Load.parse(new String[] {"--mode", "2pc", "--my-isolation", "serializable"}).myIsolation());
    }

    @Test
    void whatIsNotImplementedIsRefused() {
        assertThrows(IllegalArgumentException.class, () -> Load.parse(new String[] {"--S", "3"}));
        assertThrows(IllegalArgumentException.class, () -> Load.parse(new String[] {"--P", "1"}));
        assertThrows(IllegalArgumentException.class, () -> Load.parse(new String[] {"--mode", "client"}));
        assertThrows(IllegalArgumentException.class, () -> Load.parse(new String[] {"--workload", "tpcc"}));
        assertThrows(IllegalArgumentException.class, () -> Load.parse(new String[] {"--parallel-prepare"}));
        assertThrows(IllegalArgumentException.class, () -> Load.parse(new String[] {"--clients"}));
    }

    @Test
    void dsnsBecomeJdbc() {
        Map<String, String> f = Load.pgFields("host=127.0.0.1 port=5433 user=postgres dbname='my db'");
        assertEquals("5433", f.get("port"));
        assertEquals("my db", f.get("dbname"));
        Map<String, String> u = Load.pgFields("postgresql://bob:pw@db.example:6000/app?sslmode=disable");
        assertEquals("bob", u.get("user"));
        assertEquals("pw", u.get("password"));
        assertEquals("app", u.get("dbname"));
        assertEquals("disable", u.get("sslmode"));
        assertEquals("jdbc:mariadb://127.0.0.1:3307/test?useServerPrepStmts=true&user=root",
                Load.mariaJdbcUrl("mysql://root@127.0.0.1:3307/test"));
    }

    @Test
    void keysAreTheRustDriversDraws() {
        // workload.rs's Rng::new(1): the first draws of xorshift64* (computed by hand from
        // the same constants; a change here changes which keys the two drivers touch).
        Load.Rng r = new Load.Rng(1);
        long x = 0x9E3779B97F4A7C15L | 1;
        x ^= x >>> 12;
        x ^= x << 25;
        x ^= x >>> 27;
        assertEquals(x * 0x2545F4914F6CDD1DL, r.next());
        long[][] ks = new Load.Keys(100, 0).txn(new Load.Rng(5), 6, 6);
        for (long[] b : ks) {
            assertEquals(12, b.length);
            for (int i = 7; i < 12; i++) {
                assertTrue(b[i - 1] <= b[i], "writes sorted");
            }
            for (long k : b) {
                assertTrue(k >= 0 && k < 100);
            }
        }
    }

    @Test
    void failuresAreNamedAsTheRustDriverNamesThem() {
        XAException xa = new XAException(XAException.XAER_RMFAIL);
        xa.initCause(new org.postgresql.util.PSQLException(
                "pg_co refused PREPARE TRANSACTION: commitment ordering rule A", org.postgresql.util.PSQLState.SERIALIZATION_FAILURE));
        RollbackException rb = new RollbackException("ARJUNA016053");
        rb.addSuppressed(xa);
        Load.Failure f = Load.classify(rb);
        assertEquals("pg_co rule A", f.kind());
        assertTrue(f.retryable());
        assertEquals("my deadlock", Load.classify(new java.sql.SQLException("Deadlock found", "40001", 1213)).kind());
        Load.Failure other = Load.classify(new java.sql.SQLException("Connection refused", "08001"));
        assertTrue(other.kind().startsWith("jta other"));
        assertFalse(other.retryable());
    }
}
