"""The fault campaign (checker/campaign.py), bounded for CI: 3 daemons on a
replicated PostgreSQL decision store, bank transfers through all of them, and random
kill -9 / SIGSTOP of daemons, kill -9 of PostgreSQL, MariaDB and the store's primary
(failover). Afterwards: total conserved, no split transfer, no acknowledged commit
missing, none told aborted applied, nothing left prepared, no cycle in the history.

COTX_CAMPAIGN_SECONDS sets the load time (default 60); longer runs:
`python -m checker.campaign --seconds 600` (see docs/testing.md)."""
import os

from checker import campaign
from cotest.marks import requires_mysql_co, requires_pg_co

pytestmark = [requires_pg_co, requires_mysql_co]


def test_fault_campaign():
    seconds = float(os.environ.get("COTX_CAMPAIGN_SECONDS", "60"))
    # Every kind of fault comes once first (in random order), then by weight.
    cfg = campaign.Config(seconds=seconds, fault_gap=(0.5, 2.0), downtime=(0.3, 2.0), long_downtime=(4.0, 8.0),
                          recovery_timeout=150)
    r = campaign.run(cfg)
    print(campaign.summary(r))
    # It must have been a campaign: faults of several kinds, transfers committed.
    assert r["faults"] >= 5, r["faults_by_kind"]
    assert len(r["faults_by_kind"]) == len(campaign.FAULT_KINDS) or seconds < 60, r["faults_by_kind"]
    assert not r["fault_errors"], r["fault_errors"]
    assert r["transfers"]["committed"] > 0
    assert r["total_conserved"], (r["total_found"], r["total_expected"])
    assert not r["split"], f"split transfers: {r['split'][:20]}"
    assert not r["lost_commits"], f"told committed, not applied in both: {r['lost_commits'][:20]}"
    assert not r["aborted_but_applied"], f"told aborted, applied: {r['aborted_but_applied'][:20]}"
    assert not r["left_prepared"]["pg"] and not r["left_prepared"]["my"], r["left_prepared"]
    assert r["checker"]["ok"], r["checker"]["summary"]
