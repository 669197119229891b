package io.cotx.tm;

import jakarta.transaction.HeuristicMixedException;
import jakarta.transaction.HeuristicRollbackException;
import jakarta.transaction.RollbackException;
import jakarta.transaction.Status;
import jakarta.transaction.Transaction;
import jakarta.transaction.TransactionManager;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import javax.sql.XAConnection;
import javax.sql.XADataSource;

/**
 * The overdraft workload as a JTA application would write it (demo/overdraft.py has the
 * same shape through our coordinator): a user has savings on PostgreSQL and checking on
 * MariaDB; a withdrawal reads both balances in one global transaction and debits one
 * account when savings + checking stays >= 0.
 *
 * <p>What the application must do for pg_co / mysql_co to protect it:
 * <ul>
 *   <li>set SERIALIZABLE on each connection <em>before</em> it is enlisted (before the
 *       branch's BEGIN / XA START; pgjdbc refuses to change it inside a transaction);</li>
 *   <li>never mark a branch's connection read-only (pg_co refuses READ ONLY branches, and
 *       newer pgjdbc answers XA_RDONLY for them without preparing);</li>
 *   <li>keep the connections open until commit()/rollback() returned (a MariaDB read-only
 *       branch is lost with its session);</li>
 *   <li>retry the whole transaction when {@link Retry#isRetryable} says so.</li>
 * </ul>
 */
public final class Bank {
    /** What the TM told the application about one attempt. */
    public enum Told { COMMITTED, ROLLED_BACK, HEURISTIC, DECLINED }

    public record Attempt(String tid, String account, Told told, String detail) {}

    public static final class Result {
        public final List<Attempt> attempts = new ArrayList<>();
        public final List<String> refusals = new ArrayList<>();
        /** withdrawn, declined, gave_up, heuristic or failed. */
        public String outcome = "failed";
    }

    /** Called between the reads and the write of the first attempt (tests line up the race there). */
    public interface Hook {
        void afterReads() throws Exception;
    }

    private final TransactionManager tm;
    private final XADataSource pg;
    private final XADataSource my;
    private final int mariaIsolation;
    private final int maxAttempts;

    /**
     * @param mariaIsolation Connection.TRANSACTION_SERIALIZABLE (what the project needs) or
     *                       TRANSACTION_REPEATABLE_READ (plain 2PC as usually deployed)
     */
    public Bank(TransactionManager tm, XADataSource pg, XADataSource my, int mariaIsolation, int maxAttempts) {
        this.tm = tm;
        this.pg = pg;
        this.my = my;
        this.mariaIsolation = mariaIsolation;
        this.maxAttempts = maxAttempts;
    }

    /** account: "savings" (PostgreSQL) or "checking" (MariaDB). */
    public Result withdraw(String account, String user, int amount, String tag, Hook hook) throws Exception {
        Result res = new Result();
        for (int attempt = 1; attempt <= maxAttempts; attempt++) {
            String tid = tag + "." + attempt;
            Attempt a = once(account, user, amount, tid, attempt == 1 ? hook : null);
            res.attempts.add(a);
            switch (a.told()) {
                case COMMITTED -> {
                    res.outcome = "withdrawn";
                    return res;
                }
                case DECLINED -> {
                    res.outcome = "declined";
                    return res;
                }
                case HEURISTIC -> {
                    // Outcome unknown or mixed: never retry blindly (it may have committed).
                    res.outcome = "heuristic";
                    return res;
                }
                case ROLLED_BACK -> {
                    if (a.detail() == null || a.detail().startsWith("not retryable")) {
                        res.outcome = "failed";
                        return res;
                    }
                    res.refusals.add(a.detail());
                }
            }
        }
        res.outcome = "gave_up";
        return res;
    }

    private Attempt once(String account, String user, int amount, String tid, Hook hook) throws Exception {
        XAConnection px = pg.getXAConnection();
        XAConnection mx = my.getXAConnection();
        try {
            Connection pc = px.getConnection();
            Connection mc = mx.getConnection();
            // Before enlistment: the branch's BEGIN / XA START takes the level from the session.
            pc.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
            mc.setTransactionIsolation(mariaIsolation);
            tm.begin();
            try {
                Transaction t = tm.getTransaction();
                t.enlistResource(px.getXAResource());
                t.enlistResource(mx.getXAResource());
                int savings = balance(pc, "savings", user);
                int checking = balance(mc, "checking", user);
                if (hook != null) {
                    hook.afterReads();
                }
                if (savings + checking - amount < 0) {
                    tm.rollback();
                    return new Attempt(tid, account, Told.DECLINED, "total " + (savings + checking));
                }
                Connection mine = account.equals("savings") ? pc : mc;
                String concat = account.equals("savings") ? "log || ' ' || ?" : "CONCAT(log, ' ', ?)";
                try (PreparedStatement st = mine.prepareStatement(
                        "UPDATE " + account + " SET bal = bal - ?, log = " + concat + " WHERE u = ?")) {
                    st.setInt(1, amount);
                    st.setString(2, tid);
                    st.setString(3, user);
                    st.executeUpdate();
                }
            } catch (Exception e) {
                // A statement failed inside the branch (deadlock, lock timeout, serialization),
                // or enlisting did (XA START): roll back; never leave the thread associated.
                if (tm.getStatus() != Status.STATUS_NO_TRANSACTION) {
                    tm.rollback();
                }
                if (e instanceof SQLException || Retry.isRetryable(e)) {
                    return rolledBack(tid, account, e);
                }
                throw e;
            }
            try {
                tm.commit();
                return new Attempt(tid, account, Told.COMMITTED, null);
            } catch (RollbackException e) {
                return rolledBack(tid, account, e);
            } catch (HeuristicMixedException | HeuristicRollbackException e) {
                return new Attempt(tid, account, Told.HEURISTIC, e.getClass().getSimpleName() + ": " + describe(e));
            }
        } finally {
            // Only now, after commit()/rollback() returned, may the sessions go.
            close(px);
            close(mx);
        }
    }

    private static Attempt rolledBack(String tid, String account, Exception e) {
        String why = Retry.reason(e);
        return new Attempt(tid, account, Told.ROLLED_BACK, why != null ? why : "not retryable: " + describe(e));
    }

    static String describe(Throwable e) {
        StringBuilder sb = new StringBuilder();
        for (Throwable x : Retry.graph(e)) {
            if (sb.length() > 0) {
                sb.append(" | ");
            }
            sb.append(x.getClass().getSimpleName()).append(": ").append(x.getMessage());
            if (sb.length() > 2000) {
                break;
            }
        }
        return sb.toString();
    }

    private static int balance(Connection c, String table, String user) throws SQLException {
        try (PreparedStatement st = c.prepareStatement("SELECT bal FROM " + table + " WHERE u = ?")) {
            st.setString(1, user);
            try (ResultSet rs = st.executeQuery()) {
                if (!rs.next()) {
                    throw new SQLException("no " + table + " row for " + user);
                }
                return rs.getInt(1);
            }
        }
    }

    private static void close(XAConnection c) {
        try {
            c.close();
        } catch (SQLException ignored) {
            // already broken; the database rolled the session's work back
        }
    }
}
