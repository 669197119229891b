package cotx

import (
	"context"
	"errors"
)

// The decision in a participant (docs/coordinator.md, "Decision in a participant"): with
// Tx.DecideInParticipant the last PostgreSQL branch in engine mode is not prepared; once
// every other branch is, the commit request hands the decision to it (decide_in), and it
// commits in one phase with pg_co's co.decide(gtid) inside: its COMMIT is the global
// decision. Its resource needs decisions = true at the daemon. On the begin path the
// commit is Commit's loop with decide_in; with Coordinator.OneRequest it is
// leasedDecideIn, the transaction's only request.

// decider is the branch whose commit carries the decision: the last active PostgreSQL
// branch in engine mode (co.decide needs pg_co there); nil without DecideInParticipant or
// without such a branch (then the daemon decides, as always).
func (t *Tx) decider() *Branch {
	if !t.DecideInParticipant {
		return nil
	}
	for i := len(t.branches) - 1; i >= 0; i-- {
		if b := t.branches[i]; b.state == stActive && b.Kind == Postgres && b.Enforcement != EnforcementClient {
			return b
		}
	}
	return nil
}

// leasedDecideIn is the one-request commit handing the decision to d (every other branch
// prepared). Sent once: on any answer but "in_participant" d never commits, so nothing
// can (a daemon that took the request resolves abort in d's database, co.resolve), and
// every branch is rolled back here at once. A refusal the retry rules call "aborted" is
// the abort as the daemon tells it (a refusal of the request itself, which the daemon
// does not record, such as not_a_decision_resource, names it and is not retried); any
// other, and no answer, is a Retryable *AbortedError: nothing committed.
func (t *Tx) leasedDecideIn(ctx context.Context, d *Branch) (string, error) {
	body := map[string]interface{}{"branches": t.leasedBranches(ctx, d), "decide_in": d.ID}
	t.coord.carryAcks(body)
	var r struct {
		Decision string `json:"decision"`
	}
	if err := t.coord.do(ctx, "POST", "/v1/transactions/"+q(t.gtid)+"/commit", body, &r, 0); err != nil {
		t.coord.dropLease(t.gtid)
		t.rollbackLocal()
		t.Outcome = "abort"
		var ce *CoordinatorError
		if errors.As(err, &ce) && daemonAction("commit", ce.Status, ce.Code) == ActionAborted {
			return "", t.abortError(ctx, "one-request commit refused: "+ce.Error())
		}
		return "", &AbortedError{GTID: t.gtid, Reason: "one-request commit with the decision in " + d.Resource + ": " + err.Error(), Retryable: true, Err: err}
	}
	if r.Decision != "in_participant" {
		return r.Decision, nil // abort: finishAll rolls d back with the others
	}
	return t.commitDecisionBranch(ctx, d)
}

// commitDecisionBranch: the daemon answered "in_participant"; d commits with the decision
// inside it (co.decide, then COMMIT). Returns the decision for the other branches.
func (t *Tx) commitDecisionBranch(ctx context.Context, d *Branch) (string, error) {
	g, err := literal(t.gtid)
	if err == nil {
		// One round trip: pgx sends a statement without arguments as one simple query, in
		// which an error in co.decide skips the COMMIT (the ROLLBACK below ends it).
		err = d.exec("SELECT co.decide(" + g + "); COMMIT")
	}
	if err == nil {
		d.state = stFinished
		t.decidedIn = d
		return "commit", nil
	}
	if d.exec("ROLLBACK") != nil {
		// The session is gone (lost during the COMMIT): whether it committed is the
		// database's to say; the daemon reads it there (co.resolve) after the owners'
		// grace period. Nothing more is run on d here.
		d.state = stFailed
		return t.waitDecision(ctx)
	}
	// The engine refused the decision (40001: a CO rule, or already resolved as abort) or
	// another SQL error: nothing committed there. The daemon, which knows the gtid from the
	// commit request on, hears it at once (a leased transaction too).
	d.state = stRolledBack
	retry := IsRetryableDBError(err)
	d.postFailed(ctx, "decision commit refused: "+describeDBError(err), retry)
	t.rollbackLocal()
	t.Outcome = "abort"
	if retry {
		return "", &AbortedError{GTID: t.gtid, Reason: d.Resource + ": decision commit refused: " + describeDBError(err), Retryable: true, Refused: true, Err: err}
	}
	return "", t.abortError(ctx, d.Resource+": decision commit failed: "+describeDBError(err))
}
