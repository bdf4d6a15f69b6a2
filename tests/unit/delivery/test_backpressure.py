"""Backpressure's pure decisions: which answers slow an endpoint down, how its concurrency halves
once per round of sends and grows back by about one per round of successes, and how a pause is
bounded."""

from __future__ import annotations

import aiohttp
import pytest

from delivery.engine.backpressure import Backpressure, says_slow_down
from delivery.engine.sender_aiohttp import describe_failure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("status_code", "error", "expected"), [
    (429, "http 429", True), (502, None, True), (503, None, True), (504, None, True),
    (500, None, False), (200, None, False), (410, None, False), (None, "connection refused", False),
    (None, "timeout after 1000 ms", False), (None, "connect timeout after 1000 ms", True), (None, None, False),
])
def test_which_answers_say_slow_down(status_code, error, expected) -> None:
    assert says_slow_down(status_code, error) is expected


def test_a_connect_timeout_is_described_as_one() -> None:
    """The sender's text for aiohttp's ConnectionTimeoutError is what backpressure looks for."""
    text = describe_failure(aiohttp.ConnectionTimeoutError("connect"), 1500)
    assert text == "connect timeout after 1500 ms" and says_slow_down(None, text)
    assert not says_slow_down(None, describe_failure(TimeoutError(), 1500))


def test_one_round_of_429s_halves_once_and_successes_grow_it_back() -> None:
    clock = Clock()
    pressure = Backpressure(16, clock=clock)
    assert pressure.limit("e") == 16 and pressure.endpoints == 0
    # 16 sends left at 99.0; all answer 429: only the first halves (the rest were on the wire already).
    for _ in range(16):
        pressure.observe("e", 429, "http 429", None, sent_at=99.0)
    assert pressure.limit("e") == 8
    clock.now = 101.0
    pressure.observe("e", 503, None, None, sent_at=100.5)  # left after the halving: halves again
    assert pressure.limit("e") == 4
    for _ in range(10):
        clock.now += 1
        pressure.observe("e", 429, None, None, sent_at=clock.now)
    assert pressure.limit("e") == 1, "never below one"
    grew = [pressure.observe("e", 200, None, None, sent_at=clock.now) for _ in range(200)]
    assert pressure.limit("e") == 16 and pressure.endpoints == 0, "back at the bound: forgotten"
    # 1 -> 2 after one success, then about one more per round of successes: 15 steps, each reported once.
    assert sum(grew) == 15 and grew[0] and not grew[1]
    successes_to_the_bound = max(index for index, step in enumerate(grew) if step) + 1
    assert 100 <= successes_to_the_bound <= 130, "about the sum of 1..15: one step per round of sends"


def test_an_answer_never_sent_and_other_endpoints_are_left_alone() -> None:
    pressure = Backpressure(4, clock=Clock())
    assert not pressure.observe("e", 429, None, 5.0, sent_at=0.0)
    assert pressure.limit("e") == 4 and pressure.paused_for("e") == 0.0
    pressure.observe("e", 429, None, None, sent_at=1.0)
    assert (pressure.limit("e"), pressure.limit("f")) == (2, 4)


def test_a_retry_after_pauses_the_endpoint_bounded_by_the_longest_retry_delay() -> None:
    clock = Clock()
    pressure = Backpressure(8, pause_seconds_max=30.0, clock=clock)
    pressure.observe("e", 503, None, 2.0, sent_at=99.0)
    assert pressure.paused_for("e") == 2.0 and pressure.paused_for("f") == 0.0
    clock.now += 1.5
    assert pressure.paused_for("e") == pytest.approx(0.5)
    pressure.pause("e", 0.1)  # shorter than what is left: the longer pause stands
    assert pressure.paused_for("e") == pytest.approx(0.5)
    pressure.observe("e", 429, None, 3600.0, sent_at=clock.now)
    assert pressure.paused_for("e") == 30.0, "at most the longest retry delay"
    clock.now += 30.0
    assert pressure.paused_for("e") == 0.0
    pressure.observe("e", 500, None, 60.0, sent_at=clock.now)  # not a slow-down answer: no pause
    assert pressure.paused_for("e") == 0.0
