package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.junit.jupiter.api.Test;

/** A Java service and a Python service (the Python client, cotx; cross_service.py) in one
 * global transaction, both ways, through one real daemon: the gtid crosses in the
 * {@code Cotx-Gtid} header each client writes and reads. Java writes (key, 'java') on the
 * MariaDB resource, Python (key, 'python') on the PostgreSQL one; both rows commit, nothing
 * is left prepared. The Python interpreter is the project's venv ({@code -Dcotx.python},
 * set by scripts/test-java.sh). */
class CrossLanguageTest {
    static String python() {
        String p = System.getProperty("cotx.python");
        if (p == null) {
            throw new IllegalStateException("-Dcotx.python is not set: run scripts/test-java.sh (the venv's python)");
        }
        return p;
    }

    static Path script() throws Exception {
        Path f = Files.createTempFile("cross_service", ".py");
        try (var in = CrossLanguageTest.class.getResourceAsStream("cross_service.py")) {
            Files.write(f, in.readAllBytes());
        }
        f.toFile().deleteOnExit();
        return f;
    }

    static void tables(Servers s) throws Exception {
        s.exec(true, "CREATE TABLE IF NOT EXISTS xlang(k text PRIMARY KEY, who text NOT NULL)");
        s.exec(false, "CREATE TABLE IF NOT EXISTS xlang(k varchar(64) PRIMARY KEY, who text NOT NULL) ENGINE=InnoDB");
    }

    static String who(Servers s, boolean pg, String key) throws Exception {
        try (Connection c = pg ? s.pg() : s.my(); PreparedStatement ps = c.prepareStatement("SELECT who FROM xlang WHERE k = ?")) {
            ps.setString(1, key);
            try (ResultSet rs = ps.executeQuery()) {
                return rs.next() ? rs.getString(1) : null;
            }
        }
    }

    @Test
    void javaRootPythonParticipant() throws Exception {
        Servers s = Servers.engine();
        s.setChecks(true);
        tables(s);
        String key = "j2p-" + Traceparent.randomHex(4);
        try (LocalDaemon d = s.daemon("j-xlang-1", "engine").start()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            Process py = new ProcessBuilder(python(), script().toString(), "participant", d.url(), d.token(), String.valueOf(s.pgPort()))
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            try {
                String line = new BufferedReader(new InputStreamReader(py.getInputStream(), StandardCharsets.UTF_8)).readLine();
                assertTrue(line != null && line.startsWith("LISTENING "), "the Python service did not start: " + line);
                String pyUrl = "http://127.0.0.1:" + line.split(" ")[1];
                Coordinator coord = d.client().build();
                String gtid = coord.run(tx -> {
                    Connection my = s.my();
                    try {
                        tx.branch(my, "checking");
                        try (PreparedStatement ps = my.prepareStatement("INSERT INTO xlang VALUES (?, 'java')")) {
                            ps.setString(1, key);
                            ps.executeUpdate();
                        }
                        HttpRequest.Builder rb = HttpRequest.newBuilder(URI.create(pyUrl + "/write?key=" + key))
                                .POST(HttpRequest.BodyPublishers.noBody()).timeout(Duration.ofSeconds(60));
                        tx.headers().forEach(rb::header);
                        HttpResponse<String> r = HttpClient.newHttpClient().send(rb.build(), HttpResponse.BodyHandlers.ofString());
                        assertEquals(200, r.statusCode(), r.body());
                        assertEquals(tx.gtid(), r.body(), "the Python service joined our transaction");
                        tx.commit();
                        return tx.gtid();
                    } finally {
                        my.close();
                    }
                }, 0);
                assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(30)));
                assertEquals("java", who(s, false, key));
                assertEquals("python", who(s, true, key));
                assertEquals("committed", coord.get(gtid).path("state").asText());
            } finally {
                py.destroyForcibly().waitFor();
            }
        }
    }

    @Test
    void pythonRootJavaParticipant() throws Exception {
        Servers s = Servers.engine();
        s.setChecks(true);
        tables(s);
        String key = "p2j-" + Traceparent.randomHex(4);
        ExecutorService background = Executors.newCachedThreadPool();
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        try (LocalDaemon d = s.daemon("j-xlang-2", "engine").start()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            Coordinator coord = d.client().build();
            // The Java participant: join, write, prepare, answer; finish after the decision.
            server.setExecutor(background);
            server.createContext("/write", ex -> {
                String k = ex.getRequestURI().getQuery().replaceFirst("^key=", "");
                try {
                    Connection my = s.my();
                    Transaction tx = coord.joinFrom(ex.getRequestHeaders()::getFirst);
                    tx.branch(my, "checking");
                    try (PreparedStatement ps = my.prepareStatement("INSERT INTO xlang VALUES (?, 'java')")) {
                        ps.setString(1, k);
                        ps.executeUpdate();
                    }
                    tx.prepare();
                    background.submit(() -> {
                        try (my) {
                            tx.finish();
                        }
                        return null;
                    });
                    ex.sendResponseHeaders(200, -1);
                } catch (Exception e) {
                    byte[] b = e.toString().getBytes(StandardCharsets.UTF_8);
                    ex.sendResponseHeaders(500, b.length);
                    ex.getResponseBody().write(b);
                }
                ex.close();
            });
            server.start();
            String javaUrl = "http://127.0.0.1:" + server.getAddress().getPort();
            Process py = new ProcessBuilder(python(), script().toString(), "root", d.url(), d.token(), String.valueOf(s.pgPort()), javaUrl,
                    key).redirectErrorStream(true).start();
            List<String> out = new BufferedReader(new InputStreamReader(py.getInputStream(), StandardCharsets.UTF_8)).lines().toList();
            assertEquals(0, py.waitFor(), "the Python root: " + out);
            String last = out.get(out.size() - 1);
            assertTrue(last.startsWith("COMMITTED ") && last.endsWith(" commit"), String.valueOf(out));
            assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(30)));
            assertEquals("python", who(s, true, key));
            assertEquals("java", who(s, false, key));
        } finally {
            server.stop(0);
            background.shutdown();
        }
    }
}
