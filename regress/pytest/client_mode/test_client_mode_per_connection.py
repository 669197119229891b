"""Client mode on MariaDB, checked once per connection (docs/client-mode.md,
"MariaDB / MySQL"): the client sets SERIALIZABLE, reads it back and reads the server's
start once per connection, and sends that start with each later registration; the daemon
then asks the server nothing for the registration while it shows the run its restart gate
knows. These tests show what that saves (the statements of one branch, from the server's
general log) and that the restart gate still holds:

- a restart between two branches: a NEW connection (checked after the restart) reads
  another start, and the daemon looks and refuses (`restart_gate`);
- a branch run in a session that is not the one its connection's check was made in (a
  reconnect, a thread id met again after a restart) cannot prepare.
"""
from __future__ import annotations

import time

import pytest
from cotest import MariaServer
from cotest.coord import make_daemon, my_prepared, wait_until
from cotx import Coordinator
from cotx.dialect import MariaDB
from cotx.errors import CoordinatorError, PrepareRefused

# The gate takes a client's start only once it has seen the run up this long
# (enforcement/gate.rs, VOUCH_AFTER_UPTIME_S), plus a margin.
SETTLED_UPTIME_S = 12


def uptime(my) -> int:
    return int(my.sql("SHOW GLOBAL STATUS LIKE 'Uptime'")[0][1])


def settle(my):
    """Waits until the server has run SETTLED_UPTIME_S (the daemon's first look after it
    sees a settled run)."""
    wait_until(lambda: uptime(my) >= SETTLED_UPTIME_S, SETTLED_UPTIME_S + 10, "a settled uptime", step=0.5)


def one_branch(d, mc, rid):
    """One global transaction with one client-mode branch on `mc`: a read and a write."""
    tx = Coordinator(d.url, d.token).transaction()
    with tx.branch(mc, "my") as b:
        with mc.cursor() as cur:
            cur.execute("SELECT bal FROM acct WHERE id = %s", (rid,))
            cur.execute("UPDATE acct SET bal = bal + 1 WHERE id = %s", (rid,))
    tx.commit()
    assert b.enforcement == "client"
    return b


class GeneralLog:
    """The server's general log, as a table: every statement with its connection."""

    def __init__(self, my):
        self.my = my
        my.sql("SET GLOBAL log_output = 'TABLE'")
        my.sql("TRUNCATE mysql.general_log")
        my.sql("SET GLOBAL general_log = 1")

    def stop(self):
        self.my.sql("SET GLOBAL general_log = 0")
        rows = self.my.sql("SELECT thread_id, command_type, CONVERT(argument USING utf8mb4) FROM mysql.general_log")
        return [(int(t), c, a) for t, c, a in rows]


def statements_per_branch(d, my, n):
    """Runs n branches on one connection after a first one (the connection's check);
    returns (the client's statements, the other connections' statements) per branch
    and the texts of the latter."""
    mc = my.connect()
    one_branch(d, mc, 1)
    log = GeneralLog(my)
    for _ in range(n):
        one_branch(d, mc, 1)
    rows = log.stop()
    mine = [a for t, c, a in rows if t == mc.thread_id() and c == "Query"]
    ours = {t for t, c, a in rows if "general_log" in a}  # the log's own switch
    others = [a for t, c, a in rows if t != mc.thread_id() and t not in ours
              and c in ("Query", "Reset connection", "Execute")]
    return len(mine) / n, len(others) / n, mine, others


def test_a_branch_costs_no_daemon_statement_and_no_isolation_round_trip(bare_pg):
    """The saving, counted by the server: per branch on a connection already checked, the
    client runs SET TRANSACTION, XA START, the application's SQL (2), the slot write, XA END,
    XA COMMIT ONE PHASE (7: a single branch commits in one phase, docs/client-mode.md "One
    phase"; 8 with XA PREPARE and XA COMMIT before it) and the daemon nothing; before, the client also ran SET
    SESSION + SELECT @@tx_isolation and the daemon a GLOBAL_STATUS query per branch (and
    reset its pooled connection). An old client (no `server_started`) still gets the look."""
    with MariaServer(plugin=False) as my:
        my.sql("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
        my.sql("INSERT INTO acct VALUES (1, 100), (2, 100)")
        settle(my)
        # No recovery pass while counting (it probes and looks): only the branches' statements.
        with make_daemon(bare_pg, my, enforcement="client", timeouts={"recovery_interval_ms": 600000}) as d:
            n = 10
            client, daemon, mine, others = statements_per_branch(d, my, n)
            print(f"per branch, checked connection: client {client:.1f} statements, daemon {daemon:.1f}")
            assert not any("SET SESSION" in a or "@@session" in a or "GLOBAL_STATUS" in a for a in mine), mine[:12]
            assert client == 7, mine[:12]
            assert any("ONE PHASE" in a for a in mine) and not any("XA PREPARE" in a for a in mine), mine[:12]
            assert daemon == 0, others[:12]

            # An old client: the same branches without the start, and with the check
            # every time (what every client did before).
            orig = MariaDB.checked_start, MariaDB.is_checked
            MariaDB.checked_start = staticmethod(lambda conn: None)
            MariaDB.is_checked = staticmethod(lambda conn: False)
            try:
                client_old, daemon_old, mine, others = statements_per_branch(d, my, n)
            finally:
                MariaDB.checked_start, MariaDB.is_checked = (staticmethod(f) for f in orig)
            print(f"per branch, old client: client {client_old:.1f} statements, daemon {daemon_old:.1f}")
            assert client_old == client + 2, mine[:12]
            assert sum("GLOBAL_STATUS" in a for a in others) == n, others[:12]
            assert daemon_old >= daemon + 1, others[:12]


def test_a_restart_between_two_branches_is_caught_on_a_new_connection(bare_pg):
    """Two branches; between them the server restarts with a third branch prepared (its
    read locks lost). The second branch comes on a NEW connection, checked after the
    restart: it reads the new start, which the gate does not know, so the daemon looks,
    finds the recovered branch and refuses (503 restart_gate) until it is decided. A
    daemon that took any client's start on trust would admit it."""
    with MariaServer(plugin=False) as my:
        my.sql("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
        my.sql("INSERT INTO acct VALUES (1, 100), (2, 100)")
        settle(my)
        # No recovery pass during the test (its look would close the gate by itself): only
        # the registrations' own looks can.
        with make_daemon(bare_pg, my, enforcement="client",
                         timeouts={"transaction_ms": 60000, "recovery_interval_ms": 600000}) as d:
            first = my.connect()
            one_branch(d, first, 2)
            one_branch(d, first, 2)  # the gate knows the run and the connection is checked
            assert MariaDB.checked_start(first) is not None

            # A branch that read row 1, prepared, the decision pending; then the restart.
            tx = Coordinator(d.url, d.token).transaction()
            pc = my.connect()
            with tx.branch(pc, "my"):
                with pc.cursor() as cur:
                    cur.execute("SELECT bal FROM acct WHERE id = 1")
                    cur.execute("UPDATE acct SET bal = bal - 1 WHERE id = 2")
            tx.prepare_all(report=True)
            pc.close()
            time.sleep(3)  # a start that differs beyond the rounding
            my.kill9()
            my.start()
            assert my_prepared(my), "the prepared branch survives the restart"

            # The second branch, on a new connection checked after the restart.
            new = my.connect()
            MariaDB.set_serializable_verified(new)
            assert MariaDB.checked_start(new) != MariaDB.checked_start(first)
            blocked = Coordinator(d.url, d.token).transaction()
            with pytest.raises(CoordinatorError) as refused:
                with blocked.branch(new, "my"):
                    with new.cursor() as cur:
                        cur.execute("UPDATE acct SET bal = bal + 1 WHERE id = 1")
            assert refused.value.status == 503 and refused.value.code == "restart_gate", (refused.value, d.log_tail(60))
            blocked.abort("test")

            # Decided: the gate opens and the new connection's branches go through.
            assert tx._commit_call({"prepared": []}) == "commit"
            wait_until(lambda: not my_prepared(my), 30, "recovered branch completed by the daemon")

            def admitted():
                try:
                    one_branch(d, new, 1)
                    return True
                except CoordinatorError as err:
                    assert err.code == "restart_gate", err
                    return False
            wait_until(admitted, 30, "the gate to open once the recovered branch is decided")


def test_a_branch_in_a_session_other_than_the_checked_one_cannot_prepare(bare_pg):
    """The client keys its check on the connection id, and the slot write checks the
    session variable the check set: a connection reconnected under the same object (here
    with the old check forged onto it, as if the restarted server gave the same id
    again) runs its branch but cannot prepare it; the next branch checks anew."""
    with MariaServer(plugin=False) as my:
        my.sql("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
        my.sql("INSERT INTO acct VALUES (1, 100), (2, 100)")
        with make_daemon(bare_pg, my, enforcement="client") as d:
            mc = my.connect()
            one_branch(d, mc, 1)
            forged = getattr(mc, MariaDB._CHECKED)
            mc.ping(reconnect=False)
            mc.close()
            mc.connect()  # the same object, a new session
            assert MariaDB.checked_start(mc) is None, "another connection id: not checked"
            setattr(mc, MariaDB._CHECKED, (mc.thread_id(), forged[1]))
            with pytest.raises(PrepareRefused, match="not the one checked"):
                one_branch(d, mc, 1)
            assert not MariaDB.is_checked(mc)
            one_branch(d, mc, 1)
            assert my.sql("SELECT bal FROM acct WHERE id = 1")[0][0] == 102


def test_a_session_level_changed_later_does_not_reach_a_branch(bare_pg):
    """The session's level is read back once per connection; the application (or a pool's
    reset) may set it to something else afterwards. Each branch still sets SERIALIZABLE
    for its own transaction (SET TRANSACTION before XA START), so InnoDB runs the branch
    SERIALIZABLE whatever the session says."""
    with MariaServer(plugin=False) as my:
        my.sql("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
        my.sql("INSERT INTO acct VALUES (1, 100), (2, 100)")
        with make_daemon(bare_pg, my, enforcement="client") as d:
            mc = my.connect()
            one_branch(d, mc, 1)
            with mc.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            tx = Coordinator(d.url, d.token).transaction()
            with tx.branch(mc, "my"):
                with mc.cursor() as cur:
                    cur.execute("UPDATE acct SET bal = bal + 1 WHERE id = 2")
                    cur.execute("SELECT trx_isolation_level FROM information_schema.INNODB_TRX "
                                "WHERE trx_mysql_thread_id = CONNECTION_ID()")
                    level = cur.fetchone()[0]
            tx.commit()
            assert MariaDB.is_checked(mc) and level == "SERIALIZABLE", level
