"""Throwaway PostgreSQL (pg_co preloaded) and MariaDB (mysql_co loaded) for the Java and Go
transaction-manager tests (scripts/test-java.sh, scripts/test-go.sh).

    python scripts/tm_servers.py INFO_FILE

Starts both servers on free loopback ports, writes `PG_PORT=…` and `MY_PORT=…` lines to
INFO_FILE (shell-sourceable, written last, so its presence means "ready"), then waits for
SIGTERM/SIGINT and removes both servers.
"""
import os
import signal
import sys
from pathlib import Path

from cotest import MariaServer, PgServer, reap_orphans


def main() -> int:
    info = Path(sys.argv[1])
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    reap_orphans()
    servers = []
    try:
        pg = PgServer().start()
        servers.append(pg)
        my = MariaServer().start()
        servers.append(my)
        if not (pg.preload and my.plugin):
            print("pg_co or mysql_co is not installed: run scripts/build.sh", file=sys.stderr)
            return 2
        tmp = info.with_suffix(".tmp")
        tmp.write_text(f"PG_PORT={pg.port}\nMY_PORT={my.port}\nPG_DSN='{pg.dsn}'\nMY_DSN='{my.dsn}'\n")
        os.replace(tmp, info)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for s in servers:
            s.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
