/*
  mysql_co_rules.h: the decision of mysql_co (may this XA branch reach its commit point?)
  and the text of its refusals, free of the server: no THD, no globals, no server headers.
  mysql_co.cc gathers the facts into co_rules::Facts, asks co_rules::check, and switches on
  the verdict; mysql_co_rules_test.cc (run by scripts/test-mysql-co.sh) tests it with g++
  alone. The rules and why: docs/mysql_co.md.
*/
#ifndef MYSQL_CO_RULES_H
#define MYSQL_CO_RULES_H

#include <cstddef>
#include <string>
#include <vector>

namespace co_rules {

/* The values of the server's enum_tx_isolation (handler.h); mysql_co.cc asserts that
   they agree, so that the rules need not include server headers. */
enum Iso { READ_UNCOMMITTED= 0, READ_COMMITTED= 1, REPEATABLE_READ= 2, SERIALIZABLE= 3 };

/* Where the check runs: the statement named in the refusal. */
enum class Point { XA_PREPARE, ONE_PHASE_COMMIT };

/* What the plugin knows when a branch reaches XA PREPARE or XA COMMIT ... ONE PHASE. */
struct Facts
{
  bool restart_gate;          // mysql_co_restart_gate
  std::size_t gate_pending;   // recovered XIDs still undecided (0 when the gate is off)
  int tx_isolation;           // the transaction's level now (thd_tx_isolation)
  int min_iso;                // lowest level any statement of the branch ran at
                              // (SERIALIZABLE when the plugin saw none)
  bool observe_only;          // mysql_co_observe_only
};

enum class Verdict
{
  ALLOW,
  /* Branches recovered at the last server start are undecided; their read locks are gone. */
  REFUSE_RESTART_GATE,
  /* The branch did not run SERIALIZABLE throughout: its reads did not keep their locks. */
  REFUSE_ISOLATION,
  /* The same two under mysql_co_observe_only: counted and logged, the branch goes on. */
  OBSERVE_RESTART_GATE,
  OBSERVE_ISOLATION,
};

/* The level the branch's reads ran at: the lowest of every statement's and the current. */
inline int branch_isolation(const Facts &f)
{
  return f.min_iso < f.tx_isolation ? f.min_iso : f.tx_isolation;
}

/* The rules, the gate first: a branch refused by it would be refused whatever its level,
   and its message names the XIDs to resolve. */
inline Verdict check(const Facts &f)
{
  if (f.restart_gate && f.gate_pending > 0)
    return f.observe_only ? Verdict::OBSERVE_RESTART_GATE : Verdict::REFUSE_RESTART_GATE;
  if (branch_isolation(f) != SERIALIZABLE)
    return f.observe_only ? Verdict::OBSERVE_ISOLATION : Verdict::REFUSE_ISOLATION;
  return Verdict::ALLOW;
}

inline bool is_gate(Verdict v)
{
  return v == Verdict::REFUSE_RESTART_GATE || v == Verdict::OBSERVE_RESTART_GATE;
}

inline bool is_observed(Verdict v)
{
  return v == Verdict::OBSERVE_RESTART_GATE || v == Verdict::OBSERVE_ISOLATION;
}

inline const char *iso_name(int iso)
{
  switch (iso) {
  case READ_UNCOMMITTED: return "READ-UNCOMMITTED";
  case READ_COMMITTED:   return "READ-COMMITTED";
  case REPEATABLE_READ:  return "REPEATABLE-READ";
  case SERIALIZABLE:     return "SERIALIZABLE";
  }
  return "UNKNOWN";
}

inline const char *point_name(Point p)
{
  return p == Point::XA_PREPARE ? "XA PREPARE" : "XA COMMIT ... ONE PHASE";
}

/* How many pending XIDs a gate refusal names; more are shown as ", ...". */
const std::size_t GATE_XIDS_SHOWN= 5;

/* The refusal's text (also what observe-only logs) for a verdict other than ALLOW.
   gate_xids: the first GATE_XIDS_SHOWN pending XIDs in SQL form, read together with
   f.gate_pending. */
inline std::string message(Verdict v, Point p, const Facts &f,
                           const std::vector<std::string> &gate_xids)
{
  const std::string what= point_name(p);
  if (is_gate(v))
  {
    std::string list;
    for (std::size_t i= 0; i < gate_xids.size() && i < GATE_XIDS_SHOWN; i++)
    {
      if (!list.empty()) list+= ", ";
      list+= gate_xids[i];
    }
    if (f.gate_pending > GATE_XIDS_SHOWN)
      list+= ", ...";
    return "mysql_co: " + what + " refused by the restart gate: " +
           std::to_string(f.gate_pending) +
           " XA branch(es) recovered at server start are still undecided (" + list +
           "); their read locks were lost in the restart. Commit or roll back every "
           "recovered XID (XA RECOVER; XA COMMIT|ROLLBACK <xid>) first, or SET GLOBAL "
           "mysql_co_restart_gate=OFF.";
  }
  if (v == Verdict::REFUSE_ISOLATION || v == Verdict::OBSERVE_ISOLATION)
    return "mysql_co: " + what + " refused: this XA branch ran at " +
           iso_name(branch_isolation(f)) + ", but commitment ordering needs SERIALIZABLE "
           "(its reads must hold their locks until XA COMMIT). Run SET TRANSACTION "
           "ISOLATION LEVEL SERIALIZABLE before XA START, or SET SESSION "
           "mysql_co_serializable_xa=ON.";
  return std::string();
}

/* Appended to a refusal's text: the server rolls the branch back (ER_XA_RBROLLBACK). */
const char *const ROLLED_BACK= " This branch was rolled back.";

} // namespace co_rules

#endif
