"""The daemon's own share of a two-branch global transaction, without databases: the
calls the Python client makes (begin + first branch, second branch, commit carrying the
prepared reports, acknowledgement not awaited), against a real daemon process whose
store is in --store-dir. Prints JSON with p50/p99 per sequence.

With --calls batched: both branches registered with the begin and the acknowledgement
carried by the next begin (two requests per transaction).

usage: protocol.py [--n 5000] [--store-dir /dev/shm/cotx-bench] [--calls per-step|batched]
"""
import argparse
import json
import os
import time

from cotx import Coordinator
from cotest.daemon import Daemon


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--store-dir", default="/dev/shm/cotx-bench")
    ap.add_argument("--calls", default="per-step", choices=["per-step", "batched"])
    a = ap.parse_args()
    os.makedirs(a.store_dir, exist_ok=True)
    path = os.path.join(a.store_dir, f"protocol-{os.getpid()}.db")
    # The resource is never contacted: recovery and completion are pushed out of the way.
    # enforcement said: with the default (auto) a registration probes the resource.
    d = Daemon([{"name": "pg", "kind": "postgres", "dsn": "host=127.0.0.1 port=1 user=x", "enforcement": "none"},
                {"name": "my", "kind": "mariadb", "dsn": "mysql://x@127.0.0.1:1/x", "enforcement": "none"}],
               store={"kind": "sqlite", "path": path},
               timeouts={"recovery_interval_ms": 3600000, "owner_grace_ms": 3600000})
    with d:
        h = Coordinator(d.url, d.token).http
        ts = []
        acks = []
        for i in range(a.n + 200):
            t0 = time.perf_counter()
            if a.calls == "batched":
                body = {"branches": [{"resource": "pg", "branch_id": "b1"}, {"resource": "my", "branch_id": "b2"}]}
                if acks:
                    body["finished"] = acks
                g = h.request("POST", "/v1/transactions", body)["gtid"]
                h.request("POST", f"/v1/transactions/{g}/commit", {"prepared": ["b1", "b2"]})
                acks = [{"gtid": g, "outcome": "commit", "branches": ["b1", "b2"]}]
                if i >= 200:
                    ts.append(time.perf_counter() - t0)
                continue
            g = h.request("POST", "/v1/transactions", {"branch": {"resource": "pg", "branch_id": "b1"}})["gtid"]
            h.request("POST", f"/v1/transactions/{g}/branches", {"resource": "my", "branch_id": "b2"})
            h.request("POST", f"/v1/transactions/{g}/commit", {"prepared": ["b1", "b2"]})
            h.send_nowait("POST", f"/v1/transactions/{g}/finished", {"outcome": "commit", "branches": ["b1", "b2"]})
            if i >= 200:  # warm-up excluded
                ts.append(time.perf_counter() - t0)
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f):
            os.remove(f)
    ts.sort()
    print(json.dumps({"sequences": a.n, "store_dir": a.store_dir, "calls": a.calls,
                      "p50_ms": round(ts[len(ts) // 2] * 1e3, 3), "p99_ms": round(ts[int(len(ts) * 0.99)] * 1e3, 3)}))


if __name__ == "__main__":
    main()
