package io.cotx.client;

/** The global transaction was aborted and every local branch rolled back. {@link #retryable()}:
 * running it again may succeed (a refused prepare, a serialization failure, deadlock or lock
 * timeout, an abort the coordinator marked retryable such as a timeout); {@link #refused()}:
 * an engine refused one of our prepares (or a one-phase commit), a subset of retryable. The
 * driver's exception, when there is one, is the cause. */
public class TransactionAbortedException extends CotxException {
    private final String gtid;
    private final String reason;
    private final boolean retryable;
    private final boolean refused;

    public TransactionAbortedException(String gtid, String reason, boolean retryable, boolean refused, Throwable cause) {
        super("global transaction " + gtid + " aborted: " + (reason == null || reason.isEmpty() ? "no reason given" : reason), cause);
        this.gtid = gtid;
        this.reason = reason;
        this.retryable = retryable;
        this.refused = refused;
    }

    public String gtid() {
        return gtid;
    }

    public String reason() {
        return reason;
    }

    public boolean retryable() {
        return retryable;
    }

    public boolean refused() {
        return refused;
    }
}
