package io.cotx.client;

import java.time.Duration;

/** Callbacks at the steps of a global transaction, for metrics and logs (the Spring starter
 * counts commits, refusals and retries with one) and for tests that stop a process at a
 * chosen step (the crash tests). Called on the transaction's thread; an exception thrown here
 * propagates to the application like any failure at that step. */
public interface TransactionListener {
    /** Every local branch of {@code tx} is prepared; the decision has not been asked for. */
    default void prepared(Transaction tx) {
    }

    /** The decision is known ("commit" or "abort"); the local branches are not finished yet. */
    default void decided(Transaction tx, String decision) {
    }

    /** {@code tx} committed (its local branches finished, or left to the coordinator). */
    default void committed(Transaction tx) {
    }

    /** {@code tx} was aborted; {@code e.refused()} when an engine refused a prepare. */
    default void aborted(Transaction tx, TransactionAbortedException e) {
    }

    /** {@link Coordinator#run} runs the work again after {@code e}, in {@code delay}. */
    default void retrying(int attempt, TransactionAbortedException e, Duration delay) {
    }
}
