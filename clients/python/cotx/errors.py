"""Exceptions of the cotx client. Catch RetryableError to retry a global transaction."""


class CotxError(Exception):
    """Base class of every error this client raises."""


class CoordinatorError(CotxError):
    """The coordinator refused a request (4xx) or failed (5xx). `phase`: which request it
    answered, as the retry rules name it (cotx.retry_rules.phase_of: "begin", "register",
    "commit", …); `retry_after`: its Retry-After header in seconds (None without one)."""

    def __init__(self, status: int, code: str, message: str, phase: str = "other",
                 retry_after: float | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.phase = phase
        self.retry_after = retry_after


class CoordinatorUnavailable(CotxError):
    """The coordinator could not be reached (or its answer not read). `phase`: which
    request, as for CoordinatorError."""

    def __init__(self, message: str, phase: str = "other"):
        super().__init__(message)
        self.phase = phase


class TransactionAborted(CotxError):
    """The global transaction was aborted; every local branch has been rolled back."""

    retryable = False

    def __init__(self, gtid: str, reason: str | None = None):
        super().__init__(f"global transaction {gtid} aborted: {reason or 'no reason given'}")
        self.gtid = gtid
        self.reason = reason


class RetryableError(TransactionAborted):
    """Aborted for a reason that retrying may cure: a prepare refused by the engine's
    commitment-ordering check (PostgreSQL SQLSTATE 40001, MariaDB mysql_co's XA PREPARE
    refusal), a deadlock, a serialization failure, a timeout."""

    retryable = True


class PrepareRefused(RetryableError):
    """An engine refused to prepare one of our branches."""


class OutcomeUnknown(CotxError):
    """The decision could not be learned in time (coordinator unreachable). The branches
    stay prepared; the coordinator completes them when it is back."""


class BeginPathNeeded(RetryableError):
    """A one-request transaction (Coordinator(one_request=True)) reached a branch the
    one-request commit does not serve (a client-mode resource, or one whose enforcement
    the daemon has not told yet) after its first branch: nothing was sent, its branches
    are rolled back. Run it again: `coord.run` does, on the begin path."""
