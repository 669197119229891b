package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** What the client does with the daemon's answers, against stand-in daemons (the JDK's HTTP
 * server) that answer as the real one does in cases a test cannot easily make it reach: a
 * {@code 421 wrong_node} followed to {@code owner_url} with the same token and traceparent,
 * {@code 410 outcome_forgotten} and an unreachable daemon as "outcome unknown", never abort;
 * an https:// daemon trusted through a CA file, the token from a file. */
class StandInDaemonTest {
    record Seen(String path, String auth, String traceparent) {
    }

    final List<HttpServer> servers = new CopyOnWriteArrayList<>();

    HttpServer serve(List<Seen> seen, int status, String body) throws IOException {
        HttpServer s = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        s.createContext("/", (HttpExchange ex) -> {
            seen.add(new Seen(ex.getRequestURI().toString(), ex.getRequestHeaders().getFirst("Authorization"),
                    ex.getRequestHeaders().getFirst("traceparent")));
            byte[] b = body.getBytes(StandardCharsets.UTF_8);
            ex.getResponseHeaders().add("Content-Type", "application/json");
            ex.sendResponseHeaders(status, b.length);
            ex.getResponseBody().write(b);
            ex.close();
        });
        s.start();
        servers.add(s);
        return s;
    }

    static String url(HttpServer s) {
        return "http://127.0.0.1:" + s.getAddress().getPort();
    }

    @AfterEach
    void stop() {
        servers.forEach(s -> s.stop(0));
    }

    @Test
    void wrongNodeIsFollowedToTheOwner() throws IOException {
        List<Seen> atOwner = new CopyOnWriteArrayList<>();
        List<Seen> atFirst = new CopyOnWriteArrayList<>();
        HttpServer owner = serve(atOwner, 200, "{\"decision\": \"abort\", \"retryable\": true, \"abort_reason\": \"x\"}");
        HttpServer first = serve(atFirst, 421,
                "{\"error\": {\"code\": \"wrong_node\", \"message\": \"n2 owns it\", \"owner_url\": \"" + url(owner) + "\"}}");
        Coordinator c = Coordinator.builder(url(first)).token("t0123456789abcdef").build();
        String tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        Transaction tx = c.join("n2.abc-1", tp);
        TransactionAbortedException e = assertThrows(TransactionAbortedException.class, tx::finish);
        assertTrue(e.retryable(), "the daemon marked the abort retryable");
        // The long poll, then the abort's reason: each sent to the first daemon, then to the owner.
        assertEquals(atFirst.size(), atOwner.size());
        assertFalse(atOwner.isEmpty());
        Seen s = atOwner.get(0);
        assertTrue(s.path().startsWith("/v1/transactions/n2.abc-1/decision?wait_ms="), s.path());
        assertEquals("Bearer t0123456789abcdef", s.auth());
        assertEquals(tp, s.traceparent(), "the caller's traceparent, sent as given");
        assertEquals(tp, atFirst.get(0).traceparent());
    }

    @Test
    void outcomeForgottenIsUnknownNotAbort() throws IOException {
        List<Seen> seen = new CopyOnWriteArrayList<>();
        HttpServer d = serve(seen, 410, "{\"error\": {\"code\": \"outcome_forgotten\", \"message\": \"purged\"}}");
        Transaction tx = Coordinator.builder(url(d)).build().join("n1.abc-7");
        OutcomeUnknownException e = assertThrows(OutcomeUnknownException.class, tx::finish);
        assertTrue(e.forgotten());
        assertEquals("n1.abc-7", e.gtid());
        String generated = seen.get(0).traceparent();
        assertTrue(Traceparent.valid(generated), "a traceparent of the transaction's own: " + generated);
        assertEquals(tx.traceId(), generated.split("-")[1]);
    }

    @Test
    void unreachableDaemonIsUnknownAfterTheDecisionTimeout() throws IOException {
        HttpServer d = serve(new CopyOnWriteArrayList<>(), 200, "{}");
        String gone = url(d);
        d.stop(0);
        Coordinator c = Coordinator.builder(gone).decisionTimeout(Duration.ofMillis(600)).build();
        OutcomeUnknownException e = assertThrows(OutcomeUnknownException.class, () -> c.join("n1.abc-8").finish());
        assertFalse(e.forgotten());
        assertThrows(CoordinatorUnavailableException.class, c::health);
    }

    /** An https:// daemon whose certificate chains to the CA file only (a self-signed one, made
     * by the JDK's keytool with the address in its subjectAltName), and the token read from a
     * file: trusted with caFile, refused without it. */
    @Test
    void httpsWithACaFileAndATokenFile(@TempDir Path dir) throws Exception {
        Path ks = dir.resolve("daemon.p12");
        String keytool = Path.of(System.getProperty("java.home"), "bin", "keytool").toString();
        run(keytool, "-genkeypair", "-keystore", ks.toString(), "-storetype", "PKCS12", "-storepass", "changeit", "-alias", "d",
                "-keyalg", "EC", "-dname", "CN=cotx test daemon", "-ext", "SAN=ip:127.0.0.1", "-validity", "2");
        Path pem = dir.resolve("ca.pem");
        run(keytool, "-exportcert", "-rfc", "-keystore", ks.toString(), "-storetype", "PKCS12", "-storepass", "changeit", "-alias", "d",
                "-file", pem.toString());
        KeyStore store = KeyStore.getInstance("PKCS12");
        try (var in = Files.newInputStream(ks)) {
            store.load(in, "changeit".toCharArray());
        }
        KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(store, "changeit".toCharArray());
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(kmf.getKeyManagers(), null, null);
        HttpsServer https = HttpsServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        https.setHttpsConfigurator(new HttpsConfigurator(ctx));
        List<Seen> seen = new CopyOnWriteArrayList<>();
        https.createContext("/", ex -> {
            seen.add(new Seen(ex.getRequestURI().toString(), ex.getRequestHeaders().getFirst("Authorization"), null));
            byte[] b = "{\"status\": \"ok\"}".getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(200, b.length);
            ex.getResponseBody().write(b);
            ex.close();
        });
        https.start();
        servers.add(https);
        Path tok = dir.resolve("token");
        Files.writeString(tok, "0123456789abcdef-file\n");
        String url = "https://127.0.0.1:" + https.getAddress().getPort();
        Coordinator.builder(url).tokenFile(tok).caFile(pem).build().health();
        assertEquals("Bearer 0123456789abcdef-file", seen.get(0).auth());
        assertThrows(CoordinatorUnavailableException.class, () -> Coordinator.builder(url).build().health(),
                "the JDK's default trust store does not know the daemon's certificate");
    }

    static void run(String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertEquals(0, p.waitFor(), String.join(" ", cmd) + ": " + out);
    }

    @Test
    void headersCarryTheGtidAndTheTrace() throws IOException {
        HttpServer d = serve(new CopyOnWriteArrayList<>(), 201, "{\"gtid\": \"n1.abc-9\", \"state\": \"active\"}");
        Transaction tx = Coordinator.builder(url(d)).build().transaction();
        var h = tx.headers();
        assertEquals("n1.abc-9", h.get(Propagation.GTID_HEADER));
        assertEquals(tx.traceId(), h.get("traceparent").split("-")[1]);
        assertEquals("n1.abc-9", Propagation.gtidFrom(h::get));
    }
}
