"""billing.messages: a request with endpoint_ids (what a replay sends) targets only those endpoints."""

from __future__ import annotations

import uuid

from billing import accounts, ids, messages
from billing.audit import audit
from billing.errors import IdempotencyConflict, InvalidInput


async def _account(pool, balance: int) -> uuid.UUID:
    account = await accounts.create_account(pool, "targeted", price_per_delivery=2)
    await accounts.top_up(pool, account.id, f"order-{account.id}", balance)
    return account.id


async def _endpoint(pool, account_id, *, event_types=None, enabled=True, deleted=False) -> uuid.UUID:
    endpoint_id = ids.new_id()
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url, event_types, enabled, deleted_at)"
        " VALUES ($1, $2, 'https://example.com/h', $3, $4, CASE WHEN $5 THEN now() END)",
        endpoint_id, account_id, event_types, enabled, deleted,
    )
    return endpoint_id


async def _counts(pool) -> tuple[int, int, int]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM messages) m, (SELECT count(*) FROM deliveries) d,"
        " (SELECT count(*) FROM ledger_entries) l"
    )
    return tuple(row)


async def test_targeted_request_charges_only_the_named_endpoint(pool):
    """endpoint_ids=(one,) creates one delivery to that endpoint, even if its filter excludes the type; None still fans out."""
    account_id = await _account(pool, 100)
    target = await _endpoint(pool, account_id, event_types=["other.type"])
    await _endpoint(pool, account_id)
    request = messages.MessageRequest(account_id, "invoice.paid", b"{}", endpoint_ids=(target,))
    created = await messages.create_message(pool, request, attempts_max=3)
    assert [d.endpoint_id for d in created.deliveries] == [target]
    assert created.total_charged == 2
    fan_out = await messages.create_message(pool, messages.MessageRequest(account_id, "invoice.paid", b"{}"), attempts_max=3)
    assert len(fan_out.deliveries) == 1 and fan_out.deliveries[0].endpoint_id != target
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 96
    assert (await audit(pool)).clean


async def test_targeting_a_deleted_disabled_or_foreign_endpoint_is_refused_and_writes_nothing(pool):
    """A target that is deleted, disabled or another account's is an InvalidInput naming it; nothing is written."""
    account_id = await _account(pool, 100)
    other_account = await _account(pool, 100)
    refused = [
        await _endpoint(pool, account_id, deleted=True),
        await _endpoint(pool, account_id, enabled=False),
        await _endpoint(pool, other_account),
        uuid.uuid4(),
    ]
    before = await _counts(pool)
    for endpoint_id in refused:
        request = messages.MessageRequest(account_id, "invoice.paid", b"{}", endpoint_ids=(endpoint_id,))
        (result,) = await messages.create_messages(pool, [request], attempts_max=3)
        assert isinstance(result, InvalidInput) and str(endpoint_id) in result.detail
    assert await _counts(pool) == before


TARGET_COUNT = f"endpoint_ids must be a tuple of 1 to {messages.TARGET_ENDPOINTS_MAX} endpoint ids"
TARGET_KINDS = "endpoint_ids must be distinct UUIDs"


async def test_malformed_targets_are_refused(pool):
    """An empty, oversized, repeated or non-UUID endpoint_ids, or a list, is refused before any
    transaction: each with the message that names its fault, and nothing written (the balance too)."""
    account_id = await _account(pool, 100)
    endpoint_id = await _endpoint(pool, account_id)
    cases = [
        ((), TARGET_COUNT),
        (tuple(uuid.uuid4() for _ in range(messages.TARGET_ENDPOINTS_MAX + 1)), TARGET_COUNT),
        ([endpoint_id], TARGET_COUNT),
        ((endpoint_id, endpoint_id), TARGET_KINDS),
        (("not-a-uuid",), TARGET_KINDS),
    ]
    before = await _counts(pool), await _balance(pool, account_id)
    for targets, detail in cases:
        request = messages.MessageRequest(account_id, "t", b"{}", endpoint_ids=targets)
        (result,) = await messages.create_messages(pool, [request], attempts_max=3)
        assert isinstance(result, InvalidInput), (targets, result)
        assert result.detail == detail, (targets, result.detail)
        assert (await _counts(pool), await _balance(pool, account_id)) == before, targets
    # The same request with a well-formed target is accepted: the refusals were the targets' alone.
    request = messages.MessageRequest(account_id, "t", b"{}", endpoint_ids=(endpoint_id,))
    (created,) = await messages.create_messages(pool, [request], attempts_max=3)
    assert not isinstance(created, Exception), created
    assert await _counts(pool) == (before[0][0] + 1, before[0][1] + 1, before[0][2] + 1)


async def _balance(pool, account_id) -> int:
    return await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)


async def test_the_target_is_part_of_the_idempotency_hash(pool):
    """The same key with the same body but another target conflicts; with the same target it replays."""
    account_id = await _account(pool, 100)
    first = await _endpoint(pool, account_id)
    second = await _endpoint(pool, account_id)
    request = messages.MessageRequest(account_id, "t", b"{}", "key-1", endpoint_ids=(first,))
    created = await messages.create_message(pool, request, attempts_max=3)
    replay = await messages.create_message(pool, request, attempts_max=3)
    assert replay.replayed and replay.message_id == created.message_id
    other = messages.MessageRequest(account_id, "t", b"{}", "key-1", endpoint_ids=(second,))
    (result,) = await messages.create_messages(pool, [other], attempts_max=3)
    assert isinstance(result, IdempotencyConflict)
