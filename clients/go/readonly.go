package cotx

import (
	"context"
	"strings"
)

// Read-only branches. A branch opened WithReadOnly says it writes nothing; it is checked
// before it prepares, and when every branch of a transaction wrote nothing the commit
// request lists them all (`read_only`) and the daemon decides commit in memory, with no
// store sync (docs/coordinator.md, "All-read-only transactions"). The checks, as the
// Python and Java clients make them:
//   - PostgreSQL: no transaction id assigned just before PREPARE TRANSACTION
//     (pg_current_xact_id_if_assigned() IS NULL: the transaction changed no row); a
//     branch that did write is simply not listed, and the decision syncs.
//   - MariaDB in engine mode and plain 2PC: the branch runs as a READ ONLY transaction,
//     so InnoDB refuses its writes (error 1792); in engine mode its SERIALIZABLE reads
//     still lock until XA COMMIT.
//   - MariaDB in client mode: never listed. The branch's slot write makes it a read-write
//     transaction, and nothing the session can read says for certain that the
//     application's statements changed no row; the daemon refuses such a listing
//     (docs/client-mode.md, "Read-only branches"). The branch runs as any other.

// The read-only vote (XA's read-only optimisation, plain 2PC only): a branch that
// votesReadOnly is committed in one phase on its session at its vote (PostgreSQL COMMIT,
// MariaDB XA END + XA COMMIT ONE PHASE) instead of prepared, and is still listed with the
// commit (prepared, read_only); after the decision nothing runs for it but its
// acknowledgement. Plain 2PC promises atomicity only, and a branch that wrote nothing has
// nothing to commit or roll back: ending it early changes no data whatever the decision and
// lets its locks go sooner; it saves PostgreSQL's PREPARE (a WAL flush even with nothing
// written) and the COMMIT PREPARED round trip. Not in engine mode (pg_co's rule C needs a
// reader prepared until the decision; mysql_co likewise) nor in client mode (the helper's
// edge and the slot write): ending a branch before the last PREPARE is what the in-memory
// commit's serializability argument forbids where commitment ordering is claimed. Only on
// the root's two-phase commit through the daemon: a lone branch commits in one phase anyway,
// and a participant's branch is reported prepared by its own request.

// WithReadOnly declares that the branch writes nothing (see readonly.go's checks): when
// every branch of the transaction is read-only, the daemon commits it without a synced
// store write. Branches still prepare where commitment ordering is enforced (it needs
// their PREPARE); in plain 2PC such a branch ends at its vote instead.
func WithReadOnly() BranchOption { return func(b *Branch) { b.ReadOnly = true } }

// engineReadOnly: MariaDB in engine mode runs a read-only branch as a READ ONLY
// transaction. Not in client mode, whose slot write must go through; not on PostgreSQL,
// where pg_co refuses to prepare READ ONLY transactions (SSI does not track them).
func (b *Branch) engineReadOnly() bool {
	return b.ReadOnly && b.Kind == MariaDB && b.Enforcement != EnforcementClient
}

// readOnlyClause: what SET TRANSACTION adds for the branch on MariaDB.
func (b *Branch) readOnlyClause() string {
	if b.engineReadOnly() {
		return ", READ ONLY"
	}
	return ""
}

// checkWroteNothing (a branch declared read-only, just before its slot write and
// PREPARE): did the branch change nothing? PostgreSQL assigns a transaction id at a
// transaction's first write.
func (b *Branch) checkWroteNothing() (bool, error) {
	switch {
	case b.engineReadOnly():
		return true, nil
	case b.Kind == Postgres:
		ctx, cancel := context.WithTimeout(context.Background(), protocolTimeout)
		defer cancel()
		var none bool
		err := b.Conn.QueryRowContext(ctx, "SELECT pg_current_xact_id_if_assigned() IS NULL").Scan(&none)
		return none, err
	default:
		return false, nil // MariaDB in client mode: cannot be checked, never claimed
	}
}

// votesReadOnly (after checkWroteNothing): the branch may end at its vote instead of
// preparing: declared read-only, wrote nothing (MariaDB: a READ ONLY transaction), and its
// resource in plain 2PC (the registration's answer, or on the one-request path the mode
// learnt from earlier registrations).
func (b *Branch) votesReadOnly() bool {
	return b.wroteNothing && b.Enforcement == EnforcementNone
}

// wroteNothing: the ids of the transaction's prepared branches that wrote nothing.
func (t *Tx) wroteNothing() []string {
	var ids []string
	for _, b := range t.branches {
		if b.state == stPrepared && b.wroteNothing {
			ids = append(ids, b.ID)
		}
	}
	return ids
}

// readOnlyRefused: the commit was refused for its read_only list (a daemon older than the
// field, or a branch it will not take as read-only): it is sent again without the list.
func readOnlyRefused(ce *CoordinatorError, readOnly []string) bool {
	return len(readOnly) > 0 && ce.Code == "invalid_field" && strings.Contains(ce.Error(), "read_only")
}
