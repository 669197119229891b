package io.cotx.client;

import java.security.SecureRandom;
import java.util.HexFormat;

/** The W3C {@code traceparent} sent on every request of a transaction, so the daemon logs (and
 * exports) its part of the workflow under the caller's trace id (docs/coordinator.md, "Logs
 * and traces"): the caller's, as given, or one trace id per transaction with a new span id per
 * request. */
public final class Traceparent {
    /** The header's name. */
    public static final String HEADER = "traceparent";
    private static final SecureRandom RANDOM = new SecureRandom();

    private Traceparent() {
    }

    /** The daemon's rule (api::traceparent): version 00-fe, a 32-hex trace id and a 16-hex
     * parent id that are not all zeros, 2-hex flags, lowercase. A header the daemon would
     * ignore is not worth sending. */
    public static boolean valid(String s) {
        if (s == null) {
            return false;
        }
        String[] p = s.split("-", -1);
        if (p.length != 4 || !lowerHex(p[0], 2) || p[0].equals("ff") || !lowerHex(p[1], 32) || !lowerHex(p[2], 16)
                || !lowerHex(p[3], 2)) {
            return false;
        }
        return !p[1].chars().allMatch(c -> c == '0') && !p[2].chars().allMatch(c -> c == '0');
    }

    private static boolean lowerHex(String s, int n) {
        return s.length() == n && s.chars().allMatch(c -> (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    }

    static String randomHex(int bytes) {
        byte[] b = new byte[bytes];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    /** A traceparent under trace id {@code traceId} with a fresh span id, flags "sampled". */
    static String child(String traceId) {
        return "00-" + traceId + "-" + randomHex(8) + "-01";
    }
}
