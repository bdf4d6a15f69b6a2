"""Per-endpoint throttle and backpressure through real workers, real Redis, real PostgreSQL and
loopback receivers that keep their own clock (time.monotonic as each request is handled).

Every claim here is judged from the receiver's order and counts, or from the database's rows,
never from how long something took: the machine running the suite is shared and loaded.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time

import pytest
from aiohttp import web

from billing.audit import audit
from billing.messages import MessageRequest, create_messages
from delivery.platform import config
from engine_helpers import add_account, add_endpoint, fast_environment, running_worker, wait_for

THROTTLED_PER_SECOND = 50
WORKERS = 4


async def _create(pool, settings, arq_queue, account_id, count: int) -> list:
    """count messages of one account (one delivery each, to its one endpoint), woken at once."""
    delivery_ids = []
    for start in range(0, count, 200):
        created = await create_messages(
            pool, [MessageRequest(account_id, "order.paid", b'{"n": %d}' % n) for n in range(start, min(count, start + 200))],
            attempts_max=settings.ledger.attempts_max)
        batch = [delivery.id for message in created for delivery in message.deliveries]
        delivery_ids += batch
        await arq_queue.wake(batch)
    return delivery_ids


def _most_in_any_second(times: list[float]) -> int:
    """The most arrivals in any window [t, t + 1 s) of the receiver's clock, t any arrival."""
    times = sorted(times)
    return max((bisect.bisect_left(times, start + 1.0) - index for index, start in enumerate(times)), default=0)


async def _finished(pool, delivery_ids) -> bool:
    return await pool.fetchval("SELECT count(*) FROM deliveries WHERE id = ANY($1::uuid[]) AND state IN"
                               " ('delivered', 'dead')", delivery_ids) == len(delivery_ids)


async def test_a_throttled_endpoint_gets_at_most_its_limit_in_any_second_across_four_workers(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """50/s, 4 workers, about 20 s of sends: at most 50 arrive in any second of the receiver's
    clock; every delivery is delivered on its first attempt with one attempt row (holding spent
    none); an unthrottled endpoint's 300 deliveries, created at the same time, all arrive while
    the throttled one has not yet received half of its own."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_LEASE_MS="10000"))
    throttled_times: list[float] = []
    throttled = await receiver_factory(lambda number: throttled_times.append(time.monotonic()) or 200)
    other_done_at_throttled_count: list[int] = []
    others = 300

    def other_answer(number: int) -> int:
        if number == others:
            other_done_at_throttled_count.append(len(throttled_times))
        return 200

    other = await receiver_factory(other_answer)
    throttled_account, other_account = await add_account(pool, balance=10_000), await add_account(pool, balance=10_000)
    endpoint_id = await add_endpoint(pool, throttled_account, throttled, keyring)
    await pool.execute("UPDATE endpoints SET rate_limit_per_second = $2 WHERE id = $1", endpoint_id, THROTTLED_PER_SECOND)
    await add_endpoint(pool, other_account, other, keyring)
    count = THROTTLED_PER_SECOND * 19
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(WORKERS):
            await stack.enter_async_context(running_worker(settings, pool))
        throttled_ids = await _create(pool, settings, arq_queue, throttled_account, count)
        other_ids = await _create(pool, settings, arq_queue, other_account, others)
        await wait_for(lambda: _finished(pool, other_ids), timeout_seconds=120)
        await wait_for(lambda: _finished(pool, throttled_ids), timeout_seconds=300)

    assert len(throttled_times) == count and len(other.received) == others
    assert _most_in_any_second(throttled_times) <= THROTTLED_PER_SECOND
    assert other_done_at_throttled_count and other_done_at_throttled_count[0] < count // 2, other_done_at_throttled_count
    rows = await pool.fetch("SELECT d.state, d.attempt, count(a.*) AS attempts, bool_and(a.status_code = 200) AS ok"
                            " FROM deliveries d LEFT JOIN delivery_attempts a ON a.delivery_id = d.id"
                            " WHERE d.id = ANY($1::uuid[]) GROUP BY d.account_id, d.id", throttled_ids)
    assert {(row["state"], row["attempt"], row["attempts"], row["ok"]) for row in rows} == {("delivered", 1, 1, True)}
    assert (await audit(pool)).clean


@pytest.mark.parametrize("slow_down_status", [503, 502])
async def test_a_retry_after_pauses_the_whole_endpoint_and_spends_no_other_attempt(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue, slow_down_status):
    """A receiver answers its first request 503 (or 502, a gateway's) with Retry-After: 2 and the
    rest 200. One send at a time, so the receiver's clock shows the pause: its next request comes
    at least 2 s after the first answer. Then it receives again: all 20 are delivered, none dead,
    and only the one that was answered 503 or 502 used a second attempt."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_SENDS_PER_ENDPOINT_MAX="1",
                                            HOOKLEDGER_RETRY_SCHEDULE="0,0.2,5", HOOKLEDGER_LEASE_MS="20000"))
    answers: list[tuple[float, int]] = []

    def answer(number: int):
        status = slow_down_status if number == 1 else 200
        answers.append((time.monotonic(), status))
        if status == slow_down_status:
            return web.Response(status=status, headers={"Retry-After": "2"}, text="busy")
        return status

    receiver = await receiver_factory(answer)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        delivery_ids = await _create(pool, settings, arq_queue, account_id, 20)
        await wait_for(lambda: _finished(pool, delivery_ids), timeout_seconds=120)

    (paused_at, status), (resumed_at, _) = answers[0], answers[1]
    assert status == slow_down_status and resumed_at - paused_at >= 2.0, answers[:3]
    rows = await pool.fetch("SELECT state, attempt FROM deliveries WHERE id = ANY($1::uuid[])", delivery_ids)
    assert sorted((row["state"], row["attempt"]) for row in rows) == [("delivered", 1)] * 19 + [("delivered", 2)]
    assert await pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE delivery_id = ANY($1::uuid[])",
                               delivery_ids) == 21
    assert (await audit(pool)).clean


async def test_an_endpoint_answering_429_under_load_gets_fewer_sends_at_once_then_more_again(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """The receiver takes 50 ms per request and counts the requests open at each arrival. Its
    requests 121 to 180 are answered 429 (no Retry-After), the others 200. Before the 429s more
    than 4 requests are open at once; the first ones after them find at most 3 open (the sender
    halved the endpoint's concurrency on each round of 429s, to 1, and each success adds back
    1/limit); and once answers have succeeded for a while, more than 4 again. No delivery dies."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0,1,1,1,1,1",
                                            HOOKLEDGER_LEASE_MS="30000"))
    open_now = [0]
    open_at_arrival: list[int] = []

    async def answer_later(status: int) -> int:
        try:
            await asyncio.sleep(0.05)
        finally:
            open_now[0] -= 1
        return status

    def answer(number: int):
        open_now[0] += 1
        open_at_arrival.append(open_now[0])
        return answer_later(429 if 121 <= number <= 180 else 200)

    receiver = await receiver_factory(answer)
    account_id = await add_account(pool, balance=10_000)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        delivery_ids = await _create(pool, settings, arq_queue, account_id, 600)
        await wait_for(lambda: _finished(pool, delivery_ids), timeout_seconds=240)

    before, after_429s, recovered = open_at_arrival[:120], open_at_arrival[180:184], open_at_arrival[400:]
    assert max(before) > 4, before
    assert max(after_429s) <= 3, open_at_arrival[170:200]
    assert max(recovered) > 4, recovered
    states = await pool.fetch("SELECT DISTINCT state FROM deliveries WHERE id = ANY($1::uuid[])", delivery_ids)
    assert [row["state"] for row in states] == ["delivered"]


async def test_no_delivery_dies_because_its_endpoint_was_paused(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Every delivery has one attempt only. The first is answered 503 with Retry-After: 2 and dies
    of it (out_of_retries, refunded); the other 19, held back by the pause on that very attempt,
    are sent after it and delivered: a pause never takes an attempt. The audit is clean."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_SENDS_PER_ENDPOINT_MAX="1",
                                            HOOKLEDGER_RETRY_SCHEDULE="0,0.2,5", HOOKLEDGER_ATTEMPTS_MAX="1",
                                            HOOKLEDGER_LEASE_MS="20000"))
    answers: list[float] = []

    def answer(number: int):
        answers.append(time.monotonic())
        return web.Response(status=503, headers={"Retry-After": "2"}) if number == 1 else 200

    receiver = await receiver_factory(answer)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        delivery_ids = await _create(pool, settings, arq_queue, account_id, 20)
        await wait_for(lambda: _finished(pool, delivery_ids), timeout_seconds=120)

    assert len(answers) == 20 and answers[1] - answers[0] >= 2.0
    rows = await pool.fetch("SELECT state, dead_reason, attempt FROM deliveries WHERE id = ANY($1::uuid[])", delivery_ids)
    assert sorted((row["state"], row["dead_reason"], row["attempt"]) for row in rows) == (
        [("dead", "out_of_retries", 1)] + [("delivered", None, 1)] * 19)
    assert (await audit(pool)).clean
