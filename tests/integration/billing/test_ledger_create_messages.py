"""Creating messages: fan-out, one charge per delivery, all-or-nothing refusals, idempotency keys, batches."""

from __future__ import annotations

import asyncio

import pytest

from billing import closeout, ids, messages
from billing.errors import AccountNotActive, AccountNotFound, IdempotencyConflict, InsufficientBalance
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    balance,
    create,
    delivery,
    entries_of,
    make_account,
    row_counts,
)


async def test_fan_out_to_every_subscribed_enabled_endpoint(pool):
    """One delivery and one charge:<id> of -price per enabled, non-deleted, subscribed endpoint; the balance drops by the total."""
    account_id = await make_account(pool, balance=100, price=3)
    every_type = await add_endpoint(pool, account_id, event_types=None)
    subscribed = await add_endpoint(pool, account_id, event_types=["invoice.paid", "invoice.void"])
    await add_endpoint(pool, account_id, event_types=["user.created"])  # other type
    await add_endpoint(pool, account_id, enabled=False)
    await add_endpoint(pool, account_id, deleted=True)
    other_account = await make_account(pool, balance=100)
    await add_endpoint(pool, other_account)  # another account's endpoint

    created = await create(pool, account_id, event_type="invoice.paid", attempts_max=5)

    assert {d.endpoint_id for d in created.deliveries} == {every_type, subscribed}
    assert (created.total_charged, created.replayed) == (6, False)
    for item in created.deliveries:
        row = await delivery(pool, item.id)
        assert (row["account_id"], row["state"], row["attempt"], row["attempts_max"], row["price"]) == (
            account_id, "pending", 0, 5, 3)
        assert await entries_of(pool, item.id) == {ids.charge_id(item.id): -3}
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE message_id = $1", created.message_id) == 2
    assert await balance(pool, account_id) == 94
    assert await balance(pool, other_account) == 100
    await assert_audit_clean(pool)


async def test_insufficient_balance_writes_nothing(pool):
    """A message the balance cannot cover raises InsufficientBalance and writes no message, delivery or ledger row."""
    account_id = await make_account(pool, balance=2, price=1)
    for _ in range(3):
        await add_endpoint(pool, account_id)
    before = await row_counts(pool)
    with pytest.raises(InsufficientBalance, match="cannot cover 3 deliveries"):
        await create(pool, account_id)
    assert await row_counts(pool) == before
    assert await balance(pool, account_id) == 2


@pytest.mark.parametrize("status", ["closing", "deleted"])
async def test_non_active_account_cannot_create(pool, status):
    """A closing or deleted account gets AccountNotActive and nothing is written."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    await closeout.begin_closing(pool, account_id)
    if status == "deleted":
        await closeout.close_out(pool, account_id)
    before = await row_counts(pool)
    with pytest.raises(AccountNotActive, match=status):
        await create(pool, account_id)
    assert await row_counts(pool) == before


async def test_unknown_account_cannot_create(pool):
    """A message for an account that does not exist raises AccountNotFound and writes nothing."""
    before = await row_counts(pool)
    with pytest.raises(AccountNotFound):
        await create(pool, ids.new_id())
    assert await row_counts(pool) == before


async def test_same_idempotency_key_and_request_replays_without_charging(pool):
    """Repeating a keyed request returns the original message and deliveries (replayed=True) and charges nothing more."""
    account_id = await make_account(pool, balance=10, price=2)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id)
    original = await create(pool, account_id, key="key-1")
    after_first = await row_counts(pool)
    replay = await create(pool, account_id, key="key-1")
    assert replay.replayed is True and original.replayed is False
    assert replay.message_id == original.message_id
    assert sorted(replay.deliveries, key=lambda d: d.id) == sorted(original.deliveries, key=lambda d: d.id)
    assert replay.total_charged == original.total_charged == 4
    assert await row_counts(pool) == after_first
    assert await balance(pool, account_id) == 6
    await assert_audit_clean(pool, account_id)


async def test_same_idempotency_key_other_request_conflicts(pool):
    """The same key with another payload or event type raises IdempotencyConflict and writes nothing."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    await create(pool, account_id, key="key-1", payload=b"one")
    before = await row_counts(pool)
    with pytest.raises(IdempotencyConflict, match="key-1"):
        await create(pool, account_id, key="key-1", payload=b"two")
    with pytest.raises(IdempotencyConflict):
        await create(pool, account_id, key="key-1", payload=b"one", event_type="other.type")
    assert await row_counts(pool) == before
    assert await balance(pool, account_id) == 9


async def test_idempotency_keys_are_per_account(pool):
    """Two accounts may use the same key; each gets and pays for its own message."""
    first = await make_account(pool, balance=10)
    second = await make_account(pool, balance=10)
    await add_endpoint(pool, first)
    await add_endpoint(pool, second)
    a = await create(pool, first, key="shared")
    b = await create(pool, second, key="shared", payload=b"different")
    assert a.message_id != b.message_id and not a.replayed and not b.replayed
    assert (await balance(pool, first), await balance(pool, second)) == (9, 9)


async def test_batch_refuses_only_the_request_without_balance(pool):
    """In one create_messages batch, the request its account cannot cover is refused alone; the others commit."""
    rich = await make_account(pool, balance=10)
    poor = await make_account(pool, balance=1)
    await add_endpoint(pool, rich)
    await add_endpoint(pool, poor)
    await add_endpoint(pool, poor)
    before = await row_counts(pool)
    requests = [
        messages.MessageRequest(rich, "a", b"1"),
        messages.MessageRequest(poor, "a", b"2"),  # needs 2, has 1
        messages.MessageRequest(rich, "a", b"3", "k"),
        messages.MessageRequest(rich, "a", b"3", "k"),  # the same keyed request again in one batch
    ]
    outcome = await messages.create_messages(pool, requests, attempts_max=3)
    assert isinstance(outcome[1], InsufficientBalance)
    assert [type(o) for o in outcome] == [messages.MessageCreated, InsufficientBalance,
                                          messages.MessageCreated, messages.MessageCreated]
    assert (outcome[2].replayed, outcome[3].replayed, outcome[3].message_id) == (False, True, outcome[2].message_id)
    after = await row_counts(pool)
    assert after["messages"] - before["messages"] == 2
    assert after["deliveries"] - before["deliveries"] == 2
    assert after["ledger_entries"] - before["ledger_entries"] == 2
    assert (await balance(pool, rich), await balance(pool, poor)) == (8, 1)
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", poor) == 0
    await assert_audit_clean(pool)


async def test_batch_spends_the_balance_in_order(pool):
    """Requests of one account in one batch share its balance: the ones that fit commit, the next is refused."""
    account_id = await make_account(pool, balance=2)
    await add_endpoint(pool, account_id)
    requests = [messages.MessageRequest(account_id, "a", bytes([n])) for n in range(3)]
    outcome = await messages.create_messages(pool, requests, attempts_max=3)
    assert [type(o) for o in outcome] == [messages.MessageCreated, messages.MessageCreated, InsufficientBalance]
    assert await balance(pool, account_id) == 0
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1", account_id) == 2
    await assert_audit_clean(pool, account_id)


async def test_concurrent_requests_with_one_key_charge_once(pool):
    """Twenty concurrent creates with the same key and body, on separate connections, make one message and one charge."""
    account_id = await make_account(pool, balance=100, price=5)
    await add_endpoint(pool, account_id)
    outcomes = await asyncio.gather(
        *(create(pool, account_id, key="same", payload=b"body") for _ in range(20)), return_exceptions=True)
    assert all(isinstance(o, messages.MessageCreated) for o in outcomes), outcomes
    assert len({o.message_id for o in outcomes}) == 1
    assert sorted(o.replayed for o in outcomes) == [False] + [True] * 19
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == 1
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'charge'") == 1
    assert await balance(pool, account_id) == 95
    await assert_audit_clean(pool, account_id)


async def test_a_batch_of_many_event_types_fans_each_out_to_its_own_subscribers(pool):
    """The batch reads only endpoints some request can go to (its event types, or every live one
    when a request names endpoints): each request still reaches exactly its own subscribers, and a
    request that names an endpoint not subscribed to its type still reaches it."""
    first, second = await make_account(pool, balance=100), await make_account(pool, balance=100)
    every = {account: await add_endpoint(pool, account, event_types=None) for account in (first, second)}
    paid = {account: await add_endpoint(pool, account, event_types=["invoice.paid"]) for account in (first, second)}
    created_only = await add_endpoint(pool, first, event_types=["user.created"])
    unused = await add_endpoint(pool, second, event_types=["never.sent"])

    typed = [
        messages.MessageRequest(first, "invoice.paid", b"1"),
        messages.MessageRequest(second, "invoice.paid", b"2"),
        messages.MessageRequest(first, "user.created", b"3"),
        messages.MessageRequest(second, "user.created", b"4"),
        messages.MessageRequest(first, "other", b"5"),
    ]
    outcome = await messages.create_messages(pool, typed, attempts_max=3)
    targets = [{d.endpoint_id for d in created.deliveries} for created in outcome]
    assert targets == [
        {every[first], paid[first]}, {every[second], paid[second]}, {every[first], created_only},
        {every[second]}, {every[first]},
    ]

    named = [
        messages.MessageRequest(first, "invoice.paid", b"6"),
        messages.MessageRequest(second, "invoice.paid", b"7", endpoint_ids=(unused,)),  # not subscribed to its type
    ]
    outcome = await messages.create_messages(pool, named, attempts_max=3)
    assert [{d.endpoint_id for d in created.deliveries} for created in outcome] == [{every[first], paid[first]}, {unused}]
    assert (await balance(pool, first), await balance(pool, second)) == (100 - 2 - 2 - 1 - 2, 100 - 2 - 1 - 1)
    await assert_audit_clean(pool)
