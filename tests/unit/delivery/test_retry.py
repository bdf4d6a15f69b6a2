"""Pure retry decisions: schedule parsing, backoff with jitter, Retry-After, outcomes, auto-disable."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from delivery.engine import retry
from delivery.engine.backpressure import SLOW_DOWN_STATUSES
from delivery.errors import RetryScheduleError, RetrySettingsError

NOW = datetime(2024, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


class FixedRandom:
    """A random source that always answers the same value, to pin jitter at its edges."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


MIDDLE = FixedRandom(0.5)  # no jitter: factor exactly 1


@pytest.mark.parametrize(
    ("attempt_number", "expected_seconds"),
    [(1, 0), (2, 5), (3, 300), (4, 1800), (5, 7200), (6, 18000), (7, 36000), (8, 36000), (9, None), (50, None)],
)
def test_default_schedule_delays(attempt_number: int, expected_seconds: float | None) -> None:
    """The default schedule is 0, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, then out of attempts."""
    assert retry.delay_before(attempt_number, retry.RetrySchedule(), MIDDLE) == expected_seconds


@pytest.mark.parametrize(
    ("random_value", "expected_seconds"),
    [(0.0, 240.0), (0.25, 270.0), (0.5, 300.0), (0.75, 330.0), (0.999999, pytest.approx(360.0, abs=0.001))],
)
def test_jitter_stays_within_twenty_percent(random_value: float, expected_seconds: float) -> None:
    """Jitter maps the random source's [0, 1) onto a factor in [0.8, 1.2) of the scheduled delay."""
    assert retry.delay_before(3, retry.RetrySchedule(), FixedRandom(random_value)) == expected_seconds


def test_jitter_with_a_seeded_generator_is_bounded_and_spread() -> None:
    """A real generator gives delays inside ±20% and not all the same (deliveries do not retry in step)."""
    rng = random.Random(7)
    delays = [retry.delay_before(4, retry.RetrySchedule(), rng) for _ in range(1000)]
    assert all(1440 <= delay < 2160 for delay in delays)
    assert len(set(delays)) > 900


def test_attempt_zero_is_a_programmer_error() -> None:
    """Attempt numbers start at 1; asking for attempt 0 raises instead of guessing."""
    with pytest.raises(ValueError):
        retry.delay_before(0, retry.RetrySchedule(), MIDDLE)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0,5,300,1800", (0, 5, 300, 1800)),
        (" 0 , 5 ,300 ", (0, 5, 300)),
        ("10", (10,)),
        ("0.5,1.5", (0.5, 1.5)),
    ],
)
def test_schedule_parses_from_text(text: str, expected: tuple[float, ...]) -> None:
    """The environment form "0,5,300" becomes the tuple of delays, spaces ignored."""
    assert retry.RetrySchedule.from_string(text).delays_seconds == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("0,,5", "delay 2 is ''"),
        ("0,five", "delay 2 is 'five'"),
        ("0,-1", "delay -1.0 is out of range"),
        ("0,nan", "delay nan is out of range"),
        ("0,inf", "delay inf is out of range"),
        ("0,604801", "out of range"),
        (",".join(["1"] * 51), "51 delays given"),
        ("1" * 1001, "longer than 1000 characters"),
    ],
)
def test_schedule_rejects_bad_text_clearly(text: str, fragment: str) -> None:
    """A malformed schedule raises RetryScheduleError whose message names the bad part."""
    with pytest.raises(RetryScheduleError) as caught:
        retry.RetrySchedule.from_string(text)
    assert fragment in str(caught.value)
    assert "comma-separated delays in seconds" in str(caught.value)


@pytest.mark.parametrize("jitter_fraction", [-0.1, 1.0, float("nan")])
def test_schedule_rejects_bad_jitter(jitter_fraction: float) -> None:
    """Jitter must be in [0, 1): a factor of 0 or below would make delays negative."""
    with pytest.raises(RetrySettingsError):
        retry.RetrySchedule(jitter_fraction=jitter_fraction)


@pytest.mark.parametrize(
    ("header", "expected_seconds"),
    [
        ("120", 120.0),
        ("0", 0.0),
        (" 30 ", 30.0),
        ("Fri, 01 Mar 2024 12:02:00 GMT", 120.0),  # IMF-fixdate
        ("Friday, 01-Mar-24 12:00:30 GMT", 30.0),  # RFC 850
        ("Fri Mar  1 12:01:00 2024", 60.0),  # asctime, no zone: GMT
        ("Fri, 01 Mar 2024 11:00:00 GMT", 0.0),  # in the past: no wait
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("9" * 65, None),
        ("٣", None),  # a non-ASCII digit is not delta-seconds
    ],
)
def test_parse_retry_after(header: str | None, expected_seconds: float | None) -> None:
    """Retry-After is delta-seconds or an HTTP-date measured from the given now; junk is ignored."""
    assert retry.parse_retry_after(header, NOW) == expected_seconds


@pytest.mark.parametrize(
    ("status_code", "expected_seconds"),
    [(429, 60.0), (502, 60.0), (503, 60.0), (504, 60.0), (500, None), (501, None), (505, None), (200, None),
     (301, None), (None, None)],
)
def test_retry_after_only_on_429_502_503_and_504(status_code: int | None, expected_seconds: float | None) -> None:
    """Only 429, 502, 503 and 504 ask us to wait; the same header on other statuses is ignored."""
    assert retry.retry_after_for(status_code, "60", NOW) == expected_seconds


@pytest.mark.parametrize(
    ("failed_attempt_number", "retry_after_seconds", "expected_seconds"),
    [
        (1, None, 5.0),  # backoff alone
        (1, 60.0, 60.0),  # the receiver asks for longer: honour it
        (3, 60.0, 1800.0),  # the backoff is longer: keep it
        (1, 10 * 86400.0, 86400.0),  # a huge Retry-After is capped at 24 h
        (8, 60.0, None),  # out of attempts, whatever the receiver asks
    ],
)
def test_next_delay_takes_the_later_of_backoff_and_retry_after(
    failed_attempt_number: int, retry_after_seconds: float | None, expected_seconds: float | None
) -> None:
    """The next delay is max(backoff, Retry-After), capped; None when the failed attempt was the last."""
    settings = retry.RetrySettings()
    assert retry.next_delay(failed_attempt_number, settings, MIDDLE, retry_after_seconds) == expected_seconds


def test_cap_bounds_the_backoff_too() -> None:
    """The cap is a bound on every delay, including one from the schedule itself."""
    settings = retry.RetrySettings(schedule=retry.RetrySchedule((0, 600)), delay_cap_seconds=60)
    assert retry.next_delay(1, settings, MIDDLE) == 60


@pytest.mark.parametrize(
    ("status_code", "outcome"),
    [
        (200, retry.Outcome.SUCCESS),
        (204, retry.Outcome.SUCCESS),
        (299, retry.Outcome.SUCCESS),
        (199, retry.Outcome.FAILURE),
        (302, retry.Outcome.FAILURE),
        (400, retry.Outcome.FAILURE),
        (404, retry.Outcome.FAILURE),
        (410, retry.Outcome.GONE),
        (429, retry.Outcome.FAILURE),
        (500, retry.Outcome.FAILURE),
        (None, retry.Outcome.FAILURE),  # timeout, refused, DNS, reset, SSRF refusal
    ],
)
def test_classify(status_code: int | None, outcome: retry.Outcome) -> None:
    """2xx succeeds, 410 means gone, every other status and every network failure is a failure."""
    assert retry.classify(status_code) is outcome


def streak(first_ago: timedelta | None, last_ago: timedelta | None, count: int, success: bool = False) -> retry.FailureStreak:
    return retry.FailureStreak(
        first_failure_at=None if first_ago is None else NOW - first_ago,
        last_failure_at=None if last_ago is None else NOW - last_ago,
        failure_count=count,
        success_since_first_failure=success,
    )


@pytest.mark.parametrize(
    ("summary", "disable"),
    [
        (streak(6 * DAY, 0 * DAY, 20), True),  # failing for 6 days: disable
        (streak(5 * DAY, 0 * DAY, 2), True),  # exactly 5 days, two failures
        (streak(5 * DAY - HOUR, 0 * DAY, 20), False),  # not yet 5 days
        (streak(6 * DAY, 0 * DAY, 20, success=True), False),  # a success broke the streak
        (streak(6 * DAY, 6 * DAY, 1), False),  # one failure long ago is not a streak
        (streak(6 * DAY, 6 * DAY - HOUR, 2), False),  # two failures, but only an hour apart
        (streak(None, None, 0), False),  # never failed
    ],
)
def test_auto_disable_default_policy(summary: retry.FailureStreak, disable: bool) -> None:
    """Default: disable only when failures span 5 days with no success and at least 2 failures."""
    assert (retry.disable_reason(summary, retry.AutoDisablePolicy()) is not None) is disable


@pytest.mark.parametrize(
    ("policy", "summary", "disable"),
    [
        (retry.AutoDisablePolicy(failing_seconds_min=3600, failure_spread_seconds_min=0), streak(2 * HOUR, 0 * HOUR, 2), True),
        (retry.AutoDisablePolicy(failing_seconds_min=3600, failures_min=5), streak(2 * DAY, 0 * HOUR, 4), False),
        # The spread rule still holds when the streak threshold is configured below it.
        (retry.AutoDisablePolicy(failing_seconds_min=0), streak(HOUR, 0 * HOUR, 3), False),
        (retry.AutoDisablePolicy(failing_seconds_min=0), streak(13 * HOUR, 0 * HOUR, 3), True),
    ],
)
def test_auto_disable_thresholds_are_configurable(
    policy: retry.AutoDisablePolicy, summary: retry.FailureStreak, disable: bool
) -> None:
    """Each threshold of the auto-disable policy is honoured when configured."""
    assert (retry.disable_reason(summary, policy) is not None) is disable


def test_disable_reason_names_the_evidence() -> None:
    """The stored reason says when the streak ran and how many failures it had."""
    reason = retry.disable_reason(streak(6 * DAY, 0 * DAY, 20), retry.AutoDisablePolicy())
    assert reason is not None
    assert "20 failures" in reason and "6.0 days" in reason and "2024-02-24" in reason


@pytest.mark.parametrize(
    "build",
    [
        lambda: retry.AutoDisablePolicy(failures_min=0),
        lambda: retry.AutoDisablePolicy(failing_seconds_min=-1),
        lambda: retry.RetrySettings(delay_cap_seconds=0),
        lambda: retry.RetrySettings(delay_cap_seconds=float("inf")),
    ],
)
def test_bad_settings_are_refused(build) -> None:
    """Settings out of range fail at construction, not at the first retry."""
    with pytest.raises(RetrySettingsError):
        build()


def test_the_receivers_clock_comes_from_its_date_header_else_ours() -> None:
    assert retry.receiver_now("Mon, 01 Jan 2001 00:00:00 GMT") == datetime(2001, 1, 1, tzinfo=timezone.utc)
    for missing in (None, "", "not a date", "x" * 1000):
        assert abs((retry.receiver_now(missing) - datetime.now(timezone.utc)).total_seconds()) < 5


def test_retry_after_is_read_on_every_status_that_slows_the_endpoint() -> None:
    """The statuses whose Retry-After pauses an endpoint are exactly those that halve its concurrency."""
    assert retry.RETRY_AFTER_STATUSES == SLOW_DOWN_STATUSES == {429, 502, 503, 504}
