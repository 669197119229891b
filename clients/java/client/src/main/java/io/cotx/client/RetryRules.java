package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Locale;

/** The retry rules: what the client does with each answer that is not a success, read from
 * the one table every client shares (clients/retry-rules.json; the build copies it into this
 * jar as {@code io/cotx/client/retry-rules.json}, and RetryRulesTest checks the copy equals it
 * and that this class classifies every row as the table says). Its {@code _doc} field and
 * clients/README.md ("Retry rules") describe the format; the matching is the Python client's
 * {@code cotx/retry_rules.py}. */
public final class RetryRules {
    public static final String RETRY_REQUEST = "retry_request";
    public static final String RETRY_TRANSACTION = "retry_transaction";
    public static final String ABORTED = "aborted";
    public static final String POLL_DECISION = "poll_decision";
    public static final String OUTCOME_UNKNOWN = "outcome_unknown";
    public static final String FOLLOW = "follow";
    public static final String IGNORE = "ignore";
    public static final String FAIL = "fail";

    /** The table as shipped in the jar. */
    public static final JsonNode RULES = load();

    private RetryRules() {
    }

    private static JsonNode load() {
        try (InputStream in = RetryRules.class.getResourceAsStream("retry-rules.json")) {
            if (in == null) {
                throw new IllegalStateException("retry-rules.json is missing from the jar (the build copies clients/retry-rules.json)");
            }
            return Coordinator.JSON.readTree(in);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** An engine row: the error's kind, its engine ("postgres", "mariadb"; null for "other"),
     * and the action. */
    public record EngineRule(String kind, String engine, String action) {
        public boolean retryable() {
            return RETRY_TRANSACTION.equals(action);
        }
    }

    static final EngineRule OTHER = new EngineRule("other", null, FAIL);

    /** Which phase of the table a request is: its method, its path after the base URL, and
     * for a commit whether it is a one-phase one. */
    public static String phaseOf(String method, String path, boolean onePhase) {
        String[] parts = path.split("\\?", 2)[0].replaceAll("^/+|/+$", "").split("/");
        if (method.equals("POST") && path.equals("/v1/gtid-leases")) {
            return "begin"; // a lease of gtids (LeasedGtids): as a begin, nothing exists yet
        }
        if (parts.length < 2 || !parts[0].equals("v1") || !parts[1].equals("transactions")) {
            return "other";
        }
        int rest = parts.length - 2;
        String last = parts[parts.length - 1];
        if (method.equals("POST") && rest == 0) {
            return "begin";
        }
        if (method.equals("POST") && rest == 2 && last.equals("branches")) {
            return "register";
        }
        if (method.equals("POST") && rest == 2 && last.equals("commit")) {
            return onePhase ? "one_phase" : "commit";
        }
        if (method.equals("GET") && rest == 2 && last.equals("decision")) {
            return "decision";
        }
        if (method.equals("POST") && rest == 4 && last.equals("prepared")) {
            return "prepared";
        }
        if (method.equals("POST") && rest > 0 && (last.equals("failed") || last.equals("finished") || last.equals("abort"))) {
            return "report";
        }
        return "other";
    }

    /** The action for the daemon's answer {@code status} / {@code code} to a request of
     * {@code phase}: the most specific row (its exact code, then '*' with the status, then '*'
     * without one, then the '*'-phase row); among equals the first. */
    public static String daemonAction(String phase, int status, String code) {
        JsonNode best = null;
        int score = -1;
        for (JsonNode row : RULES.path("daemon")) {
            JsonNode phases = row.path("phases");
            String rowCode = row.path("code").asText();
            int s;
            if (phases.size() == 1 && phases.get(0).asText().equals("*")) {
                s = 0;
            } else if (!contains(phases, phase)) {
                continue;
            } else if (rowCode.equals(code)) {
                s = 3;
            } else if (rowCode.equals("*") && row.has("status") && row.path("status").asInt() == status) {
                s = 2;
            } else if (rowCode.equals("*") && !row.has("status")) {
                s = 1;
            } else {
                continue;
            }
            if (s > score) {
                best = row;
                score = s;
            }
        }
        return best == null ? FAIL : best.path("action").asText();
    }

    /** The action when the daemon could not be reached (or its answer not read) in {@code phase}. */
    public static String transportAction(String phase) {
        for (JsonNode row : RULES.path("transport")) {
            if (contains(row.path("phases"), phase)) {
                return row.path("action").asText();
            }
        }
        return FAIL;
    }

    /** The action for an aborted transaction, from {@code GET …/decision}'s {@code retryable}
     * and {@code abort_reason} (null: none recorded, or the daemon no longer knows it). */
    public static String abortAction(boolean retryable, String reason) {
        for (JsonNode row : RULES.path("aborts")) {
            if (row.path("retryable").asBoolean(false)) {
                if (retryable) {
                    return row.path("action").asText();
                }
            } else if (row.has("reason")) {
                if (reason == null) {
                    return row.path("action").asText();
                }
            } else if (reason != null && reason.startsWith(row.path("reason_prefix").asText())) {
                return row.path("action").asText();
            }
        }
        return FAIL;
    }

    /** The engine row an error matches (kind "other", action fail, when none): a SQLSTATE is
     * PostgreSQL's, an errno MariaDB's, first match wins; text alone (an abort reason)
     * matches by the rows' message fragments or text. */
    public static EngineRule engineRule(String sqlstate, Integer errno, String text) {
        String low = text == null ? "" : text.toLowerCase(Locale.ROOT);
        for (JsonNode row : RULES.path("engine")) {
            JsonNode frags = row.path("message");
            if (sqlstate == null && errno == null) {
                if ((frags.size() > 0 && all(frags, low)) || (row.has("text") && low.contains(row.path("text").asText()))) {
                    return rule(row);
                }
                continue;
            }
            if (row.path("engine").asText().equals("postgres")) {
                if (errno != null || (row.has("sqlstate") && !row.path("sqlstate").asText().equals(sqlstate))) {
                    continue;
                }
            } else if (sqlstate != null || (row.has("errno") && row.path("errno").asInt() != errno)) {
                continue;
            }
            if (all(frags, low)) {
                return rule(row);
            }
        }
        return OTHER;
    }

    private static EngineRule rule(JsonNode row) {
        return new EngineRule(row.path("kind").asText(), row.path("engine").asText(), row.path("action").asText());
    }

    private static boolean all(JsonNode frags, String low) {
        for (JsonNode f : frags) {
            if (!low.contains(f.asText())) {
                return false;
            }
        }
        return true;
    }

    private static boolean contains(JsonNode arr, String s) {
        for (JsonNode n : arr) {
            if (n.asText().equals(s)) {
                return true;
            }
        }
        return false;
    }
}
