package io.cotx.spring;

import io.cotx.client.Coordinator;
import io.cotx.client.CotxException;
import io.cotx.client.Refusals;
import io.cotx.client.Retry;
import io.cotx.client.Transaction;
import io.cotx.client.TransactionAbortedException;
import java.lang.reflect.Method;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.aspectj.lang.ProceedingJoinPoint;
import org.aspectj.lang.annotation.Around;
import org.aspectj.lang.annotation.Aspect;
import org.aspectj.lang.reflect.MethodSignature;
import org.springframework.core.annotation.AnnotatedElementUtils;

/** {@link GlobalTransactional} as an aspect around the method (why an annotation and not a
 * PlatformTransactionManager: see the starter's README). Root: the client's retry loop
 * ({@link Retry#run}) around the method, each attempt's branch connections given back after
 * it ended. Participant (the request carried {@code Cotx-Gtid}): join, run, prepare, and
 * finish in the background after the root's decision; a statement's retryable error (or the
 * daemon's cancel) becomes a retryable {@link TransactionAbortedException}, for the
 * application to answer so that the root runs the transaction again (e.g. HTTP 409). */
@Aspect
public class GlobalTransactionalAspect {
    private final Coordinator coord;
    private final CotxProperties props;
    private final ExecutorService finisher;

    public GlobalTransactionalAspect(Coordinator coord, CotxProperties props, ExecutorService finisher) {
        this.coord = coord;
        this.props = props;
        this.finisher = finisher;
    }

    @Around("@annotation(io.cotx.spring.GlobalTransactional) || @within(io.cotx.spring.GlobalTransactional)")
    public Object around(ProceedingJoinPoint pjp) throws Throwable {
        if (GlobalTransactions.scope() != null) {
            return pjp.proceed(); // inside a global transaction already: take part in it
        }
        GlobalTransactional gt = annotation(pjp);
        GlobalTransactions.Incoming in = GlobalTransactions.incoming();
        if (in != null) {
            return participant(pjp, in);
        }
        return root(pjp, gt);
    }

    private static GlobalTransactional annotation(ProceedingJoinPoint pjp) {
        Method m = ((MethodSignature) pjp.getSignature()).getMethod();
        GlobalTransactional gt = AnnotatedElementUtils.findMergedAnnotation(m, GlobalTransactional.class);
        if (gt == null) {
            gt = AnnotatedElementUtils.findMergedAnnotation(pjp.getTarget().getClass(), GlobalTransactional.class);
        }
        return gt;
    }

    private Object root(ProceedingJoinPoint pjp, GlobalTransactional gt) throws Throwable {
        int retries = gt == null || gt.retries() < 0 ? props.getRetries() : gt.retries();
        AtomicInteger attempt = new AtomicInteger();
        AtomicReference<GlobalTransactions.Scope> held = new AtomicReference<>();
        try {
            return Retry.run(coord, tx -> {
                tx.decideInParticipant(gt != null && gt.decideInParticipant());
                held.set(GlobalTransactions.bind(tx, attempt.incrementAndGet()));
                try {
                    return pjp.proceed();
                } catch (Exception | Error e) {
                    throw e;
                } catch (Throwable t) {
                    throw new Exception(t);
                } finally {
                    GlobalTransactions.unbind();
                }
            }, Retry.Policy.ofRetries(retries), gt == null ? 0 : gt.timeoutMs(), null, tx -> {
                GlobalTransactions.Scope s = held.getAndSet(null);
                if (s != null) {
                    s.release(); // the attempt has ended: its connections go back to their pools
                }
            });
        } catch (Retry.WorkFailedException e) {
            throw e.getCause(); // the method's own checked exception, as it threw it
        }
    }

    private Object participant(ProceedingJoinPoint pjp, GlobalTransactions.Incoming in) throws Throwable {
        Transaction tx = coord.join(in.gtid(), in.traceparent());
        GlobalTransactions.Scope scope = GlobalTransactions.bind(tx, 1);
        Object result;
        try {
            result = pjp.proceed();
        } catch (Throwable t) {
            boolean cancelled = !(t instanceof CotxException) && tx.daemonAbortedRetryably();
            try {
                tx.rollback("the participant failed: " + t);
            } finally {
                scope.release();
            }
            if (cancelled || (!(t instanceof CotxException) && Refusals.retryable(t))) {
                // A serialization failure, deadlock or lock timeout of a statement, or the
                // daemon's cancel of a deadlock victim: the caller's root may run it again.
                throw new TransactionAbortedException(in.gtid(), "the participant's statement failed: " + t.getMessage(), true, false, t);
            }
            throw t;
        } finally {
            GlobalTransactions.unbind();
        }
        try {
            tx.prepare();
        } catch (CotxException e) {
            scope.release();
            throw e;
        }
        // The decision comes when the root commits, after this request is answered: wait for
        // it elsewhere, then give the connections back (a MariaDB branch dies with its session).
        finisher.submit(() -> {
            try {
                tx.finish();
            } catch (CotxException e) {
                // aborted, or the outcome unknown: the coordinator finishes what is prepared
            } finally {
                scope.release();
            }
        });
        return result;
    }
}
