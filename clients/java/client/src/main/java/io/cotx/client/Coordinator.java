package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CopyOnWriteArrayList;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** A handle on a cotx-coordinator daemon (docs/coordinator.md, "HTTP API"). Thread-safe; one
 * per process and daemon:
 * <pre>{@code
 * Coordinator coord = Coordinator.builder("http://127.0.0.1:7420").token(token).build();
 * coord.run(tx -> {
 *     Branch b = tx.branch(pgConn, "savings");       // BEGIN ISOLATION LEVEL SERIALIZABLE
 *     ... statements on pgConn ...
 *     return null;
 * }, 5);                                             // commits; retries refusals
 * }</pre> */
public final class Coordinator {
    static final ObjectMapper JSON = new ObjectMapper();
    /** How many {@code 421 wrong_node} answers one call follows: one hop is the usual case; a
     * second covers an ownership that moved between the two requests. More would be two
     * daemons naming each other: an error, not a loop. */
    static final int MAX_REDIRECTS = 2;

    private final String base;
    private final String token;
    private final HttpClient http;
    private final Duration requestTimeout;
    private final Duration decisionTimeout;
    private final List<TransactionListener> listeners = new CopyOnWriteArrayList<>();
    private final LeasedGtids leased; // null: the one-request commit is off

    private Coordinator(Builder b) {
        this.leased = b.oneRequest ? new LeasedGtids(this, b.leaseCount) : null;
        this.base = stripSlash(b.url);
        this.token = b.token;
        this.requestTimeout = b.requestTimeout;
        this.decisionTimeout = b.decisionTimeout;
        HttpClient.Builder hb = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(5)).followRedirects(HttpClient.Redirect.NEVER);
        if (b.sslContext != null) {
            hb.sslContext(b.sslContext);
        }
        this.http = hb.build();
    }

    /** A builder for the daemon at {@code url} ({@code http://host:port} or {@code https://…}). */
    public static Builder builder(String url) {
        return new Builder(url);
    }

    /** Settings of a {@link Coordinator}. */
    public static final class Builder {
        private final String url;
        private String token;
        private SSLContext sslContext;
        private Duration requestTimeout = Duration.ofSeconds(10);
        private Duration decisionTimeout = Duration.ofSeconds(120);
        private boolean oneRequest;
        private int leaseCount = LeasedGtids.DEFAULT_COUNT;

        private Builder(String url) {
            URI u = URI.create(Objects.requireNonNull(url, "url"));
            if (!("http".equals(u.getScheme()) || "https".equals(u.getScheme())) || u.getHost() == null) {
                throw new IllegalArgumentException("coordinator url must be http(s)://host:port, got " + url);
            }
            this.url = url;
        }

        /** The bearer token (the daemon's {@code token}, or {@code auth.client_token}). */
        public Builder token(String token) {
            this.token = token == null || token.isBlank() ? null : token.trim();
            return this;
        }

        /** The token read from a file (trailing whitespace dropped), as the daemon's {@code token_file}. */
        public Builder tokenFile(Path file) {
            try {
                return token(Files.readString(file));
            } catch (IOException e) {
                throw new CotxException("cannot read the coordinator token file " + file + ": " + e.getMessage(), e);
            }
        }

        /** Trust only the CA certificate(s) in this PEM file for an {@code https://} daemon (its
         * {@code tls.ca_file}; a self-signed certificate is its own CA). */
        public Builder caFile(Path pem) {
            try (InputStream in = Files.newInputStream(pem)) {
                KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                ks.load(null, null);
                int i = 0;
                for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                    ks.setCertificateEntry("ca" + i++, c);
                }
                if (i == 0) {
                    throw new CotxException("no certificate in " + pem);
                }
                TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
                tmf.init(ks);
                SSLContext ctx = SSLContext.getInstance("TLS");
                ctx.init(null, tmf.getTrustManagers(), null);
                this.sslContext = ctx;
                return this;
            } catch (IOException | GeneralSecurityException e) {
                throw new CotxException("cannot use the CA file " + pem + ": " + e.getMessage(), e);
            }
        }

        /** Bound on one ordinary API call (default 10 s). */
        public Builder requestTimeout(Duration d) {
            this.requestTimeout = d;
            return this;
        }

        /** Bound on the wait for the decision (default 120 s); then a participant gets
         * {@link OutcomeUnknownException} and its branches stay prepared. */
        public Builder decisionTimeout(Duration d) {
            this.decisionTimeout = d;
            return this;
        }

        /** The one-request commit (default off): a root transaction whose branches are all on
         * resources this handle has seen in engine mode or plain 2PC draws its gtid from a
         * range leased from the daemon ({@code POST /v1/gtid-leases}), prepares its branches
         * under the names the lease gives and sends them with its commit — its only request
         * (docs/coordinator.md, "One request per transaction: leased gtids"). Acknowledgements
         * ride with the next commit ({@link #flushAcks()} before the process stops). Off by
         * default: the daemon's cross-database deadlock detector sees only begun
         * transactions. */
        public Builder oneRequest(boolean on) {
            this.oneRequest = on;
            return this;
        }

        /** Gtids per lease with {@link #oneRequest(boolean)} (default 1000, at most 100000). */
        public Builder leaseCount(int n) {
            if (n < 1 || n > 100_000) {
                throw new IllegalArgumentException("leaseCount must be between 1 and 100000, got " + n);
            }
            this.leaseCount = n;
            return this;
        }

        public Coordinator build() {
            return new Coordinator(this);
        }
    }

    /** Registers a listener for every transaction of this coordinator handle. */
    public Coordinator addListener(TransactionListener l) {
        listeners.add(l);
        return this;
    }

    List<TransactionListener> listeners() {
        return listeners;
    }

    Duration decisionTimeout() {
        return decisionTimeout;
    }

    /** The one-request commit's state; null when it is off. */
    LeasedGtids leased() {
        return leased;
    }

    /** Whether the one-request commit is on ({@link Builder#oneRequest(boolean)}). */
    public boolean oneRequest() {
        return leased != null;
    }

    /** Sends the acknowledgements held for the next commit (the one-request commit) on their
     * own requests; call it before the process stops. One never sent is confirmed by the
     * daemon after its owner grace period (the outcome is durable: nothing is lost). */
    public void flushAcks() {
        if (leased != null) {
            leased.flush();
        }
    }

    public String url() {
        return base;
    }

    // ---- transactions ----------------------------------------------------------------------

    /** A new global transaction whose root is this process: it decides it in
     * {@link Transaction#commit()}. Begun at the coordinator with its first branch (one round
     * trip), or when {@link Transaction#gtid()} is first called. */
    public Transaction transaction() {
        return new Transaction(this, null, true, 0, null);
    }

    /** As {@link #transaction()}, with a timeout (0: the daemon's default) and the caller's
     * traceparent (null: one trace id of the transaction's own). */
    public Transaction transaction(int timeoutMs, String traceparent) {
        return new Transaction(this, null, true, timeoutMs, traceparent);
    }

    /** Takes part in a global transaction begun elsewhere (its gtid, propagated as a string). */
    public Transaction join(String gtid) {
        return join(gtid, null);
    }

    /** As {@link #join(String)}, under the caller's traceparent. */
    public Transaction join(String gtid, String traceparent) {
        if (gtid == null || gtid.isBlank()) {
            throw new CotxException("join needs a gtid");
        }
        return new Transaction(this, gtid, false, 0, traceparent);
    }

    /** Joins the transaction named by an incoming request's {@code Cotx-Gtid} header, under its
     * traceparent when it carries one; {@link CotxException} without the header. */
    public Transaction joinFrom(java.util.function.Function<String, String> header) {
        String g = Propagation.gtidFrom(header);
        if (g == null) {
            throw new CotxException("the request carries no " + Propagation.GTID_HEADER + " header");
        }
        return join(g, Propagation.traceparentFrom(header));
    }

    /** Work run in a global transaction by {@link #run}. */
    @FunctionalInterface
    public interface Work<T> {
        T apply(Transaction tx) throws Exception;
    }

    /** {@code work} in a new global transaction, committed when it returns and retried (at
     * most {@code retries} more times, jittered exponential backoff) when the transaction is
     * aborted retryably. See {@link Retry}. */
    public <T> T run(Work<T> work, int retries) {
        return Retry.run(this, work, Retry.Policy.ofRetries(retries), null);
    }

    // ---- API calls -------------------------------------------------------------------------

    /** Begins a global transaction and returns its gtid (timeoutMs 0: the daemon's default). */
    public String begin(int timeoutMs) {
        ObjectNode body = JSON.createObjectNode();
        if (timeoutMs > 0) {
            body.put("timeout_ms", timeoutMs);
        }
        return call("POST", "/v1/transactions", body, null, null).path("gtid").asText();
    }

    /** The coordinator's view of a transaction (state, decision, branches). */
    public JsonNode get(String gtid) {
        return call("GET", "/v1/transactions/" + q(gtid), null, null, null);
    }

    /** Each configured resource, with its enforcement ({@code GET /v1/resources}; operator role). */
    public JsonNode resources() {
        return call("GET", "/v1/resources", null, null, null);
    }

    /** {@code GET /healthz}: throws when the daemon cannot be reached or is not healthy. */
    public void health() {
        call("GET", "/healthz", null, null, null);
    }

    /** Aborts a global transaction (the branches' owners roll back theirs). */
    public void abort(String gtid, String reason, String traceparent) {
        ObjectNode body = JSON.createObjectNode().put("reason", trunc(reason, 900));
        call("POST", "/v1/transactions/" + q(gtid) + "/abort", body, traceparent, null);
    }

    /** Long poll of the decision, up to {@code wait}: the answer's {@code decision} is null
     * while undecided. */
    public JsonNode decision(String gtid, Duration wait, String traceparent) {
        return call("GET", "/v1/transactions/" + q(gtid) + "/decision?wait_ms=" + wait.toMillis(), null, traceparent,
                requestTimeout.plus(wait));
    }

    /** One JSON request; the answer's body (an empty object for an empty body). A {@code 421
     * wrong_node} (another daemon owns the gtid) is sent again, the same request with the same
     * token, to the owner's {@code error.owner_url}, as the Python and Go clients do. */
    JsonNode call(String method, String path, JsonNode body, String traceparent, Duration timeout) {
        byte[] data;
        try {
            data = body == null ? null : JSON.writeValueAsBytes(body);
        } catch (IOException e) {
            throw new CotxException("cannot encode a request body", e);
        }
        String phase = RetryRules.phaseOf(method, path, body != null && body.has("one_phase_branch"));
        String at = base;
        for (int hop = 0; ; hop++) {
            HttpResponse<byte[]> resp = send(at, method, path, data, traceparent, timeout == null ? requestTimeout : timeout, phase);
            JsonNode answer = parse(resp.body());
            int status = resp.statusCode();
            if (status < 400) {
                return answer;
            }
            JsonNode err = answer.path("error");
            String code = err.path("code").asText("");
            String message = err.path("message").asText("");
            if (code.isEmpty()) {
                code = "unknown";
                message = new String(resp.body(), StandardCharsets.UTF_8);
            }
            if (status == 421 && code.equals("wrong_node") && hop < MAX_REDIRECTS) {
                String owner = ownerBase(err.path("owner_url").asText(""));
                if (owner != null && !owner.equals(at)) {
                    at = owner;
                    continue;
                }
            }
            java.time.Duration after = resp.headers().firstValue("Retry-After").map(v -> {
                try {
                    return Duration.ofSeconds(Long.parseLong(v.trim()));
                } catch (NumberFormatException e) {
                    return null; // an HTTP date: the client's own backoff
                }
            }).orElse(null);
            throw new CoordinatorException(status, code, message, phase, after);
        }
    }

    private HttpResponse<byte[]> send(String at, String method, String path, byte[] data, String traceparent, Duration timeout,
            String phase) {
        HttpRequest.Builder rb = HttpRequest.newBuilder(URI.create(at + path)).timeout(timeout)
                .header("Content-Type", "application/json")
                .method(method, data == null ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofByteArray(data));
        if (token != null) {
            rb.header("Authorization", "Bearer " + token);
        }
        if (traceparent != null) {
            rb.header(Traceparent.HEADER, traceparent);
        }
        try {
            return http.send(rb.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (IOException e) {
            throw new CoordinatorUnavailableException("coordinator unavailable: " + method + " " + path + ": " + e, e, phase);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CoordinatorUnavailableException("interrupted: " + method + " " + path, e, phase);
        }
    }

    private static JsonNode parse(byte[] raw) {
        if (raw == null || raw.length == 0) {
            return JSON.createObjectNode();
        }
        try {
            return JSON.readTree(raw);
        } catch (IOException e) {
            return JSON.createObjectNode(); // not JSON (a proxy's page): the status still counts
        }
    }

    /** An owner_url is checked before any request is sent there: http(s) with a host. */
    static String ownerBase(String s) {
        try {
            URI u = URI.create(s);
            if (!("http".equals(u.getScheme()) || "https".equals(u.getScheme())) || u.getHost() == null) {
                return null;
            }
            return stripSlash(s);
        } catch (IllegalArgumentException e) {
            return null;
        }
    }

    static String q(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    static String trunc(String s, int n) {
        if (s == null) {
            return "";
        }
        return s.length() > n ? s.substring(0, n) : s;
    }

    private static String stripSlash(String s) {
        return s.endsWith("/") ? s.substring(0, s.length() - 1) : s;
    }
}
