"""Run a global transaction and retry it when it is refused, with jittered backoff.

    result = coord.run(lambda tx: transfer(tx, ...), retries=5)

`fn(tx)` opens its branches (`with tx.branch(conn, ...)`) and does its work; `run` begins
the transaction, lets it commit at the end of `fn`, and returns what `fn` returned. A
RetryableError (a refused prepare, a serialization failure, a deadlock: cotx.refusals)
reruns `fn` in a new transaction, at most `retries` more times; any other error, and the
last RetryableError, propagate. So `fn` must be safe to run again: it must do all of its
work inside the transaction's branches.

Between attempts it sleeps a random time in [0, min(max_delay, base_delay * 2**n)) before
attempt n + 1 ("full jitter"). The randomness matters: two transactions refused by the
same conflict would otherwise retry at the same moment and meet again.
"""
from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

from .errors import RetryableError

T = TypeVar("T")


def backoff(attempt: int, base_delay: float, max_delay: float, rand: Callable[[], float]) -> float:
    """Seconds to wait after failed attempt number `attempt` (0-based)."""
    return rand() * min(max_delay, base_delay * (2 ** attempt))


def run(coord, fn: Callable[..., T], retries: int = 5, *, timeout_ms: int | None = None,
        decide_in_participant: bool = False, traceparent: str | None = None,
        base_delay: float = 0.02, max_delay: float = 1.0,
        on_retry: Callable[[int, RetryableError, float], None] | None = None,
        sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random) -> T:
    """fn(tx) in a global transaction of `coord`, retried on RetryableError (see module
    docstring). on_retry(attempt, error, delay) is called before each wait; `sleep` and
    `rand` are there for tests (and for callers with their own clock). traceparent: the
    caller's trace context, shared by every attempt (each attempt is a new transaction)."""
    if retries < 0:
        raise ValueError("retries must be >= 0")
    attempt = 0
    while True:
        try:
            with coord.transaction(timeout_ms=timeout_ms, decide_in_participant=decide_in_participant,
                                   traceparent=traceparent) as tx:
                result = fn(tx)
            return result
        except RetryableError as e:
            if attempt >= retries:
                raise
            delay = backoff(attempt, base_delay, max_delay, rand)
            attempt += 1
            if on_retry is not None:
                on_retry(attempt, e, delay)
            sleep(delay)
