"""Test harness: throwaway PostgreSQL and MariaDB servers on free loopback ports.

Used by the pytest suites (regress/pytest), the demo and the benchmarks.
"""
from .servers import PgServer, MariaServer, free_port, reap_orphans  # noqa: F401
from .replica import PgReplicaPair  # noqa: F401,E402
