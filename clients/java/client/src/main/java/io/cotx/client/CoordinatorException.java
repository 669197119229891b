package io.cotx.client;

/** The coordinator refused a request (4xx) or failed (5xx): its status and error code
 * ({@code {"error": {"code", "message"}}}, docs/coordinator.md "HTTP API"). */
public class CoordinatorException extends CotxException {
    private final int status;
    private final String code;

    public CoordinatorException(int status, String code, String message) {
        super("coordinator: " + status + " " + code + ": " + message);
        this.status = status;
        this.code = code;
    }

    public int status() {
        return status;
    }

    public String code() {
        return code;
    }
}
