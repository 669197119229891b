package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;

/** A real cotx-coordinator process on this machine, for tests and demos, configured as the
 * Python harness's {@code cotest.daemon.Daemon} and the Go tests do it: a TOML file in a fresh
 * directory, a free loopback port, a random token, a SQLite store. Not for production (there
 * the daemon runs under systemd: docs/ops.md). */
public final class LocalDaemon implements AutoCloseable {
    /** One {@code [[resources]]} entry; enforcement null: the daemon's default (auto). */
    public record Resource(String name, String kind, String dsn, String enforcement) {
    }

    private final Path dir;
    private final String url;
    private final String token;
    private Process process;

    private LocalDaemon(Path dir, String url, String token, Process process) {
        this.dir = dir;
        this.url = url;
        this.token = token;
        this.process = process;
    }

    public static Builder builder() {
        return new Builder();
    }

    /** The daemon's settings. */
    public static final class Builder {
        private String node = "j1";
        private final List<Resource> resources = new ArrayList<>();
        private int transactionMs = 30000;
        private int ownerGraceMs = 2000;
        private int recoveryMs = 500;
        private final Set<String> decisionResources = new HashSet<>();

        public Builder node(String node) {
            this.node = node;
            return this;
        }

        public Builder resource(String name, String kind, String dsn, String enforcement) {
            resources.add(new Resource(name, kind, dsn, enforcement));
            return this;
        }

        /** Declares the PostgreSQL resource {@code name} a decision resource ({@code decisions =
         * true}): a branch there may carry the global decision (pg_co's co.decide;
         * {@link Transaction#decideInParticipant(boolean)}). */
        public Builder decisions(String name) {
            decisionResources.add(name);
            return this;
        }

        public Builder transactionMs(int ms) {
            this.transactionMs = ms;
            return this;
        }

        public Builder ownerGraceMs(int ms) {
            this.ownerGraceMs = ms;
            return this;
        }

        public Builder recoveryMs(int ms) {
            this.recoveryMs = ms;
            return this;
        }

        /** Writes the config, starts the daemon and waits until {@code /healthz} answers. */
        public LocalDaemon start() throws IOException, InterruptedException {
            Path bin = binary();
            Path dir = Files.createTempDirectory("cotx-java-coord-");
            int port;
            try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
                port = s.getLocalPort();
            }
            String token = Traceparent.randomHex(16);
            StringBuilder cfg = new StringBuilder();
            cfg.append("node_id = ").append(toml(node)).append("\nlisten = \"127.0.0.1:").append(port).append("\"\ntoken = ")
                    .append(toml(token)).append("\n\n[timeouts]\ntransaction_ms = ").append(transactionMs)
                    .append("\nowner_grace_ms = ").append(ownerGraceMs).append("\nrecovery_interval_ms = ").append(recoveryMs)
                    .append("\nretry_initial_ms = 50\nretry_max_ms = 500\nretention_ms = 60000\n")
                    .append("\n[store]\nkind = \"sqlite\"\npath = ").append(toml(dir.resolve("decisions.db").toString())).append('\n');
            for (Resource r : resources) {
                cfg.append("\n[[resources]]\nname = ").append(toml(r.name())).append("\nkind = ").append(toml(r.kind()))
                        .append("\ndsn = ").append(toml(r.dsn())).append("\npool_size = 2\n");
                if (r.enforcement() != null) {
                    cfg.append("enforcement = ").append(toml(r.enforcement())).append('\n');
                }
                if (decisionResources.contains(r.name())) {
                    cfg.append("decisions = true\n");
                }
            }
            Files.writeString(dir.resolve("coordinator.toml"), cfg);
            LocalDaemon d = new LocalDaemon(dir, "http://127.0.0.1:" + port, token, null);
            d.launch();
            return d;
        }
    }

    /** Starts the process on the directory's config and waits until it answers. */
    private void launch() throws IOException, InterruptedException {
        Process p = new ProcessBuilder(binary().toString(), "serve", "--config", dir.resolve("coordinator.toml").toString())
                .redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("coordinator.log").toFile())).start();
        process = p;
        Coordinator probe = Coordinator.builder(url).requestTimeout(Duration.ofSeconds(1)).build();
        Instant deadline = Instant.now().plusSeconds(30);
        while (Instant.now().isBefore(deadline)) {
            if (!p.isAlive()) {
                throw new IOException("coordinator exited (" + p.exitValue() + "): see " + dir.resolve("coordinator.log"));
            }
            try {
                probe.health();
                return;
            } catch (CotxException e) {
                Thread.sleep(50);
            }
        }
        close();
        throw new IOException("coordinator did not answer on " + url);
    }

    /** kill -9, then the daemon started again on the same config, store and port: a new
     * epoch, which knows none of the old process's leased gtid ranges. */
    public void restart() throws IOException, InterruptedException {
        kill();
        launch();
    }

    /** The binary: $COTX_COORDINATOR_BIN, else what scripts/build.sh installs under $COTX_CACHE. */
    public static Path binary() throws IOException {
        String cache = System.getenv().getOrDefault("COTX_CACHE", "/var/cache/cotx");
        List<String> cands = new ArrayList<>();
        if (System.getenv("COTX_COORDINATOR_BIN") != null) {
            cands.add(System.getenv("COTX_COORDINATOR_BIN"));
        }
        cands.add(cache + "/bin/cotx-coordinator");
        cands.add(cache + "/target-coord/release/cotx-coordinator");
        for (String c : cands) {
            Path p = Path.of(c);
            if (Files.isExecutable(p)) {
                return p;
            }
        }
        throw new IOException("cotx-coordinator not built: run scripts/build.sh (or set COTX_COORDINATOR_BIN)");
    }

    private static String toml(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    public String url() {
        return url;
    }

    public String token() {
        return token;
    }

    public Path dir() {
        return dir;
    }

    /** A client of this daemon. */
    public Coordinator.Builder client() {
        return Coordinator.builder(url).token(token);
    }

    /** Each resource's enforcement mode as the daemon reports it ({@code GET /v1/resources}):
     * engine, client, none, or unknown / refused with the reason in brackets. */
    public Map<String, String> modes() {
        JsonNode r = client().build().resources();
        Map<String, String> m = new LinkedHashMap<>();
        for (JsonNode x : r.path("resources")) {
            String mode = x.path("enforcement").path("mode").asText();
            String reason = x.path("enforcement").path("reason").asText("");
            m.put(x.path("name").asText(), reason.isEmpty() ? mode : mode + " (" + reason + ")");
        }
        return m;
    }

    /** Waits until every resource is in {@code mode} (the daemon probes them at start and at
     * every recovery pass, and creates client mode's objects). */
    public void awaitModes(String mode, Duration within) throws InterruptedException {
        Instant deadline = Instant.now().plus(within);
        Map<String, String> m = Map.of();
        while (Instant.now().isBefore(deadline)) {
            try {
                m = modes();
                if (!m.isEmpty() && m.values().stream().allMatch(mode::equals)) {
                    return;
                }
            } catch (CotxException e) {
                m = Map.of("error", e.getMessage());
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("the resources are not in " + mode + " mode after " + within + ": " + m);
    }

    /** The daemon's process id: to signal it (a test pauses it with SIGSTOP). */
    public long pid() {
        return process.pid();
    }

    /** kill -9: what a crash leaves. */
    public void kill() throws InterruptedException {
        process.destroyForcibly();
        process.waitFor();
    }

    /** SIGTERM, then SIGKILL after 10 s; the directory is removed unless COTX_KEEP_SERVERS is set. */
    @Override
    public void close() {
        process.destroy();
        try {
            if (!process.waitFor(10, java.util.concurrent.TimeUnit.SECONDS)) {
                process.destroyForcibly().waitFor();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (System.getenv("COTX_KEEP_SERVERS") == null) {
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            } catch (IOException ignored) {
                // a temporary directory
            }
        }
    }
}
