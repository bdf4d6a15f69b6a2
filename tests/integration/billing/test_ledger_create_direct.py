"""The direct create (billing.message_direct, via billing.messages.create_messages): one autocommit
statement in which PostgreSQL fans a batch out to its subscribed endpoints, locks the batch's
accounts in id order, and writes messages, deliveries, one charge per delivery and the balances
only if every account is active and covers its share and no key was used before; else it writes
nothing and the batch is decided the planned way, which refuses each failing request on its own.
Real database, concurrent connections.

What this file proves:
- a plain batch goes direct and writes exactly what the planned way would: each message's
  deliveries go to its subscribed, enabled, undeleted endpoints, numbered in endpoint-id order on
  one UUIDv7 base; one charge of -price per delivery; balance == ledger; the audit is clean;
- a batch direct cannot take in full (a balance short, an account closing or unknown, a key used
  before, a key repeated in the batch) writes nothing there, and the planned way then refuses
  only the failing requests (or replays), never charging twice;
- batches that target endpoints, and batches inside a caller's transaction, never go direct;
- forced races, for certain (a transaction holds the account's row lock until the direct
  statement waits on it): the statement checks and charges the locked row's NEWEST version
  (a new price is charged, a closed account or a spent balance declines), and two statements
  with one key make one message;
- a race by chance, many rounds: concurrent batches sharing keys write each key once (the race
  of direct and planned batches on few small accounts being repriced, which never overspends, is
  in test_ledger_create_unlocked.py);
- a direct write whose answer is lost is resolved: written, its results are read back; not
  written, the connection's error, and nothing was written.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from billing import ids, message_direct, messages
from billing.database import create_pool
from billing.errors import (
    AccountNotActive,
    AccountNotFound,
    ApplicationNotFound,
    IdempotencyConflict,
    InsufficientBalance,
    InvalidInput,
)
from billing.message_direct import DIRECT_WRITE
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    balance,
    holding_account_lock,
    ledger_sum,
    make_account,
    row_counts,
)

RACE_ROUNDS = 12


def _counters() -> tuple[Counter, Counter, Counter]:
    return messages.WRITES.copy(), messages.DECLINED.copy(), messages.REFUSED.copy()


def _deltas(before: tuple[Counter, Counter, Counter]) -> tuple[Counter, Counter, Counter]:
    """What WRITES, DECLINED and REFUSED counted since `before` (counters only grow)."""
    return tuple(now - then for now, then in zip(_counters(), before, strict=True))  # type: ignore[return-value]


def _holding(pool: asyncpg.Pool, account_id: uuid.UUID, creates: list, then=None):
    """Run `creates` while a transaction holds the account's row lock; once all their direct
    statements wait on it, run `then(holder)` in that transaction and commit. Their results."""
    return holding_account_lock(pool, account_id, creates, waiting="WITH request AS", then=then)


async def _rows_of(pool: asyncpg.Pool, account_id: uuid.UUID) -> tuple[int, int, int]:
    """The account's messages, deliveries and charge entries."""
    return (
        await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id),
        await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1", account_id),
        await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1 AND kind = 'charge'",
                            account_id),
    )


async def _assert_written_as_answered(pool: asyncpg.Pool, created: messages.MessageCreated, attempts_max: int) -> None:
    """The database holds exactly the message and deliveries the result says, each with its charge."""
    assert await pool.fetchval("SELECT account_id FROM messages WHERE id = $1", created.message_id) == created.account_id
    rows = await pool.fetch(
        "SELECT id, account_id, endpoint_id, price, state, attempt, attempts_max FROM deliveries"
        " WHERE message_id = $1 ORDER BY id", created.message_id)
    assert [(row["id"], row["endpoint_id"], row["price"]) for row in rows] == sorted(
        (delivery.id, delivery.endpoint_id, delivery.price) for delivery in created.deliveries)
    for row in rows:
        assert (row["account_id"], row["state"], row["attempt"], row["attempts_max"]) == (
            created.account_id, "pending", 0, attempts_max)
    charges = await pool.fetch(
        "SELECT id, account_id, kind, amount FROM ledger_entries WHERE delivery_id = ANY ($1::uuid[])",
        [delivery.id for delivery in created.deliveries])
    assert {row["id"]: (row["account_id"], row["kind"], row["amount"]) for row in charges} == {
        f"charge:{delivery.id}": (created.account_id, "charge", -delivery.price) for delivery in created.deliveries}
    assert all(ids.charge_id(delivery.id) == f"charge:{delivery.id}" for delivery in created.deliveries)
    assert created.total_charged == sum(delivery.price for delivery in created.deliveries)


def _assert_delivery_ids(created: messages.MessageCreated, started_ms: int, ended_ms: int) -> None:
    """Within a message: ids end in 0001, 0002, ... in endpoint-id order, all on one base (the
    first 28 hex digits), valid RFC 4122 version-7 UUIDs whose top 48 bits are this test's clock."""
    deliveries = created.deliveries
    assert [delivery.endpoint_id for delivery in deliveries] == sorted(delivery.endpoint_id for delivery in deliveries)
    assert [delivery.id.hex[-4:] for delivery in deliveries] == [f"{n:04x}" for n in range(1, len(deliveries) + 1)]
    assert len({delivery.id.hex[:28] for delivery in deliveries}) <= 1
    for delivery in deliveries:
        assert delivery.id.version == 7 and delivery.id.variant == uuid.RFC_4122, delivery.id
        assert started_ms - 5 <= delivery.id.int >> 80 <= ended_ms + 5, (delivery.id, started_ms, ended_ms)
        assert delivery.id != created.message_id


async def test_a_plain_batch_goes_direct_and_fans_out_exactly_to_the_subscribers(pool):
    """A batch over four accounts with fan-outs of 0, 1, 2 and 3 (event-type filters; a disabled,
    a deleted and an other-type endpoint that get nothing) is written direct in one statement:
    each result's deliveries are its subscribed endpoints exactly, in endpoint-id order, with ids
    numbered 0001.. on one fresh UUIDv7 per message; one charge:<delivery id> of -price each; the
    balances fell by the totals and equal the ledger; a keyed message replays afterwards."""
    typed = await make_account(pool, balance=100, price=3)
    every = await add_endpoint(pool, typed, event_types=None)
    paid = await add_endpoint(pool, typed, event_types=["invoice.paid", "invoice.void"])
    user = await add_endpoint(pool, typed, event_types=["user.created"])
    await add_endpoint(pool, typed, enabled=False)
    await add_endpoint(pool, typed, deleted=True)
    empty = await make_account(pool, balance=5, price=1)  # no endpoints at all
    dead_only = await make_account(pool, balance=5, price=1)
    await add_endpoint(pool, dead_only, enabled=False)
    await add_endpoint(pool, dead_only, deleted=True)
    await add_endpoint(pool, dead_only, event_types=["other"])
    wide = await make_account(pool, balance=50, price=2)
    wide_endpoints = sorted([await add_endpoint(pool, wide) for _ in range(3)])
    bystander = await make_account(pool, balance=7)
    await add_endpoint(pool, bystander)

    requests = [
        messages.MessageRequest(typed, "invoice.paid", b"1"),
        messages.MessageRequest(empty, "invoice.paid", b"2"),
        messages.MessageRequest(wide, "x", b"3", "key-3"),
        messages.MessageRequest(typed, "zzz", b"4"),
        messages.MessageRequest(dead_only, "invoice.paid", b"5"),
        messages.MessageRequest(typed, "user.created", b"6"),
        messages.MessageRequest(wide, "y", b"7"),
        messages.MessageRequest(typed, "", b"8"),  # invalid: refused before any write, and left out of it
    ]
    expected = [sorted([every, paid]), [], wide_endpoints, [every], [], sorted([every, user]), wide_endpoints]
    before = _counters()
    started_ms = time.time_ns() // 1_000_000
    results = await messages.create_messages(pool, requests, attempts_max=4)
    ended_ms = time.time_ns() // 1_000_000
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())

    invalid = results.pop()
    assert isinstance(invalid, InvalidInput), invalid
    requests.pop()
    assert all(isinstance(result, messages.MessageCreated) and not result.replayed for result in results), results
    assert [result.account_id for result in results] == [request.account_id for request in requests]
    assert [result.event_type for result in results] == [request.event_type for request in requests]
    assert [[delivery.endpoint_id for delivery in result.deliveries] for result in results] == expected
    assert [result.total_charged for result in results] == [6, 0, 6, 3, 0, 6, 6]
    assert len({result.message_id for result in results}) == len(results)
    bases = [result.deliveries[0].id.hex[:28] for result in results if result.deliveries]
    assert len(set(bases)) == len(bases)  # each message its own base
    for result in results:
        _assert_delivery_ids(result, started_ms, ended_ms)
        assert result.message_id.version == 7
        await _assert_written_as_answered(pool, result, attempts_max=4)
    assert await pool.fetchval("SELECT count(*) FROM messages") == 7
    assert await pool.fetchval("SELECT count(*) FROM deliveries") == 11
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'charge'") == 11
    row = await pool.fetchrow("SELECT event_type, payload, idempotency_key, request_hash FROM messages WHERE id = $1",
                              results[2].message_id)
    assert (row["event_type"], row["payload"], row["idempotency_key"], row["request_hash"]) == (
        "x", b"3", "key-3", requests[2].request_hash())
    expected_balances = {typed: 100 - 15, empty: 5, dead_only: 5, wide: 50 - 12, bystander: 7}
    for account_id, expected_balance in expected_balances.items():
        assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == expected_balance
    await assert_audit_clean(pool)

    (replay,) = await messages.create_messages(pool, [requests[2]], attempts_max=4)
    assert replay.replayed and replay.message_id == results[2].message_id
    assert replay.deliveries == results[2].deliveries and replay.total_charged == 6
    assert await balance(pool, wide) == 38


async def test_a_free_account_goes_direct_with_charges_of_zero(pool):
    """At price 0 a delivery costs nothing: the batch goes direct on a balance of 0, with one
    charge of 0 per delivery (as the planned way writes), the balance unmoved."""
    account_id = await make_account(pool, balance=0, price=0)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id)
    before = _counters()
    (created,) = await messages.create_messages(pool, [messages.MessageRequest(account_id, "a", b"1")], attempts_max=2)
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())
    assert created.total_charged == 0 and [delivery.price for delivery in created.deliveries] == [0, 0]
    await _assert_written_as_answered(pool, created, attempts_max=2)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0
    await assert_audit_clean(pool, account_id)


async def test_a_message_with_more_endpoints_than_its_ids_can_number_goes_planned(pool):
    """A delivery's number has 16 bits: 65535 endpoints go direct (the last id ends in ffff);
    with one endpoint more the direct statement declines and the planned way writes all 65536."""
    limit = message_direct.DELIVERIES_PER_MESSAGE_MAX
    account_id = await make_account(pool, balance=2 * limit + 1, price=1)
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url)"
        " SELECT gen_random_uuid(), $1, 'https://example.com/' || n FROM generate_series(1, $2) n", account_id, limit)
    before = _counters()
    (direct,) = await messages.create_messages(pool, [messages.MessageRequest(account_id, "a", b"1")], attempts_max=1)
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())
    assert len(direct.deliveries) == limit and direct.deliveries[-1].id.hex[-4:] == "ffff"
    assert len({delivery.id for delivery in direct.deliveries}) == limit
    await add_endpoint(pool, account_id)
    before = _counters()
    (planned,) = await messages.create_messages(pool, [messages.MessageRequest(account_id, "a", b"2")], attempts_max=1)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert len(planned.deliveries) == limit + 1 and planned.total_charged == limit + 1
    assert await _rows_of(pool, account_id) == (2, 2 * limit + 1, 2 * limit + 1)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0


async def test_one_account_short_of_its_share_declines_and_only_its_requests_are_refused(pool):
    """The poor account's share (2 messages x 2 endpoints = 4) exceeds its balance of 3: direct
    writes nothing ("not_ok"); the planned way then writes everything else, the poor account's
    first message (which fits), and refuses its second alone with InsufficientBalance."""
    rich = await make_account(pool, balance=20, price=1)
    other = await make_account(pool, balance=20, price=2)
    poor = await make_account(pool, balance=3, price=1)
    await add_endpoint(pool, rich)
    await add_endpoint(pool, other)
    await add_endpoint(pool, poor)
    await add_endpoint(pool, poor)
    requests = [
        messages.MessageRequest(rich, "a", b"1"),
        messages.MessageRequest(poor, "a", b"2"),
        messages.MessageRequest(other, "a", b"3"),
        messages.MessageRequest(poor, "a", b"4"),
        messages.MessageRequest(rich, "a", b"5"),
    ]
    before = _counters()
    results = await messages.create_messages(pool, requests, attempts_max=2)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert [type(result) for result in results] == [messages.MessageCreated, messages.MessageCreated,
                                                    messages.MessageCreated, InsufficientBalance,
                                                    messages.MessageCreated]
    assert "cannot cover 2 deliveries" in str(results[3])
    for result in results:
        if isinstance(result, messages.MessageCreated):
            await _assert_written_as_answered(pool, result, attempts_max=2)
    assert await _rows_of(pool, rich) == (2, 2, 2)
    assert await _rows_of(pool, other) == (1, 1, 1)
    assert await _rows_of(pool, poor) == (1, 2, 2)
    for account_id, expected in {rich: 18, other: 18, poor: 1}.items():
        assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == expected
    await assert_audit_clean(pool)


async def test_a_balance_that_covers_its_share_exactly_goes_direct(pool):
    """The boundary: a share equal to the balance passes (>=), down to zero; one credit more
    declines, and the planned way refuses it."""
    account_id = await make_account(pool, balance=4, price=2)
    await add_endpoint(pool, account_id)
    before = _counters()
    results = await messages.create_messages(
        pool, [messages.MessageRequest(account_id, "a", b"1"), messages.MessageRequest(account_id, "a", b"2")],
        attempts_max=1)
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())
    assert [result.total_charged for result in results] == [2, 2]
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0
    before = _counters()
    (refused,) = await messages.create_messages(pool, [messages.MessageRequest(account_id, "a", b"3")], attempts_max=1)
    assert isinstance(refused, InsufficientBalance), refused
    assert _deltas(before) == (Counter(), Counter({"not_ok": 1}), Counter())
    assert await _rows_of(pool, account_id) == (2, 2, 2)
    await assert_audit_clean(pool, account_id)


async def test_a_closing_account_declines_and_only_its_requests_get_account_not_active(pool):
    """An account set to 'closing' fails the direct statement's check (nothing written), and the
    planned way refuses only its requests, even the one that fans out to nobody."""
    active = await make_account(pool, balance=10, price=1)
    closing = await make_account(pool, balance=10, price=1)
    await add_endpoint(pool, active)
    await add_endpoint(pool, closing, event_types=["a"])
    await pool.execute("UPDATE accounts SET status = 'closing' WHERE id = $1", closing)
    requests = [
        messages.MessageRequest(closing, "a", b"1"),
        messages.MessageRequest(active, "a", b"2"),
        messages.MessageRequest(closing, "nobody-listens", b"3"),
    ]
    before = _counters()
    results = await messages.create_messages(pool, requests, attempts_max=2)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert isinstance(results[0], AccountNotActive) and "closing" in str(results[0])
    assert isinstance(results[2], AccountNotActive)
    assert isinstance(results[1], messages.MessageCreated) and results[1].total_charged == 1
    assert await _rows_of(pool, closing) == (0, 0, 0)
    assert await _rows_of(pool, active) == (1, 1, 1)
    assert (await balance(pool, closing), await balance(pool, active)) == (10, 9)
    assert await ledger_sum(pool, active) == 9
    await assert_audit_clean(pool, active)
    await assert_audit_clean(pool, closing)


async def test_an_unknown_account_declines_and_gets_account_not_found(pool):
    """A request for an account that does not exist makes the direct statement lock fewer
    accounts than the batch names: nothing written there; planned, that request alone is refused."""
    known = await make_account(pool, balance=10, price=1)
    await add_endpoint(pool, known)
    before = _counters()
    results = await messages.create_messages(
        pool, [messages.MessageRequest(ids.new_id(), "a", b"1"), messages.MessageRequest(known, "a", b"2")],
        attempts_max=2)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert isinstance(results[0], AccountNotFound) and isinstance(results[1], messages.MessageCreated)
    assert await pool.fetchval("SELECT count(*) FROM messages") == 1
    assert await balance(pool, known) == await ledger_sum(pool, known) == 9
    await assert_audit_clean(pool)


async def test_a_key_used_before_declines_and_replays_without_charging_again(pool):
    """The first keyed create goes direct. The same keyed request again, in a batch with a new
    message, makes the direct statement decline (the key is used); the planned way replays it
    (replayed=True, the same message and deliveries), writes the new message, and charges only
    that. The same key with another payload is an IdempotencyConflict, and writes nothing."""
    account_id = await make_account(pool, balance=20, price=2)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id)
    keyed = messages.MessageRequest(account_id, "a", b"body", "key-1")
    before = _counters()
    (original,) = await messages.create_messages(pool, [keyed], attempts_max=3)
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())
    assert original.total_charged == 4 and await balance(pool, account_id) == 16

    before = _counters()
    replay, fresh = await messages.create_messages(
        pool, [keyed, messages.MessageRequest(account_id, "a", b"other")], attempts_max=3)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert replay.replayed is True and replay.message_id == original.message_id
    assert replay.deliveries == original.deliveries and replay.total_charged == 4
    assert fresh.replayed is False and fresh.total_charged == 4
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE idempotency_key = 'key-1'") == 1
    assert await _rows_of(pool, account_id) == (2, 4, 4)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 12

    counts = await row_counts(pool)
    before = _counters()
    (conflict,) = await messages.create_messages(
        pool, [messages.MessageRequest(account_id, "a", b"changed", "key-1")], attempts_max=3)
    assert isinstance(conflict, IdempotencyConflict), conflict
    assert _deltas(before) == (Counter(), Counter({"not_ok": 1}), Counter())
    assert await row_counts(pool) == counts and await balance(pool, account_id) == 12
    await assert_audit_clean(pool, account_id)


async def test_one_key_twice_in_one_batch_is_written_once(pool):
    """A batch repeating a new key passes the direct statement's check (the key is not in the
    table yet), fails on the unique index there, and writes nothing (DECLINED by the error's
    name); planned, the first is created and the second replays it: one message, charged once."""
    account_id = await make_account(pool, balance=10, price=1)
    await add_endpoint(pool, account_id)
    keyed = messages.MessageRequest(account_id, "a", b"1", "twice")
    before = _counters()
    first, second = await messages.create_messages(pool, [keyed, keyed], attempts_max=2)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"UniqueViolationError": 1}), Counter())
    assert (first.replayed, second.replayed, second.message_id) == (False, True, first.message_id)
    assert await _rows_of(pool, account_id) == (1, 1, 1)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)


async def test_a_batch_that_targets_endpoints_never_goes_direct(pool):
    """A request naming its endpoints (a replay) is only checked the planned way: the batch is
    written unlocked, the direct statement not even tried (nothing declined)."""
    account_id = await make_account(pool, balance=10, price=1)
    target = await add_endpoint(pool, account_id, event_types=["other"])
    await add_endpoint(pool, account_id)
    before = _counters()
    named, plain = await messages.create_messages(pool, [
        messages.MessageRequest(account_id, "a", b"1", endpoint_ids=(target,)),
        messages.MessageRequest(account_id, "a", b"2")], attempts_max=2)
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter(), Counter())
    assert [delivery.endpoint_id for delivery in named.deliveries] == [target]
    assert len(plain.deliveries) == 1 and plain.deliveries[0].endpoint_id != target
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 8
    await assert_audit_clean(pool, account_id)


async def test_inside_a_callers_transaction_the_direct_way_does_not_run(pool):
    """In a caller's transaction the batch is decided locked (a savepoint), never direct; a
    connection outside a transaction goes direct; a rolled-back caller's batch left nothing."""
    account_id = await make_account(pool, balance=10, price=1)
    await add_endpoint(pool, account_id)
    before = _counters()
    async with pool.acquire() as connection, connection.transaction():
        (created,) = await messages.create_messages(
            connection, [messages.MessageRequest(account_id, "a", b"1")], attempts_max=2)
    assert _deltas(before) == (Counter({"in_transaction": 1}), Counter(), Counter())
    await _assert_written_as_answered(pool, created, attempts_max=2)

    before = _counters()
    with pytest.raises(RuntimeError, match="caller gives up"):
        async with pool.acquire() as connection, connection.transaction():
            await messages.create_messages(connection, [messages.MessageRequest(account_id, "a", b"2")], attempts_max=2)
            raise RuntimeError("caller gives up")
    assert _deltas(before) == (Counter({"in_transaction": 1}), Counter(), Counter())

    before = _counters()
    async with pool.acquire() as connection:
        (direct,) = await messages.create_messages(
            connection, [messages.MessageRequest(account_id, "a", b"3")], attempts_max=2)
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())
    await _assert_written_as_answered(pool, direct, attempts_max=2)
    assert await _rows_of(pool, account_id) == (2, 2, 2)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 8
    await assert_audit_clean(pool, account_id)


async def test_an_account_repriced_while_the_direct_write_waits_is_charged_the_new_price(pool):
    """The direct statement waits on the account's row lock; the holder reprices it from 1 to 2
    and commits. The statement checks and charges the row's newest version (EvalPlanQual): the
    deliveries cost 2 and it is still written direct."""
    account_id = await make_account(pool, balance=100, price=1)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id)
    before = _counters()

    async def reprice(holder):
        await holder.execute("UPDATE accounts SET price_per_delivery = 2 WHERE id = $1", account_id)

    ((created,),) = await _holding(pool, account_id, [
        messages.create_messages(pool, [messages.MessageRequest(account_id, "t", b"1")], attempts_max=2)], reprice)
    assert _deltas(before) == (Counter({"direct": 1}), Counter(), Counter())
    assert created.total_charged == 4 and [delivery.price for delivery in created.deliveries] == [2, 2]
    await _assert_written_as_answered(pool, created, attempts_max=2)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 96
    await assert_audit_clean(pool, account_id)


async def test_a_repricing_that_the_balance_no_longer_covers_declines(pool):
    """Balance 2, one delivery at price 1 as the statement reads it; the holder reprices to 3
    meanwhile: the locked row's newest version does not cover 3, so nothing is written direct,
    and the planned way refuses with InsufficientBalance at the new price."""
    account_id = await make_account(pool, balance=2, price=1)
    await add_endpoint(pool, account_id)
    before = _counters()

    async def reprice(holder):
        await holder.execute("UPDATE accounts SET price_per_delivery = 3 WHERE id = $1", account_id)

    ((refused,),) = await _holding(pool, account_id, [
        messages.create_messages(pool, [messages.MessageRequest(account_id, "t", b"1")], attempts_max=2)], reprice)
    assert isinstance(refused, InsufficientBalance) and "at 3 credits" in str(refused), refused
    assert _deltas(before) == (Counter(), Counter({"not_ok": 1}), Counter())
    assert await _rows_of(pool, account_id) == (0, 0, 0)
    assert await balance(pool, account_id) == 2
    await assert_audit_clean(pool, account_id)


async def test_an_account_closed_while_the_direct_write_waits_writes_nothing_for_it(pool):
    """The holder sets the account to 'closing' while the direct statement waits on its row: the
    newest version is not active, the statement writes nothing (not even the other account's
    message), and the planned way refuses that account's request with AccountNotActive and writes
    the other's."""
    account_id = await make_account(pool, balance=100, price=1)
    other = await make_account(pool, balance=100, price=1)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, other)
    before = _counters()

    async def close(holder):
        await holder.execute("UPDATE accounts SET status = 'closing' WHERE id = $1", account_id)

    ((refused, created),) = await _holding(pool, account_id, [
        messages.create_messages(pool, [messages.MessageRequest(account_id, "t", b"1"),
                                        messages.MessageRequest(other, "t", b"2")], attempts_max=2)], close)
    assert isinstance(refused, AccountNotActive), refused
    assert isinstance(created, messages.MessageCreated) and created.total_charged == 1
    assert _deltas(before) == (Counter({"unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert await _rows_of(pool, account_id) == (0, 0, 0)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 100
    assert await balance(pool, other) == await ledger_sum(pool, other) == 99
    await assert_audit_clean(pool)


async def test_a_balance_spent_while_the_direct_write_waits_is_never_overspent(pool):
    """Balance 3; the direct batch of two messages (share 2) waits on the row while the holder's
    own transaction creates two messages through create_messages (spending 2, leaving 1) and
    commits. The statement rechecks the newest version, which no longer covers 2: nothing written
    direct; planned, the first message is written and the second refused. Balance 0, never below."""
    account_id = await make_account(pool, balance=3, price=1)
    await add_endpoint(pool, account_id)
    before = _counters()
    spent: list = []

    async def spend(holder):
        spent.extend(await messages.create_messages(
            holder, [messages.MessageRequest(account_id, "h", b"h1"), messages.MessageRequest(account_id, "h", b"h2")],
            attempts_max=2))

    ((first, second),) = await _holding(pool, account_id, [messages.create_messages(
        pool, [messages.MessageRequest(account_id, "t", b"1"), messages.MessageRequest(account_id, "t", b"2")],
        attempts_max=2)], spend)
    assert all(isinstance(result, messages.MessageCreated) for result in spent), spent
    assert isinstance(first, messages.MessageCreated) and isinstance(second, InsufficientBalance), (first, second)
    assert _deltas(before) == (Counter({"in_transaction": 1, "unlocked": 1}), Counter({"not_ok": 1}), Counter())
    assert await _rows_of(pool, account_id) == (3, 3, 3)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0
    await assert_audit_clean(pool, account_id)


async def test_one_key_in_two_waiting_direct_writes_is_written_once(pool):
    """Two batches carry the same new key (and one other message each); both direct statements
    take their snapshots and wait on the account's row before either writes. The first written
    wins; the second passes the snapshot's key check but fails on the unique index, writes
    nothing (DECLINED UniqueViolationError), and planned replays the first and writes its other
    message. One message with the key, one created and one replayed result, charged once."""
    account_id = await make_account(pool, balance=100, price=1)
    await add_endpoint(pool, account_id)
    keyed = messages.MessageRequest(account_id, "t", b"1", "same-key")
    before = _counters()
    first, second = await _holding(pool, account_id, [
        messages.create_messages(pool, [keyed, messages.MessageRequest(account_id, "t", b"2")], attempts_max=2),
        messages.create_messages(pool, [keyed, messages.MessageRequest(account_id, "t", b"3")], attempts_max=2)])
    created = [result for result in (first[0], second[0]) if not result.replayed]
    replayed = [result for result in (first[0], second[0]) if result.replayed]
    assert len(created) == 1 and len(replayed) == 1, (first, second)
    assert replayed[0].message_id == created[0].message_id and replayed[0].deliveries == created[0].deliveries
    assert not first[1].replayed and not second[1].replayed
    assert _deltas(before) == (Counter({"direct": 1, "unlocked": 1}), Counter({"UniqueViolationError": 1}), Counter())
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE idempotency_key = 'same-key'") == 1
    assert await _rows_of(pool, account_id) == (3, 3, 3)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 97
    await assert_audit_clean(pool, account_id)


async def test_concurrent_batches_with_shared_keys_write_each_key_once(pool):
    """Eight writers send batches drawing keys from a small shared set on two accounts, RACE_ROUNDS
    times: each key ends with exactly one message; every result for a key, created or replayed,
    names that message; exactly one of them was created; the balance fell by exactly the created
    messages' charges; the audit is clean."""
    rng = random.Random(11)
    before = _counters()
    for _ in range(RACE_ROUNDS):
        account_ids = [await make_account(pool, balance=1000, price=1) for _ in range(2)]
        for account_id in account_ids:
            await add_endpoint(pool, account_id)
        seen: dict[tuple, list] = {}
        charged = Counter()

        async def writer() -> None:
            for _ in range(5):
                batch = []
                for _ in range(rng.randint(1, 4)):
                    account_id, key = rng.choice(account_ids), f"k{rng.randint(0, 5)}"
                    batch.append(messages.MessageRequest(account_id, "a", key.encode(), key))
                if rng.random() < 0.5:
                    batch.append(messages.MessageRequest(rng.choice(account_ids), "a", b"unkeyed"))
                for request, result in zip(batch, await messages.create_messages(pool, batch, attempts_max=2),
                                           strict=True):
                    assert isinstance(result, messages.MessageCreated), result
                    if not result.replayed:
                        charged[request.account_id] += result.total_charged
                    if request.idempotency_key is not None:
                        seen.setdefault((request.account_id, request.idempotency_key), []).append(result)

        await asyncio.gather(*(writer() for _ in range(8)))
        for (account_id, key), results in seen.items():
            stored = await pool.fetch("SELECT id FROM messages WHERE account_id = $1 AND idempotency_key = $2",
                                      account_id, key)
            assert len(stored) == 1 and {result.message_id for result in results} == {stored[0]["id"]}, (key, results)
            assert sum(not result.replayed for result in results) == 1, (key, results)
        for account_id in account_ids:
            assert 1000 - await balance(pool, account_id) == charged[account_id]
            assert await balance(pool, account_id) == await ledger_sum(pool, account_id)
            await assert_audit_clean(pool, account_id)
    writes, declined, refusals = _deltas(before)
    print(f"\nkeyed race: writes {dict(writes)}, declined {dict(declined)}, refused {dict(refusals)}")
    assert writes["direct"] > 0, writes
    assert set(declined) <= {"not_ok", "UniqueViolationError"}, declined  # a key written meanwhile, no deadlock
    assert set(refusals) <= {"UniqueViolationError"}, refusals


# ---- a direct write whose answer is lost (a TCP proxy cuts the connection at DIRECT_WRITE) ----

def _commit_cutter():
    api_tests = str(Path(__file__).parent.parent / "api")
    if api_tests not in sys.path:
        sys.path.append(api_tests)
    from commit_cutter import CommitCutter
    return CommitCutter


@pytest.fixture
async def cut(database_url):
    """A proxy that cuts the connection running DIRECT_WRITE, and a pool through it."""
    cutter = await _commit_cutter()(database_url, statements=(DIRECT_WRITE,)).start()
    cut_pool = await create_pool(cutter.url(), size_min=1, size_max=4)
    yield cutter, cut_pool
    try:
        await asyncio.wait_for(cut_pool.close(), 5)
    except asyncio.TimeoutError:
        cut_pool.terminate()
    await cutter.close()


async def test_a_direct_write_whose_answer_was_lost_reads_back_what_it_made(pool, cut):
    """The server runs the direct statement and its answer is dropped: create_messages on a pool
    ends the backend, finds the batch written, and reads back its deliveries: the results are
    those in the database, as if nothing had broken (fan-outs 0, 1 and 2 over two accounts)."""
    cutter, cut_pool = cut
    one = await make_account(pool, balance=10, price=1)
    two = await make_account(pool, balance=10, price=3)
    await add_endpoint(pool, one)
    await add_endpoint(pool, two)
    await add_endpoint(pool, two)
    empty = await make_account(pool, balance=1, price=1)
    requests = [messages.MessageRequest(one, "a", b"1", "k1"), messages.MessageRequest(two, "a", b"2"),
                messages.MessageRequest(one, "a", b"3"),
                messages.MessageRequest(one, "", b"invalid"),  # refused before any write: stays refused
                messages.MessageRequest(empty, "a", b"4")]
    before = _counters()
    cutter.arm("after")
    results = await messages.create_messages(cut_pool, requests, attempts_max=2)
    assert cutter.cuts == 1
    writes, declined, refusals = _deltas(before)
    assert (writes, declined, refusals) == (Counter({"direct": 1}), Counter(), Counter())  # it went direct
    assert isinstance(results[3], InvalidInput), results[3]
    created = [results[0], results[1], results[2], results[4]]
    assert all(isinstance(result, messages.MessageCreated) and not result.replayed for result in created), results
    assert [len(result.deliveries) for result in created] == [1, 2, 1, 0]
    assert [result.total_charged for result in created] == [1, 6, 1, 0]
    for result in created:
        await _assert_written_as_answered(pool, result, attempts_max=2)
    assert await pool.fetchval("SELECT count(*) FROM messages") == 4
    for account_id, expected in {one: 8, two: 4, empty: 1}.items():
        assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == expected
    (replay,) = await messages.create_messages(pool, [requests[0]], attempts_max=2)
    assert replay.replayed and replay.message_id == results[0].message_id
    await assert_audit_clean(pool)


async def test_a_direct_write_that_never_ran_raises_the_connection_error_and_wrote_nothing(pool, cut):
    """The direct statement is dropped before the server sees it: create_messages on a pool finds
    nothing written and raises the connection's error; nothing was written, and a retry writes once."""
    cutter, cut_pool = cut
    account_id = await make_account(pool, balance=10, price=1)
    await add_endpoint(pool, account_id)
    request = messages.MessageRequest(account_id, "a", b"1", "k")
    cutter.arm("before")
    with pytest.raises(asyncpg.PostgresConnectionError):
        await messages.create_messages(cut_pool, [request], attempts_max=2)
    assert cutter.cuts == 1
    assert await _rows_of(pool, account_id) == (0, 0, 0) and await balance(pool, account_id) == 10
    (retried,) = await messages.create_messages(cut_pool, [request], attempts_max=2)
    assert not retried.replayed and await _rows_of(pool, account_id) == (1, 1, 1)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)


async def test_a_direct_write_on_a_connection_leaves_the_outcome_to_the_caller(pool, cut):
    """Given a connection, a lost direct answer raises CreateOutcomeUnknown naming the backend and
    a message of the batch; resolve_outcome through a working pool then fills in the results from
    the database (read back), which match what was written."""
    cutter, cut_pool = cut
    account_id = await make_account(pool, balance=10, price=2)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id)
    requests = [messages.MessageRequest(account_id, "a", b"1"), messages.MessageRequest(account_id, "a", b"2")]
    cutter.arm("after")
    async with cut_pool.acquire() as connection:
        pid = connection.get_server_pid()
        with pytest.raises(messages.CreateOutcomeUnknown) as raised:
            await messages.create_messages(connection, requests, attempts_max=2)
    unknown = raised.value
    assert unknown.unlocked.backend_pid == pid and unknown.direct is not None
    assert len(unknown.message_ids) == 2 and unknown.unlocked.message_id == unknown.message_ids[0]
    assert unknown.results == [None, None]
    results = await messages.resolve_outcome(pool, unknown)
    assert [result.message_id for result in results] == unknown.message_ids
    for result in results:
        assert result.total_charged == 4 and len(result.deliveries) == 2
        await _assert_written_as_answered(pool, result, attempts_max=2)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 2
    await assert_audit_clean(pool, account_id)


async def test_an_application_named_by_a_uid_it_no_longer_has_is_refused_alone_both_ways(pool):
    """A request naming its application by uid (MessageRequest.application_uid) is written only if
    the application still has that uid: the API resolves uids from a cache another process's change
    outdates. Direct, the batch declines and the planned way refuses that request alone with
    ApplicationNotFound; inside a caller's transaction (locked) likewise. Requests whose uid still
    holds, the default application's included, are written; the refused one wrote nothing."""
    account_id = await make_account(pool, balance=100, price=1)
    moved, kept = ids.new_id(), ids.new_id()
    await pool.execute("INSERT INTO applications (id, account_id, uid, name) VALUES ($1, $3, 'moved', 'a'),"
                       " ($2, $3, 'kept', 'b')", moved, kept, account_id)
    await pool.execute("UPDATE applications SET uid = 'home' WHERE id = $1", account_id)
    for application_id in (moved, kept, account_id):
        await pool.execute("INSERT INTO endpoints (id, account_id, application_id, url) VALUES ($1, $2, $3, 'https://e/x')",
                           ids.new_id(), account_id, application_id)
    # Another process moves the uid: the request below still names it with the id it had.
    await pool.execute("UPDATE applications SET uid = 'elsewhere' WHERE id = $1", moved)

    def batch(payload: bytes) -> list[messages.MessageRequest]:
        return [messages.MessageRequest(account_id, "a", payload, application_id=moved, application_uid="moved"),
                messages.MessageRequest(account_id, "a", payload, application_id=kept, application_uid="kept"),
                messages.MessageRequest(account_id, "a", payload, application_id=account_id, application_uid="home"),
                messages.MessageRequest(account_id, "a", payload, application_id=moved)]  # by id: still fine

    before = _counters()
    results = await messages.create_messages(pool, batch(b"1"), attempts_max=2)
    assert _deltas(before)[1] == Counter({"not_ok": 1})  # the direct way declined the batch
    async with pool.acquire() as connection, connection.transaction():
        results += await messages.create_messages(connection, batch(b"2"), attempts_max=2)
    for index, result in enumerate(results):
        if index % 4 == 0:
            assert isinstance(result, ApplicationNotFound) and "'moved'" in str(result)
        else:
            assert isinstance(result, messages.MessageCreated) and len(result.deliveries) == 1
            await _assert_written_as_answered(pool, result, attempts_max=2)
    assert await _rows_of(pool, account_id) == (6, 6, 6)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 94

    before = _counters()
    (direct,) = await messages.create_messages(
        pool, [messages.MessageRequest(account_id, "a", b"3", application_id=moved, application_uid="elsewhere")],
        attempts_max=2)
    assert _deltas(before)[0] == Counter({"direct": 1})  # the uid it has now goes direct
    await _assert_written_as_answered(pool, direct, attempts_max=2)
    await assert_audit_clean(pool, account_id)
