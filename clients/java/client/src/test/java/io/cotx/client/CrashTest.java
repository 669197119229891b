package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/** The JVM running a global transaction killed (-9) at a step, a child process (CrashChild)
 * with the client: between prepare and decision, the daemon aborts it at its timeout and
 * rolls both branches back; after the commit decision, the daemon commits both once the
 * owner's grace has passed. In engine mode and in client mode (whose helper transactions
 * must go too). Afterwards nothing is split (the key in both tables or in neither) and
 * nothing is left prepared. */
class CrashTest {
    record Child(Process process, String gtid, String what) {
    }

    static Child start(LocalDaemon d, Servers s, String key, String step) throws Exception {
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        // surefire's own classpath property: java.class.path is its booter jar.
        String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
        List<String> cmd = new ArrayList<>(List.of(java, "-cp", cp, CrashChild.class.getName(), d.url(), d.token(),
                String.valueOf(s.pgPort()), String.valueOf(s.myPort()), key, step));
        Process p = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
        String line = out.readLine();
        if (line == null || !line.startsWith("READY ")) {
            p.destroyForcibly();
            throw new AssertionError("the child did not reach " + step + ": " + line);
        }
        String[] f = line.split(" ");
        return new Child(p, f[1], f[2]);
    }

    static int rows(Servers s, boolean pg, String key) throws SQLException {
        try (Connection c = pg ? s.pg() : s.my(); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery("SELECT count(*) FROM crash WHERE k = '" + key + "'")) {
            rs.next();
            return rs.getInt(1);
        }
    }

    @ParameterizedTest(name = "{0} mode, killed when {1}")
    @CsvSource({"engine, prepared", "engine, decided", "client, prepared", "client, decided"})
    void killedChildLeavesNothingSplit(String mode, String step) throws Exception {
        Servers s = mode.equals("engine") ? Servers.engine() : Servers.bare();
        if (mode.equals("engine")) {
            s.setChecks(true);
        }
        s.exec(true, "CREATE TABLE IF NOT EXISTS crash(k text PRIMARY KEY, v int)");
        s.exec(false, "CREATE TABLE IF NOT EXISTS crash(k varchar(64) PRIMARY KEY, v int) ENGINE=InnoDB");
        String key = "java-" + mode + "-" + step + "-" + Traceparent.randomHex(3);
        // A short transaction timeout: undecided at the kill, it is aborted soon after.
        try (LocalDaemon d = s.daemon("j-crash-" + mode, mode).transactionMs(3000).ownerGraceMs(300).start()) {
            d.awaitModes(mode, Duration.ofSeconds(15));
            Child ch = start(d, s, key, step);
            assertEquals(step.equals("prepared") ? "prepared" : "commit", ch.what());
            assertTrue(s.prepared() >= 2, "both branches prepared at the kill");
            ch.process().destroyForcibly();
            ch.process().waitFor();
            assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(30)), "the daemon finishes every branch (and helper)");
            int pg = rows(s, true, key);
            int my = rows(s, false, key);
            assertEquals(pg, my, "split: PostgreSQL " + pg + ", MariaDB " + my);
            assertEquals(step.equals("decided") ? 1 : 0, pg, "the decided outcome in both databases");
            JsonNode t = d.client().build().get(ch.gtid());
            System.out.println("[crash " + mode + "/" + step + "] " + t);
            for (JsonNode b : t.path("branches")) {
                assertEquals("finished", b.path("state").asText(), t.toString());
                String by = b.path("finished_by").asText();
                assertTrue(by.equals("daemon") || by.equals("recovery"), "finished by the daemon, the owner is dead: " + t);
            }
        }
    }
}
