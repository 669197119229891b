"""Abort reasons as the slices and runs store them: "kind=count;kind=count" (most frequent
first), pooled over runs, and shortened for a table cell."""
from __future__ import annotations

from collections import Counter


def pool(rows) -> str:
    """The reasons of many runs added up, in the stored form."""
    total: Counter = Counter()
    for r in rows:
        for part in filter(None, str(r["reasons"]).split(";")):
            k, _, v = part.rpartition("=")
            total[k] += int(v)
    return ";".join(f"{k}={v}" for k, v in total.most_common())


def cell(reasons, width: int) -> str:
    """The stored form as a markdown cell of at most `width` characters ("-" when none)."""
    text = str(reasons or "").replace(";", ", ") or "-"
    return text if len(text) <= width else text[:width - 3] + "..."
