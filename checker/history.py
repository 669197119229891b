"""Transactions and micro-operations of a recorded history (see the package docstring)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class Txn:
    id: str
    ops: list = field(default_factory=list)   # [(f, key, value), ...] in program order
    status: str = "ok"                        # ok (committed) | fail (aborted) | info (unknown)
    kind: str = "global"                      # global (2PC) | local
    note: str = ""                            # free text shown in reports

    def read(self, key, value):
        self.ops.append(("r", key, list(value) if isinstance(value, (list, tuple)) else value))
        return self

    def append(self, key, value):
        self.ops.append(("append", key, value))
        return self

    def write(self, key, value):
        self.ops.append(("w", key, value))
        return self

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "kind": self.kind, "note": self.note,
                "ops": [list(o) for o in self.ops]}

    @staticmethod
    def from_json(d: dict) -> "Txn":
        return Txn(d["id"], [tuple(o) for o in d.get("ops", [])], d.get("status", "ok"),
                   d.get("kind", "global"), d.get("note", ""))


def parse_list(text) -> list:
    """The engines store a list-append value as space-separated ids ('' = empty)."""
    if text is None:
        return []
    if isinstance(text, bytes):
        text = text.decode()
    return text.split()


def dump_jsonl(history, path) -> None:
    with open(path, "w") as f:
        for t in history:
            f.write(json.dumps(t.to_json()) + "\n")


def load_jsonl(path) -> list:
    with open(path) as f:
        return [Txn.from_json(json.loads(line)) for line in f if line.strip()]
