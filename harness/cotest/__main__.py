"""Small CLI: start throwaway servers for a demo or a manual session.

  python -m cotest up [--pg [15|17|18]] [--mariadb] [--no-ext]   start, print how to connect, wait for Ctrl-C
  python -m cotest reap                               stop servers left behind by killed runs
"""
import argparse
import signal
import sys

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
    sub.add_parser("reap", help="stop servers whose harness process is gone")
    a = ap.parse_args(argv)
    if a.cmd == "reap":
        print(f"reaped {reap_orphans()} server directories")
        return 0
    reap_orphans()
    both = not (a.pg or a.mariadb)
    servers = []
    try:
        if a.pg or both:
            pg = PgServer(port=a.pg_port, preload=False if a.no_ext else None, major=a.pg).start()
            servers.append(pg)
            print(f"{pg.version}: psql 'host=127.0.0.1 port={pg.port} user=postgres'  (pg_co preloaded: {pg.preload})")
        if a.mariadb or both:
            md = MariaServer(port=a.mariadb_port, plugin=False if a.no_ext else None).start()
            servers.append(md)
            print(f"MariaDB 10.11: mariadb -h127.0.0.1 -P{md.port} -uroot test  (mysql_co loaded: {md.plugin})")
        print("Ctrl-C stops the servers and removes their data.", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for s in servers:
            s.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
