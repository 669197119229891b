"""Python client of the cotx coordinator.

    from cotx import Coordinator, RetryableError
    coord = Coordinator("http://127.0.0.1:7420", token)
    with coord.transaction() as tx:               # root: begins, decides at exit
        with tx.branch(pg_conn, "orders"):        # BEGIN ISOLATION LEVEL SERIALIZABLE
            pg_conn.execute("UPDATE ...")
        requests.post(url, headers=tx.headers())  # Cotx-Gtid + traceparent; it joins with
                                                  # coord.join_from(request.headers)
    # exit: PREPARE everywhere, durable decision, COMMIT PREPARED / XA COMMIT

A refused prepare raises RetryableError (subclass PrepareRefused). Transactions with a
single branch and no other participant commit in one phase.
"""
from .branch import Branch
from .coordinator import Coordinator
from .transaction import Transaction
from .errors import (BeginPathNeeded, CoordinatorError, CoordinatorUnavailable, CotxError, OutcomeUnknown,
                     PrepareRefused, RetryableError, TransactionAborted)
from .propagation import HEADER as GTID_HEADER
from .propagation import gtid_from_headers, set_gtid

__all__ = ["Coordinator", "Transaction", "Branch", "CotxError", "CoordinatorError",
           "CoordinatorUnavailable", "TransactionAborted", "RetryableError", "PrepareRefused",
           "BeginPathNeeded", "OutcomeUnknown", "GTID_HEADER", "set_gtid", "gtid_from_headers"]
