"""W3C trace context for the requests of a global transaction.

Every request the client sends for a transaction carries a `traceparent` header, so the
daemon logs (and, with `[telemetry] otlp_endpoint`, exports) its part of the workflow
under the caller's trace id (docs/coordinator.md, "Logs and traces"). Where the context
comes from, first found wins:

1. the `traceparent` the caller passes (`coord.transaction(traceparent=...)`, `join`);
2. OpenTelemetry's current span, if the `opentelemetry-api` package is importable (it is
   not a dependency: without it this step is skipped);
3. an incoming request's `traceparent` (`coord.join_from(headers)`);
4. a trace id drawn for the transaction, with a new span id on each request.
"""
from __future__ import annotations

import re
import secrets

HEADER = "traceparent"

_FORM = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def valid(tp: str | None) -> bool:
    """The daemon's rule (api::traceparent in coordinator-daemon): lowercase hex, version not
    ff, trace id and parent id not all zeros. A header it would ignore is not worth sending."""
    m = _FORM.match(tp or "")
    return bool(m) and m.group(1) != "ff" and m.group(2).strip("0") != "" and m.group(3).strip("0") != ""


def _otel_current() -> str | None:
    try:
        from opentelemetry import trace as otel  # optional: only if the application has it
    except ImportError:
        return None
    sc = otel.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


class TraceContext:
    """The trace context of one transaction: `header()` is the value each request sends."""

    def __init__(self, traceparent: str | None = None):
        if traceparent is not None and valid(traceparent):
            # The caller's span is the parent of every daemon span of this transaction.
            self.traceparent: str | None = traceparent
            self.trace_id = traceparent[3:35]
        else:
            self.traceparent = None
            self.trace_id = secrets.token_hex(16)

    @classmethod
    def resolve(cls, explicit: str | None = None, incoming: str | None = None) -> "TraceContext":
        for tp in (explicit, _otel_current(), incoming):
            if tp and valid(tp):
                return cls(tp)
        return cls()

    @property
    def generated(self) -> bool:
        return self.traceparent is None

    def header(self) -> str:
        if self.traceparent is not None:
            return self.traceparent
        # No caller span to point at: a fresh span id per request keeps the daemon's spans
        # distinct; "sampled" because nobody asked otherwise and a collector that honours
        # the flag should keep them.
        return f"00-{self.trace_id}-{secrets.token_hex(8)}-01"
