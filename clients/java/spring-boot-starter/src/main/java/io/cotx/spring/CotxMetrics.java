package io.cotx.spring;

import io.cotx.client.Transaction;
import io.cotx.client.TransactionAbortedException;
import io.cotx.client.TransactionListener;
import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.MeterRegistry;
import java.time.Duration;

/** Micrometer counters of this service's global transactions (root and participant parts):
 * {@code cotx.commits}, {@code cotx.aborts}, {@code cotx.refusals} (aborts because an engine
 * refused one of our prepares: pg_co, mysql_co, or client mode's SSI / lock conflicts) and
 * {@code cotx.retries} (attempts run again by {@code @GlobalTransactional}). In Prometheus:
 * {@code cotx_commits_total} and so on. */
public class CotxMetrics implements TransactionListener {
    private final Counter commits;
    private final Counter aborts;
    private final Counter refusals;
    private final Counter retries;

    public CotxMetrics(MeterRegistry registry) {
        commits = Counter.builder("cotx.commits").description("global transactions committed (this service's part)").register(registry);
        aborts = Counter.builder("cotx.aborts").description("global transactions aborted (this service's part)").register(registry);
        refusals = Counter.builder("cotx.refusals").description("aborts because an engine refused a prepare of ours")
                .register(registry);
        retries = Counter.builder("cotx.retries").description("attempts run again after a retryable abort").register(registry);
    }

    @Override
    public void committed(Transaction tx) {
        commits.increment();
    }

    @Override
    public void aborted(Transaction tx, TransactionAbortedException e) {
        aborts.increment();
        if (e.refused()) {
            refusals.increment();
        }
    }

    @Override
    public void retrying(int attempt, TransactionAbortedException e, Duration delay) {
        retries.increment();
    }
}
