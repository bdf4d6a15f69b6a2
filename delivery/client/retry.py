"""When the SDK retries a request, and how long it waits: pure decisions, no I/O.

A retry must never do twice what the caller asked once. So what may be retried depends on
whether the call is *idempotent* (a repeat changes nothing more: reads, PATCH, DELETE, top-ups by
order id, and every create the SDK sends with an Idempotency-Key: sends, replays, accounts, API
keys, endpoints, secret rotations) or not (a call without a key; none of the SDK's calls today,
but the rule stays for any added without one):

| outcome                                          | idempotent | not idempotent |
|--------------------------------------------------|------------|----------------|
| could not connect (nothing was sent)             | retry      | retry          |
| 429; 503 overloaded, shutting-down, write-failed | retry      | retry          |
| (the API says nothing was written)               |            |                |
| 409 idempotency-key-in-use (first in flight)     | retry      | -              |
| any other 503 (database-unavailable: a write's   | retry      | no: it may have happened |
| COMMIT may have been cut off; write-outcome-     |            |                |
| unknown), other 5xx, timeout, broken connection  |            |                |
| any other 4xx                                    | no         | no             |

Waits grow exponentially with jitter; a `Retry-After` from the API is honoured (up to a bound:
past it the error is raised rather than blocking the caller for long).

A keyed call whose outcome the API says is still being decided (409 idempotency-key-in-use: the
first request with the key still holds it; 503 write-outcome-unknown: its COMMIT's answer was
lost and not yet found out) is retried past `retries`, for up to `in_doubt_seconds` of waiting:
the next answer with the key is then the first request's own. Raised anyway, the error carries
the call's `idempotency_key`, so the caller can ask again with it instead of making a second one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Callable

import httpx

RETRIES_MAX = 10
# 503s whose problem type says the API wrote nothing. A 503 database-unavailable can come from a
# connection lost during a COMMIT that took effect, and write-outcome-unknown says outright that
# the write may exist: a retry of those could do the call twice.
NOTHING_WRITTEN_503_SLUGS = frozenset({"overloaded", "shutting-down", "write-failed"})
KEY_IN_PROGRESS_SLUG = "idempotency-key-in-use"
OUTCOME_UNKNOWN_SLUG = "write-outcome-unknown"
IN_DOUBT_SECONDS_MAX = 600.0
IN_DOUBT_RETRIES_MAX = 100  # a bound on the count too: waits of Retry-After 0 add no time

# Raised before a single byte of the request left: safe to retry anything.
NOT_SENT_ERRORS: tuple[type[httpx.TransportError], ...] = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 2  # retries after the first attempt: 2 means at most 3 attempts
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 8.0
    retry_after_max_seconds: float = 60.0
    # Past `retries`, how long (in waits) a keyed call whose outcome is still in doubt is asked
    # again: longer than the API's commit-outcome wait (10 s) plus a request's timeout.
    in_doubt_seconds: float = 30.0
    random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.retries <= RETRIES_MAX:
            raise ValueError(f"retries must be from 0 to {RETRIES_MAX}; got {self.retries}")
        if self.backoff_base_seconds < 0 or self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError("backoff seconds must satisfy 0 <= base <= max")
        if not 0 <= self.in_doubt_seconds <= IN_DOUBT_SECONDS_MAX:
            raise ValueError(f"in_doubt_seconds must be from 0 to {IN_DOUBT_SECONDS_MAX}; got {self.in_doubt_seconds}")

    def backoff_seconds(self, retry_number: int) -> float:
        """The wait before retry `retry_number` (1-based): base * 2^(n-1), capped, times a jitter in [0.5, 1)."""
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** (retry_number - 1))
        return ceiling * (0.5 + self.random() / 2)

    def delay_seconds(self, retry_number: int, retry_after_seconds: float | None, *, in_doubt: bool = False,
                      waited_seconds: float = 0.0) -> float | None:
        """The wait before retry `retry_number`, or None when no retry is left (or the API asks too long a wait).

        `in_doubt` (a keyed call whose outcome is still being decided) goes on past `retries` while
        the waits so far (`waited_seconds`) and this one stay within `in_doubt_seconds`.
        """
        if retry_after_seconds is None:
            delay = self.backoff_seconds(retry_number)
        elif retry_after_seconds > self.retry_after_max_seconds:
            return None
        else:
            delay = max(retry_after_seconds, 0.0)
        if retry_number <= self.retries:
            return delay
        if (in_doubt and retry_number <= self.retries + IN_DOUBT_RETRIES_MAX
                and waited_seconds + delay <= self.in_doubt_seconds):
            return delay
        return None


def retryable_error(error: httpx.TransportError, idempotent: bool) -> bool:
    """A transport error: retry when nothing was sent, or when a repeat is harmless."""
    return isinstance(error, NOT_SENT_ERRORS) or idempotent


def outcome_in_doubt(status: int, slug: str, keyed: bool) -> bool:
    """A keyed call's answer that says its outcome is still being decided, and will be told to the key."""
    return keyed and ((status == 409 and slug == KEY_IN_PROGRESS_SLUG) or (status == 503 and slug == OUTCOME_UNKNOWN_SLUG))


def retryable_status(status: int, slug: str, idempotent: bool) -> bool:
    if status == 429 or (status == 503 and slug in NOTHING_WRITTEN_503_SLUGS):
        return True
    if status == 409 and slug == KEY_IN_PROGRESS_SLUG:
        return True
    return status >= 500 and idempotent


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value[:9]))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max(0.0, (moment - (now or datetime.now(timezone.utc))).total_seconds())
