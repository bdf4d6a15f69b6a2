"""The throttle's shared state on a real Redis, and its fallbacks: the bucket two workers share,
each worker's own share when Redis is lost, a pause one worker shares with another, and sends
held past their hold given back with the time they are due again (a real sender and receiver)."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
import uuid

from redis.asyncio import Redis

from delivery import metrics
from delivery.engine import throttle as throttle_module
from delivery.engine.backpressure import Backpressure
from delivery.engine.sender import Sender, SenderSettings, SendRequest, SendResult, was_held
from delivery.engine.throttle import Throttle, spacing_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _counted(name: str, **labels: str) -> float:
    """A worker-side counter's value in this process (0.0 before its first increment)."""
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def _closed_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


async def test_two_workers_share_one_bucket_per_endpoint(arq_queue):
    """Worker B finds the token worker A just took: it must wait up to one spacing; both count as
    live. Then, taking as fast as both can for a while, they are granted no more than the limit
    allows over that while (load only makes them slower). Another endpoint's bucket is its own."""
    first, second = (Throttle(arq_queue.redis, Backpressure(16)) for _ in range(2))
    endpoint, other = str(uuid.uuid4()), str(uuid.uuid4())
    assert await first.take_token(endpoint, 10) == 0.0
    wait = await second.take_token(endpoint, 10)
    assert 0.0 < wait <= spacing_seconds(10)
    assert second.workers == 2
    assert await second.take_token(other, 10) == 0.0
    started = time.monotonic()
    granted = 0
    while time.monotonic() - started < 1.0:
        for worker in (first, second):
            granted += await worker.take_token(endpoint, 10) == 0.0
    elapsed = time.monotonic() - started
    assert 1 <= granted <= elapsed / spacing_seconds(10) + 1, (granted, elapsed)


async def test_without_redis_each_worker_sends_its_share_and_never_above_the_limit():
    """Redis refuses the connection: a worker that last saw 4 workers spaces its sends 4 times
    as far apart; one alone, as the limit says. It asks Redis again after REDIS_RETRY_SECONDS."""
    clock = Clock()
    redis = Redis(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=1)
    try:
        throttle = Throttle(redis, Backpressure(16), clock=clock)
        throttle.workers = 4
        endpoint = str(uuid.uuid4())
        assert await throttle.take_token(endpoint, 10) == 0.0
        assert math.isclose(await throttle.take_token(endpoint, 10), spacing_seconds(10) * 4)
        clock.now += spacing_seconds(10) * 4
        assert await throttle.take_token(endpoint, 10) == 0.0
        throttle.workers = 1
        clock.now += throttle_module.REDIS_RETRY_SECONDS  # Redis is asked again, and still refuses
        assert await throttle.take_token(endpoint, 10) == 0.0
        wait = await throttle.take_token(endpoint, 10)
        assert math.isclose(wait, spacing_seconds(10)) and wait >= 1 / 10
    finally:
        await redis.aclose()


async def test_a_pause_one_worker_was_told_holds_the_endpoint_in_another(arq_queue):
    """Worker A's answer was a 503 with Retry-After: 2; worker B, reading the endpoint's pause
    before its batch, holds it for what is left of the 2 s. Other endpoints are not paused. The
    pause is counted once, by the worker that was told (hookledger_endpoint_pauses_total)."""
    first, second = (Throttle(arq_queue.redis, Backpressure(16)) for _ in range(2))
    endpoint, other = uuid.uuid4(), uuid.uuid4()
    pauses_before = _counted("hookledger_endpoint_pauses_total")
    first.observed(endpoint, SendResult(503, 5, "http 503", "", 2.0, False, False, 1.0, 1.1))
    first.observed(other, SendResult(500, 5, "http 500", "", 2.0, False, False, 1.0, 1.1))  # not a slow-down
    assert _counted("hookledger_endpoint_pauses_total") == pauses_before + 1
    await first.pauses_shared()
    await second.read_pauses([endpoint, other, endpoint])
    assert 0.0 < second.backpressure.paused_for(str(endpoint)) <= 2.0
    assert second.backpressure.paused_for(str(other)) == 0.0


async def test_sends_past_their_hold_are_given_back_due_later(receiver_factory, caplog):
    """30 sends at 10/s to a loopback receiver, with no Redis (one worker: its own bucket): those
    that fit in the hold go out, in the order they came; the rest come back held, never on the
    wire, each due again at a slot of its own (booked one spacing apart, after those booked
    before). The receiver got exactly the ones sent, and the throttle logged no failure. The
    counters say the same: every send but the first waited for the bucket, and those given back
    are counted under rate_limit."""
    receiver = await receiver_factory()
    held_before = _counted("hookledger_throttle_sends_held_total")
    given_back_before = _counted("hookledger_held_deliveries_given_back_total", reason="rate_limit")
    caplog.set_level(logging.WARNING, logger="delivery.engine.throttle")
    answered_at: dict[int, float] = {}
    async with Sender(SenderSettings(allow_loopback=True)) as sender:
        throttle = Throttle(None, sender.backpressure)
        endpoint = str(uuid.uuid4())
        futures = [throttle.submit(10, SendRequest(str(uuid.uuid4()), 1, receiver.url, b"{}", {}, 1000, endpoint),
                                   sender.submit) for _ in range(30)]
        for number, future in enumerate(futures):
            future.add_done_callback(lambda done, number=number: answered_at.setdefault(number, time.monotonic()))
        results = await asyncio.gather(*futures)
        await throttle.close()
    sent = [result for result in results if not was_held(result)]
    held = [(number, result) for number, result in enumerate(results) if was_held(result)]
    assert [result.status_code for result in sent] == [200] * len(sent) and len(receiver.received) == len(sent)
    assert 1 <= len(sent) <= throttle_module.HOLD_SECONDS_MAX / spacing_seconds(10) + 1
    assert len(sent) + len(held) == 30 and results[:len(sent)] == sent, "sent in the order they came"
    assert all(result.sent_at == 0.0 and result.retry_after_seconds >= throttle_module.RELEASE_DELAY_SECONDS_MIN
               for _, result in held)
    due = sorted(answered_at[number] + result.retry_after_seconds for number, result in held)
    assert all(later - earlier >= spacing_seconds(10) / 2 for earlier, later in zip(due, due[1:])), due
    assert not caplog.records, "the throttle gave its sends back as planned, not after a failure"
    assert _counted("hookledger_throttle_sends_held_total") - held_before == 29
    assert _counted("hookledger_held_deliveries_given_back_total", reason="rate_limit") - given_back_before == len(held)


async def test_claims_given_back_book_slots_after_those_booked_before(arq_queue):
    """Two workers give back 10 and then 5 sends of one endpoint at 10/s: the second worker's first
    slot comes after the first worker's tenth (the backlog is spread, not stacked on one time)."""
    first, second = (Throttle(arq_queue.redis, Backpressure(16)) for _ in range(2))
    endpoint = str(uuid.uuid4())
    began = time.monotonic()
    start, slot = await first._book_slots(endpoint, 10, 10, 0.5)
    later, _ = await second._book_slots(endpoint, 10, 5, 0.0)
    between = time.monotonic() - began  # Redis's clock moved on by no more than this between the two
    assert math.isclose(slot, spacing_seconds(10)) and start == 0.5
    assert later >= start + 10 * slot - between - 0.001, (start, later, between)


async def test_a_worker_that_finds_redis_down_does_not_ask_it(arq_queue):
    """While the worker's poll loop finds Redis down (queue_reachable False), the throttle keeps to
    its own bucket and asks Redis nothing, so no send waits out a command's timeout; the shared
    bucket is untouched, and the next worker still finds it full."""
    reachable = [False]
    alone = Throttle(arq_queue.redis, Backpressure(16), reachable=lambda: reachable[0])
    endpoint = str(uuid.uuid4())
    assert await alone.take_token(endpoint, 10) == 0.0
    assert 0.0 < await alone.take_token(endpoint, 10) <= spacing_seconds(10)
    assert await arq_queue.redis.exists(throttle_module.BUCKET_KEY_PREFIX + endpoint) == 0
    other = Throttle(arq_queue.redis, Backpressure(16))
    assert await other.take_token(endpoint, 10) == 0.0
