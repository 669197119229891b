"""The Python side of CrossLanguageTest: a service of the Python client (cotx) in one global
transaction with a Java service, both ways. Each writes (key, 'python') into xlang on the
PostgreSQL resource "savings".

    python cross_service.py participant URL TOKEN PG_PORT
        serves POST /write?key=K: joins the request's Cotx-Gtid, writes, prepares, answers;
        finishes after the root's decision (join_from(wait=False)). Prints LISTENING <port>.
    python cross_service.py root URL TOKEN PG_PORT JAVA_URL KEY
        begins, writes, calls JAVA_URL/write?key=KEY with the gtid header, commits; prints
        COMMITTED <gtid>.
"""
import sys
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from cotx import Coordinator


def connect(pg_port):
    return psycopg.connect(host="127.0.0.1", port=int(pg_port), user="postgres", dbname="postgres", autocommit=True)


def participant(url, token, pg_port):
    coord = Coordinator(url, token)
    held = []  # each branch's session stays open until its transaction is finished

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            key = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["key"][0]
            conn = connect(pg_port)
            held.append(conn)
            with coord.join_from(self.headers, wait=False) as tx:
                with tx.branch(conn, "savings"):
                    conn.execute("INSERT INTO xlang VALUES (%s, 'python')", (key,))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(tx.gtid.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print("LISTENING", server.server_address[1], flush=True)
    server.serve_forever()


def root(url, token, pg_port, java_url, key):
    coord = Coordinator(url, token)
    conn = connect(pg_port)
    with coord.transaction() as tx:
        with tx.branch(conn, "savings"):
            conn.execute("INSERT INTO xlang VALUES (%s, 'python')", (key,))
        req = urllib.request.Request(f"{java_url}/write?key={key}", method="POST", headers=tx.headers(), data=b"")
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200, r.status
    print("COMMITTED", tx.gtid, tx.outcome, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "participant":
        participant(*sys.argv[2:5])
    else:
        root(*sys.argv[2:7])
