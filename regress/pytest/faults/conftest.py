"""Fixtures of the fault tests: the withdrawal's tables (cotest.transfers.withdrawal),
made once per module on its servers."""
import pytest
from cotest.transfers import create_withdrawal_tables


@pytest.fixture(scope="module")
def withdrawal_tables(pg, mariadb):
    """wd_acct on PostgreSQL, wd_log on MariaDB; each test sets its balances
    (cotest.transfers.reset_accounts)."""
    create_withdrawal_tables(pg, mariadb)
