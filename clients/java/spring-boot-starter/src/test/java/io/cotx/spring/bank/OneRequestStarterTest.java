package io.cotx.spring.bank;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.cotx.client.Coordinator;
import io.cotx.client.LocalDaemon;
import io.cotx.client.TransactionAbortedException;
import io.cotx.client.TransactionListener;
import io.cotx.spring.onerequest.TransferApplication;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;

/** {@code cotx.one-request=true} in a Spring Boot service (onerequest.TransferApplication) against the
 * real daemon and servers with pg_co / mysql_co: each {@code @GlobalTransactional} call
 * commits with one request (cotx_requests_total, one lease), and a daemon killed (-9) and
 * restarted under load leads to retries, nothing left prepared, nothing split. */
class OneRequestStarterTest {
    static double metric(LocalDaemon d, String name) throws Exception {
        HttpRequest req = HttpRequest.newBuilder(URI.create(d.url() + "/metrics")).header("Authorization", "Bearer " + d.token()).build();
        for (String line : HttpClient.newHttpClient().send(req, HttpResponse.BodyHandlers.ofString()).body().split("\n")) {
            if (line.startsWith(name + " ")) {
                return Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
            }
        }
        return 0;
    }

    static ConfigurableApplicationContext app(TestServers s, LocalDaemon d) {
        return new SpringApplicationBuilder(TransferApplication.class).web(WebApplicationType.NONE)
                .properties("spring.main.banner-mode=off", "logging.level.root=WARN", "cotx.url=" + d.url(), "cotx.token=" + d.token(),
                        "cotx.one-request=true", "cotx.retries=30", "cotx.decision-timeout=60s",
                        "cotx.resources.savings.url=" + s.pgUrl(), "cotx.resources.savings.username=postgres",
                        "cotx.resources.savings.maximum-pool-size=6",
                        "cotx.resources.checking.url=" + s.myUrl(), "cotx.resources.checking.username=root",
                        "cotx.resources.checking.maximum-pool-size=6")
                .run();
    }

    static void clear(TestServers s, String prefix) throws Exception {
        s.exec(true, "CREATE TABLE IF NOT EXISTS savings(u text PRIMARY KEY, bal int NOT NULL, log text NOT NULL DEFAULT '')");
        s.exec(false, "CREATE TABLE IF NOT EXISTS checking(u varchar(64) PRIMARY KEY, bal int NOT NULL, log text NOT NULL) ENGINE=InnoDB");
        s.exec(true, "DELETE FROM savings WHERE u LIKE '" + prefix + "%'");
        s.exec(false, "DELETE FROM checking WHERE u LIKE '" + prefix + "%'");
    }

    static boolean present(TestServers s, boolean pg, String key) throws Exception {
        return s.scalar(pg, "SELECT count(*) FROM " + (pg ? "savings" : "checking") + " WHERE u = '" + key + "'") == 1;
    }

    /** {@code @GlobalTransactional(decideInParticipant = true)}: decided in the savings branch's
     * COMMIT (no PREPARE there, no store write), still one request each, nothing left
     * prepared. */
    @Test
    void decisionInTheParticipant() throws Exception {
        var s = TestServers.engine();
        clear(s, "boot-dip-");
        s.exec(true, "CREATE EXTENSION IF NOT EXISTS pg_co");
        try (LocalDaemon d = s.builder("j-boot-dip", "engine").decisions("savings").start()) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            try (ConfigurableApplicationContext ctx = app(s, d)) {
                TransferApplication.Transfers t = ctx.getBean(TransferApplication.Transfers.class);
                t.open("boot-dip-first"); // learns the resources' modes (on the begin)
                int n = 5;
                double decided = metric(d, "cotx_decided_in_participant_total");
                double requests = metric(d, "cotx_requests_total");
                for (int i = 0; i < n; i++) {
                    t.openDecidingInSavings("boot-dip-" + i);
                }
                // The metrics read before is counted once answered; then one lease, one request each.
                assertEquals(n + 2, metric(d, "cotx_requests_total") - requests, "requests for " + n + " transactions");
                assertEquals(n, metric(d, "cotx_decided_in_participant_total") - decided, "decided in the participant");
                for (int i = 0; i < n; i++) {
                    assertTrue(present(s, true, "boot-dip-" + i) && present(s, false, "boot-dip-" + i), "boot-dip-" + i);
                }
                ctx.getBean(Coordinator.class).flushAcks();
            }
            assertEquals(0, s.prepared(), "prepared left");
        }
    }

    @Test
    void oneRequestEach() throws Exception {
        var s = TestServers.engine();
        clear(s, "boot-one-");
        try (LocalDaemon d = s.daemon("j-boot-one", "engine")) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            try (ConfigurableApplicationContext ctx = app(s, d)) {
                TransferApplication.Transfers t = ctx.getBean(TransferApplication.Transfers.class);
                t.open("boot-one-first"); // learns the resources' modes (on the begin)
                int n = 20;
                double leases = metric(d, "cotx_gtid_leases_total");
                double requests = metric(d, "cotx_requests_total");
                for (int i = 0; i < n; i++) {
                    t.open("boot-one-" + i);
                }
                assertEquals(n + 2, metric(d, "cotx_requests_total") - requests, "requests for " + n + " transactions");
                assertEquals(1, metric(d, "cotx_gtid_leases_total") - leases, "leases");
                for (int i = 0; i < n; i++) {
                    assertTrue(present(s, true, "boot-one-" + i) && present(s, false, "boot-one-" + i), "boot-one-" + i);
                }
            }
            assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(15)), "left prepared");
        }
    }

    @Test
    void daemonRestartUnderLoad() throws Exception {
        var s = TestServers.engine();
        clear(s, "boot-one-r-");
        try (LocalDaemon d = s.daemon("j-boot-one-r", "engine")) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            try (ConfigurableApplicationContext ctx = app(s, d)) {
                AtomicInteger retries = new AtomicInteger();
                ctx.getBean(Coordinator.class).addListener(new TransactionListener() {
                    @Override
                    public void retrying(int attempt, TransactionAbortedException e, Duration delay) {
                        retries.incrementAndGet();
                    }
                });
                TransferApplication.Transfers t = ctx.getBean(TransferApplication.Transfers.class);
                t.open("boot-one-r-first");
                int workers = 4;
                int each = 25;
                AtomicInteger committed = new AtomicInteger();
                ConcurrentLinkedQueue<String> failures = new ConcurrentLinkedQueue<>();
                List<Thread> threads = new ArrayList<>();
                for (int w = 0; w < workers; w++) {
                    int worker = w;
                    Thread th = new Thread(() -> {
                        for (int i = 0; i < each; i++) {
                            String key = "boot-one-r-" + worker + "-" + i;
                            try {
                                t.open(key);
                                committed.incrementAndGet();
                            } catch (RuntimeException e) {
                                failures.add(key + ": " + e);
                            }
                        }
                    });
                    th.start();
                    threads.add(th);
                }
                while (committed.get() < 10) {
                    Thread.sleep(5);
                }
                d.restart();
                for (Thread th : threads) {
                    th.join();
                }
                assertTrue(failures.isEmpty(), "failed: " + failures);
                assertTrue(retries.get() > 0, "no transaction was run again across the restart");
                assertTrue(metric(d, "cotx_gtid_leases_total") >= 1, "the restarted daemon leased no range");
                assertEquals(0, s.awaitNothingPrepared(Duration.ofSeconds(30)), "left prepared");
                for (int w = 0; w < workers; w++) {
                    for (int i = 0; i < each; i++) {
                        String key = "boot-one-r-" + w + "-" + i;
                        assertTrue(present(s, true, key) && present(s, false, key), key + " not committed in both");
                    }
                }
            }
        }
    }

    /** A method that hands its gtid on (the headers for a call to another service): its first
     * leased attempt is rolled back and run again on the begin, and its later calls take the
     * begin at once (one begin each, no retry). */
    @Test
    void propagationTakesTheBegin() throws Exception {
        TestServers s = TestServers.engine();
        clear(s, "boot-one-p-");
        try (LocalDaemon d = s.daemon("j-boot-one-p", "engine")) {
            d.awaitModes("engine", Duration.ofSeconds(15));
            try (ConfigurableApplicationContext ctx = app(s, d)) {
                AtomicInteger retries = new AtomicInteger();
                ctx.getBean(Coordinator.class).addListener(new TransactionListener() {
                    @Override
                    public void retrying(int attempt, TransactionAbortedException e, Duration delay) {
                        retries.incrementAndGet();
                    }
                });
                TransferApplication.Transfers t = ctx.getBean(TransferApplication.Transfers.class);
                t.open("boot-one-p-first");
                assertTrue(t.openAndPropagate("boot-one-p-1").containsKey("Cotx-Gtid"));
                assertEquals(1, retries.get(), "the first propagating call's leased attempt run again");
                double begun = metric(d, "cotx_transactions_begun_total");
                for (int i = 2; i <= 3; i++) {
                    t.openAndPropagate("boot-one-p-" + i);
                }
                assertEquals(1, retries.get(), "later propagating calls retried");
                assertEquals(2, metric(d, "cotx_transactions_begun_total") - begun);
                for (int i = 1; i <= 3; i++) {
                    assertTrue(present(s, true, "boot-one-p-" + i) && present(s, false, "boot-one-p-" + i), "boot-one-p-" + i);
                }
            }
        }
    }
}
