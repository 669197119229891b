"""Fuzz the daemon's API from its own OpenAPI document (schemathesis + hypothesis,
bounded in examples and time). Every response must conform to the document and never be
a 5xx other than a documented "retry later" 503; every refused request (4xx) must leave the transactions exactly as they were."""
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,  # noqa: E402
                                               status_code_conformance)

from cotx import Coordinator  # noqa: E402
from cotest.coord import make_daemon  # noqa: E402

EXAMPLES_PER_OPERATION = 25
# 503 with one of these codes is the daemon saying "not now, retry" (coordinator-daemon/
# src/api/mod.rs maps them to 503 with Retry-After): e.g. a well-formed gtid of a node no
# daemon of this store holds. Any other 5xx is a server error.
RETRY_LATER = {"store_unavailable", "owner_unavailable", "quarantined", "lease_unconfirmed", "lease_lost", "too_many_connections"}


def no_server_error(ctx, response, case):
    if response.status_code < 500:
        return
    code = None
    try:
        code = response.json()["error"]["code"]
    except Exception:  # noqa: BLE001
        pass
    assert response.status_code == 503 and code in RETRY_LATER and response.headers.get("retry-after"), \
        f"server error {response.status_code}: {response.text[:200]}"
# The daemon's document is OpenAPI 3.1 (derived from its Rust types); schemathesis 3
# reads 3.1 behind this switch.
schemathesis.experimental.OPEN_API_3_1.enable()


@pytest.fixture(scope="module")
def daemon(pg, mariadb):
    d = make_daemon(pg, mariadb, timeouts={"transaction_ms": 600000, "long_poll_max_ms": 20,
                                           "owner_grace_ms": 600000, "retention_ms": 600000})
    with d:
        yield d


def _view(coord, witnesses):
    out = {}
    for g in witnesses:
        t = coord.get(g)
        t.pop("age_ms")
        out[g] = t
    return out, len(coord.list())


def test_fuzz_api_from_openapi(daemon):
    coord = Coordinator(daemon.url, daemon.token)
    h = coord.http
    # Witnesses in several states; the fuzzer cannot guess their gtids, but a refused
    # request that changed anything at all would show in them or in the count.
    w_active = coord.begin()
    h.request("POST", f"/v1/transactions/{w_active}/branches", {"resource": "pg", "branch_id": "b1"})
    w_prepared = coord.begin()
    h.request("POST", f"/v1/transactions/{w_prepared}/branches", {"resource": "my", "branch_id": "b1"})
    h.request("POST", f"/v1/transactions/{w_prepared}/branches/b1/prepared", {})
    w_aborted = coord.begin()
    h.request("POST", f"/v1/transactions/{w_aborted}/abort", {})
    witnesses = [w_active, w_prepared, w_aborted]

    schema = schemathesis.from_uri(daemon.url + "/openapi.json", base_url=daemon.url)
    auth = {"Authorization": f"Bearer {daemon.token}"}
    checks = (no_server_error, status_code_conformance, content_type_conformance, response_schema_conformance)
    stats = {"calls": 0, "refused": 0}
    for result in schema.get_all_operations():
        if hasattr(result, "err"):  # an operation the document describes wrongly
            raise AssertionError(result.err())
        op = result.ok()

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            before = _view(coord, witnesses)
            headers = dict(case.headers or {})
            # Generated tokens may hold bytes that HTTP itself forbids (hyper answers those
            # before our code runs); auth refusals are tested in test_coordinator_flow.py.
            headers["Authorization"] = auth["Authorization"]
            resp = case.call(headers=headers, timeout=10)
            try:
                case.validate_response(resp, checks=checks)
            except Exception:
                print("FAILED CASE:", case.method, case.formatted_path, case.query, repr(case.body)[:200],
                      {k: v for k, v in headers.items() if k != "Authorization"}, "->", resp.status_code,
                      resp.headers, resp.text[:200])
                raise
            stats["calls"] += 1
            if 400 <= resp.status_code < 500:
                stats["refused"] += 1
                assert _view(coord, witnesses) == before, f"{case.method} {case.formatted_path} changed state"
        run()
    assert stats["calls"] >= 100 and stats["refused"] > 0, stats
