"""The retry decisions as tables: which outcomes retry, the backoff curve, Retry-After parsing."""

from __future__ import annotations

from datetime import datetime, timezone

import httpx
import pytest

from delivery.client.retry import RetryPolicy, outcome_in_doubt, parse_retry_after, retryable_error, retryable_status


@pytest.mark.parametrize(("status", "slug", "idempotent", "expected"), [
    (429, "rate-limited", False, True),
    (503, "overloaded", False, True),
    (503, "shutting-down", False, True),
    (503, "write-failed", False, True),
    (503, "write-outcome-unknown", False, False),
    (503, "write-outcome-unknown", True, True),
    (503, "database-unavailable", False, False),
    (503, "database-unavailable", True, True),
    (500, "internal", True, True),
    (500, "internal", False, False),
    (502, "about:blank", True, True),
    (504, "about:blank", False, False),
    (409, "idempotency-key-in-use", True, True),
    (409, "topup-conflict", True, False),
    (400, "malformed-json", True, False),
    (401, "unauthorized", True, False),
    (404, "not-found", True, False),
    (422, "invalid-request", True, False),
])
def test_which_statuses_retry(status, slug, idempotent, expected):
    assert retryable_status(status, slug, idempotent) is expected


@pytest.mark.parametrize(("error", "idempotent", "expected"), [
    (httpx.ConnectError("x"), False, True),
    (httpx.ConnectTimeout("x"), False, True),
    (httpx.PoolTimeout("x"), False, True),
    (httpx.ReadTimeout("x"), False, False),
    (httpx.ReadTimeout("x"), True, True),
    (httpx.RemoteProtocolError("x"), False, False),
    (httpx.RemoteProtocolError("x"), True, True),
])
def test_which_transport_errors_retry(error, idempotent, expected):
    assert retryable_error(error, idempotent) is expected


def test_backoff_doubles_up_to_its_cap_with_jitter_in_the_upper_half():
    top = RetryPolicy(retries=10, random=lambda: 0.999999)
    bottom = RetryPolicy(retries=10, random=lambda: 0.0)
    assert [round(top.delay_seconds(n, None), 3) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert [bottom.delay_seconds(n, None) for n in range(1, 4)] == [0.25, 0.5, 1.0]
    assert top.delay_seconds(11, None) is None


def test_retry_after_replaces_backoff_within_its_bound():
    policy = RetryPolicy(retries=2, retry_after_max_seconds=30)
    assert policy.delay_seconds(1, 12.0) == 12.0
    assert policy.delay_seconds(1, 31.0) is None
    assert policy.delay_seconds(3, 1.0) is None


@pytest.mark.parametrize(("header", "expected"), [
    (None, None), ("3", 3.0), (" 10 ", 10.0), ("soon", None), ("-1", None),
    ("Thu, 01 Jan 2026 00:00:30 GMT", 30.0), ("Wed, 31 Dec 2025 00:00:00 GMT", 0.0),
])
def test_parse_retry_after(header, expected):
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_retry_after(header, now) == expected


def test_a_policy_refuses_an_unbounded_retry_count_or_wait_in_doubt():
    with pytest.raises(ValueError):
        RetryPolicy(retries=1000)
    for seconds in (-1.0, 601.0):
        with pytest.raises(ValueError):
            RetryPolicy(in_doubt_seconds=seconds)


def test_only_a_keyed_call_in_doubt_waits_past_the_retry_count():
    policy = RetryPolicy(retries=1, in_doubt_seconds=5.0, random=lambda: 1.0)
    assert policy.delay_seconds(2, 2.0) is None
    assert policy.delay_seconds(2, 2.0, in_doubt=True, waited_seconds=3.0) == 2.0
    assert policy.delay_seconds(2, 2.0, in_doubt=True, waited_seconds=3.5) is None
    # Retry-After: 0 adds no wait, so the count is bounded as well.
    assert policy.delay_seconds(101, 0.0, in_doubt=True) == 0.0
    assert policy.delay_seconds(102, 0.0, in_doubt=True) is None
    assert outcome_in_doubt(409, "idempotency-key-in-use", keyed=True)
    assert outcome_in_doubt(503, "write-outcome-unknown", keyed=True)
    assert not outcome_in_doubt(503, "write-outcome-unknown", keyed=False)
    assert not outcome_in_doubt(503, "database-unavailable", keyed=True)


def test_the_sdk_imports_nothing_of_the_server():
    """An app installs the SDK without the server's dependencies being loaded."""
    import subprocess
    import sys

    code = ("import sys, delivery.client; "
            "print(sorted(m for m in ('aiohttp', 'asyncpg', 'arq', 'billing', 'signing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
