"""Compatibility module: the client used to live here in one file and is now split by
layer (clients/python/README.md, "Layering"):

- cotx._http: the HTTP transport (keep-alive raw socket, TLS, failover, 421 following);
- cotx.coordinator: `Coordinator`, the API facade;
- cotx.transaction: `Transaction` and its commit protocols;
- cotx.branch: `Branch`, one database's part and its state machine;
- cotx.dialect: the PostgreSQL / MariaDB SQL and error codes.

Every name this module had is re-exported, and they are the same objects: a test that
patches `cotx.client.Transaction._finish` patches the class the client runs. Rebinding a
module-level function here (say `cotx.client._retryable = ...`) no longer reaches the
code, which looks it up in its own module: patch it there. New code imports from `cotx`
or from the modules above.
"""
from ._http import _Http, _q  # noqa: F401
from .branch import Branch  # noqa: F401
from .coordinator import Coordinator  # noqa: F401
from .dialect import (GID_MAX, ISOLATION_LEVELS, MY_XAER_NOTA, PG_NO_SUCH_PREPARED,  # noqa: F401
                      _ID_CHARS, _kind_of, _my_code, _pg_literal, _pg_state, _retryable)
from .errors import (CoordinatorError, CoordinatorUnavailable, CotxError, OutcomeUnknown,  # noqa: F401
                     PrepareRefused, RetryableError, TransactionAborted)
from .propagation import HEADER as GTID_HEADER  # noqa: F401
from .propagation import gtid_from_headers, traceparent_from_headers  # noqa: F401
from .refusals import classify  # noqa: F401
from .trace import TraceContext  # noqa: F401
from .transaction import Transaction  # noqa: F401
