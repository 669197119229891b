"""Propagating a global transaction between services over HTTP (docs/coordinator.md,
"Propagating a transaction between services").

The gtid travels in one header, `Cotx-Gtid`, in every client (Go: `cotx.Header`), and the
W3C `traceparent` beside it, so the services' requests to the coordinator share a trace.
The calling side: `requests.post(url, headers=tx.headers())` (or `set_gtid(headers,
tx.gtid)`); the called side: `with coord.join_from(request.headers) as tx:` (or
`gtid_from_headers(request.headers)` and `coord.join(gtid)`).
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from . import trace

HEADER = "Cotx-Gtid"


def set_gtid(headers: MutableMapping, gtid: str) -> MutableMapping:
    """Puts the gtid on an outgoing request's headers (a dict, requests' or httpx's
    headers, ...) and returns them. An empty gtid sets nothing."""
    if gtid:
        headers[HEADER] = gtid
    return headers


def _get(headers, name: str) -> str | None:
    """A header by name from whatever a framework hands over: a case-insensitive mapping
    (requests, httpx, Starlette, http.server's message), a plain dict with any case, or a
    WSGI environ."""
    if headers is None:
        return None
    v = None
    if isinstance(headers, Mapping) or hasattr(headers, "get"):
        v = headers.get(name)
        if v is None:
            # A WSGI environ (PEP 3333): HTTP_ + upper case, "-" becomes "_".
            wsgi = "HTTP_" + name.upper().replace("-", "_")
            v = headers.get(wsgi)
        if v is None and isinstance(headers, Mapping):
            low = name.lower()
            v = next((val for k, val in headers.items() if isinstance(k, str) and k.lower() == low), None)
    if isinstance(v, bytes):
        v = v.decode("latin-1")
    v = v.strip() if isinstance(v, str) else None
    return v or None


def gtid_from_headers(headers) -> str | None:
    """The gtid of an incoming request's headers (None if there is none)."""
    return _get(headers, HEADER)


def traceparent_from_headers(headers) -> str | None:
    """The incoming request's W3C traceparent, if well formed (None otherwise)."""
    tp = _get(headers, trace.HEADER)
    return tp if trace.valid(tp) else None
