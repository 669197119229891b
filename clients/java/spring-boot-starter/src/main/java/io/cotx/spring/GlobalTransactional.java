package io.cotx.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/** Runs the method as (its part of) a cotx global transaction, as {@code @Transactional} runs
 * it as a local one: connections taken from the resources' DataSources inside it are
 * branches; the transaction commits when the method returns and rolls back when it throws.
 * <ul>
 * <li>A request that carries the {@code Cotx-Gtid} header (Spring MVC; the starter's
 * interceptor reads it): the method joins that transaction as a participant, prepares its
 * branches when it returns, and finishes them in the background once the root decided.</li>
 * <li>Otherwise the method is the root: a new global transaction, decided when it returns,
 * and run again (at most {@link #retries()} more times, jittered backoff) when it is aborted
 * retryably: a refused prepare, a serialization failure, a deadlock. The method must
 * therefore be safe to run again: all its effects in the branches.</li>
 * <li>Called inside a global transaction of the same thread, it takes part in that one.</li>
 * </ul>
 * Methods are intercepted through Spring AOP proxies: the annotation works on public methods
 * of beans called from another bean, as {@code @Transactional}. */
@Target({ElementType.METHOD, ElementType.TYPE})
@Retention(RetentionPolicy.RUNTIME)
@Documented
public @interface GlobalTransactional {
    /** More attempts after a retryable abort; -1: {@code cotx.retries} (default 5). */
    int retries() default -1;

    /** The transaction's timeout at the daemon in ms; 0: the daemon's default. */
    int timeoutMs() default 0;

    /** As the root: the last PostgreSQL branch (engine mode) commits in one phase with the
     * global decision inside it, pg_co's co.decide (its resource needs {@code decisions =
     * true} at the daemon): {@code Transaction.decideInParticipant}. Ignored by a participant. */
    boolean decideInParticipant() default false;
}
