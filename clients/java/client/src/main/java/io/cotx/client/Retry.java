package io.cotx.client;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Consumer;

/** Runs work in a global transaction and runs it again when the retry rules
 * ({@link RetryRules}, the table every client shares) say that is safe and may help:
 * <ul>
 * <li>{@code retry_transaction}: an abort nothing of which committed (a refused prepare, a
 * serialization failure, deadlock or lock timeout, also raised by a statement of the work;
 * an abort after a crash, a takeover or a timeout; the daemon unreachable at a branch's
 * registration): run again after "full jitter" backoff, a random time in
 * [0, min(maxDelay, baseDelay * 2^n)), counted against the retries;</li>
 * <li>{@code retry_request}: the daemon did not act ("not now": a 503 or 429 at the begin or
 * a registration, or unreachable at the begin): run again after its {@code Retry-After} (or
 * the backoff), not counted, but all such waits together bounded by {@code maxWait};</li>
 * <li>everything else (the application's own exception, {@code fail}, outcome unknown)
 * propagates at once.</li>
 * </ul>
 * The randomness matters: two transactions refused by the same conflict would otherwise retry
 * at the same moment and meet again. The work must be safe to run again: all of its effects
 * inside the transaction's branches. */
public final class Retry {
    private Retry() {
    }

    /** How often and how long to wait. */
    public record Policy(int retries, Duration baseDelay, Duration maxDelay, Duration maxWait) {
        public Policy {
            if (retries < 0) {
                throw new IllegalArgumentException("retries must be >= 0");
            }
        }

        /** {@code retries} more attempts, 20 ms doubling up to 1 s; "not now" waits up to 30 s
         * in all (the Python client's defaults). */
        public static Policy ofRetries(int retries) {
            return new Policy(retries, Duration.ofMillis(20), Duration.ofSeconds(1), Duration.ofSeconds(30));
        }
    }

    /** The wait after failed attempt {@code attempt} (0-based), {@code rand} in [0, 1). */
    public static Duration backoff(int attempt, Policy p, double rand) {
        long cap = Math.min(p.maxDelay().toNanos(), p.baseDelay().toNanos() << Math.min(attempt, 30));
        return Duration.ofNanos((long) (rand * cap));
    }

    /** What the retry rules say to do after {@code e} escaped an attempt of {@code tx}. */
    public static String actionOf(Throwable e) {
        if (e instanceof TransactionAbortedException a) {
            return a.retryable() ? RetryRules.RETRY_TRANSACTION : RetryRules.FAIL;
        }
        if (e instanceof OutcomeUnknownException) {
            return RetryRules.OUTCOME_UNKNOWN;
        }
        if (e instanceof CoordinatorException c) {
            return c.action();
        }
        if (e instanceof CoordinatorUnavailableException u) {
            return u.action();
        }
        return Refusals.retryable(e) ? RetryRules.RETRY_TRANSACTION : RetryRules.FAIL;
    }

    /** A checked exception of the work, wrapped: {@link #getCause()} is the work's own. */
    public static final class WorkFailedException extends CotxException {
        WorkFailedException(String gtid, Exception cause) {
            super("the work of " + gtid + " failed: " + cause, cause);
        }
    }

    /** {@code work} in a global transaction of {@code coord} (root; traceparent: the caller's,
     * shared by every attempt, or null), committed when it returns, run again as the retry
     * rules say. An exception of the work rolls the transaction back and propagates unless it
     * is retried (a checked one wrapped in {@link WorkFailedException}); a statement's
     * serialization failure, deadlock or lock timeout surfaces as a retryable
     * {@link TransactionAbortedException}, as in the Python client. */
    public static <T> T run(Coordinator coord, Coordinator.Work<T> work, Policy policy, String traceparent) {
        return run(coord, work, policy, 0, traceparent, tx -> { });
    }

    /** As {@link #run(Coordinator, Coordinator.Work, Policy, String)}, with the transaction's
     * timeout at the daemon (0: its default) and {@code afterAttempt}, called with each
     * attempt's transaction once it has ended (committed, rolled back or aborted), before any
     * wait: where the caller gives back what the attempt held, e.g. its connections. */
    public static <T> T run(Coordinator coord, Coordinator.Work<T> work, Policy policy, int timeoutMs, String traceparent,
            Consumer<Transaction> afterAttempt) {
        int attempt = 0;
        long waited = 0;
        while (true) {
            Transaction tx = coord.transaction(timeoutMs, traceparent);
            RuntimeException failure;
            try {
                T result;
                try {
                    result = work.apply(tx);
                } catch (Exception e) {
                    // Asked before our own abort is recorded: a statement the daemon cancelled
                    // (it aborted the transaction as a deadlock victim, or at its timeout).
                    boolean cancelled = !(e instanceof CotxException) && tx.daemonAbortedRetryably();
                    tx.rollback("the work failed: " + e);
                    if (cancelled || (!(e instanceof CotxException) && Refusals.retryable(e))) {
                        // A serialization failure, deadlock or lock timeout raised by a
                        // statement (also wrapped, e.g. in Spring's DataAccessException).
                        throw new TransactionAbortedException(tx.gtidOrNull(), "a statement failed: " + e.getMessage(), true, false, e);
                    }
                    if (e instanceof RuntimeException re) {
                        throw re;
                    }
                    throw new WorkFailedException(tx.gtidOrNull(), e);
                } catch (Error e) {
                    tx.rollback("the work failed: " + e);
                    throw e;
                }
                tx.commit();
                return result;
            } catch (RuntimeException e) {
                failure = e;
            } finally {
                afterAttempt.accept(tx); // before any wait: nothing held while waiting
            }
            String action = actionOf(failure);
            if (action.equals(RetryRules.ABORTED) && tx.gtidOrNull() != null) {
                // Refused because the transaction is aborted: its abort's reason decides.
                action = tx.abortedRetryably() ? RetryRules.RETRY_TRANSACTION : RetryRules.FAIL;
            }
            Duration delay;
            if (action.equals(RetryRules.RETRY_TRANSACTION) && attempt < policy.retries()) {
                delay = backoff(attempt, policy, ThreadLocalRandom.current().nextDouble());
                attempt++;
                TransactionAbortedException why = failure instanceof TransactionAbortedException a ? a
                        : new TransactionAbortedException(tx.gtidOrNull(), failure.getMessage(), true, false, failure);
                for (TransactionListener l : coord.listeners()) {
                    l.retrying(attempt, why, delay);
                }
            } else if (action.equals(RetryRules.RETRY_REQUEST)) {
                Duration after = failure instanceof CoordinatorException c ? c.retryAfter() : null;
                delay = after != null ? after : backoff(attempt, policy, ThreadLocalRandom.current().nextDouble());
                if (waited + delay.toNanos() > policy.maxWait().toNanos()) {
                    throw failure;
                }
                waited += delay.toNanos();
            } else {
                throw failure;
            }
            try {
                Thread.sleep(delay.toMillis(), (int) (delay.toNanos() % 1_000_000));
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw failure;
            }
        }
    }
}
