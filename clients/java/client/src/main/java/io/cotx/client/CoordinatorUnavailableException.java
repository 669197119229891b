package io.cotx.client;

/** The coordinator could not be reached (connection refused, timeout, broken answer). */
public class CoordinatorUnavailableException extends CotxException {
    private final String phase;

    public CoordinatorUnavailableException(String message, Throwable cause, String phase) {
        super(message, cause);
        this.phase = phase;
    }

    /** Which request could not be sent or answered, as the retry rules name it. */
    public String phase() {
        return phase;
    }

    /** What the retry rules say to do about it. */
    public String action() {
        return RetryRules.transportAction(phase);
    }
}
