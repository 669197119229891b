package io.cotx.spring.bank;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.cotx.client.LocalDaemon;
import io.cotx.client.TransactionAbortedException;
import io.cotx.spring.CotxHealthIndicator;
import io.micrometer.core.instrument.MeterRegistry;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.springframework.boot.actuate.health.Status;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.servlet.context.ServletWebServerApplicationContext;
import org.springframework.context.ConfigurableApplicationContext;

/** The overdraft as two Spring Boot services in this JVM, on random ports: savings on
 * PostgreSQL, checking on MariaDB, each a BankApplication with the starter, calling each
 * other over HTTP (RestClient out, Spring MVC in: the gtid header). Two withdrawals of 80
 * from 50 + 50 at once, each reading both balances before either writes. Plain 2PC (checks
 * off, the daemon's enforcement "none", MariaDB branches REPEATABLE READ) shows negative
 * totals; engine mode (pg_co / mysql_co) and client mode (servers without them) show none.
 * Every mode: what the services were told is what the databases did, nothing is left
 * prepared; the counters and the health indicator as the services saw it; the project's
 * history checker finds a cycle in plain 2PC's history and none in the others'. Each mode
 * has a daemon of its own. */
class TwoServiceOverdraftTest {
    static final int START = 50;
    static final int ROUNDS = Integer.getInteger("cotx.java.rounds", 4);
    static final ObjectMapper JSON = new ObjectMapper();

    record Outcome(String told, String committedTid, List<Attempt> attempts, String error) {
        @Override
        public String toString() {
            return told + " " + attempts.stream().map(a -> a.tid).toList() + (error == null ? "" : " " + error);
        }
    }

    /** checkerExit, checker: the history checker's verdict on every attempt of the run (exit 1: a cycle). */
    record Stats(int negative, int withdrawn, int declined, int failed, int mismatches, int prepared, int checkerExit,
            String checker, List<String> notes) {
    }

    static ConfigurableApplicationContext service(String account, TestServers s, LocalDaemon d, boolean mariaRR) {
        boolean pg = account.equals("savings");
        List<String> props = new ArrayList<>(List.of("server.port=0", "spring.main.banner-mode=off", "bank.account=" + account,
                "spring.application.name=" + account, "logging.level.root=WARN", "cotx.url=" + d.url(), "cotx.token=" + d.token(),
                "cotx.decision-timeout=60s", "cotx.resources." + account + ".url=" + (pg ? s.pgUrl() : s.myUrl()),
                "cotx.resources." + account + ".username=" + (pg ? "postgres" : "root"),
                "cotx.resources." + account + ".maximum-pool-size=6"));
        if (!pg && mariaRR) {
            props.add("cotx.resources.checking.isolation=REPEATABLE_READ");
        }
        return new SpringApplicationBuilder(BankApplication.class).properties(props.toArray(String[]::new)).run();
    }

    static int port(ConfigurableApplicationContext ctx) {
        return ((ServletWebServerApplicationContext) ctx).getWebServer().getPort();
    }

    static Stats overdraft(TestServers s, String mode, String enforcement, boolean mariaRR) throws Exception {
        s.exec(true, "CREATE TABLE IF NOT EXISTS savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')");
        s.exec(false, "CREATE TABLE IF NOT EXISTS checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, log text NOT NULL) ENGINE=InnoDB");
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try (LocalDaemon d = s.daemon("j-boot-" + mode, enforcement);
                ConfigurableApplicationContext savings = service("savings", s, d, mariaRR);
                ConfigurableApplicationContext checking = service("checking", s, d, mariaRR)) {
            d.awaitModes(enforcement, Duration.ofSeconds(15));
            AccountService sa = savings.getBean(AccountService.class);
            AccountService ca = checking.getBean(AccountService.class);
            sa.setPeerUrl("http://127.0.0.1:" + port(checking));
            ca.setPeerUrl("http://127.0.0.1:" + port(savings));
            for (ConfigurableApplicationContext ctx : List.of(savings, checking)) {
                assertEquals(Status.UP, ctx.getBean(CotxHealthIndicator.class).health().getStatus(), "the daemon is reachable");
            }
            int negative = 0, withdrawn = 0, declined = 0, failed = 0, mismatches = 0;
            List<String> notes = new ArrayList<>();
            List<Map<String, Object>> history = new ArrayList<>();
            for (int r = 1; r <= ROUNDS; r++) {
                String user = "boot-" + mode + "-u" + r + "-" + System.nanoTime() % 100000;
                s.exec(true, "INSERT INTO savings VALUES ('" + user + "', " + START + ", '')");
                s.exec(false, "INSERT INTO checking VALUES ('" + user + "', " + START + ", '')");
                CountDownLatch lineup = new CountDownLatch(2);
                String tag = mode + "-r" + r;
                Future<Outcome> fs = pool.submit(() -> withdraw(sa, user, tag + "-s", lineup));
                Future<Outcome> fc = pool.submit(() -> withdraw(ca, user, tag + "-c", lineup));
                List<Outcome> results = List.of(fs.get(180, TimeUnit.SECONDS), fc.get(180, TimeUnit.SECONDS));
                s.awaitNothingPrepared(Duration.ofSeconds(30));
                Set<String> inDb = new HashSet<>();
                int total = balance(s, true, user, inDb) + balance(s, false, user, inDb);
                if (total < 0) {
                    negative++;
                }
                for (Outcome o : results) {
                    switch (o.told()) {
                        case "withdrawn" -> withdrawn++;
                        case "declined" -> declined++;
                        default -> {
                            failed++;
                            notes.add(o.error());
                        }
                    }
                    for (Attempt a : o.attempts()) {
                        boolean committed = a.tid.equals(o.committedTid());
                        if (committed != inDb.contains(a.tid)) {
                            mismatches++; // told committed but rolled back, or told aborted but committed
                        }
                        // A failed withdrawal's last attempt: outcome not known to the service.
                        String status = committed ? "ok" : o.told().equals("failed") ? "info" : "fail";
                        history.add(a.toJson(status, mode + " " + o.told()));
                    }
                }
                System.out.printf("[boot %s] round %d: total %d; %s / %s%n", mode, r, total, results.get(0), results.get(1));
            }
            String[] verdict = checkHistory(history);
            Stats st = new Stats(negative, withdrawn, declined, failed, mismatches, s.prepared(), Integer.parseInt(verdict[0]), verdict[1],
                    notes);
            double refusals = 0;
            double retries = 0;
            for (ConfigurableApplicationContext ctx : List.of(savings, checking)) {
                MeterRegistry m = ctx.getBean(MeterRegistry.class);
                refusals += m.counter("cotx.refusals").count();
                retries += m.counter("cotx.retries").count();
                System.out.printf("[boot %s] %s: commits %.0f aborts %.0f refusals %.0f retries %.0f%n", mode,
                        ctx.getEnvironment().getProperty("bank.account"), m.counter("cotx.commits").count(),
                        m.counter("cotx.aborts").count(), m.counter("cotx.refusals").count(), m.counter("cotx.retries").count());
            }
            System.out.println("[boot " + mode + "] " + st);
            assertEquals(0, st.mismatches(), "what the services were told differs from the databases: " + st);
            assertEquals(0, st.prepared(), "prepared transactions left: " + st);
            if (!enforcement.equals("none")) {
                assertEquals(0, st.checkerExit(), "the history checker found a cycle: " + st.checker());
            }
            if (!enforcement.equals("none")) {
                assertEquals(0, st.failed(), "failed withdrawals: " + st);
                assertTrue(retries > 0, "the counters saw the retries (refusals: " + refusals + "): " + st);
            }
            return st;
        } finally {
            pool.shutdownNow();
        }
    }

    /** The project's history checker (python -m checker, the venv's python: -Dcotx.python) on
     * the run's attempts: its exit status (0: serializable, 1: a cycle) and its summary. */
    static String[] checkHistory(List<Map<String, Object>> history) throws Exception {
        Path f = Files.createTempFile("boot-overdraft-", ".jsonl");
        try {
            StringBuilder lines = new StringBuilder();
            for (Map<String, Object> t : history) {
                lines.append(JSON.writeValueAsString(t)).append('\n');
            }
            Files.writeString(f, lines);
            String python = TestServers.need("cotx.python");
            Process p = new ProcessBuilder(python, "-m", "checker", f.toString()).redirectErrorStream(true).start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
            int rc = p.waitFor();
            assertTrue(rc == 0 || rc == 1, "the checker failed: " + out);
            return new String[] {String.valueOf(rc), out};
        } finally {
            Files.deleteIfExists(f);
        }
    }

    static Outcome withdraw(AccountService svc, String user, String tag, CountDownLatch lineup) {
        List<Attempt> attempts = Collections.synchronizedList(new ArrayList<>());
        try {
            String tid = svc.withdraw(user, tag, lineup, attempts);
            return new Outcome("withdrawn", tid, attempts, null);
        } catch (AccountService.Declined e) {
            return new Outcome("declined", null, attempts, null);
        } catch (TransactionAbortedException e) {
            return new Outcome("aborted", null, attempts, String.valueOf(e));
        } catch (Exception e) {
            return new Outcome("failed", null, attempts, String.valueOf(e));
        } finally {
            lineup.countDown(); // an attempt that ended before its reads leaves the line-up
        }
    }

    static int balance(TestServers s, boolean pg, String user, Set<String> log) throws Exception {
        try (Connection c = s.connect(pg);
                PreparedStatement ps = c.prepareStatement("SELECT bal, log FROM " + (pg ? "savings" : "checking") + " WHERE u = ?")) {
            ps.setString(1, user);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                log.addAll(List.of(rs.getString(2).trim().split("\\s+")));
                return rs.getInt(1);
            }
        }
    }

    @Test
    void plainTwoPhaseCommitOverdraws() throws Exception {
        TestServers s = TestServers.engine();
        s.setChecks(false);
        try {
            Stats st = overdraft(s, "plain", "none", true);
            assertTrue(st.negative() > 0, "plain 2PC should overdraw at least once: " + st);
            assertEquals(1, st.checkerExit(), "the history checker should find the overdraft's cycle: " + st.checker());
        } finally {
            s.setChecks(true);
        }
    }

    @Test
    void engineModeNeverOverdraws() throws Exception {
        TestServers s = TestServers.engine();
        s.setChecks(true);
        Stats st = overdraft(s, "engine", "engine", false);
        assertEquals(0, st.negative(), "engine mode: no round may end below 0: " + st);
        assertTrue(st.withdrawn() > 0, st.toString());
    }

    @Test
    void clientModeNeverOverdraws() throws Exception {
        Stats st = overdraft(TestServers.bare(), "client", "client", false);
        assertEquals(0, st.negative(), "client mode: no round may end below 0: " + st);
        assertTrue(st.withdrawn() > 0, st.toString());
    }
}
