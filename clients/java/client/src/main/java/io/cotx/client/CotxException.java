package io.cotx.client;

/** Base class of every error this client throws. Unchecked: a global transaction's failure
 * is handled where the transaction is run (Coordinator.run, the Spring starter's aspect). */
public class CotxException extends RuntimeException {
    public CotxException(String message) {
        super(message);
    }

    public CotxException(String message, Throwable cause) {
        super(message, cause);
    }
}
