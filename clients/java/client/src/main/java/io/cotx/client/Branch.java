package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import java.sql.Connection;
import java.sql.SQLException;

/** One database's part of a global transaction, on the owner's JDBC connection. Keep the
 * connection open (and out of any pool) until the transaction is finished: a MariaDB read-only
 * branch dies with its session. */
public final class Branch {
    /** How the coordinator says commitment ordering is enforced at the branch's resource. */
    public enum Enforcement {
        /** pg_co / mysql_co refuse what would break commitment ordering. */
        ENGINE,
        /** Neither is installed there (a managed database): the daemon's helper and the
         * branch's slot write (docs/client-mode.md). The branch must be SERIALIZABLE; it
         * prepares, or, alone in its transaction, commits in one phase after its slot write
         * where the daemon allows it ("One phase"). */
        CLIENT,
        /** Plain 2PC, configured so (comparisons). */
        NONE
    }

    enum State { ACTIVE, PREPARED, FINISHED, ROLLED_BACK, FAILED }

    private final Transaction tx;
    private final Connection conn;
    private final String resource;
    private final String id;
    private final Isolation isolation;
    private Dialect dialect;
    private String engineId; // PostgreSQL: the gid literal; MariaDB: 'gtrid','bqual',formatID
    private Enforcement enforcement = Enforcement.ENGINE;
    private int shimKey;
    // Client mode: the daemon lets it commit in one phase when it is its transaction's only
    // branch (the registration's shim.one_phase).
    private boolean shimOnePhase;
    // Declared read-only by the application; wroteNothing: what the check before PREPARE
    // found (the commit lists such branches: the daemon skips its sync when all are).
    private final boolean readOnly;
    private boolean wroteNothing;
    // Committed in one phase at its vote instead of prepared (the read-only vote of plain
    // 2PC, votesReadOnly): it keeps PREPARED as its vote, and after the decision nothing is
    // run for it but its acknowledgement.
    private boolean endedAtVote;
    State state = State.ACTIVE;

    Branch(Transaction tx, Connection conn, String resource, String id, Isolation isolation, boolean readOnly) {
        this.tx = tx;
        this.conn = conn;
        this.resource = resource;
        this.id = id;
        this.isolation = isolation;
        this.readOnly = readOnly;
    }

    /** Declared read-only ({@link Transaction#branch(Connection, String, Isolation, String, boolean)}). */
    public boolean readOnly() {
        return readOnly;
    }

    /** Declared read-only and found to have written nothing before its PREPARE: listed as
     * such with the commit. */
    public boolean wroteNothing() {
        return wroteNothing;
    }

    /** The read-only vote (XA's read-only optimisation, plain 2PC only): after the check,
     * the branch may end at its vote — committed in one phase on its session (PostgreSQL
     * COMMIT, MariaDB XA END + XA COMMIT ONE PHASE) instead of prepared, still listed with the
     * commit (prepared, read_only). Plain 2PC promises atomicity only, and a branch that wrote
     * nothing has nothing to commit or roll back: ending it early changes no data whatever the
     * decision and lets its locks go sooner; it saves PostgreSQL's PREPARE (a WAL flush even
     * with nothing written) and the COMMIT PREPARED round trip. Not in engine mode (pg_co's
     * rule C needs a reader prepared until the decision; mysql_co likewise) nor in client mode
     * (the helper's edge, the slot write): ending a branch before the last PREPARE is what the
     * in-memory commit's serializability argument forbids where commitment ordering is
     * claimed. The enforcement is the registration's answer, or on the one-request path the
     * mode learnt from earlier registrations. */
    private boolean votesReadOnly() {
        return wroteNothing && enforcement == Enforcement.NONE;
    }

    /** MariaDB in engine mode runs a read-only branch as a READ ONLY transaction (a write is
     * refused there). Not in client mode, whose slot write must go through; not on
     * PostgreSQL, where pg_co refuses to prepare READ ONLY transactions (SSI does not track
     * them): their writes are looked for before PREPARE instead. */
    private boolean engineReadOnly() {
        return readOnly && dialect == Dialect.MARIADB && enforcement != Enforcement.CLIENT;
    }

    public Connection connection() {
        return conn;
    }

    public String resource() {
        return resource;
    }

    public String id() {
        return id;
    }

    public Isolation isolation() {
        return isolation;
    }

    /** As the coordinator answered the registration (ENGINE from a daemon that does not say). */
    public Enforcement enforcement() {
        return enforcement;
    }

    /** Client mode's slot (1 and up; 0 in the other modes). */
    public int shimKey() {
        return shimKey;
    }

    /** "postgres" or "mariadb". */
    public String kind() {
        return dialect == null ? null : dialect.wire;
    }

    /** A registered branch (its answer {@code r}) is checked and opened: the enforcement and
     * client mode's slot, then BEGIN / XA START. In client mode a branch that is not
     * SERIALIZABLE is refused before it runs, and a MariaDB session is set SERIALIZABLE and
     * read back. If it cannot be opened, the coordinator is told (the global transaction
     * aborts). */
    void open(JsonNode r) {
        try {
            Dialect mine = Dialect.of(conn);
            dialect = Dialect.ofWire(r.path("kind").asText());
            if (dialect != mine) {
                throw new CotxException("resource " + resource + " is " + dialect.wire + " at the coordinator but the connection is "
                        + mine.wire);
            }
            String mode = r.path("enforcement").asText("engine");
            enforcement = switch (mode) {
                case "client" -> Enforcement.CLIENT;
                case "none" -> Enforcement.NONE;
                default -> Enforcement.ENGINE;
            };
            if (enforcement == Enforcement.CLIENT) {
                if (isolation != Isolation.SERIALIZABLE) {
                    throw new ClientModeIsolationException("resource " + resource + " runs in client mode (no pg_co / mysql_co there): "
                            + "its branches must be SERIALIZABLE, not " + isolation.sql);
                }
                shimKey = r.path("shim").path("key").asInt(0);
                shimOnePhase = r.path("shim").path("one_phase").asBoolean(false);
                if (shimKey < 1) {
                    throw new CotxException("the coordinator answered client mode without a shim slot");
                }
                if (dialect != Dialect.MARIADB || !ClientModeChecks.isChecked(conn)) {
                    dialect.setSerializableVerified(conn);
                }
            }
            if (dialect == Dialect.POSTGRES) {
                engineId = Dialect.literal(r.path("gid").asText(null));
            } else {
                JsonNode x = r.path("xid");
                if (x.isMissingNode() || x.isNull()) {
                    throw new CotxException("the coordinator answered no xid");
                }
                engineId = Dialect.literal(x.path("gtrid").asText(null)) + "," + Dialect.literal(x.path("bqual").asText(null)) + ","
                        + x.path("format_id").asLong();
            }
            dialect.begin(conn, engineId, isolation, engineReadOnly());
        } catch (SQLException | RuntimeException e) {
            reportFailed("begin failed: " + e.getMessage(), false);
            state = State.FAILED;
            if (e instanceof CotxException ce) {
                throw ce;
            }
            throw new CotxException("opening branch " + id + " at " + resource + ": " + e.getMessage(), e);
        }
    }

    /** For an error inside the branch: rolls back every local branch of the transaction,
     * tells the coordinator (the global transaction aborts) and returns the exception to
     * throw, retryable when {@code e} is a serialization failure, deadlock or lock timeout. */
    public TransactionAbortedException fail(Throwable e) {
        rollbackUnprepared();
        boolean retry = Refusals.retryable(e);
        JsonNode ack = reportFailed(String.valueOf(e.getMessage()), retry);
        // The daemon had aborted the transaction and cancelled our statement (a deadlock
        // across databases, a timeout): the error is that cancel; the daemon says whether
        // running the transaction again may work.
        retry = retry || ack.path("retryable").asBoolean(false) || ack.path("aborted_as").asText("").equals("deadlock_victim");
        state = State.FAILED;
        tx.rollbackOthers(this);
        TransactionAbortedException ab = new TransactionAbortedException(tx.gtidOrNull(), resource + ": " + e.getMessage(), retry, false, e);
        tx.aborted(ab);
        return ab;
    }

    private String path(String suffix) {
        return "/v1/transactions/" + Coordinator.q(tx.gtidOrNull()) + "/branches/" + Coordinator.q(id) + suffix;
    }

    /** The daemon's answer (empty when there is none). */
    JsonNode reportFailed(String reason, boolean retryable) {
        if (tx.leased()) {
            return Coordinator.JSON.createObjectNode(); // the daemon has not heard of the transaction
        }
        return postFailed(reason, retryable);
    }

    /** POST …/failed whatever the path: after a commit request the daemon knows a leased gtid
     * too (the decision branch's refused commit). */
    JsonNode postFailed(String reason, boolean retryable) {
        // Best effort: if it is lost, the coordinator aborts on timeout (presumed abort).
        try {
            return tx.call("POST", path("/failed"),
                    Coordinator.JSON.createObjectNode().put("reason", Coordinator.trunc(reason, 900)).put("retryable", retryable));
        } catch (CotxException ignored) {
            return Coordinator.JSON.createObjectNode(); // the timeout aborts it
        }
    }

    void rollbackUnprepared() {
        try {
            dialect.rollbackUnprepared(conn, engineId);
        } catch (SQLException | RuntimeException ignored) {
            // the session is gone or the branch already ended: nothing of it can commit
        }
    }

    /** PREPARE TRANSACTION / XA END + XA PREPARE, in client mode after the slot's write. A
     * failure rolls back and reports; the exception is a TransactionAbortedException, refused
     * and retryable for the engines' refusals. {@code mayEnd}: the root's two-phase commit
     * through the daemon, where a read-only branch of plain 2PC ends at its vote instead
     * ({@link #votesReadOnly}; a lone branch commits in one phase anyway, and a participant's
     * branch is reported prepared by its own request). */
    void prepare(boolean mayEnd) {
        try {
            if (readOnly) {
                // Before client mode's slot write, which is not the application's data.
                wroteNothing = engineReadOnly() || dialect.wroteNothing(conn);
            }
            if (enforcement == Enforcement.CLIENT) {
                dialect.shimTouch(conn, shimKey);
            }
            if (mayEnd && votesReadOnly()) {
                dialect.commitOnePhase(conn, engineId);
                endedAtVote = true;
            } else {
                dialect.prepare(conn, engineId);
            }
            state = State.PREPARED;
        } catch (SQLException e) {
            throw refused(e, "prepare");
        }
    }

    /** Whether this branch, alone in its transaction, may commit in one phase. */
    boolean onePhaseAllowed() {
        return enforcement != Enforcement.CLIENT || shimOnePhase;
    }

    /** Client mode, before a one-phase commit is asked for: the slot write it would make
     * before PREPARE (docs/client-mode.md, "One phase"). Nothing in the other modes. */
    void writeSlotForOnePhase() {
        if (enforcement != Enforcement.CLIENT) {
            return;
        }
        try {
            dialect.shimTouch(conn, shimKey);
        } catch (SQLException e) {
            throw refused(e, "slot write");
        }
    }

    /** A refusal before the branch is prepared: rolled back, reported, returned to throw. */
    private TransactionAbortedException refused(SQLException e, String step) {
        rollbackUnprepared();
        state = State.FAILED;
        boolean retry = Refusals.retryable(e) || e instanceof ClientModeChecks.SessionNotCheckedException;
        reportFailed(step + " refused: " + e.getMessage(), retry);
        return new TransactionAbortedException(tx.gtidOrNull(),
                resource + ": " + step + (retry ? " refused: " : " failed: ") + e.getMessage(), retry, retry, e);
    }

    /** This unprepared PostgreSQL branch commits in one phase with the global decision written
     * inside it (pg_co's co.decide, then COMMIT): its COMMIT is the decision
     * (docs/coordinator.md, "Decision in a participant"). Both in one round trip: pgjdbc
     * sends the two statements with one Sync, so an error in co.decide skips the COMMIT. */
    void commitWithDecision(String gtid) throws SQLException {
        Dialect.exec(conn, "SELECT co.decide(" + Dialect.literal(gtid) + "); COMMIT");
        state = State.FINISHED;
    }

    /** After a failed statement: rolls back, and tells whether the session still answered (a
     * ROLLBACK that worked) or is gone. */
    boolean rolledBackOnLiveSession() {
        try {
            dialect.rollbackUnprepared(conn, engineId);
            return true;
        } catch (SQLException | RuntimeException e) {
            return false;
        }
    }

    /** Whether the session still answers (after a failed statement: refused by the engine, or
     * lost with its connection). */
    boolean alive() {
        try {
            return conn.isValid(2);
        } catch (SQLException e) {
            return false;
        }
    }

    void commitOnePhase() throws SQLException {
        dialect.commitOnePhase(conn, engineId);
        state = State.FINISHED;
    }

    /** The decided outcome on the owner's session. A branch the coordinator already finished
     * (its owner grace ran out) is fine. A branch that ended at its vote runs nothing: it wrote
     * nothing, so commit and rollback are the same data (its acknowledgement still follows, so
     * that the daemon does not try to finish it). */
    void finish(boolean commit) throws SQLException {
        try {
            if (!endedAtVote) {
                dialect.finish(conn, engineId, commit);
            }
        } catch (SQLException e) {
            if (!dialect.alreadyFinished(e)) {
                throw e;
            }
        }
        state = commit ? State.FINISHED : State.ROLLED_BACK;
    }

    /** Rolls back whatever state the branch is in; a prepared one is acknowledged. */
    void rollback() {
        switch (state) {
            case PREPARED -> {
                try {
                    finish(false);
                    ack("abort");
                } catch (SQLException e) {
                    // the coordinator's recovery rolls it back
                }
            }
            case ACTIVE -> {
                rollbackUnprepared();
                state = State.ROLLED_BACK;
            }
            default -> {
            }
        }
    }

    void ack(String outcome) {
        if (tx.leased()) {
            return; // an abort of a leased gtid: recovery finds nothing (or aborts it on record)
        }
        // Nobody waits on an acknowledgement: if it is lost, recovery confirms the branch.
        try {
            tx.call("POST", path("/finished"), Coordinator.JSON.createObjectNode().put("outcome", outcome));
        } catch (CotxException ignored) {
            // recovery confirms it
        }
    }

    void reportPrepared() {
        tx.call("POST", path("/prepared"), Coordinator.JSON.createObjectNode());
    }
}
