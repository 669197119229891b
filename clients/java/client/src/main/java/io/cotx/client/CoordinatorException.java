package io.cotx.client;

/** The coordinator refused a request (4xx) or failed (5xx): its status and error code
 * ({@code {"error": {"code", "message"}}}, docs/coordinator.md "HTTP API"). */
public class CoordinatorException extends CotxException {
    private final int status;
    private final String code;
    private final String phase;
    private final java.time.Duration retryAfter;

    public CoordinatorException(int status, String code, String message, String phase) {
        this(status, code, message, phase, null);
    }

    public CoordinatorException(int status, String code, String message, String phase, java.time.Duration retryAfter) {
        super("coordinator: " + status + " " + code + ": " + message);
        this.status = status;
        this.code = code;
        this.phase = phase;
        this.retryAfter = retryAfter;
    }

    /** The answer's {@code Retry-After} (the daemon sends one with 429 and 503), or null. */
    public java.time.Duration retryAfter() {
        return retryAfter;
    }

    /** Which request was refused, as the retry rules name it ({@link RetryRules#phaseOf}). */
    public String phase() {
        return phase;
    }

    /** What the retry rules say to do about this answer. */
    public String action() {
        return RetryRules.daemonAction(phase, status, code);
    }

    public int status() {
        return status;
    }

    public String code() {
        return code;
    }
}
