"""A test's own reader of the log store's file (`[store] kind = "log"`; the format:
coordinator-daemon/src/store/applog/format.rs): the gtids of unfinished decision records,
read while the daemon runs, as the SQLite tests read the `decisions` table. Written from the
format's description, not from the daemon's code: a reader that disagrees with the daemon
fails the test."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

MAGIC = b"COTXLOG\n"
NONE = -(2 ** 63)  # an optional time that is absent
# Each record kind's fields after its kind byte: s = string (u32 LE length + UTF-8), q = i64 LE.
FIELDS = {1: "qs", 2: "sssssqq", 3: "sq", 4: "s", 5: "sqq", 6: "sqqq", 7: "sqq", 8: "sssqq",
          9: "sq", 10: "ss", 11: "qsssss", 12: "qqq"}


def records(body: bytes):
    at = 0
    while at < len(body):
        kind, at = body[at], at + 1
        vals = []
        for f in FIELDS[kind]:
            if f == "q":
                vals.append(struct.unpack_from("<q", body, at)[0])
                at += 8
            else:
                n = struct.unpack_from("<I", body, at)[0]
                vals.append(body[at + 4:at + 4 + n].decode())
                at += 4 + n
        yield kind, vals


def unfinished(path: Path) -> list[str]:
    data = path.read_bytes()
    assert data[:8] == MAGIC, data[:8]
    at, rows = 8, {}
    while at + 8 <= len(data):
        n, crc = struct.unpack_from("<II", data, at)
        body = data[at + 8:at + 8 + n]
        if n == 0 or len(body) < n or zlib.crc32(data[at:at + 4] + body) != crc:
            break  # the end (or a batch being written)
        for kind, v in records(body):
            if kind == 2:
                rows[v[0]] = v[6] == NONE
            elif kind == 3 and v[0] in rows:
                rows[v[0]] = False
            elif kind == 4:
                rows.pop(v[0], None)
        at += 8 + n
    return [g for g, open_ in rows.items() if open_]
