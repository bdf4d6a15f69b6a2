"""Retry decisions, all pure: backoff with jitter, Retry-After, outcome, and auto-disable.

Nothing here reads a clock, a random source or the network. The caller passes "now" and the
random source, so the worker can use PostgreSQL's clock and tests can use fixed values.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Protocol

from delivery.errors import RetryScheduleError, RetrySettingsError

# Delays before attempts 1..8: immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
DEFAULT_DELAYS_SECONDS: tuple[float, ...] = (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
DEFAULT_JITTER_FRACTION = 0.2
ATTEMPTS_MAX = 50
DELAY_SECONDS_MAX = 7 * 24 * 3600
SCHEDULE_TEXT_CHARS_MAX = 1000

# Retry-After is honoured on these statuses only: the ones the Standard Webhooks spec names as the
# receiver asking senders to slow down (429 Too Many Requests, 502 Bad Gateway, 503 Service
# Unavailable, 504 Gateway Timeout). Behind a gateway a 502 or 504 may carry the upstream's wait.
RETRY_AFTER_STATUSES = frozenset({429, 502, 503, 504})
# A Retry-After value longer than this is garbage, not a delay; a bound before int().
RETRY_AFTER_CHARS_MAX = 64
DEFAULT_DELAY_CAP_SECONDS = 24 * 3600

GONE_STATUS = 410
GONE_REASON = "receiver answered 410 Gone"


class RandomSource(Protocol):
    """Anything with random() -> float in [0, 1), e.g. random.Random(seed)."""

    def random(self) -> float: ...


@dataclass(frozen=True)
class RetrySchedule:
    """Delays before each attempt, in seconds; attempt 1 is the first send.

    The number of delays is the number of attempts. Each delay is stretched or shrunk by up to
    jitter_fraction at random so that deliveries failing together do not retry together.
    """

    delays_seconds: tuple[float, ...] = DEFAULT_DELAYS_SECONDS
    jitter_fraction: float = DEFAULT_JITTER_FRACTION

    def __post_init__(self) -> None:
        if not 1 <= len(self.delays_seconds) <= ATTEMPTS_MAX:
            raise RetryScheduleError(f"{len(self.delays_seconds)} delays given")
        for delay in self.delays_seconds:
            if not (math.isfinite(delay) and 0 <= delay <= DELAY_SECONDS_MAX):
                raise RetryScheduleError(f"delay {delay!r} is out of range")
        if not (math.isfinite(self.jitter_fraction) and 0 <= self.jitter_fraction < 1):
            raise RetrySettingsError(f"jitter_fraction must be at least 0 and below 1, got {self.jitter_fraction!r}")

    @property
    def attempts_max(self) -> int:
        return len(self.delays_seconds)

    @classmethod
    def from_string(cls, text: str, jitter_fraction: float = DEFAULT_JITTER_FRACTION) -> RetrySchedule:
        """Parse "0,5,300,1800" (seconds; spaces allowed), the form an environment variable holds."""
        if len(text) > SCHEDULE_TEXT_CHARS_MAX:
            raise RetryScheduleError(f"longer than {SCHEDULE_TEXT_CHARS_MAX} characters")
        parts = [part.strip() for part in text.split(",")]
        if parts == [""]:
            raise RetryScheduleError("empty")
        delays: list[float] = []
        for position, part in enumerate(parts, start=1):
            try:
                delay = float(part)
            except ValueError:
                raise RetryScheduleError(f"delay {position} is {part!r}, not a number of seconds") from None
            delays.append(delay)
        return cls(tuple(delays), jitter_fraction)


@dataclass(frozen=True)
class AutoDisablePolicy:
    """When an endpoint that keeps failing is switched off.

    Defaults: every attempt failed for at least 5 days, with at least 2 failures 12 h apart
    (so a single failure, or a burst within minutes, never disables an endpoint).
    """

    failing_seconds_min: float = 5 * 24 * 3600
    failures_min: int = 2
    failure_spread_seconds_min: float = 12 * 3600

    def __post_init__(self) -> None:
        if not (math.isfinite(self.failing_seconds_min) and self.failing_seconds_min >= 0):
            raise RetrySettingsError(f"failing_seconds_min must be at least 0, got {self.failing_seconds_min!r}")
        if self.failures_min < 1:
            raise RetrySettingsError(f"failures_min must be at least 1, got {self.failures_min!r}")
        if not (math.isfinite(self.failure_spread_seconds_min) and self.failure_spread_seconds_min >= 0):
            raise RetrySettingsError(
                f"failure_spread_seconds_min must be at least 0, got {self.failure_spread_seconds_min!r}"
            )


@dataclass(frozen=True)
class RetrySettings:
    """Everything the retry decisions need; one frozen value built from the environment."""

    schedule: RetrySchedule = field(default_factory=RetrySchedule)
    delay_cap_seconds: float = DEFAULT_DELAY_CAP_SECONDS
    auto_disable: AutoDisablePolicy = field(default_factory=AutoDisablePolicy)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delay_cap_seconds) and 0 < self.delay_cap_seconds <= DELAY_SECONDS_MAX):
            raise RetrySettingsError(f"delay_cap_seconds must be above 0 and at most {DELAY_SECONDS_MAX}")


# Backoff and Retry-After.


def delay_before(attempt_number: int, schedule: RetrySchedule, rng: RandomSource) -> float | None:
    """Seconds to wait before attempt `attempt_number` (1-based), jittered; None when out of attempts."""
    if attempt_number < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt_number}")
    if attempt_number > schedule.attempts_max:
        return None
    delay = schedule.delays_seconds[attempt_number - 1]
    # rng.random() is in [0, 1); map it to a factor in [1 - jitter, 1 + jitter).
    factor = 1 + schedule.jitter_fraction * (2 * rng.random() - 1)
    return delay * factor


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds asked for by a Retry-After header (delta-seconds or HTTP-date); None if absent or malformed.

    A date in the past asks for no wait (0). `now` must be timezone-aware.
    """
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > RETRY_AFTER_CHARS_MAX:
        return None
    if text.isascii() and text.isdigit():
        return float(int(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # HTTP dates are always GMT; asctime form carries no zone, so say so explicitly.
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def receiver_now(date_header: str | None) -> datetime:
    """The receiver's clock when it answered, from its Date header, else ours.

    An HTTP-date Retry-After is measured against the clock that wrote it: the wait then comes out
    the same whatever our clock says, and is added to PostgreSQL's now() when it is recorded.
    """
    if date_header and len(date_header) <= RETRY_AFTER_CHARS_MAX:
        try:
            when = parsedate_to_datetime(date_header.strip())
        except (TypeError, ValueError, IndexError):
            when = None
        if when is not None:
            return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    return datetime.now(timezone.utc)


def retry_after_for(status_code: int | None, header: str | None, now: datetime) -> float | None:
    """The Retry-After wait to honour for this response, only on 429, 502, 503 and 504."""
    if status_code not in RETRY_AFTER_STATUSES:
        return None
    return parse_retry_after(header, now)


def next_delay(
    failed_attempt_number: int,
    settings: RetrySettings,
    rng: RandomSource,
    retry_after_seconds: float | None = None,
) -> float | None:
    """Seconds until the attempt after `failed_attempt_number`; None when that was the last one.

    The later of the jittered backoff and the receiver's Retry-After, capped so that no
    receiver can park a delivery for longer than the cap.
    """
    backoff = delay_before(failed_attempt_number + 1, settings.schedule, rng)
    if backoff is None:
        return None
    delay = backoff if retry_after_seconds is None else max(backoff, retry_after_seconds)
    return min(delay, settings.delay_cap_seconds)


# Outcomes.


class Outcome(enum.Enum):
    """What one attempt means for the delivery and its endpoint."""

    SUCCESS = "success"
    FAILURE = "failure"
    # A failed attempt that also says: disable the endpoint, the receiver does not want more.
    GONE = "gone"


def classify(status_code: int | None) -> Outcome:
    """2xx is success; 410 is gone; anything else, including no response at all, is a failure."""
    if status_code is None:
        return Outcome.FAILURE
    if 200 <= status_code <= 299:
        return Outcome.SUCCESS
    if status_code == GONE_STATUS:
        return Outcome.GONE
    return Outcome.FAILURE


# Auto-disable.


@dataclass(frozen=True)
class FailureStreak:
    """An endpoint's current run of failed attempts, as the database summarises it."""

    first_failure_at: datetime | None
    last_failure_at: datetime | None
    failure_count: int
    success_since_first_failure: bool


def warning_policy(policy: AutoDisablePolicy) -> AutoDisablePolicy:
    """Half of what disables an endpoint: a streak that meets it is warned of (endpoint.failing)."""
    return AutoDisablePolicy(policy.failing_seconds_min / 2, max(1, math.ceil(policy.failures_min / 2)),
                             policy.failure_spread_seconds_min / 2)


def disable_reason(streak: FailureStreak, policy: AutoDisablePolicy) -> str | None:
    """The reason to store when the endpoint should be disabled now; None to keep it enabled.

    Measured from the streak's own failure times, not from a clock: the evidence is that
    failures span the whole period, not merely that time has passed since one failure.
    """
    if streak.success_since_first_failure or streak.first_failure_at is None or streak.last_failure_at is None:
        return None
    if streak.failure_count < policy.failures_min:
        return None
    span = streak.last_failure_at - streak.first_failure_at
    if span < timedelta(seconds=max(policy.failing_seconds_min, policy.failure_spread_seconds_min)):
        return None
    return (
        f"every attempt failed from {streak.first_failure_at.isoformat()} to "
        f"{streak.last_failure_at.isoformat()} ({streak.failure_count} failures over "
        f"{span.total_seconds() / 86400:.1f} days)"
    )
