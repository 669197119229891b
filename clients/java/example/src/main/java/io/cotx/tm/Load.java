package io.cotx.tm;

import com.sun.management.OperatingSystemMXBean;
import jakarta.transaction.Status;
import jakarta.transaction.TransactionManager;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.atomic.LongAdder;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import javax.sql.XAConnection;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import org.mariadb.jdbc.MariaDbDataSource;
import org.postgresql.xa.PGXADataSource;

/**
 * The benchmark harness's load driver with Narayana as the transaction manager instead of
 * the cotx daemon (bench/harness/jta.py runs it for the modes {@code 2pc:jta} and
 * {@code co:jta}). The same command line and output as the Rust driver (bench/loadgen) as
 * far as the harness uses them: N client threads, each with its own XA connections to
 * PostgreSQL and MariaDB, the micro workload's point (S=2: table mt0 on PostgreSQL, mt1 on
 * MariaDB, R point reads then W sorted updates each), a warm-up then a measured window
 * framed by {@code {"event":"measure_start"}} / {@code {"event":"measure_end"}}, then one
 * result JSON line with the Rust driver's field names.
 *
 * <p>Each attempt is one JTA transaction as an application writes it: {@code tm.begin()},
 * each XA resource enlisted just before its branch's statements, {@code tm.commit()}
 * (Narayana: XA END, XA PREPARE of both, its log record, XA COMMIT of both, in this
 * thread). A refused or conflicted attempt is rolled back and retried, each attempt
 * counted as the Rust driver counts them.
 *
 * <p>{@code --mode co} starts Narayana as the example does ({@link Narayana#startRecovery}
 * refuses engines without pg_co / mysql_co). {@code --mode 2pc} is the plain-XA baseline:
 * {@link Narayana#startRecoveryPlainXa}, benchmark only.
 *
 * <p>CPU: {@code cpu_s} is the whole process in the window (as the Rust driver's);
 * {@code cpu_tm_s} the part of it spent inside the transaction manager's calls (begin,
 * enlist, commit, rollback, measured per thread, so it includes the XA statements' client
 * side, which on the daemon path the Rust driver spends) plus every thread that is not a
 * client (Narayana's reaper and recovery, the JVM's service threads): the harness reports
 * it as the coordinator's share.
 */
public final class Load {
    static final String USAGE = "java -cp CLASSPATH io.cotx.tm.Load --mode 2pc|co --pg DSN --my URL\n"
            + "  [--clients 8] [--warmup 1] [--seconds 5] [--seed 1] [--sync-stdin] [--lock-timeout-ms 2000]\n"
            + "  [--my-isolation repeatable-read|serializable: default REPEATABLE READ in 2pc, SERIALIZABLE in co]\n"
            + "  micro only: [--workload micro] [--S 2 --R 6 --W 6 --P 0.5 --N 100000 --K 0]\n"
            + "  --coord and --token are accepted and ignored (the transaction manager is in this process).\n"
            + "S=2 with one branch on each database only (P such that round(S*P) = 1).";

    private Load() {}

    // --- arguments ------------------------------------------------------------------------
    /** The parsed command line. */
    record Args(String mode, String pgDsn, String myUrl, int clients, double warmup, double seconds, long seed,
                boolean syncStdin, int r, int w, long n, double k, String myIsolation, int lockTimeoutMs) {}

    /** Options that take no value. */
    private static final Set<String> FLAGS = Set.of("sync-stdin", "help");
    /** Options the harness may pass that mean nothing here. */
    private static final Set<String> IGNORED = Set.of("coord", "token");
    private static final Set<String> KNOWN = Set.of("mode", "pg", "my", "clients", "warmup", "seconds", "seed",
            "lock-timeout-ms", "my-isolation", "workload", "S", "R", "W", "P", "N", "K", "autocommit-reads");

    /** Parses the Rust driver's command line; IllegalArgumentException says what is wrong. */
    static Args parse(String[] argv) {
        Map<String, String> m = new LinkedHashMap<>();
        for (int i = 0; i < argv.length; i++) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("unexpected argument " + argv[i]);
            }
            String key = argv[i].substring(2);
            if (FLAGS.contains(key)) {
                m.put(key, "1");
                continue;
            }
            if (!KNOWN.contains(key) && !IGNORED.contains(key)) {
                throw new IllegalArgumentException("unknown option --" + key
                        + (key.startsWith("parallel") || key.equals("attempt-log")
                                ? " (the Rust driver's; not implemented for Narayana)" : ""));
            }
            if (i + 1 >= argv.length) {
                throw new IllegalArgumentException("--" + key + " needs a value");
            }
            m.put(key, argv[++i]);
        }
        if (m.containsKey("help")) {
            throw new IllegalArgumentException("usage");
        }
        String mode = m.getOrDefault("mode", "co");
        if (!mode.equals("2pc") && !mode.equals("co")) {
            throw new IllegalArgumentException("--mode " + mode + ": Narayana runs 2pc (plain XA) or co (engines' CO)");
        }
        if (!m.getOrDefault("workload", "micro").equals("micro")) {
            throw new IllegalArgumentException("--workload " + m.get("workload") + ": only micro is implemented");
        }
        int s = (int) num(m, "S", 2);
        double p = num(m, "P", 0.5);
        // The Rust driver's layout: the first round(S*P) sub-transactions on PostgreSQL.
        int nPg = (int) (s * p + 0.5);
        if (s != 2 || nPg != 1) {
            throw new IllegalArgumentException("--S " + s + " --P " + p + ": the Narayana driver runs S=2 with one "
                    + "branch on PostgreSQL (mt0) and one on MariaDB (mt1) only");
        }
        if (num(m, "autocommit-reads", 0) != 0) {
            throw new IllegalArgumentException("--autocommit-reads: not implemented for Narayana");
        }
        String iso = switch (m.getOrDefault("my-isolation", mode.equals("2pc") ? "repeatable-read" : "serializable")) {
            case "repeatable-read" -> "REPEATABLE READ";
            case "serializable" -> "SERIALIZABLE";
            default -> throw new IllegalArgumentException("--my-isolation " + m.get("my-isolation")
                    + ": expected repeatable-read or serializable");
        };
        Args a = new Args(mode, m.getOrDefault("pg", "host=127.0.0.1 user=postgres dbname=postgres"),
                m.getOrDefault("my", "mysql://root@127.0.0.1:3306/test"), (int) num(m, "clients", 8),
                num(m, "warmup", 1), num(m, "seconds", 5), (long) num(m, "seed", 1), m.containsKey("sync-stdin"),
                (int) num(m, "R", 6), (int) num(m, "W", 6), (long) num(m, "N", 100000), num(m, "K", 0), iso,
                (int) num(m, "lock-timeout-ms", 2000));
        if (a.clients() < 1 || a.n() < 1 || a.r() < 0 || a.w() < 0 || a.seconds() <= 0) {
            throw new IllegalArgumentException("--clients, --N, --seconds must be positive, --R and --W not negative");
        }
        return a;
    }

    private static double num(Map<String, String> m, String k, double d) {
        String v = m.get(k);
        if (v == null) {
            return d;
        }
        try {
            return Double.parseDouble(v);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("--" + k + ": not a number: " + v);
        }
    }

    // --- DSNs -----------------------------------------------------------------------------
    /**
     * A libpq DSN (key=value pairs, as core.py's {@code env.pg.dsn}, or a postgres:// URL)
     * as the fields PGXADataSource takes: host, port (comma-separated for several hosts),
     * user, password, dbname, and any other key as a pgjdbc property of the same name.
     */
    static Map<String, String> pgFields(String dsn) {
        Map<String, String> f = new LinkedHashMap<>();
        String d = dsn.trim();
        if (d.startsWith("postgres://") || d.startsWith("postgresql://")) {
            URI u = URI.create(d);
            if (u.getUserInfo() != null) {
                String[] ui = u.getUserInfo().split(":", 2);
                f.put("user", ui[0]);
                if (ui.length > 1) {
                    f.put("password", ui[1]);
                }
            }
            f.put("host", u.getHost() != null ? u.getHost() : "127.0.0.1");
            if (u.getPort() > 0) {
                f.put("port", String.valueOf(u.getPort()));
            }
            if (u.getPath() != null && u.getPath().length() > 1) {
                f.put("dbname", u.getPath().substring(1));
            }
            if (u.getRawQuery() != null) {
                for (String kv : u.getRawQuery().split("&")) {
                    String[] p = kv.split("=", 2);
                    f.put(p[0], p.length > 1 ? URLDecoder.decode(p[1], StandardCharsets.UTF_8) : "");
                }
            }
            return f;
        }
        // key=value pairs; values may be single-quoted (libpq's rules, without escapes inside).
        Matcher m = Pattern.compile("(\\w+)\\s*=\\s*('([^']*)'|\\S*)").matcher(d);
        while (m.find()) {
            f.put(m.group(1), m.group(3) != null ? m.group(3) : m.group(2));
        }
        return f;
    }

    static PGXADataSource pgDataSource(String dsn) {
        Map<String, String> f = pgFields(dsn);
        PGXADataSource ds = new PGXADataSource();
        String[] hosts = f.getOrDefault("host", "127.0.0.1").split(",");
        String[] ports = f.getOrDefault("port", "5432").split(",");
        int[] pn = new int[hosts.length];
        for (int i = 0; i < hosts.length; i++) {
            pn[i] = Integer.parseInt(ports[Math.min(i, ports.length - 1)].trim());
        }
        ds.setServerNames(hosts);
        ds.setPortNumbers(pn);
        ds.setUser(f.getOrDefault("user", "postgres"));
        if (f.containsKey("password")) {
            ds.setPassword(f.get("password"));
        }
        ds.setDatabaseName(f.getOrDefault("dbname", "postgres"));
        for (Map.Entry<String, String> e : f.entrySet()) {
            if (!Set.of("host", "port", "user", "password", "dbname").contains(e.getKey())) {
                try {
                    ds.setProperty(e.getKey(), e.getValue());
                } catch (SQLException ex) {
                    throw new IllegalArgumentException("--pg: " + e.getKey() + " is not a pgjdbc property", ex);
                }
            }
        }
        return ds;
    }

    /**
     * The Rust driver's MariaDB URL (mysql://user:password@host:port/db, core.py's
     * {@code env.my.dsn}) as a Connector/J URL. Server-side prepared statements, as
     * mysql_async's exec uses (Connector/J 3 prepares client-side by default).
     */
    static String mariaJdbcUrl(String url) {
        URI u = URI.create(url.trim());
        if (!"mysql".equals(u.getScheme()) && !"mariadb".equals(u.getScheme())) {
            throw new IllegalArgumentException("--my " + url + ": expected mysql://user@host:port/db");
        }
        StringBuilder sb = new StringBuilder("jdbc:mariadb://").append(u.getHost() != null ? u.getHost() : "127.0.0.1");
        sb.append(':').append(u.getPort() > 0 ? u.getPort() : 3306);
        String db = u.getPath() != null && u.getPath().length() > 1 ? u.getPath().substring(1) : "test";
        sb.append('/').append(db).append("?useServerPrepStmts=true");
        if (u.getUserInfo() != null) {
            String[] ui = u.getUserInfo().split(":", 2);
            sb.append("&user=").append(ui[0]);
            if (ui.length > 1) {
                sb.append("&password=").append(ui[1]);
            }
        }
        if (u.getRawQuery() != null) {
            sb.append('&').append(u.getRawQuery());
        }
        return sb.toString();
    }

    // --- the workload (bench/loadgen/src/workload.rs, Micro) --------------------------------
    /** workload.rs's Rng (xorshift64*), so a seed draws the same keys as the Rust driver. */
    static final class Rng {
        private long x;

        Rng(long seed) {
            x = (seed * 0x9E3779B97F4A7C15L) | 1;
        }

        long next() {
            x ^= x >>> 12;
            x ^= x << 25;
            x ^= x >>> 27;
            return x * 0x2545F4914F6CDD1DL;
        }

        double f64() {
            return (next() >>> 11) / (double) (1L << 53);
        }

        long range(long lo, long hi) {
            return lo + Long.remainderUnsigned(next(), hi - lo);
        }
    }

    /** Keys uniform in [0, N), or Zipf with exponent K over ranks scattered as workload.rs does. */
    static final class Keys {
        private final long n;
        private final double[] cdf;

        Keys(long n, double k) {
            this.n = n;
            if (k > 0) {
                cdf = new double[(int) n];
                double acc = 0;
                for (int rank = 1; rank <= n; rank++) {
                    acc += 1.0 / Math.pow(rank, k);
                    cdf[rank - 1] = acc;
                }
                for (int i = 0; i < cdf.length; i++) {
                    cdf[i] /= acc;
                }
            } else {
                cdf = null;
            }
        }

        long key(Rng rng) {
            if (cdf == null) {
                return rng.range(0, n);
            }
            double u = rng.f64();
            int lo = 0;
            int hi = cdf.length;
            while (lo < hi) {   // partition_point(x < u)
                int mid = (lo + hi) >>> 1;
                if (cdf[mid] < u) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            return ((long) lo * 7919 + 13) % n;
        }

        /** One transaction's keys: per branch (mt0, then mt1) R reads, then W writes sorted. */
        long[][] txn(Rng rng, int r, int w) {
            long[][] out = new long[2][];
            for (int b = 0; b < 2; b++) {
                long[] ks = new long[r + w];
                for (int i = 0; i < r + w; i++) {
                    ks[i] = key(rng);
                }
                Arrays.sort(ks, r, r + w);
                out[b] = ks;
            }
            return out;
        }
    }

    // --- what a failure means (db.rs's kinds, as cotx.refusals names them) ------------------
    record Failure(String kind, boolean retryable, String detail) {}

    private static final Pattern RULE = Pattern.compile("commitment ordering rule ([abc])");

    static Failure classify(Throwable e) {
        String kind = null;
        for (Throwable x : Retry.graph(e)) {
            if (String.valueOf(x.getMessage()).contains(Retry.NOT_SERIALIZABLE_MARKER)) {
                kind = "mysql_co isolation";
                break;
            }
        }
        if (kind == null) {
            for (Throwable x : Retry.graph(e)) {
                if (x instanceof SQLException s) {
                    kind = s.getClass().getName().startsWith("org.postgresql.") ? pgKind(s) : myKind(s);
                } else if (x instanceof XAException xa && xa.errorCode >= XAException.XA_RBBASE
                        && xa.errorCode <= XAException.XA_RBEND) {
                    kind = "XA rollback code " + xa.errorCode;
                }
                if (kind != null) {
                    break;
                }
            }
        }
        String detail = Bank.describe(e);
        if (kind == null) {
            kind = "jta other: " + detail.substring(0, Math.min(60, detail.length())).replaceAll("[,;=\n]", " ");
        }
        boolean retryable = !(kind.contains("other") || kind.equals("pg_co not serializable")
                || kind.equals("pg_co read only") || kind.equals("pg cancelled") || kind.equals("mysql_co isolation")
                || kind.equals("my interrupted"));
        return new Failure(kind, retryable, detail);
    }

    private static String pgKind(SQLException s) {
        String low = String.valueOf(s.getMessage()).toLowerCase();
        if (low.contains("pg_co refused")) {
            if (low.contains("rule a (summarized")) {
                return "pg_co rule A (summarized)";
            }
            Matcher m = RULE.matcher(low);
            if (m.find()) {
                return "pg_co rule " + m.group(1).toUpperCase();
            }
            if (low.contains("not serializable")) {
                return "pg_co not serializable";
            }
            if (low.contains("read only")) {
                return "pg_co read only";
            }
        }
        if (low.contains("pg_co: lock_timeout expired while waiting")) {
            return "pg_co rule B wait timeout";
        }
        String st = String.valueOf(s.getSQLState());
        return switch (st) {
            case "40001" -> low.contains("concurrent update") ? "pg concurrent update" : "pg serialization failure";
            case "40P01" -> "pg deadlock";
            case "55P03" -> "pg lock timeout";
            case "57014" -> "pg cancelled";
            default -> null;
        };
    }

    private static String myKind(SQLException s) {
        String low = String.valueOf(s.getMessage()).toLowerCase();
        int n = s.getErrorCode();
        if (low.contains("mysql_co:") && low.contains("restart gate")) {
            return "mysql_co restart gate";
        }
        return switch (n) {
            case 1213 -> "my deadlock";
            case 1205 -> "my lock wait timeout";
            case 1402, 1613, 1614 -> "my XA rollback";
            case 1317 -> "my interrupted";
            default -> null;
        };
    }

    // --- the run --------------------------------------------------------------------------
    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
    /** CPU ns the client threads spent inside the transaction manager's calls. */
    private static final LongAdder TM_CPU_NS = new LongAdder();
    /** Held: java.util.logging keeps loggers weakly, and the level must stay set. */
    private static final Logger ARJUNA_LOG = Logger.getLogger("com.arjuna");

    private static final class Client implements Runnable {
        final int wid;
        final Args a;
        final TransactionManager tm;
        final Keys keys;
        /** The window, set once every client's sessions are open. */
        long tMeasure;
        long tEnd;
        XAConnection px;
        XAConnection mx;
        XAResource pres;
        XAResource mres;
        PreparedStatement[] sel = new PreparedStatement[2];
        PreparedStatement[] upd = new PreparedStatement[2];
        long commits;
        long attempts;
        final Map<String, Long> reasons = new TreeMap<>();
        final List<Double> latMs = new ArrayList<>();
        String error;

        Client(int wid, Args a, TransactionManager tm, Keys keys) {
            this.wid = wid;
            this.a = a;
            this.tm = tm;
            this.keys = keys;
        }

        /** Sessions first (not measured), as the Rust driver opens them before the start. */
        void open(PGXADataSource pg, MariaDbDataSource my) throws SQLException {
            px = pg.getXAConnection();
            mx = my.getXAConnection();
            Connection pc = px.getConnection();
            Connection mc = mx.getConnection();
            // The levels before any enlistment (the branch's BEGIN / XA START takes them from the
            // session; pgjdbc refuses a change inside a transaction), and the Rust driver's
            // lock timeouts, so that a lock wait ends the same way on both paths.
            pc.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
            mc.setTransactionIsolation(a.myIsolation().equals("SERIALIZABLE")
                    ? Connection.TRANSACTION_SERIALIZABLE : Connection.TRANSACTION_REPEATABLE_READ);
            try (Statement s = pc.createStatement()) {
                s.execute("SET lock_timeout = '" + a.lockTimeoutMs() + "ms'");
            }
            try (Statement s = mc.createStatement()) {
                s.execute("SET SESSION innodb_lock_wait_timeout = " + Math.max(1, (a.lockTimeoutMs() + 999) / 1000));
            }
            pres = px.getXAResource();
            mres = mx.getXAResource();
            Connection[] cs = {pc, mc};
            for (int b = 0; b < 2; b++) {
                sel[b] = cs[b].prepareStatement("SELECT v FROM mt" + b + " WHERE k = ?");
                upd[b] = cs[b].prepareStatement("UPDATE mt" + b + " SET v = v + 1 WHERE k = ?");
            }
        }

        void close() {
            for (XAConnection c : new XAConnection[] {px, mx}) {
                try {
                    if (c != null) {
                        c.close();
                    }
                } catch (SQLException ignored) {
                    // the process ends; the database drops the session
                }
            }
        }

        @Override
        public void run() {
            Rng rng = new Rng(a.seed() * 1000 + wid);
            outer:
            while (System.nanoTime() < tEnd) {
                long[][] ks = keys.txn(rng, a.r(), a.w());
                long t0 = System.nanoTime();
                while (true) {
                    Failure f = once(ks);
                    long t = System.nanoTime();
                    boolean measured = t >= tMeasure && t < tEnd;
                    if (f == null) {
                        if (measured) {
                            commits++;
                            attempts++;
                            latMs.add((t - t0) / 1e6);
                        }
                        break;
                    }
                    if (measured) {
                        reasons.merge(f.kind(), 1L, Long::sum);
                        attempts++;
                    }
                    if (!f.retryable()) {
                        // Not a conflict: stop this client and report it (no busy loop on a broken setup).
                        error = f.kind() + ": " + f.detail().substring(0, Math.min(400, f.detail().length()));
                        break outer;
                    }
                    if (t >= tEnd) {
                        break outer;
                    }
                }
            }
        }

        /** One attempt: null when committed, else why not (the transaction is rolled back). */
        Failure once(long[][] ks) {
            long c0 = THREADS.getCurrentThreadCpuTime();
            try {
                tm.begin();
                XAResource[] res = {pres, mres};
                for (int b = 0; b < 2; b++) {
                    long c1 = THREADS.getCurrentThreadCpuTime();
                    // Enlisted just before its branch's statements (a pool does it on first use):
                    // XA START / BEGIN, as the Rust driver begins each branch in turn.
                    if (!tm.getTransaction().enlistResource(res[b])) {
                        throw new IllegalStateException("enlistResource refused mt" + b + "'s resource");
                    }
                    long c2 = THREADS.getCurrentThreadCpuTime();
                    TM_CPU_NS.add(c2 - (b == 0 ? c0 : c1));
                    statements(b, ks[b]);
                }
            } catch (Exception e) {
                long c1 = THREADS.getCurrentThreadCpuTime();
                try {
                    if (tm.getStatus() != Status.STATUS_NO_TRANSACTION) {
                        tm.rollback();
                    }
                } catch (Exception ignored) {
                    // the branches are gone with the error (the reaper rolls back the rest)
                }
                disassociate();
                TM_CPU_NS.add(THREADS.getCurrentThreadCpuTime() - c1);
                return classify(e);
            }
            long c1 = THREADS.getCurrentThreadCpuTime();
            try {
                tm.commit();
                return null;
            } catch (Exception e) {
                // RollbackException (a refused prepare), heuristics, or a broken resource.
                Failure f = classify(e);
                if (e instanceof jakarta.transaction.HeuristicMixedException
                        || e instanceof jakarta.transaction.HeuristicRollbackException) {
                    f = new Failure("jta other: heuristic " + e.getClass().getSimpleName(), false, f.detail());
                }
                return f;
            } finally {
                disassociate();
                TM_CPU_NS.add(THREADS.getCurrentThreadCpuTime() - c1);
            }
        }

        /** Never leaves the thread associated with a finished transaction: the next begin() would fail as nested. */
        private void disassociate() {
            try {
                if (tm.getStatus() != Status.STATUS_NO_TRANSACTION) {
                    tm.suspend();
                }
            } catch (Exception ignored) {
                // nothing associated
            }
        }

        private void statements(int b, long[] ks) throws SQLException {
            for (int i = 0; i < ks.length; i++) {
                if (i < a.r()) {
                    sel[b].setLong(1, ks[i]);
                    try (ResultSet rs = sel[b].executeQuery()) {
                        while (rs.next()) {
                            rs.getLong(1);
                        }
                    }
                } else {
                    upd[b].setLong(1, ks[i]);
                    upd[b].executeUpdate();
                }
            }
        }
    }

    static Double percentile(List<Double> xs, double p) {
        if (xs.isEmpty()) {
            return null;
        }
        xs.sort(Comparator.naturalOrder());
        double k = (xs.size() - 1) * p;
        int lo = (int) k;
        int hi = Math.min(lo + 1, xs.size() - 1);
        return xs.get(lo) + (xs.get(hi) - xs.get(lo)) * (k - lo);
    }

    /** CPU ns of every live thread that is not a client: Narayana's reaper and recovery, the JVM's. */
    private static long otherThreadsCpu(Set<Long> clients) {
        long sum = 0;
        for (long id : THREADS.getAllThreadIds()) {
            if (!clients.contains(id)) {
                long t = THREADS.getThreadCpuTime(id);
                sum += Math.max(0, t);
            }
        }
        return sum;
    }

    private static long processCpu() {
        return ((OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    private static void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String q(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                default -> {
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        return sb.append('"').toString();
    }

    private static String num(Double x) {
        return x == null || x.isNaN() ? "null" : String.valueOf(x);
    }

    public static void main(String[] argv) throws Exception {
        Args a;
        try {
            a = parse(argv);
        } catch (IllegalArgumentException e) {
            System.err.println((e.getMessage().equals("usage") ? "" : e.getMessage() + "\n") + USAGE);
            System.exit(e.getMessage().equals("usage") ? 0 : 2);
            return;
        }
        System.exit(run(a));
    }

    static int run(Args a) throws Exception {
        // Narayana logs a warning with a stack trace for every refused prepare; the harness
        // reads stderr only at the end, so that volume would fill the pipe and stall us.
        ARJUNA_LOG.setLevel(Level.SEVERE);
        THREADS.setThreadCpuTimeEnabled(true);
        String base = "{\"workload\":\"micro\",\"mode\":" + q(a.mode()) + ",\"tm\":\"narayana\",\"clients\":" + a.clients()
                + ",\"warmup_s\":" + a.warmup() + ",\"seconds\":" + a.seconds() + ",\"my_isolation\":" + q(a.myIsolation());
        // The transaction log: Narayana's default store (ShadowNoFileLockStore, every record
        // forced to disk: objectStoreSync true) in a directory of this run, removed at exit.
        Path store = Files.createTempDirectory("cotx-jta-load-");
        String node = "load-" + ProcessHandle.current().pid();   // recovery touches this node's Xids only
        TransactionManager tm = Narayana.configure(node, store, 30);
        PGXADataSource pg = pgDataSource(a.pgDsn());
        MariaDbDataSource my = new MariaDbDataSource(mariaJdbcUrl(a.myUrl()));
        List<Client> cs = new ArrayList<>();
        try {
            try {
                Map<String, javax.sql.XADataSource> resources = Map.of("pg", pg, "my", my);
                if (a.mode().equals("co")) {
                    Narayana.startRecovery(resources);
                } else {
                    Narayana.startRecoveryPlainXa(resources);
                }
            } catch (Exception e) {
                emit(base + ",\"error\":" + q("could not start Narayana's recovery: " + Bank.describe(e)) + "}");
                return 1;
            }
            Keys keys = new Keys(a.n(), a.k());
            for (int wid = 0; wid < a.clients(); wid++) {
                Client c = new Client(wid, a, tm, keys);
                cs.add(c);
                try {
                    c.open(pg, my);
                } catch (SQLException e) {
                    emit(base + ",\"error\":" + q("client " + wid + " could not connect: " + Bank.describe(e)) + "}");
                    return 1;
                }
            }
            // The clock starts once every session is open, as in the Rust driver.
            long tMeasure = System.nanoTime() + (long) (a.warmup() * 1e9);
            long tEnd = tMeasure + (long) (a.seconds() * 1e9);
            List<Thread> threads = new ArrayList<>();
            Set<Long> clientIds = new HashSet<>();
            for (Client c : cs) {
                c.tMeasure = tMeasure;
                c.tEnd = tEnd;
                Thread t = new Thread(c, "client-" + c.wid);
                clientIds.add(t.getId());
                threads.add(t);
            }
            threads.forEach(Thread::start);
            sleepUntil(tMeasure);
            long cpu0 = processCpu();
            long tm0 = TM_CPU_NS.sum() + otherThreadsCpu(clientIds);
            emit("{\"event\":\"measure_start\"}");
            sleepUntil(tEnd);
            long cpu1 = processCpu();
            long tm1 = TM_CPU_NS.sum() + otherThreadsCpu(clientIds);
            emit("{\"event\":\"measure_end\"}");
            for (Thread t : threads) {
                t.join();
            }
            if (a.syncStdin()) {
                // The sessions stay open until the harness has sampled the servers' CPU: a backend
                // exiting during that sample would be counted nowhere.
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            }
            long commits = 0;
            long attempts = 0;
            Map<String, Long> reasons = new TreeMap<>();
            List<Double> lat = new ArrayList<>();
            List<String> errors = new ArrayList<>();
            for (Client c : cs) {
                commits += c.commits;
                attempts += c.attempts;
                c.reasons.forEach((k, v) -> reasons.merge(k, v, Long::sum));
                lat.addAll(c.latMs);
                if (c.error != null) {
                    errors.add(c.error);
                }
            }
            long aborts = reasons.values().stream().mapToLong(Long::longValue).sum();
            StringBuilder sb = new StringBuilder(base);
            sb.append(",\"commits\":").append(commits).append(",\"attempts\":").append(attempts)
                    .append(",\"aborts\":").append(aborts).append(",\"reasons\":{");
            boolean first = true;
            for (Map.Entry<String, Long> e : reasons.entrySet()) {
                sb.append(first ? "" : ",").append(q(e.getKey())).append(':').append(e.getValue());
                first = false;
            }
            sb.append("},\"tps\":").append(commits / a.seconds())
                    .append(",\"p50_ms\":").append(num(percentile(lat, 0.5)))
                    .append(",\"p99_ms\":").append(num(percentile(lat, 0.99)))
                    .append(",\"cpu_s\":").append((cpu1 - cpu0) / 1e9)
                    .append(",\"cpu_tm_s\":").append((tm1 - tm0) / 1e9)
                    .append(",\"cpu_s_total\":").append(processCpu() / 1e9)
                    .append(",\"client_branches\":0,\"enforcement\":{},\"unfinished\":0,\"errors\":[");
            for (int i = 0; i < errors.size(); i++) {
                sb.append(i > 0 ? "," : "").append(q(errors.get(i)));
            }
            emit(sb.append("]}").toString());
            return errors.isEmpty() ? 0 : 1;
        } finally {
            cs.forEach(Client::close);
            Narayana.stopRecovery();
            // Stops the TransactionStatusManager now: at JVM exit its hook would write into
            // the store again, after the directory is gone.
            com.arjuna.ats.arjuna.coordinator.TxControl.disable(true);
            deleteTree(store);
        }
    }

    private static void sleepUntil(long t) throws InterruptedException {
        long d;
        while ((d = t - System.nanoTime()) > 0) {
            Thread.sleep(d / 1_000_000, (int) (d % 1_000_000));
        }
    }

    private static void deleteTree(Path p) {
        try (Stream<Path> s = Files.walk(p)) {
            s.sorted(Comparator.reverseOrder()).forEach(x -> x.toFile().delete());
        } catch (IOException ignored) {
            // a temp dir left behind
        }
    }
}
