"""Run a global transaction and run it again when the retry rules say it is safe and may
work, with jittered backoff.

    result = coord.run(lambda tx: transfer(tx, ...), retries=5)

`fn(tx)` opens its branches (`with tx.branch(conn, ...)`) and does its work; `run` begins
the transaction, lets it commit at the end of `fn`, and returns what `fn` returned. What
happens to an error is the retry rules' (clients/retry-rules.json, cotx.retry_rules):

- "retry_transaction" — a RetryableError (a refused prepare, a serialization failure, a
  deadlock, a prepared-transaction limit reached; an abort after a crash, a takeover or a
  timeout; cotx.refusals and the rules' "aborts" rows), or the daemon lost during a
  branch's registration: `fn` runs again in a new transaction, at most `retries` more
  times, after a random wait in [0, min(max_delay, base_delay * 2**n)) ("full jitter": two
  transactions refused by the same conflict would otherwise retry at the same moment and
  meet again);
- "retry_request" — the daemon said "not now" before anything was decided (a 503 such as
  lease_unconfirmed, resource_busy, restart_gate, resource_unavailable,
  too_many_connections; a 429 too_many_transactions) or could not be reached at the begin
  (restarting): `fn` runs again after the answer's Retry-After (at most MAX_RETRY_AFTER,
  spread by up to a quarter so that clients do not return together; without one the
  jittered backoff). These waits do not count against `retries`; their total is bounded
  by `max_wait` seconds, after which the error propagates;
- anything else propagates at once, and so do errors whose outcome may be a commit
  (OutcomeUnknown): those are never run again.

So `fn` must be safe to run again: it must do all of its work inside the transaction's
branches.
"""
from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

from .errors import (BeginPathNeeded, CoordinatorError, CoordinatorUnavailable, CotxError, OutcomeUnknown, RetryableError,
                     TransactionAborted)
from .retry_rules import FAIL, OUTCOME_UNKNOWN, RETRY_REQUEST, RETRY_TRANSACTION, daemon_action, transport_action

T = TypeVar("T")

# A Retry-After longer than this is waited only this long (the daemon sends 1 s).
MAX_RETRY_AFTER = 5.0


def backoff(attempt: int, base_delay: float, max_delay: float, rand: Callable[[], float]) -> float:
    """Seconds to wait after failed attempt number `attempt` (0-based)."""
    return rand() * min(max_delay, base_delay * (2 ** attempt))


def action_of(e: BaseException) -> str:
    """What the retry rules say to do after `e` escaped a transaction's attempt."""
    if isinstance(e, RetryableError):
        return RETRY_TRANSACTION
    if isinstance(e, OutcomeUnknown):
        return OUTCOME_UNKNOWN
    if isinstance(e, TransactionAborted):
        return FAIL
    if isinstance(e, CoordinatorError):
        return daemon_action(e.phase, e.status, e.code)
    if isinstance(e, CoordinatorUnavailable):
        return transport_action(e.phase)
    return FAIL


def request_delay(e: CotxError, waits: int, base_delay: float, max_delay: float,
                  rand: Callable[[], float]) -> float:
    """The wait before running again after a "retry_request" answer (the `waits`-th)."""
    after = getattr(e, "retry_after", None)
    if after is None:
        return backoff(waits, base_delay, max_delay, rand)
    return min(after, MAX_RETRY_AFTER) * (1 + 0.25 * rand())


def run(coord, fn: Callable[..., T], retries: int = 5, *, timeout_ms: int | None = None,
        decide_in_participant: bool = False, traceparent: str | None = None,
        base_delay: float = 0.02, max_delay: float = 1.0, max_wait: float = 30.0,
        on_retry: Callable[[int, CotxError, float], None] | None = None,
        sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random) -> T:
    """fn(tx) in a global transaction of `coord`, run again as the retry rules say (see the
    module docstring). on_retry(retries_used, error, delay) is called before each wait;
    `sleep` and `rand` are there for tests (and for callers with their own clock).
    traceparent: the caller's trace context, shared by every attempt (each attempt is a new
    transaction)."""
    if retries < 0:
        raise ValueError("retries must be >= 0")
    attempt, waits, waited = 0, 0, 0.0
    one_request = None  # the Coordinator's choice, until a branch needs the begin path
    while True:
        try:
            with coord.transaction(timeout_ms=timeout_ms, decide_in_participant=decide_in_participant,
                                   traceparent=traceparent, one_request=one_request) as tx:
                result = fn(tx)
            return result
        except CotxError as e:
            act = action_of(e)
            if isinstance(e, BeginPathNeeded) and one_request is None:
                # Nothing was sent: at once, on the begin path, not counted as a retry.
                one_request, delay = False, 0.0
            elif act == RETRY_REQUEST:
                delay = request_delay(e, waits, base_delay, max_delay, rand)
                if waited + delay > max_wait:
                    raise
                waits += 1
                waited += delay
            elif act == RETRY_TRANSACTION and attempt < retries:
                delay = backoff(attempt, base_delay, max_delay, rand)
                attempt += 1
            else:
                raise
            if on_retry is not None:
                on_retry(attempt, e, delay)
            sleep(delay)
