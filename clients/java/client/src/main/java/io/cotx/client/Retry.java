package io.cotx.client;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/** Runs work in a global transaction and runs it again when the transaction is aborted
 * retryably (a refused prepare, a serialization failure, a deadlock: {@link Refusals}), with
 * "full jitter" backoff: before attempt n + 1 a random time in
 * [0, min(maxDelay, baseDelay * 2^n)). The randomness matters: two transactions refused by
 * the same conflict would otherwise retry at the same moment and meet again. The work must
 * be safe to run again: all of its effects inside the transaction's branches. */
public final class Retry {
    private Retry() {
    }

    /** How often and how long to wait. */
    public record Policy(int retries, Duration baseDelay, Duration maxDelay) {
        public Policy {
            if (retries < 0) {
                throw new IllegalArgumentException("retries must be >= 0");
            }
        }

        /** {@code retries} more attempts, 20 ms doubling up to 1 s (the Python client's defaults). */
        public static Policy ofRetries(int retries) {
            return new Policy(retries, Duration.ofMillis(20), Duration.ofSeconds(1));
        }
    }

    /** The wait after failed attempt {@code attempt} (0-based), {@code rand} in [0, 1). */
    public static Duration backoff(int attempt, Policy p, double rand) {
        long cap = Math.min(p.maxDelay().toNanos(), p.baseDelay().toNanos() << Math.min(attempt, 30));
        return Duration.ofNanos((long) (rand * cap));
    }

    /** {@code work} in a global transaction of {@code coord} (root; traceparent: the caller's,
     * shared by every attempt, or null), committed when it returns. An exception of the work
     * rolls the transaction back; a retryable abort runs it again; the last one, and every
     * other exception, propagate (a checked one wrapped in {@link CotxException}). */
    public static <T> T run(Coordinator coord, Coordinator.Work<T> work, Policy policy, String traceparent) {
        int attempt = 0;
        while (true) {
            Transaction tx = coord.transaction(0, traceparent);
            try {
                T result;
                try {
                    result = work.apply(tx);
                } catch (TransactionAbortedException e) {
                    throw e; // Branch.fail: already rolled back and reported
                } catch (RuntimeException | Error e) {
                    tx.rollback("the work failed: " + e);
                    throw e;
                } catch (Exception e) {
                    tx.rollback("the work failed: " + e);
                    throw new CotxException("the work of " + tx.gtidOrNull() + " failed: " + e.getMessage(), e);
                }
                tx.commit();
                return result;
            } catch (TransactionAbortedException e) {
                if (!e.retryable() || attempt >= policy.retries()) {
                    throw e;
                }
                Duration delay = backoff(attempt, policy, ThreadLocalRandom.current().nextDouble());
                attempt++;
                for (TransactionListener l : coord.listeners()) {
                    l.retrying(attempt, e, delay);
                }
                try {
                    Thread.sleep(delay.toMillis(), (int) (delay.toNanos() % 1_000_000));
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw e;
                }
            }
        }
    }
}
