package io.cotx.client;

import java.util.function.Function;

/** The gtid between services: the one header every client writes and reads (Python
 * {@code cotx.GTID_HEADER}, Go {@code cotx.Header}); the W3C traceparent travels beside it
 * (docs/coordinator.md, "Propagating a transaction between services"). */
public final class Propagation {
    /** The header carrying the gtid. */
    public static final String GTID_HEADER = "Cotx-Gtid";

    private Propagation() {
    }

    /** The gtid of an incoming request, read through {@code header} (a name → value lookup,
     * e.g. {@code request::getHeader}); null when absent or blank. */
    public static String gtidFrom(Function<String, String> header) {
        String g = header.apply(GTID_HEADER);
        return g == null || g.isBlank() ? null : g.trim();
    }

    /** The traceparent of an incoming request when it is well formed, else null. */
    public static String traceparentFrom(Function<String, String> header) {
        String t = header.apply(Traceparent.HEADER);
        return Traceparent.valid(t) ? t : null;
    }
}
