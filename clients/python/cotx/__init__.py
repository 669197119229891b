"""Python client of the cotx coordinator.

    from cotx import Coordinator, RetryableError
    coord = Coordinator("http://127.0.0.1:7420", token)
    with coord.transaction() as tx:               # root: begins, decides at exit
        with tx.branch(pg_conn, "orders"):        # BEGIN ISOLATION LEVEL SERIALIZABLE
            pg_conn.execute("UPDATE ...")
        call_other_service(gtid=tx.gtid)          # it does coord.join(gtid)
    # exit: PREPARE everywhere, durable decision, COMMIT PREPARED / XA COMMIT

A refused prepare raises RetryableError (subclass PrepareRefused). Transactions with a
single branch and no other participant commit in one phase.
"""
from .client import Branch, Coordinator, Transaction
from .errors import (CoordinatorError, CoordinatorUnavailable, CotxError, OutcomeUnknown,
                     PrepareRefused, RetryableError, TransactionAborted)

__all__ = ["Coordinator", "Transaction", "Branch", "CotxError", "CoordinatorError",
           "CoordinatorUnavailable", "TransactionAborted", "RetryableError", "PrepareRefused",
           "OutcomeUnknown"]
