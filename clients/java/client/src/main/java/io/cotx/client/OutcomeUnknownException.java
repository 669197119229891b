package io.cotx.client;

/** The outcome of a global transaction is not known to this process: the coordinator could
 * not be reached for the decision timeout, or it answered {@code 410 outcome_forgotten} (the
 * record was purged after {@code outcome_retention_ms}: it may have committed). Never read it
 * as "aborted": the branches stay prepared until the coordinator finishes them, and the
 * application must find out (e.g. by reading its data) before it acts again. */
public class OutcomeUnknownException extends CotxException {
    private final String gtid;
    private final boolean forgotten;

    public OutcomeUnknownException(String gtid, boolean forgotten, Throwable cause) {
        super("outcome of " + gtid + " unknown: " + (forgotten
                ? "the coordinator forgot it (outcome_forgotten: its record was purged); it may have committed"
                : "branches stay prepared until the coordinator finishes them") + (cause == null ? "" : ": " + cause.getMessage()), cause);
        this.gtid = gtid;
        this.forgotten = forgotten;
    }

    /** {@code reason} in place of the default: e.g. a session lost during a one-phase COMMIT,
     * whose outcome only the database knows. */
    public OutcomeUnknownException(String gtid, String reason, Throwable cause) {
        super("outcome of " + gtid + " unknown: " + reason + (cause == null ? "" : ": " + cause.getMessage()), cause);
        this.gtid = gtid;
        this.forgotten = false;
    }

    public String gtid() {
        return gtid;
    }

    /** True for {@code 410 outcome_forgotten}, false when the coordinator was unreachable. */
    public boolean forgotten() {
        return forgotten;
    }
}
