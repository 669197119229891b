"""A read-only MariaDB branch lost in a MariaDB crash after it was prepared — after the
commit decision, or before it — is an incident, never "finished by its owner" (the
coordinator-safety suite's defect 6; a module of its own because it restarts MariaDB)."""
import time

import pytest
from cotx import Coordinator
from cotest.coord import api, nothing_prepared, wait_until
from cotest.transfers import Child

pytestmark = pytest.mark.usefixtures("crash_tables")


def test_read_only_branch_lost_in_a_mariadb_crash_is_an_incident(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 1500})
    _lost_in_crash(pg, mariadb, d)


def _lost_in_crash(pg, mariadb, d):
    ch = Child(d, pg, mariadb, "after_decision", "ro-crash", readonly=True)
    assert ch.what == "commit"
    mariadb.kill9()
    ch.kill9()
    mariadb.start()
    c = Coordinator(d.url, d.token)
    # Nothing is prepared as soon as MariaDB is back (the branch died with it); the daemon
    # books the branch at its next attempt.
    incidents = wait_until(lambda: c.http.request("GET", "/v1/incidents")["incidents"], what="the incident")
    assert [i["gtid"] for i in incidents] == [ch.gtid], incidents
    wait_until(lambda: nothing_prepared(pg, mariadb), what="completion")
    assert "restarted" in incidents[0]["message"]


def test_read_only_branch_lost_in_a_crash_before_the_decision_is_an_incident(pg, mariadb, daemons):
    """The read-only branch is prepared and reported; MariaDB is killed and restarted before
    the commit is asked (a slow client, a store outage): the branch is gone with the
    restart, its reads unprotected since, and the decision is commit. An incident, as after
    the decision. Before, the daemon compared the restart with the decision's age only:
    MariaDB up longer than that, the branch was counted "finished by its owner"."""
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 500})
    c = Coordinator(d.url, d.token)
    tx = c.transaction()
    pc, mc = pg.connect(), mariadb.connect()
    with tx.branch(pc, "pg"):
        pc.execute("INSERT INTO crash VALUES ('ro-before', 1)")
    with tx.branch(mc, "my"):
        mc.cursor().execute("SELECT count(*) FROM crash")
    assert len(tx.prepare_all(report=True)) == 2
    mariadb.kill9()
    mariadb.start()
    time.sleep(2.5)  # up for more than a whole second before the decision
    st, body = api(d, "POST", f"/v1/transactions/{tx.gtid}/commit", {})
    assert (st, body.get("decision")) == (200, "commit"), (st, body)
    incidents = wait_until(lambda: c.http.request("GET", "/v1/incidents")["incidents"], what="the incident")
    assert [i["gtid"] for i in incidents] == [tx.gtid], incidents
    assert "restarted" in incidents[0]["message"], incidents
    wait_until(lambda: nothing_prepared(pg, mariadb), what="completion")
    pc.close()
