"""cotx history checker: Elle-style cycle detection over multi-database histories.

A history is a list of transactions (`Txn`), each with micro-operations on keys that are
named after their database ("pg:savings/u1", "my:checking/u1"):

    ("append", key, value)   list-append: append a unique value (the writer's id)
    ("r", key, [..])         read of a list-append key: the whole list
    ("w", key, value)        read-write register: write a unique value
    ("r", key, value)        read of a register key (a scalar, None = initial)

`check(history)` infers the version order of every key, builds the dependency graph of
the committed transactions (global and local alike) with ww, wr and rw edges, and reports
every cycle as G0 (ww only), G1c (ww + wr) or G2 (needs an rw anti-dependency), with the
transactions involved and a sentence per edge. `serial_order(history)` is an independent
brute-force oracle for small histories (it searches a serial order that explains every
read). See docs/guarantees.md.
"""
from .history import Txn, load_jsonl, dump_jsonl  # noqa: F401
from .graph import Anomaly, Report, check, serial_order  # noqa: F401
