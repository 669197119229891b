package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/** The overdraft (demo/overdraft.py) with the Java client, as the Go client's
 * overdraft_test.go runs it: savings on PostgreSQL and checking on MariaDB, each owned by a
 * service (here the JDK's HTTP server); a withdrawal of 80 from 50 + 50 is one global
 * transaction rooted at the service debiting its account, which asks the other service for
 * its balance over HTTP with the gtid in the {@code Cotx-Gtid} header (the other joins, reads,
 * prepares, answers, and finishes in the background). Both withdrawals run at once and read
 * both balances before either writes. */
final class Bank implements AutoCloseable {
    static final int START = 50;
    static final int AMOUNT = 80;

    /** What one run found: rounds below zero, outcomes, and whether what the client told the
     * application (committed / aborted) is what the databases did. */
    static final class Stats {
        int negative, withdrawn, declined, refusals, gaveUp, failed, toldCommittedRolledBack, toldAbortedCommitted, prepared;
        final List<String> notes = new ArrayList<>();

        @Override
        public String toString() {
            return "negative=" + negative + " withdrawn=" + withdrawn + " declined=" + declined + " refusals=" + refusals + " gaveUp="
                    + gaveUp + " failed=" + failed + " toldCommittedRolledBack=" + toldCommittedRolledBack + " toldAbortedCommitted="
                    + toldAbortedCommitted + " prepared=" + prepared + " notes=" + notes;
        }
    }

    record Attempt(String tid, String told, boolean refused, Exception error) {
    }

    record Result(String outcome, List<Attempt> attempts) {
    }

    private final Servers servers;
    private final Coordinator coord;
    private final boolean mariaRR;
    private final Service savings;
    private final Service checking;
    private final ExecutorService background = Executors.newCachedThreadPool();
    private final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

    /** mariaRR: MariaDB branches at REPEATABLE READ (plain 2PC as usually deployed). */
    Bank(Servers servers, Coordinator coord, boolean mariaRR) throws IOException, SQLException {
        this.servers = servers;
        this.coord = coord;
        this.mariaRR = mariaRR;
        servers.createTables();
        savings = new Service("savings", true);
        checking = new Service("checking", false);
        savings.peer = checking;
        checking.peer = savings;
    }

    @Override
    public void close() {
        savings.server.stop(0);
        checking.server.stop(0);
        background.shutdown();
    }

    final class Service {
        final String name;
        final boolean pg;
        final HttpServer server;
        Service peer;

        Service(String name, boolean pg) throws IOException {
            this.name = name;
            this.pg = pg;
            server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            server.setExecutor(background);
            server.createContext("/read", this::read);
            server.start();
        }

        String url() {
            return "http://127.0.0.1:" + server.getAddress().getPort();
        }

        Connection connect() throws SQLException {
            return pg ? servers.pg() : servers.my();
        }

        Branch branch(Transaction tx, Connection c) {
            Isolation iso = !pg && mariaRR ? Isolation.REPEATABLE_READ : Isolation.SERIALIZABLE;
            return tx.branch(c, name, iso, null);
        }

        int balance(Connection c, String user) throws SQLException {
            try (PreparedStatement ps = c.prepareStatement("SELECT bal FROM " + name + " WHERE u = ?")) {
                ps.setString(1, user);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    return rs.getInt(1);
                }
            }
        }

        /** The participant: join the request's gtid, read the balance in a branch, prepare,
         * answer; the decision is awaited and the branch finished in the background, on the
         * same session, which is closed only then. */
        void read(HttpExchange ex) throws IOException {
            String user = ex.getRequestURI().getQuery().replaceFirst("^user=", "");
            Connection c = null;
            try {
                c = connect();
                Transaction tx = coord.joinFrom(ex.getRequestHeaders()::getFirst);
                Branch b = branch(tx, c);
                int bal;
                try {
                    bal = balance(c, user);
                } catch (SQLException e) {
                    throw b.fail(e);
                }
                tx.prepare();
                Connection held = c;
                c = null;
                background.submit(() -> {
                    try (held) {
                        tx.finish();
                    } catch (Exception e) {
                        // aborted, or left to the coordinator
                    }
                    return null;
                });
                answer(ex, 200, "{\"balance\": " + bal + "}");
            } catch (TransactionAbortedException e) {
                answer(ex, e.retryable() ? 409 : 500, e.getMessage());
            } catch (Exception e) {
                answer(ex, 500, e.toString());
            } finally {
                if (c != null) {
                    try {
                        c.close();
                    } catch (SQLException ignored) {
                        // closing
                    }
                }
            }
        }

        /** The root: up to 5 attempts, retried when the abort is retryable. */
        Result withdraw(String user, String tag, Lineup lineup) {
            List<Attempt> attempts = new ArrayList<>();
            try {
                for (int i = 1; i <= 5; i++) {
                    Attempt a = once(user, tag + "." + i, i == 1 ? lineup : null);
                    lineup.leave();
                    attempts.add(a);
                    if (a.told().equals("committed")) {
                        return new Result("withdrawn", attempts);
                    }
                    if (a.told().equals("declined")) {
                        return new Result("declined", attempts);
                    }
                    if (!(a.error() instanceof TransactionAbortedException ab && ab.retryable())) {
                        return new Result("failed", attempts);
                    }
                }
                return new Result("gave_up", attempts);
            } finally {
                lineup.leave();
            }
        }

        Attempt once(String user, String tid, Lineup lineup) {
            try (Connection c = connect()) { // closed only after commit() returned
                Transaction tx = coord.transaction();
                Branch b = branch(tx, c);
                int mine;
                try {
                    mine = balance(c, user);
                } catch (SQLException e) {
                    return new Attempt(tid, "aborted", false, b.fail(e));
                }
                int other;
                try {
                    other = peer.ask(tx, user);
                } catch (TransactionAbortedException e) {
                    tx.rollback("peer: " + e.getMessage());
                    return new Attempt(tid, "aborted", false, e);
                }
                if (lineup != null) {
                    lineup.arriveAndWait();
                }
                if (mine + other - AMOUNT < 0) {
                    tx.rollback("declined");
                    return new Attempt(tid, "declined", false, null);
                }
                String upd = pg ? "UPDATE savings SET bal = bal - ?, log = log || ' ' || ? WHERE u = ?"
                        : "UPDATE checking SET bal = bal - ?, log = CONCAT(log, ' ', ?) WHERE u = ?";
                try (PreparedStatement ps = c.prepareStatement(upd)) {
                    ps.setInt(1, AMOUNT);
                    ps.setString(2, tid);
                    ps.setString(3, user);
                    ps.executeUpdate();
                } catch (SQLException e) {
                    return new Attempt(tid, "aborted", false, b.fail(e));
                }
                try {
                    tx.commit();
                    return new Attempt(tid, "committed", false, null);
                } catch (TransactionAbortedException e) {
                    return new Attempt(tid, "aborted", e.refused(), e);
                }
            } catch (Exception e) {
                return new Attempt(tid, "error", false, e);
            }
        }

        /** This service's balance, asked by the peer's root inside its transaction. A 409 is
         * the participant's retryable abort: as retryable as our own. */
        int ask(Transaction tx, String user) throws IOException, InterruptedException {
            HttpRequest.Builder rb = HttpRequest.newBuilder(URI.create(url() + "/read?user=" + user)).timeout(Duration.ofSeconds(60))
                    .POST(HttpRequest.BodyPublishers.noBody());
            tx.headers().forEach(rb::header);
            HttpResponse<String> r = http.send(rb.build(), HttpResponse.BodyHandlers.ofString());
            if (r.statusCode() == 409) {
                throw new TransactionAbortedException(tx.gtid(), "peer refused: " + r.body(), true, false, null);
            }
            if (r.statusCode() != 200) {
                throw new TransactionAbortedException(tx.gtid(), "peer answered " + r.statusCode() + ": " + r.body(), false, false, null);
            }
            JsonNode j = Coordinator.JSON.readTree(r.body());
            return j.path("balance").asInt();
        }
    }

    static void answer(HttpExchange ex, int status, String body) throws IOException {
        byte[] b = String.valueOf(body).getBytes(StandardCharsets.UTF_8);
        ex.sendResponseHeaders(status, b.length);
        ex.getResponseBody().write(b);
        ex.close();
    }

    /** Lets two withdrawals meet between their reads and their writes: the race the overdraft
     * needs, made certain instead of left to timing. A side that ends before its reads leaves;
     * one stuck in a lock wait lets the other go on after 5 s. */
    static final class Lineup {
        final CountDownLatch arrived = new CountDownLatch(2);
        final ThreadLocal<AtomicBoolean> left = ThreadLocal.withInitial(AtomicBoolean::new);

        void arriveAndWait() throws InterruptedException {
            leave();
            arrived.await(5, TimeUnit.SECONDS);
        }

        void leave() {
            if (left.get().compareAndSet(false, true)) {
                arrived.countDown();
            }
        }
    }

    /** {@code rounds} rounds of two concurrent withdrawals for fresh users named after
     * {@code mode}; the checks every run needs (answers match the databases, nothing left
     * prepared, no failed withdrawal) are the caller's to assert from the stats. */
    Stats run(String mode, int rounds) throws Exception {
        Stats st = new Stats();
        for (int r = 1; r <= rounds; r++) {
            String user = "java-" + mode + "-u" + r + "-" + Traceparent.randomHex(3);
            servers.exec(true, "INSERT INTO savings VALUES ('" + user + "', " + START + ", '')");
            servers.exec(false, "INSERT INTO checking VALUES ('" + user + "', " + START + ", '')");
            Lineup lu = new Lineup();
            long t0 = System.nanoTime();
            String round = mode + "-r" + r;
            Future<Result> fs = background.submit(() -> savings.withdraw(user, round + "-s", lu));
            Future<Result> fc = background.submit(() -> checking.withdraw(user, round + "-c", lu));
            List<Result> results = List.of(fs.get(120, TimeUnit.SECONDS), fc.get(120, TimeUnit.SECONDS));
            servers.awaitNothingPrepared(Duration.ofSeconds(30));
            int sb;
            int cb;
            Set<String> inDb = new HashSet<>();
            try (Connection c = servers.pg(); PreparedStatement ps = c.prepareStatement("SELECT bal, log FROM savings WHERE u = ?")) {
                ps.setString(1, user);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    sb = rs.getInt(1);
                    inDb.addAll(List.of(rs.getString(2).trim().split("\\s+")));
                }
            }
            try (Connection c = servers.my(); PreparedStatement ps = c.prepareStatement("SELECT bal, log FROM checking WHERE u = ?")) {
                ps.setString(1, user);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    cb = rs.getInt(1);
                    inDb.addAll(List.of(rs.getString(2).trim().split("\\s+")));
                }
            }
            if (sb + cb < 0) {
                st.negative++;
            }
            StringBuilder line = new StringBuilder();
            for (Result res : results) {
                switch (res.outcome()) {
                    case "withdrawn" -> st.withdrawn++;
                    case "declined" -> st.declined++;
                    case "gave_up" -> st.gaveUp++;
                    default -> st.failed++;
                }
                for (Attempt a : res.attempts()) {
                    boolean retryable = a.error() instanceof TransactionAbortedException ab && ab.retryable();
                    if (a.refused() || (a.told().equals("aborted") && retryable)) {
                        st.refusals++;
                    }
                    if (a.told().equals("committed") && !inDb.contains(a.tid())) {
                        st.toldCommittedRolledBack++;
                    }
                    if (!a.told().equals("committed") && inDb.contains(a.tid())) {
                        st.toldAbortedCommitted++;
                    }
                    if (a.told().equals("error") || (a.told().equals("aborted") && !retryable)) {
                        st.notes.add(a.tid() + ": " + a.error());
                    }
                }
                line.append(' ').append(res.outcome()).append('(').append(res.attempts().size()).append(" attempt(s))");
            }
            System.out.printf("[%s] round %d: savings %d + checking %d = %d;%s [%.1f s]%n", mode, r, sb, cb, sb + cb, line,
                    (System.nanoTime() - t0) / 1e9);
        }
        st.prepared = servers.prepared();
        System.out.println("[" + mode + "] " + st);
        return st;
    }
}
