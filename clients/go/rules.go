package cotx

import (
	_ "embed" // the retry rules' table
	"encoding/json"
	"strings"
)

// The retry rules: what the client does with each answer that is not a success, from the
// table every client shares (clients/retry-rules.json). go:embed cannot reach a parent
// directory, so this package embeds its copy, retry-rules.json beside this file;
// rules_test.go checks the copy equals the original byte for byte.
//
//go:embed retry-rules.json
var rulesJSON []byte

// The actions of the table ("actions" in retry-rules.json says what each means).
const (
	ActionRetryRequest     = "retry_request"     // not done: send again after Retry-After (Run: runs fn again, not counted)
	ActionRetryTransaction = "retry_transaction" // aborted, nothing committed: run the whole transaction again
	ActionAborted          = "aborted"           // aborted: the abort's reason decides (table "aborts")
	ActionPollDecision     = "poll_decision"     // may be decided: ask GET …/decision, never run again
	ActionOutcomeUnknown   = "outcome_unknown"   // cannot be learned: never run again
	ActionFollow           = "follow"            // 421: ask the owner
	ActionIgnore           = "ignore"            // a best-effort report
	ActionFail             = "fail"              // a bug, a misconfiguration, the application's error
)

type daemonRule struct {
	Phases []string `json:"phases"`
	Status int      `json:"status"`
	Code   string   `json:"code"`
	Action string   `json:"action"`
}

type transportRule struct {
	Phases []string `json:"phases"`
	Action string   `json:"action"`
}

type abortRule struct {
	Retryable    *bool   `json:"retryable"`
	Reason       *string `json:"reason"`
	HasReason    bool    `json:"-"` // the row has "reason" (null: no reason recorded)
	ReasonPrefix *string `json:"reason_prefix"`
	Action       string  `json:"action"`
}

type engineRule struct {
	Engine   string   `json:"engine"`
	SQLState string   `json:"sqlstate"`
	Errno    uint16   `json:"errno"`
	Message  []string `json:"message"`
	Text     string   `json:"text"`
	Kind     string   `json:"kind"`
	Action   string   `json:"action"`
	Example  string   `json:"example"`
}

type retryRules struct {
	Daemon    []daemonRule    `json:"daemon"`
	Transport []transportRule `json:"transport"`
	Aborts    []abortRule     `json:"aborts"`
	Engine    []engineRule    `json:"engine"`
}

var rules = loadRules(rulesJSON)

func loadRules(data []byte) retryRules {
	var r retryRules
	if err := json.Unmarshal(data, &r); err != nil {
		panic("cotx: retry-rules.json: " + err.Error())
	}
	// "reason": null cannot be told from an absent field by a *string: read it again.
	var raw struct {
		Aborts []map[string]json.RawMessage `json:"aborts"`
	}
	_ = json.Unmarshal(data, &raw)
	for i := range r.Aborts {
		_, r.Aborts[i].HasReason = raw.Aborts[i]["reason"]
	}
	return r
}

// phaseOf names a request as the table's phases do (begin, register, commit, one_phase,
// decision, prepared, report; "other" for the rest).
func phaseOf(method, path string, body interface{}) string {
	p := strings.SplitN(path, "?", 2)[0]
	parts := strings.Split(strings.Trim(p, "/"), "/")
	if method == "POST" && p == "/v1/gtid-leases" {
		return "begin" // a lease of gtids (leased.go): as a begin, nothing exists yet
	}
	if len(parts) < 2 || parts[0] != "v1" || parts[1] != "transactions" {
		return "other"
	}
	rest := parts[2:]
	last := ""
	if len(rest) > 0 {
		last = rest[len(rest)-1]
	}
	switch {
	case method == "POST" && len(rest) == 0:
		return "begin"
	case method == "POST" && len(rest) == 2 && last == "branches":
		return "register"
	case method == "POST" && len(rest) == 2 && last == "commit":
		if m, ok := body.(map[string]string); ok && m["one_phase_branch"] != "" {
			return "one_phase"
		}
		return "commit"
	case method == "GET" && len(rest) == 2 && last == "decision":
		return "decision"
	case method == "POST" && len(rest) == 4 && last == "prepared":
		return "prepared"
	case method == "POST" && (last == "failed" || last == "finished" || last == "abort"):
		return "report"
	}
	return "other"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// daemonAction: the action for the daemon's answer status/code to a request of phase. The
// most specific row wins: the exact code, then "*" with the status, then "*", then the
// "*"-phase row; among equals the first.
func daemonAction(phase string, status int, code string) string {
	best, score := ActionFail, -1
	for _, r := range rules.Daemon {
		s := 0
		switch {
		case len(r.Phases) == 1 && r.Phases[0] == "*":
			s = 0
		case !contains(r.Phases, phase):
			continue
		case r.Code == code:
			s = 3
		case r.Code == "*" && r.Status != 0 && r.Status == status:
			s = 2
		case r.Code == "*" && r.Status == 0:
			s = 1
		default:
			continue
		}
		if s > score {
			best, score = r.Action, s
		}
	}
	return best
}

// transportAction: the action when the daemon could not be reached in phase.
func transportAction(phase string) string {
	for _, r := range rules.Transport {
		if contains(r.Phases, phase) {
			return r.Action
		}
	}
	return ActionFail
}

// abortAction: the action for an aborted transaction, from GET …/decision's retryable and
// abort_reason (reason nil: none recorded, or the daemon no longer knows the transaction).
func abortAction(retryable bool, reason *string) string {
	for _, r := range rules.Aborts {
		switch {
		case r.Retryable != nil && *r.Retryable:
			if retryable {
				return r.Action
			}
		case r.HasReason:
			if reason == nil {
				return r.Action
			}
		case r.ReasonPrefix != nil:
			if reason != nil && strings.HasPrefix(*reason, *r.ReasonPrefix) {
				return r.Action
			}
		}
	}
	return ActionFail
}

var otherRule = engineRule{Kind: "other", Action: ActionFail}

// engineRuleFor: the engine row an error matches (a SQLSTATE is PostgreSQL's, an errno
// MariaDB's; with neither, text alone matches by the rows' messages), or kind "other".
func engineRuleFor(sqlstate string, errno uint16, text string) engineRule {
	low := strings.ToLower(text)
	all := func(frags []string) bool {
		for _, f := range frags {
			if !strings.Contains(low, f) {
				return false
			}
		}
		return true
	}
	for _, r := range rules.Engine {
		if sqlstate == "" && errno == 0 {
			if (len(r.Message) > 0 && all(r.Message)) || (r.Text != "" && strings.Contains(low, r.Text)) {
				return r
			}
			continue
		}
		if r.Engine == "postgres" {
			if errno != 0 || (r.SQLState != "" && r.SQLState != sqlstate) {
				continue
			}
		} else if sqlstate != "" || (r.Errno != 0 && r.Errno != errno) {
			continue
		}
		if all(r.Message) {
			return r
		}
	}
	return otherRule
}
