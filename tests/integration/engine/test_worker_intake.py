"""A worker takes deliver jobs only while its connections have room (delivery.engine.intake): a burst
of jobs goes to every worker, not to the first to read the queue; and sends waiting behind one slow
host's bound do not stop a worker from taking other work."""

from __future__ import annotations

import asyncio
import collections

from billing.messages import MessageRequest, create_message
from delivery.engine.pipeline import Engine
from delivery.platform import config
from engine_helpers import add_account, add_endpoint, fast_environment, keys_of, running_worker, stop_sweeping, wait_for

ANSWER_SECONDS = 0.2


def _settings(database_url: str, redis_url: str, keyring, connections: int, per_host: int) -> config.Settings:
    return config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_CONNECTIONS_MAX=str(connections),
                                        HOOKLEDGER_CONNECTIONS_PER_HOST_MAX=str(per_host),
                                        HOOKLEDGER_SWEEP_SECONDS="60"))


async def _create(pool, account_id, count: int) -> list:
    return [(await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)).deliveries[0].id
            for _ in range(count)]


async def _wake_in_jobs(pool, arq_queue, delivery_ids: list, per_job: int) -> None:
    for start in range(0, len(delivery_ids), per_job):
        await arq_queue.wake(await keys_of(pool, delivery_ids[start:start + per_job]))


def _intake_empty(worker) -> bool:
    intake = worker.ctx["engine"].intake
    return intake.taken_on == 0 and not intake.jobs_starting


def _count_claims(monkeypatch) -> collections.Counter:
    """What each engine's deliver jobs claimed (by the engine's id()), added up as they end; counted
    from the first job of a worker started after this."""
    claimed: collections.Counter = collections.Counter()
    deliver_ids = Engine.deliver_ids

    async def counted(engine, *arguments, **keywords):
        report = await deliver_ids(engine, *arguments, **keywords)
        claimed[id(engine)] += report.claimed
        return report

    monkeypatch.setattr(Engine, "deliver_ids", counted)
    return claimed


async def test_a_burst_of_jobs_goes_to_the_second_worker_too(pool, database_url, redis_url, keyring, receiver_factory,
                                                              arq_queue, monkeypatch):
    """Twelve jobs of six deliveries to a receiver that answers in 0.2 s, for workers of 4 connections.
    The first worker takes only what its connections and as many again hold (about two jobs) and
    leaves the rest in the queue, so a second worker started after the first has begun sending
    takes jobs too, and each delivery is claimed once. Taking every job it had a slot for (20),
    the first worker claimed all 72 at once, could not send them all within their 4 s lease, and
    gave some back unsent to be claimed again (80 and 20 claims for 72 deliveries). Each delivery
    arrives once."""
    settings = _settings(database_url, redis_url, keyring, connections=4, per_host=4)
    receiver = await receiver_factory(lambda number: asyncio.sleep(ANSWER_SECONDS, result=200))
    account_id = await add_account(pool, balance=10_000)
    await add_endpoint(pool, account_id, receiver, keyring)
    delivery_ids = await _create(pool, account_id, 72)
    claimed = _count_claims(monkeypatch)
    async with running_worker(settings, pool) as first:
        stop_sweeping(first)  # before it first runs: only deliver jobs claim here
        await wait_for(lambda: asyncio.sleep(0, result="engine" in first.ctx))
        await _wake_in_jobs(pool, arq_queue, delivery_ids, 6)
        await wait_for(lambda: asyncio.sleep(0, result=len(receiver.received) >= 1))
        async with running_worker(settings, pool) as second:
            stop_sweeping(second)
            await wait_for(lambda: asyncio.sleep(0, result=len(receiver.received) >= len(delivery_ids)), timeout_seconds=60)
            await wait_for(lambda: pool.fetchval("SELECT count(*) = $2 FROM deliveries WHERE id = ANY($1)"
                                                 " AND state = 'delivered'", delivery_ids, len(delivery_ids)))
            for worker in (first, second):  # every reservation handed back, no job left counted whole
                await wait_for(lambda: asyncio.sleep(0, result=_intake_empty(worker)))
    assert sorted(entry["id"] for entry in receiver.received) == sorted(str(d) for d in delivery_ids)  # once each
    by_first, by_second = claimed[id(first.ctx["engine"])], claimed[id(second.ctx["engine"])]
    assert by_second > 0, f"the second worker took no job; the first claimed {by_first}"
    # Each claimed once: none held past what the connections send within a lease and given back unsent.
    assert by_first + by_second == len(delivery_ids), (by_first, by_second)


async def test_sends_waiting_behind_a_slow_host_leave_the_worker_taking_other_work(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """One worker of 8 connections, 2 per host. A slow receiver holds every answer until the test lets
    it go, with 20 deliveries for it: 2 on the wire, 18 waiting behind its host's bound. The
    connections are not all busy, so the worker still takes jobs for another receiver, and they
    arrive while the slow one still holds its two."""
    settings = _settings(database_url, redis_url, keyring, connections=8, per_host=2)
    release = asyncio.Event()

    async def held(number: int) -> int:
        await release.wait()
        return 200

    slow = await receiver_factory(held)
    fast = await receiver_factory()
    slow_account, fast_account = await add_account(pool, balance=10_000), await add_account(pool, balance=10_000)
    await add_endpoint(pool, slow_account, slow, keyring, timeout_ms=20_000)
    await add_endpoint(pool, fast_account, fast, keyring)
    slow_ids = await _create(pool, slow_account, 20)
    fast_ids = await _create(pool, fast_account, 6)
    async with running_worker(settings, pool) as worker:
        stop_sweeping(worker)
        try:
            await _wake_in_jobs(pool, arq_queue, slow_ids, 10)
            await wait_for(lambda: asyncio.sleep(0, result=len(slow.received) == 2))
            await _wake_in_jobs(pool, arq_queue, fast_ids, 2)
            await wait_for(lambda: asyncio.sleep(0, result=len(fast.received) == len(fast_ids)))
            assert len(slow.received) == 2  # still held: the fast ones did not wait for them
        finally:
            release.set()
        await wait_for(lambda: pool.fetchval("SELECT count(*) = $2 FROM deliveries WHERE id = ANY($1)"
                                             " AND state = 'delivered'", slow_ids + fast_ids, 26), timeout_seconds=60)
        await wait_for(lambda: asyncio.sleep(0, result=_intake_empty(worker)))
    assert sorted(entry["id"] for entry in slow.received) == sorted(str(d) for d in slow_ids)
