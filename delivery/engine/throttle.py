"""Per-endpoint throttle: every worker together sends at most rate_limit_per_second to an endpoint.

The workers share one bucket per endpoint in Redis, taken by an atomic Lua script on Redis's
own clock (TIME), so the workers' clocks never meet: GCRA, a "theoretical arrival time" per
endpoint, each send moving it on by one spacing. Sends are spaced SPACING_FACTOR / limit seconds
apart, a little more than 1 / limit: a receiver counting by its own clock then sees at most the
limit in any second even when the network or a busy worker delays some sends by up to a tenth of
a second more than the ones after them.

A delivery the throttle holds back stays pending and spends nothing: the worker holds it before
its send starts, at most HOLD_SECONDS_MAX (far inside its lease); one that would wait longer has
its claim given back at once (the attempt it took is handed back too, delivery.engine.results)
and is due again when the bucket should have room for it: the claims given back book slots one
spacing apart after the last slot booked (a second key per endpoint, the booking horizon), so a
backlog is spread over the time the limit needs for it and each delivery comes back about once,
not again and again. So a backlog of a throttled endpoint never fills a worker, and the other
endpoints' sends go on beside it.

If Redis cannot be reached, each worker keeps a bucket of its own for the endpoint, spaced for its
share: the limit divided by the workers that last used the shared buckets (each names itself in
a sorted set as it takes a token), never more than the limit.

The same Redis keeps an endpoint's pause (a Retry-After, delivery.engine.backpressure): a key
that expires when the pause ends, read before each batch's sends start, so every worker holds
the endpoint's sends, not only the one that was told. Without Redis each worker pauses on what it
was told itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import NamedTuple

from delivery import metrics
from delivery.engine.backpressure import Backpressure, says_slow_down
from delivery.engine.queue import REDIS_ERRORS
from delivery.engine.sender import SendRequest, SendResult, not_sent_held

logger = logging.getLogger(__name__)

SPACING_FACTOR = 1.1  # sends are spaced this many times 1 / limit apart (see above)
HOLD_SECONDS_MAX = 1.0  # a send waits for the bucket at most this long before its claim is given back
RELEASE_DELAY_SECONDS_MIN = 1.0
RELEASE_DELAY_SECONDS_MAX = 300.0
WORKERS_LIVE_SECONDS = 30  # a worker that took no token for this long no longer counts in the share
REDIS_RETRY_SECONDS = 1.0  # after a Redis error, the worker's own buckets for this long before asking again
PAUSE_ENDPOINTS_READ_MAX = 1000  # endpoints whose pause one batch reads from Redis
BUCKET_KEY_PREFIX = "hookledger:throttle:"  # + endpoint id: its theoretical arrival time, microseconds
BOOKED_KEY_PREFIX = "hookledger:throttle-booked:"  # + endpoint id: the end of the slots booked for claims given back
PAUSE_KEY_PREFIX = "hookledger:paused:"  # + endpoint id: exists while the endpoint is paused
WORKERS_KEY = "hookledger:throttle:workers"

# KEYS: the endpoint's bucket, the workers' set. ARGV: spacing in microseconds, this worker's name,
# the liveness window in microseconds. Returns {microseconds to wait (0: taken), live workers}.
# replicate_commands lets a script write after TIME on Redis before 5 (later ones do it always).
_TAKE = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local spacing = tonumber(ARGV[1])
local arrival = tonumber(redis.call('GET', KEYS[1]) or '0')
local wait = 0
if arrival > now then
  wait = arrival - now
else
  redis.call('SET', KEYS[1], string.format('%.0f', now + spacing), 'PX', math.floor(spacing / 1000) + 1000)
end
redis.call('ZADD', KEYS[2], string.format('%.0f', now), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now - tonumber(ARGV[3])))
redis.call('PEXPIRE', KEYS[2], math.floor(tonumber(ARGV[3]) / 1000))
return {math.floor(wait), redis.call('ZCARD', KEYS[2])}
"""

# KEYS: the endpoint's booking horizon. ARGV: spacing in microseconds, slots to book, earliest start
# in microseconds from now. Returns the microseconds from now to the first slot booked.
_BOOK = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local start = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now + tonumber(ARGV[3]))
local finish = start + tonumber(ARGV[1]) * tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%.0f', finish), 'PX', math.floor((finish - now) / 1000) + 1000)
return math.floor(start - now)
"""


def spacing_seconds(rate_limit_per_second: int) -> float:
    return SPACING_FACTOR / rate_limit_per_second


class _Held(NamedTuple):
    request: SendRequest
    future: asyncio.Future
    deadline: float  # time.monotonic() after which it is given back rather than held
    number: int  # its place among the gate's sends, from 1: counted as held once (metrics)


class _Gate:
    """The sends of one throttled endpoint that this worker holds, in the order they came."""

    __slots__ = ("endpoint_id", "rate", "held", "pump", "submitted", "counted_through")

    def __init__(self, endpoint_id: str, rate: int) -> None:
        self.endpoint_id = endpoint_id
        self.rate = rate
        self.held: collections.deque[_Held] = collections.deque()
        self.pump: asyncio.Task | None = None
        self.submitted = 0  # sends submitted to the gate so far: the last one's number
        self.counted_through = 0  # the sends numbered up to this one were counted as held, or left at once


class Throttle:
    def __init__(self, redis, backpressure: Backpressure, *, clock: Callable[[], float] = time.monotonic,
                 reachable: Callable[[], bool] = lambda: True) -> None:
        self._redis = redis
        # False while the worker finds Redis down (its poll loop says so): no call waits out a timeout then.
        self._reachable = reachable
        self._take = None if redis is None else redis.register_script(_TAKE)
        self._book = None if redis is None else redis.register_script(_BOOK)
        self.backpressure = backpressure
        self._clock = clock
        self._name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._gates: dict[str, _Gate] = {}
        self._local_arrivals: dict[str, float] = {}  # endpoint -> this worker's own next send time
        self._local_booked: dict[str, float] = {}  # endpoint -> the end of the slots this worker booked
        self.workers = 1  # workers taking tokens, as Redis last said
        self._redis_down_until = float("-inf")
        self._closing = False
        self._background: set[asyncio.Task] = set()

    def submit(self, rate_limit_per_second: int | None, request: SendRequest,
               send: Callable[[SendRequest], asyncio.Future[SendResult]]) -> asyncio.Future[SendResult]:
        """Send at once (no limit), or hold the send until the endpoint's bucket has room for it;
        a send that would wait past HOLD_SECONDS_MAX (or its lease) comes back held (not_sent_held)."""
        if rate_limit_per_second is None:
            return send(request)
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        if self._closing:
            future.cancel()
            return future
        gate = self._gates.get(request.endpoint_id)
        if gate is None:
            gate = self._gates[request.endpoint_id] = _Gate(request.endpoint_id, rate_limit_per_second)
        gate.rate = rate_limit_per_second
        deadline = self._clock() + HOLD_SECONDS_MAX
        if request.not_after is not None:
            deadline = min(deadline, request.not_after - request.timeout_ms / 1000)
        gate.submitted += 1
        gate.held.append(_Held(request, future, deadline, gate.submitted))
        if gate.pump is None:
            gate.pump = asyncio.get_running_loop().create_task(self._pump(gate, send))
        return future

    async def _pump(self, gate: _Gate, send: Callable[[SendRequest], asyncio.Future[SendResult]]) -> None:
        try:
            while gate.held and not self._closing:
                head = gate.held[0]
                if head.future.done():
                    gate.held.popleft()
                    continue
                paused_for = self.backpressure.paused_for(gate.endpoint_id)
                if paused_for > 0:
                    self._give_back(gate, lambda index: paused_for, "paused")
                    continue
                wait = await self.take_token(gate.endpoint_id, gate.rate)
                if wait <= 0:
                    try:
                        sending = send(head.request)
                    except RuntimeError:  # the sender is closing (shutdown): what is held goes back unsent
                        self._give_back(gate, lambda index: RELEASE_DELAY_SECONDS_MIN, "shutdown")
                        break
                    gate.held.popleft()
                    _chain(sending, head.future)
                    continue
                await self._give_back_late(gate, wait)
                if gate.held:
                    await asyncio.sleep(max(0.0, min(wait, gate.held[0].deadline - self._clock())))
        except Exception:  # noqa: BLE001 - a bug here must not strand the sends it holds
            logger.exception("the throttle of endpoint %s failed; its held sends are given back", gate.endpoint_id)
            self._give_back(gate, lambda index: RELEASE_DELAY_SECONDS_MIN, "error")
        finally:
            gate.pump = None
            if gate.held and not self._closing:  # held while this pump ended: a new one takes them
                gate.pump = asyncio.get_running_loop().create_task(self._pump(gate, send))
            elif not gate.held:
                self._gates.pop(gate.endpoint_id, None)

    async def _give_back_late(self, gate: _Gate, wait: float) -> None:
        """The bucket is empty for `wait` seconds: give back the held sends that this worker's share
        of the limit would not start before their deadline, each due at a slot booked for it."""
        now = self._clock()
        spacing_here = spacing_seconds(gate.rate) * max(1, self.workers)  # this worker's share
        kept: collections.deque[_Held] = collections.deque()
        late: list[_Held] = []
        newly_held = 0
        for held in gate.held:
            if held.future.done():
                continue
            newly_held += held.number > gate.counted_through
            if now + wait + len(kept) * spacing_here <= held.deadline:
                kept.append(held)
            else:
                late.append(held)
        gate.held = kept
        gate.counted_through = gate.submitted  # those not held now left before the bucket ran dry
        if newly_held:
            metrics.THROTTLE_SENDS_HELD.inc(newly_held)
        if not late:
            return
        first, slot = await self._book_slots(gate.endpoint_id, gate.rate, len(late), wait + len(kept) * spacing_here)
        given_back = 0
        for index, held in enumerate(late):
            if not held.future.done():
                held.future.set_result(not_sent_held(_bounded_delay(first + index * slot)))
                given_back += 1
        if given_back:
            metrics.HELD_GIVEN_BACK.labels("rate_limit").inc(given_back)

    async def _book_slots(self, endpoint_id: str, rate: int, count: int, earliest: float) -> tuple[float, float]:
        """Book `count` slots of the endpoint, after the last one booked and no sooner than `earliest`
        seconds from now: (seconds from now to the first, seconds between two)."""
        spacing = spacing_seconds(rate)
        if self._book is not None and self._asks_redis():
            try:
                first_us = await self._book(keys=[BOOKED_KEY_PREFIX + endpoint_id],
                                            args=[max(1, round(spacing * 1_000_000)), count,
                                                  max(0, round(earliest * 1_000_000))])
                return int(first_us) / 1_000_000, spacing
            except REDIS_ERRORS as error:
                logger.warning("could not book the throttle's slots in Redis (%r)", error)
                self._redis_down_until = self._clock() + REDIS_RETRY_SECONDS
        now = self._clock()  # without Redis: this worker's own slots, spaced for its share
        spacing *= max(1, self.workers)
        start = max(self._local_booked.get(endpoint_id, now), now + earliest)
        if len(self._local_booked) >= 100_000:
            self._local_booked.clear()
        self._local_booked[endpoint_id] = start + count * spacing
        return start - now, spacing

    def _give_back(self, gate: _Gate, delay_of: Callable[[int], float], reason: str) -> None:
        """Answer every held send as not sent, due again after delay_of(its place); counted by reason."""
        given_back = 0
        for index, held in enumerate(gate.held):
            if not held.future.done():
                held.future.set_result(not_sent_held(_bounded_delay(delay_of(index))))
                given_back += 1
        gate.held.clear()
        if given_back:
            metrics.HELD_GIVEN_BACK.labels(reason).inc(given_back)

    async def take_token(self, endpoint_id: str, rate: int) -> float:
        """Take a token of the endpoint's bucket: 0.0 when taken, else the seconds until one is free."""
        spacing = spacing_seconds(rate)
        if self._take is not None and self._asks_redis():
            try:
                wait_us, workers = await self._take(
                    keys=[BUCKET_KEY_PREFIX + endpoint_id, WORKERS_KEY],
                    args=[max(1, round(spacing * 1_000_000)), self._name, WORKERS_LIVE_SECONDS * 1_000_000],
                )
                self.workers = max(1, int(workers))
                return int(wait_us) / 1_000_000
            except REDIS_ERRORS as error:
                logger.warning("the throttle's Redis is unreachable (%r): this worker sends its own share of each"
                               " limit (divided by the %d workers last seen)", error, self.workers)
                self._redis_down_until = self._clock() + REDIS_RETRY_SECONDS
        return self._take_locally(endpoint_id, spacing * max(1, self.workers))

    def _asks_redis(self) -> bool:
        return self._clock() >= self._redis_down_until and self._reachable()

    def _take_locally(self, endpoint_id: str, spacing: float) -> float:
        """The worker's own bucket, spaced for its share of the limit."""
        now = self._clock()
        arrival = self._local_arrivals.get(endpoint_id, float("-inf"))
        if arrival > now:
            return arrival - now
        if len(self._local_arrivals) >= 100_000:
            self._local_arrivals.clear()
        self._local_arrivals[endpoint_id] = now + spacing
        return 0.0

    async def read_pauses(self, endpoint_ids: Iterable[uuid.UUID]) -> None:
        """Take in the pauses other workers shared for these endpoints (one round trip)."""
        if self._redis is None or not self._asks_redis():
            return
        names = list(dict.fromkeys(str(endpoint_id) for endpoint_id in endpoint_ids))[:PAUSE_ENDPOINTS_READ_MAX]
        if not names:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.pttl(PAUSE_KEY_PREFIX + name)
                left_ms = await pipe.execute()
        except REDIS_ERRORS as error:
            logger.warning("could not read the endpoints' pauses from Redis (%r)", error)
            self._redis_down_until = self._clock() + REDIS_RETRY_SECONDS
            return
        for name, milliseconds in zip(names, left_ms):
            if milliseconds is not None and int(milliseconds) > 0:
                self.backpressure.pause(name, int(milliseconds) / 1000)

    def observed(self, endpoint_id: uuid.UUID, result: SendResult) -> None:
        """An answer came in: a Retry-After that pauses the endpoint is shared with the other workers."""
        if not result.retry_after_seconds or not result.sent_at or not says_slow_down(result.status_code, result.error):
            return
        seconds = min(result.retry_after_seconds, self.backpressure.pause_seconds_max)
        if seconds > 0:
            metrics.ENDPOINT_PAUSES.inc()
        if self._redis is None or seconds <= 0 or not self._asks_redis():
            return
        task = asyncio.get_running_loop().create_task(self._share_pause(str(endpoint_id), seconds))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _share_pause(self, endpoint_id: str, seconds: float) -> None:
        """Set the endpoint's pause key to expire when the pause ends, unless it outlives that already
        (two workers told at once may both write; either pause is one the endpoint asked for)."""
        key = PAUSE_KEY_PREFIX + endpoint_id
        milliseconds = max(1, math.ceil(seconds * 1000))
        try:
            left = await self._redis.pttl(key)
            if left is None or int(left) < milliseconds:
                await self._redis.set(key, b"1", px=milliseconds)
        except REDIS_ERRORS as error:
            logger.warning("could not share endpoint %s's pause through Redis (%r)", endpoint_id, error)

    async def pauses_shared(self) -> None:
        """Wait until the pauses this worker was told are written to Redis (or failed to be)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """Give back every held send (not sent; the claims are released) and stop the pumps."""
        self._closing = True
        for gate in list(self._gates.values()):
            self._give_back(gate, lambda index: RELEASE_DELAY_SECONDS_MIN, "shutdown")
            if gate.pump is not None:
                gate.pump.cancel()
        pumps = [gate.pump for gate in self._gates.values() if gate.pump is not None]
        await asyncio.gather(*pumps, *self._background, return_exceptions=True)
        self._gates.clear()

    @property
    def held(self) -> int:
        """Sends held back now, waiting for their endpoint's bucket."""
        return sum(len(gate.held) for gate in self._gates.values())


def _bounded_delay(seconds: float) -> float:
    return min(RELEASE_DELAY_SECONDS_MAX, max(RELEASE_DELAY_SECONDS_MIN, seconds))


def _chain(source: asyncio.Future[SendResult], target: asyncio.Future[SendResult]) -> None:
    """Hand the sender's result (or its cancellation) on to the future the engine holds."""
    def copy(done: asyncio.Future[SendResult]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())
        else:
            target.set_result(done.result())
    source.add_done_callback(copy)
