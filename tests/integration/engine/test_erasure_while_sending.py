"""Retention and expunge racing a real worker that claims, sends and records: a delivery never goes out
with an erased body, a live delivery's payload is never erased, the ledger is never touched.

Each round: an account with a one-day retention and three receivers (steady, flaky, slow); messages
with distinct payloads are created while an eraser ages every kept payload past the retention and runs
the retention job in small batches, and an expunger expunges random messages. The receivers record
every body; afterwards each must be exactly the payload of the message it belongs to.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from billing import accounts
from billing.audit import audit
from billing.messages import MessageRequest, create_message
from delivery.operations import retention
from engine_helpers import add_account, add_endpoint, running_worker, keys_of

MESSAGES = 60
CREATE_BATCHES = 4  # messages are created in this many waves, the later ones while erasure runs
_AGE = ("UPDATE messages SET created_at = now() - interval '2 days'"
        " WHERE account_id = $1 AND payload IS NOT NULL AND created_at > now() - interval '1 day'")
_LEDGER = "SELECT id, kind, amount, created_at FROM ledger_entries WHERE account_id = $1 ORDER BY seq"


async def _live(pool, account_id) -> int:
    return await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1 AND state IN ('pending', 'sending')",
                               account_id)


@pytest.mark.parametrize("round_", range(5))
async def test_erasure_racing_sends_never_sends_an_erased_body(pool, settings, keyring, receiver_factory, arq_queue,
                                                               round_):
    rng = random.Random(round_)

    async def slow(number):
        await asyncio.sleep(rng.uniform(0, 0.05))
        return 200

    receivers = [await receiver_factory(), await receiver_factory(lambda number: 500 if rng.random() < 0.3 else 200),
                 await receiver_factory(slow)]
    account_id = await add_account(pool, balance=10_000)
    await accounts.update_settings(pool, account_id, payload_retention_days=1)
    for receiver in receivers:
        await add_endpoint(pool, account_id, receiver, keyring)
    ledger_before = [tuple(row) for row in await pool.fetch(_LEDGER, account_id)]
    payloads: dict[str, bytes] = {}  # delivery id -> the exact body its message carries
    message_ids: list = []
    creating_done = asyncio.Event()
    tally = {"expunged": 0, "refused_live": 0, "retention_erased": 0}

    async def create_wave(wave: int) -> None:
        for number in range(wave * MESSAGES // CREATE_BATCHES, (wave + 1) * MESSAGES // CREATE_BATCHES):
            body = json.dumps({"round": round_, "n": number, "pad": "p" * rng.randint(0, 200)}).encode()
            created = await create_message(pool, MessageRequest(account_id, "erasure.race", body),
                                           attempts_max=settings.ledger.attempts_max)
            message_ids.append(created.message_id)
            payloads.update({str(d.id): body for d in created.deliveries})
            await arq_queue.wake(await keys_of(pool, [d.id for d in created.deliveries]))

    async def creator() -> None:
        try:
            for wave in range(CREATE_BATCHES):
                await create_wave(wave)
                await asyncio.sleep(rng.uniform(0.05, 0.2))
        finally:
            creating_done.set()

    async def eraser() -> None:
        while not (creating_done.is_set() and await _live(pool, account_id) == 0):
            await pool.execute(_AGE, account_id)
            _, erased = await retention.erase_batch(pool, batch_size=rng.randint(1, 8))
            tally["retention_erased"] += erased
            await asyncio.sleep(rng.uniform(0, 0.02))

    async def expunger() -> None:
        while not (creating_done.is_set() and await _live(pool, account_id) == 0):
            if message_ids:
                try:
                    await retention.expunge(pool, account_id, rng.choice(message_ids), "test")
                    tally["expunged"] += 1
                except retention.MessageLive:
                    tally["refused_live"] += 1
            await asyncio.sleep(rng.uniform(0, 0.02))

    async with running_worker(settings, pool):
        await asyncio.wait_for(asyncio.gather(creator(), eraser(), expunger()), 120)
    await retention.run_retention(pool)

    assert tally["refused_live"] > 0 and tally["retention_erased"] > 0 and tally["expunged"] > 0, tally
    received = [request for receiver in receivers for request in receiver.received]
    assert received and all(request["valid"] for request in received)
    wrong = [request["id"] for request in received if request["body"] != payloads[request["id"]]]
    assert not wrong, f"{len(wrong)} requests carried another body than their message's"
    deaths = await pool.fetch("SELECT dead_reason, count(*) AS n FROM deliveries WHERE account_id = $1"
                              " AND state = 'dead' GROUP BY 1", account_id)
    # Under load a lease can expire (attempts_exhausted), but none may die for want of its payload.
    assert "account_closed" not in {row["dead_reason"] for row in deaths}, [tuple(row) for row in deaths]
    late = await pool.fetchval(
        "SELECT count(*) FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id"
        " JOIN messages m ON m.id = d.message_id WHERE d.account_id = $1 AND a.started_at > m.payload_erased_at",
        account_id)
    assert late == 0, f"{late} attempts started after their message was erased"
    kept = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM messages WHERE account_id = $1 AND payload IS NOT NULL) AS payloads,"
        " (SELECT count(*) FROM delivery_attempts WHERE account_id = $1 AND response_excerpt IS NOT NULL) AS excerpts,"
        " (SELECT count(*) FROM messages WHERE account_id = $1) AS messages", account_id)
    assert (kept["payloads"], kept["excerpts"], kept["messages"]) == (0, 0, MESSAGES)
    ledger_after = [tuple(row) for row in await pool.fetch(_LEDGER, account_id)]
    assert ledger_after[:len(ledger_before)] == ledger_before
    added = [row[1] for row in ledger_after[len(ledger_before):]]
    assert added.count("charge") == len(payloads) and set(added) <= {"charge", "refund", "reclaim"}
    assert (await audit(pool)).clean
