"""A read-only MariaDB branch lost in a MariaDB crash after a commit decision is an
incident, never "finished by its owner" (the coordinator-safety suite's defect 6; a
module of its own because it restarts MariaDB)."""
import pytest
from cotx import Coordinator
from cotest.coord import nothing_prepared, wait_until
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
