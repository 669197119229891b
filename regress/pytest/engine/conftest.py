"""Fixtures of the engine extensions' tests (pg_co, mysql_co)."""
import pytest


@pytest.fixture(scope="module")
def tiny_ssi_pool(pg_major) -> dict:
    """Server settings of the module's PostgreSQL major that make its pool of serializable
    transactions small ((backend slots + prepared) x 10): a few hundred commits make it
    summarize."""
    conf = {"max_connections": 4, "max_prepared_transactions": 2, "max_wal_senders": 0,
            "max_worker_processes": 1, "autovacuum_max_workers": 1, "autovacuum": "off"}
    if pg_major >= 18:  # the pool is sized by backend slots; 18 reserves 16 for autovacuum
        conf["autovacuum_worker_slots"] = 1
    return conf
