package io.cotx.client;

/** A branch that is not SERIALIZABLE on a resource in client mode, refused before it runs:
 * the shims protect SERIALIZABLE branches only (docs/client-mode.md). */
public class ClientModeIsolationException extends CotxException {
    public ClientModeIsolationException(String message) {
        super(message);
    }
}
