"""Small CLI: start throwaway servers for a demo or a manual session.

  python -m cotest up [--pg [15|17|18]] [--mariadb] [--no-ext] [--info FILE] [--require-ext]
                                                    start, print how to connect, wait for Ctrl-C/SIGTERM
  python -m cotest reap                               stop servers left behind by killed runs
"""
import argparse
import os
import signal
import sys
from pathlib import Path

from .servers import DEFAULT_PG_MAJOR, PG_MAJORS, MariaServer, PgServer, reap_orphans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="cotest")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start servers and wait")
    up.add_argument("--pg", nargs="?", type=int, const=DEFAULT_PG_MAJOR, choices=PG_MAJORS, metavar="MAJOR",
                    help=f"start PostgreSQL (major {'/'.join(map(str, PG_MAJORS))}, default {DEFAULT_PG_MAJOR} or $COTX_PG_MAJOR)")
    up.add_argument("--mariadb", action="store_true")
    up.add_argument("--no-ext", action="store_true", help="do not load pg_co / mysql_co")
    up.add_argument("--pg-port", type=int)
    up.add_argument("--mariadb-port", type=int)
    up.add_argument("--info", type=Path, help="once ready, write PG_PORT/MY_PORT/PG_DSN/MY_DSN lines "
                    "(shell-sourceable, written last: its presence means ready)")
    up.add_argument("--require-ext", action="store_true", help="exit 2 unless pg_co / mysql_co are loaded")
    sub.add_parser("reap", help="stop servers whose harness process is gone")
    a = ap.parse_args(argv)
    if a.cmd == "reap":
        print(f"reaped {reap_orphans()} server directories")
        return 0
    reap_orphans()
    both = not (a.pg or a.mariadb)
    servers = []
    # Signals wait for sigwait below: a SIGTERM during start-up must not skip the cleanup.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        if a.pg or both:
            pg = PgServer(port=a.pg_port, preload=False if a.no_ext else None, major=a.pg).start()
            servers.append(pg)
            print(f"{pg.version}: psql 'host=127.0.0.1 port={pg.port} user=postgres'  (pg_co preloaded: {pg.preload})")
        if a.mariadb or both:
            md = MariaServer(port=a.mariadb_port, plugin=False if a.no_ext else None).start()
            servers.append(md)
            print(f"MariaDB 10.11: mariadb -h127.0.0.1 -P{md.port} -uroot test  (mysql_co loaded: {md.plugin})")
        if a.require_ext and not all(getattr(s, "preload", getattr(s, "plugin", False)) for s in servers):
            print("pg_co or mysql_co is not installed: run scripts/build.sh", file=sys.stderr)
            return 2
        if a.info:
            lines = []
            for s in servers:
                kind = "PG" if isinstance(s, PgServer) else "MY"
                lines += [f"{kind}_PORT={s.port}", f"{kind}_DSN='{s.dsn}'"]
            tmp = a.info.with_suffix(".tmp")
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, a.info)
        print("Ctrl-C stops the servers and removes their data.", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for s in servers:
            s.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
