package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** A deadlock across databases, broken by the daemon (docs/coordinator.md,
 * {@code timeouts.deadlock_check_ms}): T1 holds a row on PostgreSQL and waits for one on
 * MariaDB that T2 holds while T2 waits for T1's row; neither engine sees a cycle. The Java
 * client registers each branch with its session (backend pid, connection id), so the daemon
 * sees both waits, aborts the younger transaction and cancels its waiting statement; the
 * cancelled statement's error (a cancel, not a deadlock to the driver) is run again by
 * {@code Coordinator.run} because the daemon had aborted the transaction retryably. Both
 * increments commit within seconds, not at an engine's lock timeout, and nothing is left
 * prepared. */
class DeadlockTest {
    @Test
    void crossedWaitsAreBrokenAndRunAgain() throws Exception {
        Servers s = Servers.engine();
        s.setChecks(true);
        s.exec(true, "CREATE TABLE IF NOT EXISTS dl(k text PRIMARY KEY, v int NOT NULL)");
        s.exec(false, "CREATE TABLE IF NOT EXISTS dl(k varchar(64) PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB");
        String key = "dl-" + Traceparent.randomHex(4);
        s.exec(true, "INSERT INTO dl VALUES ('" + key + "', 0)");
        s.exec(false, "INSERT INTO dl VALUES ('" + key + "', 0)");
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try (LocalDaemon d = s.daemon("j-deadlock", "engine").start()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            Coordinator coord = d.client().build();
            CyclicBarrier bothHold = new CyclicBarrier(2);
            AtomicInteger attempts = new AtomicInteger();
            long t0 = System.nanoTime();
            Future<?> t1 = pool.submit(() -> increment(coord, s, key, true, bothHold, attempts));
            Future<?> t2 = pool.submit(() -> increment(coord, s, key, false, bothHold, attempts));
            t1.get(60, TimeUnit.SECONDS);
            t2.get(60, TimeUnit.SECONDS);
            double seconds = (System.nanoTime() - t0) / 1e9;
            System.out.printf("[deadlock] both committed in %.1f s, %d attempts%n", seconds, attempts.get());
            assertEquals(2, value(s, true, key), "both increments on PostgreSQL");
            assertEquals(2, value(s, false, key), "both increments on MariaDB");
            assertTrue(attempts.get() >= 3, "one of them was the victim and ran again: " + attempts.get());
            // Without the sessions (registrations without "session") the daemon sees no wait and
            // the pair waits for MariaDB's lock wait timeout of the test servers: 10.3 s here.
            assertTrue(seconds < 5, "broken by the daemon's detector, not by a lock timeout: " + seconds + " s");
            assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(30)));
        } finally {
            pool.shutdownNow();
        }
    }

    /** One global transaction incrementing the row on both databases, PostgreSQL first
     * ({@code pgFirst}) or MariaDB first; on its first attempt it waits at {@code bothHold} until
     * the other holds its first row, so that the second statements cross. */
    static Void increment(Coordinator coord, Servers s, String key, boolean pgFirst, CyclicBarrier bothHold, AtomicInteger attempts)
            throws Exception {
        AtomicInteger mine = new AtomicInteger();
        coord.run(tx -> {
            attempts.incrementAndGet();
            try (Connection pg = s.pg(); Connection my = s.my()) {
                tx.branch(pg, "savings");
                tx.branch(my, "checking");
                Connection first = pgFirst ? pg : my;
                Connection second = pgFirst ? my : pg;
                update(first, key);
                if (mine.incrementAndGet() == 1) {
                    bothHold.await(10, TimeUnit.SECONDS);
                }
                update(second, key); // the crossed wait: one of the two is cancelled by the daemon
                tx.commit();
            }
            return null;
        }, 5);
        return null;
    }

    static void update(Connection c, String key) throws Exception {
        try (Statement st = c.createStatement()) {
            st.executeUpdate("UPDATE dl SET v = v + 1 WHERE k = '" + key + "'");
        }
    }

    static int value(Servers s, boolean pg, String key) throws Exception {
        try (Connection c = pg ? s.pg() : s.my(); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery("SELECT v FROM dl WHERE k = '" + key + "'")) {
            rs.next();
            return rs.getInt(1);
        }
    }
}
