package io.cotx.client;

/** The coordinator could not be reached (connection refused, timeout, broken answer). */
public class CoordinatorUnavailableException extends CotxException {
    public CoordinatorUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
