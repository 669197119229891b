/*
  Unit test of mysql_co_rules.h (the decision and the refusal texts), built with g++ alone
  and run by scripts/test-mysql-co.sh before the mysql-test suite. Every verdict is reached
  here, including OBSERVE_RESTART_GATE, which the mysql-test suite does not reach (it would
  need a second server restart with observe-only on). The expected texts are the ones the
  suite's .result files and error-log searches hold.
*/
#include "mysql_co_rules.h"

#include <cstdio>
#include <string>
#include <vector>

using namespace co_rules;

static int failures= 0;
static int checks= 0;

#define EXPECT(cond) do { checks++; if (!(cond)) { failures++; \
  std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define EXPECT_STR(got, want) do { checks++; std::string g_= (got), w_= (want); if (g_ != w_) { \
  failures++; std::printf("FAIL %s:%d:\n  got  %s\n  want %s\n", __FILE__, __LINE__, \
  g_.c_str(), w_.c_str()); } } while (0)

/* A SERIALIZABLE branch, gate on and empty, enforcing. */
static Facts ok()
{
  Facts f;
  f.restart_gate= true;
  f.gate_pending= 0;
  f.tx_isolation= SERIALIZABLE;
  f.min_iso= SERIALIZABLE;
  f.observe_only= false;
  return f;
}

static const std::vector<std::string> NONE;

static void test_allow()
{
  EXPECT(check(ok()) == Verdict::ALLOW);
  Facts gate_off= ok();
  gate_off.restart_gate= false;
  gate_off.gate_pending= 3;   // pending XIDs do not matter with the gate off
  EXPECT(check(gate_off) == Verdict::ALLOW);
  Facts observing= ok();
  observing.observe_only= true;
  EXPECT(check(observing) == Verdict::ALLOW);
}

static void test_isolation()
{
  for (int iso : {READ_UNCOMMITTED, READ_COMMITTED, REPEATABLE_READ})
  {
    Facts now= ok();
    now.tx_isolation= iso;
    EXPECT(check(now) == Verdict::REFUSE_ISOLATION);
    /* A statement ran at a lower level earlier, the branch is SERIALIZABLE now. */
    Facts earlier= ok();
    earlier.min_iso= iso;
    EXPECT(check(earlier) == Verdict::REFUSE_ISOLATION);
    EXPECT(branch_isolation(earlier) == iso);
    earlier.observe_only= true;
    EXPECT(check(earlier) == Verdict::OBSERVE_ISOLATION);
  }
  Facts rr= ok();
  rr.tx_isolation= REPEATABLE_READ;
  EXPECT_STR(message(Verdict::REFUSE_ISOLATION, Point::XA_PREPARE, rr, NONE) + ROLLED_BACK,
             "mysql_co: XA PREPARE refused: this XA branch ran at REPEATABLE-READ, but "
             "commitment ordering needs SERIALIZABLE (its reads must hold their locks until "
             "XA COMMIT). Run SET TRANSACTION ISOLATION LEVEL SERIALIZABLE before XA START, "
             "or SET SESSION mysql_co_serializable_xa=ON. This branch was rolled back.");
  Facts rc= ok();
  rc.min_iso= READ_COMMITTED;
  rc.tx_isolation= REPEATABLE_READ;
  EXPECT_STR(message(Verdict::REFUSE_ISOLATION, Point::ONE_PHASE_COMMIT, rc, NONE),
             "mysql_co: XA COMMIT ... ONE PHASE refused: this XA branch ran at READ-COMMITTED, "
             "but commitment ordering needs SERIALIZABLE (its reads must hold their locks "
             "until XA COMMIT). Run SET TRANSACTION ISOLATION LEVEL SERIALIZABLE before XA "
             "START, or SET SESSION mysql_co_serializable_xa=ON.");
  /* Observe-only logs the same text. */
  EXPECT_STR(message(Verdict::OBSERVE_ISOLATION, Point::XA_PREPARE, rr, NONE),
             message(Verdict::REFUSE_ISOLATION, Point::XA_PREPARE, rr, NONE));
  EXPECT_STR(iso_name(7), "UNKNOWN");
}

static void test_gate()
{
  Facts g= ok();
  g.gate_pending= 1;
  EXPECT(check(g) == Verdict::REFUSE_RESTART_GATE);
  g.tx_isolation= READ_COMMITTED;   // the gate comes first
  EXPECT(check(g) == Verdict::REFUSE_RESTART_GATE);
  g.observe_only= true;
  EXPECT(check(g) == Verdict::OBSERVE_RESTART_GATE);
  EXPECT(is_gate(Verdict::OBSERVE_RESTART_GATE) && is_observed(Verdict::OBSERVE_RESTART_GATE));
  EXPECT(!is_gate(Verdict::REFUSE_ISOLATION) && !is_observed(Verdict::REFUSE_RESTART_GATE));

  Facts one= ok();
  one.gate_pending= 1;
  EXPECT_STR(message(Verdict::REFUSE_RESTART_GATE, Point::XA_PREPARE, one, {"'r1'"}) + ROLLED_BACK,
             "mysql_co: XA PREPARE refused by the restart gate: 1 XA branch(es) recovered at "
             "server start are still undecided ('r1'); their read locks were lost in the "
             "restart. Commit or roll back every recovered XID (XA RECOVER; XA COMMIT|ROLLBACK "
             "<xid>) first, or SET GLOBAL mysql_co_restart_gate=OFF. This branch was rolled back.");
  EXPECT_STR(message(Verdict::OBSERVE_RESTART_GATE, Point::ONE_PHASE_COMMIT, one, {"'r1'"}),
             "mysql_co: XA COMMIT ... ONE PHASE refused by the restart gate: 1 XA branch(es) "
             "recovered at server start are still undecided ('r1'); their read locks were lost "
             "in the restart. Commit or roll back every recovered XID (XA RECOVER; XA "
             "COMMIT|ROLLBACK <xid>) first, or SET GLOBAL mysql_co_restart_gate=OFF.");
  /* At most five XIDs are named; more are ", ...". */
  Facts many= ok();
  std::vector<std::string> five= {"'a'", "'b'", "'c'", "'d'", "X'00'"};
  many.gate_pending= 5;
  std::string m5= message(Verdict::REFUSE_RESTART_GATE, Point::XA_PREPARE, many, five);
  EXPECT(m5.find(": 5 XA branch(es) recovered at server start are still undecided "
                 "('a', 'b', 'c', 'd', X'00'); ") != std::string::npos);
  many.gate_pending= 7;
  std::string m7= message(Verdict::REFUSE_RESTART_GATE, Point::XA_PREPARE, many, five);
  EXPECT(m7.find(": 7 XA branch(es) recovered at server start are still undecided "
                 "('a', 'b', 'c', 'd', X'00', ...); ") != std::string::npos);
}

int main()
{
  test_allow();
  test_isolation();
  test_gate();
  std::printf("mysql_co_rules_test: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
