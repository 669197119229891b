package io.cotx.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** The one-request commit's state of one {@link Coordinator} (docs/coordinator.md, "One
 * request per transaction: leased gtids"), shared by its threads: the leased range gtids are
 * drawn from, each resource's mode as the registrations answered it, the resources whose
 * transactions need the begin, and the acknowledgements held for the next commit. */
final class LeasedGtids {
    /** Gtids leased at once by default. */
    static final int DEFAULT_COUNT = 1000;
    /** A range is drawn from during this share of its lease only: the transaction drawn last
     * still has the rest (at least half of expires_in_ms) to commit before recovery may abort
     * what is left prepared under it. */
    static final double DRAW_SHARE = 0.5;
    /** Acknowledgements held for the next commit at most; the one that fills the queue sends
     * them all on their own. */
    static final int MAX_HELD_ACKS = 64;

    /** One leased gtid with what naming its branches needs. */
    record Drawn(String gtid, String gidPrefix, long formatId) {
    }

    private final Coordinator coord;
    private final int count;
    private String prefix;
    private long next;
    private long end;
    private Instant until = Instant.MIN;
    private String gidPrefix;
    private long formatId;
    private final Map<String, String[]> modes = new ConcurrentHashMap<>(); // resource -> {kind, enforcement}
    // resource -> propagated: transactions starting there take the begin (for good when
    // they propagate their gtid, which such code does each time).
    private final Map<String, Boolean> beginAfter = new ConcurrentHashMap<>();
    private final List<ObjectNode> acks = new ArrayList<>();

    LeasedGtids(Coordinator coord, int count) {
        if (count < 1 || count > 100_000) {
            throw new IllegalArgumentException("leaseCount must be between 1 and 100000, got " + count);
        }
        this.coord = coord;
        this.count = count;
    }

    /** The next gtid of the current range, leasing a new range when it is used up or its
     * drawing time is over. A lease's refusal or absence is thrown as is (classified as a
     * begin: nothing exists yet). */
    synchronized Drawn draw(String traceparent) {
        if (prefix == null || next >= end || !Instant.now().isBefore(until)) {
            Instant asked = Instant.now(); // the lease runs from the daemon's answer: counted from before the ask
            JsonNode a = coord.call("POST", "/v1/gtid-leases", Coordinator.JSON.createObjectNode().put("count", count), traceparent, null);
            long n = a.path("count").asLong(0);
            long ms = a.path("expires_in_ms").asLong(0);
            if (n < 1 || ms < 1 || a.path("prefix").asText("").isEmpty()) {
                throw new CotxException("the coordinator answered an empty gtid lease: " + a);
            }
            prefix = a.path("prefix").asText();
            next = a.path("first").asLong();
            end = next + n;
            gidPrefix = a.path("gid_prefix").asText();
            formatId = a.path("xa_format_id").asLong();
            until = asked.plus(Duration.ofMillis((long) (ms * DRAW_SHARE)));
        }
        return new Drawn(prefix + Long.toHexString(next++), gidPrefix, formatId);
    }

    /** Forgets the current range when {@code gtid} is one of it: the daemon no longer knows it
     * (restarted, or another took the node over), so the next transaction leases anew. */
    synchronized void drop(String gtid) {
        if (prefix != null && gtid.startsWith(prefix) && gtid.length() > prefix.length()) {
            prefix = null;
        }
    }

    void learn(String resource, String kind, Branch.Enforcement enforcement) {
        modes.put(resource, new String[] {kind, enforcement.name()});
    }

    void forgetModes() {
        modes.clear();
    }

    /** The resource (of kind) may be a branch of a leased transaction: seen in engine mode or
     * plain 2PC. Client mode's helper and slot are handed out at registration, so the daemon
     * refuses a client-mode resource at the commit: such transactions take the begin. */
    boolean leasable(String resource, String kind) {
        String[] m = modes.get(resource);
        return m != null && m[0].equals(kind) && !m[1].equals(Branch.Enforcement.CLIENT.name());
    }

    Branch.Enforcement mode(String resource) {
        String[] m = modes.get(resource);
        return m == null ? Branch.Enforcement.ENGINE : Branch.Enforcement.valueOf(m[1]);
    }

    boolean beginsAt(String resource) {
        return beginAfter.containsKey(resource);
    }

    void needsBegin(String resource, boolean propagated) {
        beginAfter.merge(resource, propagated, Boolean::logicalOr);
    }

    /** After an unknown resource, learnt since: the leased path again (not after a propagation). */
    void leasableAgain(String resource) {
        beginAfter.remove(resource, Boolean.FALSE);
    }

    /** Holds a committed transaction's acknowledgement for the next commit. */
    void hold(String gtid, ArrayNode branches) {
        ObjectNode a = Coordinator.JSON.createObjectNode().put("gtid", gtid).put("outcome", "commit");
        a.set("branches", branches);
        boolean full;
        synchronized (acks) {
            acks.add(a);
            full = acks.size() >= MAX_HELD_ACKS;
        }
        if (full) {
            flush();
        }
    }

    /** The held acknowledgements, taken (null: none). */
    ArrayNode take() {
        synchronized (acks) {
            if (acks.isEmpty()) {
                return null;
            }
            ArrayNode out = Coordinator.JSON.createArrayNode();
            acks.forEach(out::add);
            acks.clear();
            return out;
        }
    }

    /** Sends every held acknowledgement on its own request; a lost one is confirmed by the
     * daemon after its owner grace period. */
    void flush() {
        ArrayNode held = take();
        if (held == null) {
            return;
        }
        for (JsonNode a : held) {
            ObjectNode body = Coordinator.JSON.createObjectNode().put("outcome", a.path("outcome").asText());
            body.set("branches", a.path("branches"));
            try {
                coord.call("POST", "/v1/transactions/" + Coordinator.q(a.path("gtid").asText()) + "/finished", body, null, null);
            } catch (CotxException ignored) {
                // the daemon confirms those branches after its owner grace period
            }
        }
    }
}
