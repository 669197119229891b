package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The retry rules (clients/retry-rules.json), the one table every client classifies from:
 * the jar's copy is the table byte for byte, and the Java client classifies every row as the
 * table says (daemon answers per phase, transport failures, aborts, engine errors), as the
 * Python (regress/pytest/clients/test_client_retry_rules.py) and Go (clients/go/rules_test.go)
 * clients' tests do with theirs. No servers. */
class RetryRulesTest {
    static final Path TABLE = Path.of("..", "..", "retry-rules.json"); // from clients/java/client

    @Test
    void theJarShipsTheTableByteForByte() throws Exception {
        try (InputStream in = RetryRules.class.getResourceAsStream("retry-rules.json")) {
            assertArrayEquals(Files.readAllBytes(TABLE), in.readAllBytes(), "the build copies clients/retry-rules.json into the jar");
        }
        assertEquals(Coordinator.JSON.readTree(TABLE.toFile()), RetryRules.RULES);
    }

    static List<String> phases(JsonNode row) {
        List<String> out = new ArrayList<>();
        row.path("phases").forEach(p -> out.add(p.asText()));
        return out.equals(List.of("*")) ? List.of("other") : out;
    }

    @Test
    void daemonAnswersAreClassifiedAsTheTableSays() {
        int rows = 0;
        for (JsonNode row : RetryRules.RULES.path("daemon")) {
            for (String phase : phases(row)) {
                // An answer the row is the most specific for.
                String code = row.path("code").asText();
                int status = row.path("status").asInt(418);
                if (code.equals("*")) {
                    code = "a_code_of_no_row";
                }
                CoordinatorException e = new CoordinatorException(status, code, "m", phase);
                assertEquals(row.path("action").asText(), Retry.actionOf(e), phase + " " + status + " " + code);
            }
            rows++;
        }
        assertTrue(rows > 20, "the table has its daemon rows");
    }

    @Test
    void transportFailuresAreClassifiedAsTheTableSays() {
        for (JsonNode row : RetryRules.RULES.path("transport")) {
            for (String phase : phases(row)) {
                CoordinatorUnavailableException e = new CoordinatorUnavailableException("connection refused", null, phase);
                assertEquals(row.path("action").asText(), Retry.actionOf(e), phase);
            }
        }
    }

    @Test
    void abortsAreClassifiedAsTheTableSays() {
        for (JsonNode row : RetryRules.RULES.path("aborts")) {
            String got;
            if (row.path("retryable").asBoolean(false)) {
                got = RetryRules.abortAction(true, "branch b1 failed: prepare refused: could not serialize access");
            } else if (row.has("reason")) {
                got = RetryRules.abortAction(false, null);
            } else {
                got = RetryRules.abortAction(false, row.path("reason_prefix").asText() + "…");
            }
            assertEquals(row.path("action").asText(), got, row.toString());
        }
    }

    @Test
    void engineErrorsAreClassifiedAsTheTableSays() {
        for (JsonNode row : RetryRules.RULES.path("engine")) {
            String kind = row.path("kind").asText();
            boolean retry = row.path("action").asText().equals(RetryRules.RETRY_TRANSACTION);
            String example = row.path("example").asText();
            // As the drivers raise it: pgjdbc with the SQLSTATE, Connector/J with the errno.
            SQLException e = row.path("engine").asText().equals("postgres")
                    ? new SQLException("ERROR: " + example, row.path("sqlstate").asText("XX000"), 0)
                    : new SQLException("(conn=7) " + example, "HY000", row.path("errno").asInt());
            Refusals.Refusal r = Refusals.classify(new RuntimeException("wrapped", e));
            assertEquals(kind, r.kind(), example);
            assertEquals(retry, r.retryable(), example);
            assertEquals(row.path("engine").asText(), r.engine(), example);
            if (row.has("message") || row.has("text")) { // as an abort reason: text only
                assertEquals(kind, Refusals.classify(null, null, example).kind(), example);
            }
        }
    }

    @Test
    void requestsAreNamedByTheirPhase() {
        assertEquals("begin", RetryRules.phaseOf("POST", "/v1/transactions", false));
        assertEquals("register", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/branches", false));
        assertEquals("commit", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/commit", false));
        assertEquals("one_phase", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/commit", true));
        assertEquals("decision", RetryRules.phaseOf("GET", "/v1/transactions/n1.a-1/decision?wait_ms=10", false));
        assertEquals("prepared", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/branches/b/prepared", false));
        assertEquals("report", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/branches/b/failed", false));
        assertEquals("report", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/finished", false));
        assertEquals("report", RetryRules.phaseOf("POST", "/v1/transactions/n1.a-1/abort", false));
        assertEquals("other", RetryRules.phaseOf("GET", "/v1/transactions/n1.a-1", false));
    }

    @Test
    void whatRunDoesWithTheClientsOwnErrors() {
        assertEquals(RetryRules.RETRY_TRANSACTION, Retry.actionOf(new TransactionAbortedException("g", "x", true, true, null)));
        assertEquals(RetryRules.FAIL, Retry.actionOf(new TransactionAbortedException("g", "x", false, false, null)));
        assertEquals(RetryRules.OUTCOME_UNKNOWN, Retry.actionOf(new OutcomeUnknownException("g", true, null)));
        assertEquals(RetryRules.FAIL, Retry.actionOf(new IllegalArgumentException("application bug")));
        assertEquals(RetryRules.RETRY_TRANSACTION, Retry.actionOf(new RuntimeException("dao", new SQLException("deadlock", "40P01", 0))));
    }
}
