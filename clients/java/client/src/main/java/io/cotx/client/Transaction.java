package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** A global transaction as seen by one service: the root ({@link Coordinator#transaction()},
 * decides it in {@link #commit()}) or a participant ({@link Coordinator#join}, calls
 * {@link #prepare()} and later {@link #finish()}). Not thread-safe: one thread at a time. The
 * commit protocol is the Python and Go clients' (docs/coordinator.md, "Python client"). */
public final class Transaction {
    private final Coordinator coord;
    private final boolean root;
    private final int timeoutMs;
    private final String callerTraceparent;
    private final List<Branch> branches = new ArrayList<>();
    private String gtid;
    private String traceId;
    private String outcome;
    // Drawn from a leased range (the one-request commit, LeasedGtids): the daemon hears of the
    // transaction only with its commit.
    private LeasedGtids.Drawn drawn;
    // The decision in a participant (decideInParticipant): asked for, and the branch whose
    // COMMIT carried the decision once it committed.
    private boolean decideInParticipant;
    private Branch decidedIn;

    Transaction(Coordinator coord, String gtid, boolean root, int timeoutMs, String traceparent) {
        this.coord = coord;
        this.gtid = gtid;
        this.root = root;
        this.timeoutMs = timeoutMs;
        this.callerTraceparent = Traceparent.valid(traceparent) ? traceparent : null;
    }

    /** The global id to hand to other services, beginning the transaction at the coordinator
     * if no branch did yet. */
    public String gtid() {
        if (drawn != null) {
            // Other services' branches register with the daemon, which does not know a leased
            // gtid before its commit.
            throw fallBack("the gtid of a one-request transaction was asked for (to propagate it)", true);
        }
        if (gtid == null) {
            ObjectNode body = Coordinator.JSON.createObjectNode();
            if (timeoutMs > 0) {
                body.put("timeout_ms", timeoutMs);
            }
            gtid = call("POST", "/v1/transactions", body).path("gtid").asText();
        }
        return gtid;
    }

    String gtidOrNull() {
        return gtid;
    }

    /** Root only, before {@link #commit()}: the last PostgreSQL branch in engine mode is not
     * prepared but commits in one phase with the global decision written inside it (pg_co's
     * co.decide; its resource needs {@code decisions = true} at the daemon): a PREPARE, a
     * COMMIT PREPARED and the daemon's store write fewer, on the begin path and the
     * one-request path (docs/coordinator.md, "Decision in a participant"). Without such a
     * branch the daemon decides, as always. */
    public Transaction decideInParticipant(boolean on) {
        this.decideInParticipant = on;
        return this;
    }

    /** Whether the gtid was drawn from a leased range (the one-request commit). */
    public boolean leased() {
        return drawn != null;
    }

    public boolean isRoot() {
        return root;
    }

    /** "commit" or "abort" once decided here, else null. */
    public String outcome() {
        return outcome;
    }

    public List<Branch> branches() {
        return List.copyOf(branches);
    }

    /** The trace id of the transaction's own trace context (used when the caller gave no
     * traceparent), drawn once. */
    public String traceId() {
        if (callerTraceparent != null) {
            return callerTraceparent.split("-")[1];
        }
        if (traceId == null) {
            traceId = Traceparent.randomHex(16);
        }
        return traceId;
    }

    /** The traceparent one request sends: the caller's as given, or under the transaction's
     * own trace id a new span id per request. */
    String traceparent() {
        return callerTraceparent != null ? callerTraceparent : Traceparent.child(traceId());
    }

    /** The headers to send on a call to another service inside this transaction: the gtid
     * ({@code Cotx-Gtid}) and the traceparent. Begins the transaction if needed. */
    public Map<String, String> headers() {
        Map<String, String> h = new LinkedHashMap<>();
        h.put(Propagation.GTID_HEADER, gtid());
        h.put(Traceparent.HEADER, traceparent());
        return h;
    }

    JsonNode call(String method, String path, JsonNode body) {
        return coord.call(method, path, body, traceparent(), null);
    }

    // ---- branches --------------------------------------------------------------------------

    /** A SERIALIZABLE branch on {@code conn} at {@code resource} (its name in the daemon's
     * configuration). See {@link #branch(Connection, String, Isolation, String)}. */
    public Branch branch(Connection conn, String resource) {
        return branch(conn, resource, Isolation.SERIALIZABLE, null);
    }

    /** Registers a branch on {@code conn} (pgjdbc or MariaDB Connector/J; {@code branchId} null:
     * a random one) and opens it: {@code BEGIN ISOLATION LEVEL …} on PostgreSQL (the connection
     * is put in autocommit: the client issues BEGIN itself), {@code SET TRANSACTION ISOLATION
     * LEVEL …} + {@code XA START} on MariaDB. Run the branch's statements on {@code conn}
     * afterwards; on an error there, throw {@link Branch#fail}'s exception. The first branch of
     * a root not begun yet is registered with the begin (one request). */
    public Branch branch(Connection conn, String resource, Isolation isolation, String branchId) {
        return branch(conn, resource, isolation, branchId, false);
    }

    /** A SERIALIZABLE branch that writes nothing, see {@link #branch(Connection, String,
     * Isolation, String, boolean)}. */
    public Branch readOnlyBranch(Connection conn, String resource) {
        return branch(conn, resource, Isolation.SERIALIZABLE, null, true);
    }

    /** {@link #branch(Connection, String, Isolation, String)}; {@code readOnly}: the branch
     * writes nothing, checked before its PREPARE (PostgreSQL: no transaction id assigned, a
     * branch that wrote anyway is simply not listed) or enforced by the engine (MariaDB in
     * engine mode and plain 2PC: a READ ONLY transaction, whose writes fail with error 1792);
     * MariaDB in client mode: accepted, never listed (its slot write; docs/client-mode.md,
     * "Read-only branches"). When every branch of the transaction wrote nothing, the daemon
     * commits it without a synced store write (docs/coordinator.md, "All-read-only
     * transactions"). In plain 2PC (enforcement "none") such a branch is not prepared: it
     * commits in one phase at its vote (Branch's read-only vote). */
    public Branch branch(Connection conn, String resource, Isolation isolation, String branchId, boolean readOnly) {
        String id = branchId != null ? branchId
                : (resource.length() > 24 ? resource.substring(0, 24) : resource) + "-" + Traceparent.randomHex(8);
        Branch b = new Branch(this, conn, resource, id, isolation, readOnly);
        LeasedGtids lg = coord.leased();
        if (lg != null && root) {
            String kind = kindOf(conn);
            if (drawn != null && !lg.leasable(resource, kind)) {
                throw fallBack(resource + ": not known to be in engine mode or plain 2PC, in a one-request transaction", false);
            }
            if (drawn == null && gtid == null && branches.isEmpty() && !lg.beginsAt(resource) && lg.leasable(resource, kind)) {
                drawn = lg.draw(traceparent());
                gtid = drawn.gtid();
            }
            if (drawn != null) {
                b.open(leasedRegistration(kind, lg.mode(resource), id));
                branches.add(b);
                return b;
            }
        }
        ObjectNode reg = Coordinator.JSON.createObjectNode().put("resource", resource).put("branch_id", id);
        Long session = Dialect.session(conn);
        if (session != null) {
            // The daemon maps lock waits to the branch by it, and an abort cancels its waiting
            // statement: how a deadlock across databases is broken in seconds.
            reg.put("session", session);
        }
        Long started = ClientModeChecks.started(conn); // null but for a checked MariaDB connection
        if (started != null) {
            // Client mode: the server's start as this connection's check read it, so the
            // daemon need not ask the server for this registration.
            reg.put("server_started", started);
        }
        JsonNode r;
        if (gtid == null) {
            ObjectNode body = Coordinator.JSON.createObjectNode();
            body.set("branch", reg);
            if (timeoutMs > 0) {
                body.put("timeout_ms", timeoutMs);
            }
            JsonNode begun = call("POST", "/v1/transactions", body);
            gtid = begun.path("gtid").asText();
            r = begun.path("branch");
        } else {
            r = call("POST", "/v1/transactions/" + Coordinator.q(gtid) + "/branches", reg);
        }
        b.open(r);
        branches.add(b);
        if (lg != null) {
            lg.learn(resource, b.kind(), b.enforcement());
        }
        return b;
    }

    private static String kindOf(Connection conn) {
        try {
            return Dialect.of(conn).wire;
        } catch (SQLException e) {
            throw new CotxException("cannot tell the connection's database: " + e.getMessage(), e);
        }
    }

    /** What a registration would have answered, from the lease: PostgreSQL gid
     * {@code <gid_prefix>:<gtid>:<branch_id>}, MariaDB XID (gtid, branch id, the lease's format). */
    private JsonNode leasedRegistration(String kind, Branch.Enforcement mode, String id) {
        ObjectNode r = Coordinator.JSON.createObjectNode().put("kind", kind).put("enforcement", mode.name().toLowerCase());
        if (kind.equals(Dialect.POSTGRES.wire)) {
            r.put("gid", drawn.gidPrefix() + ":" + gtid + ":" + id);
        } else {
            r.putObject("xid").put("gtrid", gtid).put("bqual", id).put("format_id", drawn.formatId());
        }
        return r;
    }

    /** A leased transaction met what needs the begin ({@code why}; {@code propagated}: its gtid
     * was asked for): its branches are rolled back (the daemon knows nothing of it),
     * transactions starting on its first branch's resource take the begin from now on, and the
     * exception is retryable ({@link Retry}). */
    private TransactionAbortedException fallBack(String why, boolean propagated) {
        if (!branches.isEmpty()) {
            coord.leased().needsBegin(branches.get(0).resource(), propagated);
        }
        rollbackLocal();
        return aborted(new TransactionAbortedException(gtid, why + " (the begin is needed: run it again)", true, false, null));
    }

    // ---- the commit protocol ---------------------------------------------------------------

    /** Root only: decides the transaction. A single branch commits in one phase (not in client
     * mode, whose protection is the slot written before the prepare); otherwise every local
     * branch is prepared, the decision is made durable together with their "prepared"
     * reports, and the branches are committed on their sessions. Returns once committed;
     * throws {@link TransactionAbortedException} when aborted, {@link OutcomeUnknownException}
     * when the decision could not be learned. */
    public void commit() {
        if (!root) {
            throw new CotxException("commit is for the root; a participant calls prepare() and finish()");
        }
        if (gtid == null && branches.isEmpty()) {
            outcome = "commit";
            return;
        }
        relearned();
        if (drawn == null && branches.size() == 1 && branches.get(0).state == Branch.State.ACTIVE
                && branches.get(0).onePhaseAllowed() && onePhase(branches.get(0))) {
            return;
        }
        // With the decision in a participant, that branch is not prepared, and no branch ends
        // at a read-only vote: the transaction is not two-phase throughout.
        Branch d = decider();
        ArrayNode mine = Coordinator.JSON.createArrayNode();
        for (Branch b : branches) {
            if (b.state != Branch.State.ACTIVE || b == d) {
                continue;
            }
            try {
                b.prepare(d == null);
            } catch (TransactionAbortedException e) {
                rollbackLocal();
                abortQuietly(e.getMessage());
                throw aborted(e);
            }
            mine.add(b.id());
        }
        for (TransactionListener l : coord.listeners()) {
            l.prepared(this);
        }
        if (drawn != null) {
            finishAll(d != null ? leasedDecideIn(d) : leasedCommit());
            return;
        }
        // Branches that wrote nothing (checked at their PREPARE): listed, so that the daemon
        // skips its store sync when that is every branch. Absent when none is.
        ArrayNode readOnly = Coordinator.JSON.createArrayNode();
        for (Branch b : branches) {
            if (d == null && b.state == Branch.State.PREPARED && b.wroteNothing()) {
                readOnly.add(b.id()); // (read_only goes with a two-phase commit only)
            }
        }
        String decision = null;
        Instant deadline = Instant.now().plusSeconds(5);
        while (decision == null) {
            ObjectNode body = Coordinator.JSON.createObjectNode();
            body.set("prepared", mine);
            if (d != null) {
                body.put("decide_in", d.id());
            }
            if (!readOnly.isEmpty()) {
                body.set("read_only", readOnly);
            }
            try {
                decision = call("POST", "/v1/transactions/" + Coordinator.q(gtid) + "/commit", body).path("decision").asText();
            } catch (CoordinatorException ce) {
                if (!readOnly.isEmpty() && ce.code().equals("invalid_field") && String.valueOf(ce.getMessage()).contains("read_only")) {
                    // A daemon older than the field, or one that will not take a branch
                    // listed: the decision synced, as without the list.
                    readOnly = Coordinator.JSON.createArrayNode();
                    continue;
                }
                switch (ce.action()) {
                    case RetryRules.RETRY_REQUEST -> {
                        if (ce.code().equals("already_prepared") && !mine.isEmpty()) {
                            mine = Coordinator.JSON.createArrayNode(); // an earlier attempt got through
                        } else if (Instant.now().isBefore(deadline)) {
                            sleep(ce.code().equals("branch_not_prepared") ? 10 : 100); // a participant has not reported yet
                        } else {
                            decision = waitDecision(); // no more asking: the timeout decides it
                        }
                    }
                    case RetryRules.POLL_DECISION -> decision = waitDecision();
                    case RetryRules.OUTCOME_UNKNOWN -> throw new OutcomeUnknownException(gtid, true, ce);
                    default -> {
                        // Refused (a participant failed or never reported, the transaction
                        // timed out): make sure it is aborted, then roll back our branches.
                        abortQuietly("commit refused: " + ce.getMessage());
                        decision = "abort";
                    }
                }
            } catch (CoordinatorUnavailableException e) {
                decision = waitDecision(); // the decision may or may not be durable
            }
        }
        if (decision.equals("in_participant") && d != null) {
            decision = commitDecisionBranch(d);
        }
        finishAll(decision);
    }

    /** With decideInParticipant: the branch whose commit carries the decision, the last active
     * PostgreSQL branch in engine mode (co.decide needs pg_co there); null without one. */
    private Branch decider() {
        if (!decideInParticipant) {
            return null;
        }
        for (int i = branches.size() - 1; i >= 0; i--) {
            Branch b = branches.get(i);
            if (b.state == Branch.State.ACTIVE && "postgres".equals(b.kind()) && b.enforcement() != Branch.Enforcement.CLIENT) {
                return b;
            }
        }
        return null;
    }

    /** The one-request commit handing the decision to {@code d} (every other branch prepared).
     * Sent once: on any answer but "in_participant" d never commits, so nothing can (a daemon
     * that took the request resolves abort in d's database, co.resolve), and every branch is
     * rolled back here at once. A refusal the retry rules call "aborted" is the abort as the
     * daemon tells it (a refusal of the request itself, which the daemon does not record,
     * such as not_a_decision_resource, names it and is not retried); any other, and no
     * answer, is retryable: nothing committed. */
    private String leasedDecideIn(Branch d) {
        LeasedGtids lg = coord.leased();
        ArrayNode listed = Coordinator.JSON.createArrayNode();
        for (Branch b : branches) {
            if (b.state == Branch.State.PREPARED || b == d) {
                addListing(listed, b);
            }
        }
        ObjectNode body = Coordinator.JSON.createObjectNode();
        body.set("branches", listed);
        body.put("decide_in", d.id());
        ArrayNode acks = lg.take();
        if (acks != null) {
            body.set("finished", acks);
        }
        String decision;
        try {
            decision = call("POST", "/v1/transactions/" + Coordinator.q(gtid) + "/commit", body).path("decision").asText();
        } catch (CoordinatorException ce) {
            lg.drop(gtid);
            rollbackLocal();
            if (ce.action().equals(RetryRules.ABORTED)) {
                throw aborted(abortError("one-request commit refused: " + ce.getMessage(), ce));
            }
            throw aborted(new TransactionAbortedException(gtid,
                    "one-request commit with the decision in " + d.resource() + ": " + ce.getMessage(), true, false, ce));
        } catch (CoordinatorUnavailableException e) {
            lg.drop(gtid);
            rollbackLocal();
            throw aborted(new TransactionAbortedException(gtid,
                    "one-request commit with the decision in " + d.resource() + ": " + e.getMessage(), true, false, e));
        }
        if (!decision.equals("in_participant")) {
            return decision; // abort: finishAll rolls d back with the others
        }
        return commitDecisionBranch(d);
    }

    /** The daemon answered "in_participant": {@code d} commits with the decision inside it.
     * Returns the decision for the other branches. */
    private String commitDecisionBranch(Branch d) {
        try {
            d.commitWithDecision(gtid);
            decidedIn = d;
            return "commit";
        } catch (SQLException e) {
            if (!d.rolledBackOnLiveSession()) {
                // The session is gone (lost during the COMMIT): whether it committed is the
                // database's to say; the daemon reads it there (co.resolve) after the owners'
                // grace period. Nothing more is run on d here.
                d.state = Branch.State.FAILED;
                return waitDecision();
            }
            // The engine refused the decision (40001: a CO rule, or already resolved as
            // abort) or another SQL error: nothing committed there. The daemon, which knows
            // the gtid from the commit request on, hears it at once (a leased one too).
            d.state = Branch.State.ROLLED_BACK;
            boolean retry = Refusals.retryable(e);
            d.postFailed("decision commit refused: " + e.getMessage(), retry);
            rollbackLocal();
            if (retry) {
                throw aborted(new TransactionAbortedException(gtid, d.resource() + ": decision commit refused: " + e.getMessage(), true, true, e));
            }
            throw aborted(abortError(d.resource() + ": decision commit failed: " + e.getMessage(), e));
        }
    }

    /** true: done (committed, or an exception thrown); false: other services joined, so two
     * phases are needed. */
    private boolean onePhase(Branch b) {
        try {
            b.writeSlotForOnePhase();
        } catch (TransactionAbortedException e) {
            abortQuietly(e.getMessage());
            throw aborted(e);
        }
        try {
            call("POST", "/v1/transactions/" + Coordinator.q(gtid) + "/commit",
                    Coordinator.JSON.createObjectNode().put("one_phase_branch", b.id()));
        } catch (CoordinatorException ce) {
            if (ce.code().equals("not_single_branch")) {
                return false;
            }
            if (ce.action().equals(RetryRules.RETRY_TRANSACTION)) {
                // The daemon did not act: the branch was never committed; roll it back and run again.
                abortLocal("one-phase commit not taken: " + ce.getMessage());
                throw aborted(new TransactionAbortedException(gtid, "one-phase commit not taken: " + ce.getMessage(), true, false, ce));
            }
            abortLocal("one-phase commit refused: " + ce.getMessage());
            throw aborted(abortError(ce.getMessage(), ce));
        } catch (CoordinatorUnavailableException e) {
            // The branch commits only after the daemon's answer, which never came: roll it back.
            abortLocal("one-phase commit unanswered: " + e.getMessage());
            throw aborted(new TransactionAbortedException(gtid, "one-phase commit unanswered: " + e.getMessage(),
                    RetryRules.transportAction("one_phase").equals(RetryRules.RETRY_TRANSACTION), false, e));
        }
        try {
            b.commitOnePhase();
        } catch (SQLException e) {
            b.rollbackUnprepared();
            if (!b.alive()) {
                // Lost during the COMMIT: it may have committed (the database's to say), so
                // neither an abort nor "run it again"; nothing acknowledged.
                b.state = Branch.State.FAILED;
                throw new OutcomeUnknownException(gtid, b.resource()
                        + ": the session was lost during the one-phase COMMIT; whether it committed is the database's to say", e);
            }
            b.state = Branch.State.ROLLED_BACK;
            b.ack("abort");
            outcome = "abort";
            boolean retry = Refusals.retryable(e);
            throw aborted(new TransactionAbortedException(gtid, b.resource() + ": commit refused: " + e.getMessage(), retry, retry, e));
        }
        b.ack("commit");
        outcome = "commit";
        for (TransactionListener l : coord.listeners()) {
            l.committed(this);
        }
        return true;
    }

    /** Participant: prepares every local branch and reports it prepared. On any failure all
     * local branches are rolled back, the transaction is aborted and the exception thrown. */
    public void prepare() {
        for (Branch b : branches) {
            if (b.state != Branch.State.ACTIVE) {
                continue;
            }
            try {
                b.prepare(false);
            } catch (TransactionAbortedException e) {
                rollbackLocal();
                outcome = "abort";
                throw aborted(e);
            }
            try {
                b.reportPrepared();
            } catch (CotxException e) {
                // Refused (aborted meanwhile, e.g. a timeout) or unreachable: never leave a
                // prepared branch behind for a transaction that may be aborted.
                abortLocal("prepared report failed: " + e.getMessage());
                throw aborted(abortError(e.getMessage(), e));
            }
        }
        for (TransactionListener l : coord.listeners()) {
            l.prepared(this);
        }
    }

    /** Participant, after {@link #prepare()}: waits for the root's decision and completes the
     * local branches on their sessions. Returns when committed; throws
     * {@link TransactionAbortedException} when aborted, {@link OutcomeUnknownException} when
     * the coordinator stayed unreachable for the decision timeout. */
    public void finish() {
        finishAll(waitDecision());
    }

    /** Aborts the global transaction (root or participant) and rolls back the local branches. */
    public void rollback(String reason) {
        String why = reason == null || reason.isEmpty() ? "rolled back by the application" : reason;
        if (gtid == null) {
            rollbackLocal();
            outcome = "abort";
            return;
        }
        abortLocal(why);
    }

    private void abortLocal(String reason) {
        abortQuietly(reason);
        rollbackLocal();
        outcome = "abort";
    }

    private void abortQuietly(String reason) {
        if (drawn != null) {
            return; // a leased gtid the daemon has not heard of: nothing to tell it
        }
        try {
            coord.abort(gtid, reason, traceparent());
        } catch (CotxException ignored) {
            // the coordinator aborts it on timeout
        }
    }

    void rollbackLocal() {
        for (Branch b : branches) {
            b.rollback();
        }
    }

    void rollbackOthers(Branch failed) {
        for (Branch b : branches) {
            if (b != failed) {
                b.rollback();
            }
        }
        outcome = "abort";
    }

    TransactionAbortedException aborted(TransactionAbortedException e) {
        outcome = "abort";
        for (TransactionListener l : coord.listeners()) {
            l.aborted(this, e);
        }
        return e;
    }

    /** A transaction on the begin whose branches all turned out leasable lets transactions
     * starting on its first resource take the leased path again. */
    private void relearned() {
        LeasedGtids lg = coord.leased();
        if (lg == null || drawn != null || branches.isEmpty()) {
            return;
        }
        for (Branch b : branches) {
            if (!lg.leasable(b.resource(), b.kind())) {
                return;
            }
        }
        lg.leasableAgain(branches.get(0).resource());
    }

    /** The prepared branches sent with the commit, the transaction's only request; the
     * decision. A refusal meaning the daemon did not act (429, 503) or no answer sends it
     * again (a commit is answered the same when sent twice) for up to 5 s, then the decision
     * is asked for. A gtid the daemon does not know or has aborted (restarted, a takeover,
     * the lease ran out) or a resource it refuses (its mode changed): the branches are rolled
     * back, the range dropped, and a retryable {@link TransactionAbortedException} runs it
     * again on a fresh lease. */
    private String leasedCommit() {
        LeasedGtids lg = coord.leased();
        ArrayNode listed = Coordinator.JSON.createArrayNode();
        ArrayNode readOnly = Coordinator.JSON.createArrayNode();
        for (Branch b : branches) {
            if (b.state != Branch.State.PREPARED) {
                continue;
            }
            addListing(listed, b);
            if (b.wroteNothing()) {
                readOnly.add(b.id());
            }
        }
        ArrayNode acks = lg.take(); // the same ones each time the request is sent again
        Instant deadline = Instant.now().plusSeconds(5);
        while (true) {
            ObjectNode body = Coordinator.JSON.createObjectNode();
            body.set("branches", listed);
            if (!readOnly.isEmpty()) {
                body.set("read_only", readOnly);
            }
            if (acks != null) {
                body.set("finished", acks);
            }
            try {
                return call("POST", "/v1/transactions/" + Coordinator.q(gtid) + "/commit", body).path("decision").asText();
            } catch (CoordinatorException ce) {
                if (!readOnly.isEmpty() && ce.code().equals("invalid_field") && String.valueOf(ce.getMessage()).contains("read_only")) {
                    readOnly = Coordinator.JSON.createArrayNode();
                    continue;
                }
                switch (ce.code()) {
                    case "unknown_transaction", "transaction_aborted", "resource_refused" -> {
                        // Nothing recorded for it but an abort, and no commit can be recorded
                        // any more (only the process that leased the range records one).
                        lg.drop(gtid);
                        if (ce.code().equals("resource_refused")) {
                            lg.forgetModes();
                        }
                        rollbackLocal();
                        throw aborted(new TransactionAbortedException(gtid, "one-request commit: " + ce.getMessage(), true, false, ce));
                    }
                    default -> {
                    }
                }
                if ((ce.status() == 429 || ce.status() == 503) && Instant.now().isBefore(deadline)) {
                    sleep(ce.retryAfter() != null ? Math.min(ce.retryAfter().toMillis(), 1000) : 50);
                    continue;
                }
                switch (ce.action()) {
                    case RetryRules.OUTCOME_UNKNOWN -> throw new OutcomeUnknownException(gtid, true, ce);
                    case RetryRules.ABORTED -> {
                        // Aborted (a deadlock victim: the daemon's decision says whether to
                        // run it again), or refused for the request itself (the daemon wrote
                        // nothing: not retried).
                        rollbackLocal();
                        throw aborted(abortError("one-request commit refused: " + ce.getMessage(), ce));
                    }
                    default -> {
                        return waitDecision(); // decided or being decided
                    }
                }
            } catch (CoordinatorUnavailableException e) {
                // Perhaps restarted: the next transactions lease anew.
                lg.drop(gtid);
                if (Instant.now().isBefore(deadline)) {
                    sleep(50);
                    continue;
                }
                return waitDecision();
            }
        }
    }

    /** The branch as the commit with branches lists it. */
    private static void addListing(ArrayNode listed, Branch b) {
        ObjectNode x = listed.addObject().put("resource", b.resource()).put("branch_id", b.id());
        Long session = Dialect.session(b.connection());
        if (session != null) {
            x.put("session", session);
        }
    }

    private String waitDecision() {
        Instant deadline = Instant.now().plus(coord.decisionTimeout());
        RuntimeException last = null;
        while (true) {
            Duration remaining = Duration.between(Instant.now(), deadline);
            if (remaining.isNegative() || remaining.isZero()) {
                throw new OutcomeUnknownException(gtid, false, last);
            }
            if (remaining.compareTo(Duration.ofSeconds(10)) > 0) {
                remaining = Duration.ofSeconds(10);
            }
            try {
                JsonNode d = coord.decision(gtid, remaining, traceparent());
                if (d.hasNonNull("decision")) {
                    return d.path("decision").asText();
                }
            } catch (CoordinatorException ce) {
                switch (ce.action()) {
                    case RetryRules.ABORTED -> {
                        return "abort"; // presumed abort: no record and no live transaction
                    }
                    case RetryRules.OUTCOME_UNKNOWN ->
                        // Purged after the retention: not known any more (never "abort").
                        throw new OutcomeUnknownException(gtid, true, ce);
                    default -> {
                        last = ce;
                        sleep(200); // store_unavailable, owner_unavailable, quarantined: ask again
                    }
                }
            } catch (CoordinatorUnavailableException e) {
                last = e;
                sleep(200); // restarting: its recovery keeps our branches safe
            }
        }
    }

    private void finishAll(String decision) {
        for (TransactionListener l : coord.listeners()) {
            l.decided(this, decision);
        }
        if (decision.equals("commit") || decision.equals("one_phase")) {
            outcome = "commit";
            ArrayNode done = Coordinator.JSON.createArrayNode();
            if (decidedIn != null) {
                // First: a daemon that checks the list in order refuses the others' commit
                // while the transaction is still deciding.
                done.add(decidedIn.id());
            }
            for (Branch b : branches) {
                if (b.state != Branch.State.PREPARED) {
                    continue;
                }
                try {
                    b.finish(true);
                    done.add(b.id());
                } catch (SQLException e) {
                    // Decided and durable: the coordinator commits it after the owner grace.
                }
            }
            if (!done.isEmpty() && drawn != null) {
                coord.leased().hold(gtid, done); // rides with the next commit
            } else if (!done.isEmpty()) {
                ObjectNode body = Coordinator.JSON.createObjectNode().put("outcome", "commit");
                body.set("branches", done);
                try {
                    call("POST", "/v1/transactions/" + Coordinator.q(gtid) + "/finished", body);
                } catch (CotxException ignored) {
                    // one acknowledgement for all; recovery confirms the branches if it is lost
                }
            }
            for (TransactionListener l : coord.listeners()) {
                l.committed(this);
            }
            // A local branch that could not be finished is not an error of the transaction:
            // it committed, and the daemon finishes that branch (as the Python client's
            // tx.unfinished). It is logged by the caller's listener, if any.
            return;
        }
        rollbackLocal();
        throw aborted(abortError(null, null));
    }

    /** Whether the daemon had aborted this transaction, retryably, before we report anything
     * (a deadlock victim, a timeout: the statement that failed was the daemon's cancel). For
     * code that handles a statement's error itself (the Spring starter's participant). */
    public boolean daemonAbortedRetryably() {
        if (gtid == null) {
            return false;
        }
        try {
            JsonNode d = coord.decision(gtid, Duration.ZERO, traceparent());
            return "abort".equals(d.path("decision").asText(null)) && d.path("retryable").asBoolean(false);
        } catch (CotxException e) {
            return false;
        }
    }

    /** Whether the daemon's abort of this transaction may be run again (the abort rows). */
    boolean abortedRetryably() {
        return abortError(null, null).retryable();
    }

    /** The exception for an aborted transaction: retryable as the retry rules' abort rows
     * say, from the decision's {@code retryable} and {@code abort_reason} (a daemon that no
     * longer knows the gtid: presumed abort, no reason). */
    private TransactionAbortedException abortError(String reason, Throwable cause) {
        outcome = "abort";
        boolean flagged = false;
        String recorded = null;
        boolean known = true;
        try {
            JsonNode d = coord.decision(gtid, Duration.ZERO, traceparent());
            if (d.hasNonNull("decision")) { // undecided (aborting just now): only our own words count
                flagged = d.path("retryable").asBoolean(false);
                recorded = d.hasNonNull("abort_reason") ? d.path("abort_reason").asText() : null;
            } else {
                recorded = reason;
            }
        } catch (CoordinatorException ce) {
            known = ce.action().equals(RetryRules.ABORTED);
        } catch (CotxException e) {
            known = false; // unreachable: the reason stays unknown; not retried
        }
        boolean retry = known && RetryRules.abortAction(flagged, recorded).equals(RetryRules.RETRY_TRANSACTION);
        return new TransactionAbortedException(gtid, reason != null ? reason : recorded, retry, false, cause);
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CotxException("interrupted", e);
        }
    }
}
