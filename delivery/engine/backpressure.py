"""Backpressure: an endpoint that says "slow down" gets fewer sends at once, and a pause when it asks.

Pure bookkeeping for one worker, no I/O; the sender feeds it every answer and asks it two things
before a send starts: how many sends of the endpoint may run at once (send_lanes), and whether
the endpoint is paused.

- A 429, 502, 503 or 504, or a connect that timed out, halves the endpoint's concurrency
  (at least 1); each answer that is not one of those adds 1/limit to it, so it grows back by
  about one send per round of sends (AIMD, as TCP does), up to the sender's per-endpoint bound.
  Only a send that started after the last halving can halve again: the sends already on the
  wire when the first 429 came back answer 429 too, and they say nothing new.
- A Retry-After on a 429, 502, 503 or 504 (delivery.engine.retry reads it) pauses the whole endpoint for
  that long, at most `pause_seconds_max` (the longest delay of the retry schedule): sends of it
  that have not started are held back (the engine gives their claims back, no attempt spent).
  delivery.engine.throttle shares the pause with the other workers through Redis.

Endpoints back at the full bound and not paused are forgotten, and at most ENDPOINTS_TRACKED_MAX
are tracked (the oldest entries go first), so the map stays bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

SLOW_DOWN_STATUSES = frozenset({429, 502, 503, 504})
CONNECT_TIMEOUT_ERROR_PREFIX = "connect timeout"  # how delivery.engine.sender describes one
ENDPOINTS_TRACKED_MAX = 100_000
DECREASE_FACTOR = 0.5


def says_slow_down(status_code: int | None, error: str | None) -> bool:
    """Whether an answer asks the sender to slow down: 429, 502, 503, 504, or a connect timeout."""
    if status_code is not None:
        return status_code in SLOW_DOWN_STATUSES
    return error is not None and error.startswith(CONNECT_TIMEOUT_ERROR_PREFIX)


class _Pressure:
    __slots__ = ("limit", "decreased_at", "paused_until")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.decreased_at = float("-inf")
        self.paused_until = float("-inf")


class Backpressure:
    def __init__(self, ceiling: int, *, pause_seconds_max: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ceiling < 1:
            raise ValueError("the per-endpoint bound must be at least 1")
        self.ceiling = ceiling
        self.pause_seconds_max = pause_seconds_max
        self._clock = clock
        self._endpoints: dict[Hashable, _Pressure] = {}

    def limit(self, endpoint: Hashable) -> int:
        """How many sends of the endpoint may run at once now."""
        pressure = self._endpoints.get(endpoint)
        return self.ceiling if pressure is None else max(1, int(pressure.limit))

    def paused_for(self, endpoint: Hashable) -> float:
        """Seconds left of the endpoint's pause; 0.0 when it is not paused."""
        pressure = self._endpoints.get(endpoint)
        if pressure is None:
            return 0.0
        left = pressure.paused_until - self._clock()
        if left > 0:
            return left
        self._forget_if_idle(endpoint, pressure)
        return 0.0

    def pause(self, endpoint: Hashable, seconds: float) -> float:
        """Pause the endpoint for `seconds` (bounded by pause_seconds_max) unless it is paused for
        longer already; returns the pause's length from now."""
        seconds = min(max(0.0, seconds), self.pause_seconds_max)
        if seconds <= 0:
            return self.paused_for(endpoint)
        pressure = self._entry(endpoint)
        pressure.paused_until = max(pressure.paused_until, self._clock() + seconds)
        return pressure.paused_until - self._clock()

    def observe(self, endpoint: Hashable, status_code: int | None, error: str | None,
                retry_after_seconds: float | None, sent_at: float) -> bool:
        """Take in one answer (sent_at: time.monotonic() when its request left, 0.0: never sent).
        Returns True when the endpoint's limit grew by a whole send (one more may start now)."""
        if not sent_at:
            return False  # never left: it says nothing about the endpoint
        if says_slow_down(status_code, error):
            pressure = self._entry(endpoint)
            if sent_at >= pressure.decreased_at:
                pressure.limit = max(1.0, pressure.limit * DECREASE_FACTOR)
                pressure.decreased_at = self._clock()
            if retry_after_seconds:
                self.pause(endpoint, retry_after_seconds)
            return False
        pressure = self._endpoints.get(endpoint)
        if pressure is None:
            return False
        before = int(pressure.limit)
        pressure.limit = min(float(self.ceiling), pressure.limit + 1.0 / pressure.limit)
        grew = int(pressure.limit) > before
        self._forget_if_idle(endpoint, pressure)
        return grew

    def _entry(self, endpoint: Hashable) -> _Pressure:
        pressure = self._endpoints.get(endpoint)
        if pressure is None:
            if len(self._endpoints) >= ENDPOINTS_TRACKED_MAX:
                del self._endpoints[next(iter(self._endpoints))]
            pressure = self._endpoints[endpoint] = _Pressure(float(self.ceiling))
        return pressure

    def _forget_if_idle(self, endpoint: Hashable, pressure: _Pressure) -> None:
        if pressure.limit >= self.ceiling and pressure.paused_until <= self._clock():
            del self._endpoints[endpoint]

    @property
    def endpoints(self) -> int:
        """Endpoints slowed down or paused."""
        return len(self._endpoints)
