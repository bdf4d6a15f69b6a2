"""The SDK against the real API: every route's happy path, typed results, and the errors a real
server answers (as opposed to the mocked ones in tests/unit/sdk)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from billing.settle import settle
from delivery.client import (
    Account,
    AuthenticationError,
    ConflictError,
    Client,
    Delivery,
    DeliveryDetail,
    Endpoint,
    LedgerEntry,
    Message,
    NotFoundError,
    Page,
    PaymentRequiredError,
    PermissionDeniedError,
    ValidationError,
)
from signing import generate_secret


async def test_operator_creates_an_account_tops_it_up_and_reverses(operator, account):
    """The operator's routes: create (with a first key), read, top up once per order id, reverse."""
    created, key = account
    assert key.startswith(created.api_key.prefix)
    read = await operator.accounts.get(created.account.id)
    assert isinstance(read, Account) and read.balance == 100 and read.price_per_delivery == 2
    again = await operator.accounts.top_up(created.account.id, "order-1", 100)
    assert not again.applied and again.balance == 100
    reversed_ = await operator.accounts.reverse_top_up(created.account.id, "order-1")
    assert reversed_.applied and reversed_.balance == 0 and reversed_.entry_id == "topup_reversal:order-1"
    with pytest.raises(NotFoundError):
        await operator.accounts.get(uuid.uuid4())


async def test_endpoints_crud_and_secrets(sdk):
    created = await sdk.endpoints.create("https://example.com/hooks", description="billing",
                                         event_types=["invoice.paid"], timeout_ms=5000)
    assert isinstance(created, Endpoint) and created.event_types == ("invoice.paid",) and created.timeout_ms == 5000
    assert [e.id for e in await sdk.endpoints.list()] == [created.id]
    assert (await sdk.endpoints.get(created.id)).description == "billing"
    updated = await sdk.endpoints.update(created.id, enabled=False, event_types=None)
    assert updated.enabled is False and updated.event_types is None and updated.description == "billing"
    secret = await sdk.endpoints.get_secret(created.id)
    assert secret.startswith("whsec_")
    rotated = await sdk.endpoints.rotate_secret(created.id)
    assert rotated != secret and await sdk.endpoints.get_secret(created.id) == rotated
    chosen = generate_secret()
    assert await sdk.endpoints.rotate_secret(created.id, secret=chosen) == chosen
    deleted = await sdk.endpoints.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(NotFoundError):
        await sdk.endpoints.get(created.id)


async def test_send_charges_per_delivery_and_a_repeated_key_charges_once(sdk):
    """Two endpoints at 2 credits: 4 charged; the same key again is the stored answer, nothing more charged."""
    first = await sdk.endpoints.create("https://example.com/a")
    second = await sdk.endpoints.create("https://example.com/b")
    message = await sdk.send("invoice.paid", {"invoice": "in_1", "amount": 12}, idempotency_key="inv-1")
    assert isinstance(message, Message) and message.total_charged == 4 and not message.replayed
    assert {d.endpoint_id for d in message.deliveries} == {first.id, second.id}
    again = await sdk.send("invoice.paid", {"invoice": "in_1", "amount": 12}, idempotency_key="inv-1")
    assert again.replayed and again.id == message.id
    balance = await sdk.balance()
    assert (balance.balance, balance.in_flight) == (96, 4)
    with pytest.raises(ValidationError) as reused:
        await sdk.send("invoice.paid", {"other": "body"}, idempotency_key="inv-1")
    assert reused.value.status == 422 and reused.value.slug == "idempotency-key-reused"


async def test_deliveries_list_filter_page_get_and_ledger(sdk):
    await sdk.endpoints.create("https://example.com/a")
    messages = [await sdk.send("order.created", {"n": n}) for n in range(3)]
    page = await sdk.deliveries.list(limit=2)
    assert isinstance(page, Page) and len(page) == 2 and page.next_cursor is not None
    rest = await sdk.deliveries.list(limit=2, cursor=page.next_cursor)
    assert len(rest) == 1 and rest.next_cursor is None
    every = [d async for d in sdk.deliveries.iterate(page_size=1)]
    assert [d.message_id for d in every] == [m.id for m in reversed(messages)]
    assert all(isinstance(d, Delivery) and d.state == "pending" for d in every)
    one = await sdk.deliveries.list(message_id=messages[0].id, state="pending")
    assert [d.message_id for d in one] == [messages[0].id]
    detail = await sdk.deliveries.get(every[0].id)
    assert isinstance(detail, DeliveryDetail) and detail.attempts == ()
    assert [(e.kind, e.amount) for e in detail.ledger_entries] == [("charge", -2)]
    ledger = await sdk.ledger(limit=2)
    assert all(isinstance(e, LedgerEntry) for e in ledger) and ledger.data[0].kind == "topup"
    charges = await sdk.ledger(delivery_id=every[0].id)
    assert [e.id for e in charges] == [f"charge:{every[0].id}"]


async def test_refusals_from_the_real_api(sdk, base_url, operator_key):
    """402 with nothing charged, 422 with field errors, 409 for a pending replay, 401 and 403 for keys."""
    await sdk.endpoints.create("https://example.com/a")
    with pytest.raises(PaymentRequiredError):
        await _drain_then_send(sdk)
    assert (await sdk.balance()).balance == 0
    with pytest.raises(ValidationError) as invalid:
        await sdk.endpoints.create("ftp://example.com/x")
    assert invalid.value.errors and invalid.value.errors[0].field == "url"
    pending = (await sdk.deliveries.list(limit=1)).data[0]
    with pytest.raises(ConflictError) as not_replayable:
        await sdk.deliveries.replay(pending.id)
    assert not_replayable.value.status == 409 and not_replayable.value.slug == "not-replayable"
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(_balance_with_key, base_url, "hl_live_wrong")
    with pytest.raises(PermissionDeniedError):
        await asyncio.to_thread(_balance_with_key, base_url, operator_key)


async def _drain_then_send(sdk):
    """Spend the 100 credits (50 deliveries at 2), then one more send must be refused."""
    for n in range(50):
        await sdk.send("spend.it", {"n": n})
    await sdk.send("spend.it", {"n": "one too many"})


def _balance_with_key(base_url: str, key: str):
    with Client(base_url, key, retries=0) as client:
        return client.balance()


async def test_the_blocking_client_in_a_thread(base_url, account):
    """The sync Client does the same through the real server: endpoint, send, read back, keys."""
    _, key = account

    def work():
        with Client(base_url, key) as client:
            endpoint = client.endpoints.create("https://example.com/sync")
            message = client.send("user.signed_up", {"user": "u_1"})
            delivery = client.deliveries.get(message.deliveries[0].id)
            new_key = client.api_keys.create()
            keys = client.api_keys.list()
            client.api_keys.revoke(new_key.id)
            return endpoint, message, delivery, new_key, keys, client.balance()

    endpoint, message, delivery, new_key, keys, balance = await asyncio.to_thread(work)
    assert message.deliveries[0].endpoint_id == endpoint.id and message.idempotency_key
    assert delivery.event_type == "user.signed_up" and delivery.price == 2
    assert new_key.id in {k.id for k in keys} and len(keys) == 2
    assert balance.balance == 98


async def test_a_deleted_endpoint_refunds_and_the_operator_sees_the_dead_delivery(operator, sdk, account):
    """Deleting an endpoint kills its pending delivery (refunded); the operator's dead view lists it."""
    endpoint = await sdk.endpoints.create("https://example.com/gone")
    message = await sdk.send("invoice.paid", {"n": 1})
    deleted = await sdk.endpoints.delete(endpoint.id)
    assert deleted.refunded_now == 1
    detail = await sdk.deliveries.get(message.deliveries[0].id)
    assert detail.state == "dead" and detail.dead_reason == "endpoint_deleted"
    assert sorted(e.kind for e in detail.ledger_entries) == ["charge", "refund"]
    assert (await sdk.balance()).balance == 100
    dead = await operator.deliveries.list_dead(limit=5)
    assert [d.id for d in dead] == [detail.id] and dead.data[0].account_id == account[0].account.id


async def test_a_replay_with_its_key_replays_once_and_the_operator_issues_a_key(operator, sdk, account, pool):
    """A replay repeated with its key answers the first (Idempotent-Replayed), charged once; the
    operator's create_api_key gives an account a working key."""
    await sdk.endpoints.create("https://example.com/replayed")
    message = await sdk.send("invoice.paid", {"n": 1})
    dead = message.deliveries[0].id
    owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", dead)
    await settle(pool, dead, "out_of_retries", account_id=owner)  # as the worker does after the last attempt
    balance = (await sdk.balance()).balance
    first = await sdk.deliveries.replay(dead, idempotency_key="r-1")
    again = await sdk.deliveries.replay(dead, idempotency_key="r-1")
    assert (first.replayed, again.replayed) == (False, True) and again.id == first.id
    assert (await sdk.balance()).balance == balance - first.total_charged
    created, _ = account
    key = await operator.accounts.create_api_key(created.account.id)
    assert key.key.startswith(key.prefix)
    assert key.id in [k.id for k in await sdk.api_keys.list() if k.revoked_at is None]


async def test_keyed_creates_repeated_with_their_key_make_one_thing(operator, sdk, account, pool):
    """An endpoint, a rotation, an API key and an account created twice with one key (as a retry
    after a lost answer does) are made once and answered the same; a repeated delete reads as done."""
    endpoint = await sdk.endpoints.create("https://example.com/once", idempotency_key="ep-1")
    assert await sdk.endpoints.create("https://example.com/once", idempotency_key="ep-1") == endpoint
    assert [e.id for e in await sdk.endpoints.list()] == [endpoint.id]
    with pytest.raises(ValidationError):  # the same key for another endpoint
        await sdk.endpoints.create("https://example.com/other", idempotency_key="ep-1")

    rotated = await sdk.endpoints.rotate_secret(endpoint.id, idempotency_key="rot-1")
    rotated_at = (await sdk.endpoints.get(endpoint.id)).updated_at
    assert await sdk.endpoints.rotate_secret(endpoint.id, idempotency_key="rot-1") == rotated
    assert await sdk.endpoints.get_secret(endpoint.id) == rotated
    # One rotation, not two: a second would have moved the first secret out of the overlap.
    assert (await sdk.endpoints.get(endpoint.id)).updated_at == rotated_at

    keys_before = len(await sdk.api_keys.list())
    key = await sdk.api_keys.create(idempotency_key="key-1")
    assert await sdk.api_keys.create(idempotency_key="key-1") == key
    assert len(await sdk.api_keys.list()) == keys_before + 1

    made = await operator.accounts.create("once", idempotency_key="acct-1")
    assert await operator.accounts.create("once", idempotency_key="acct-1") == made
    assert await pool.fetchval("SELECT count(*) FROM accounts WHERE name = 'once'") == 1

    deleted = await sdk.endpoints.delete(endpoint.id)
    again = await sdk.endpoints.delete(endpoint.id)  # a retry whose first answer was lost
    assert deleted.deleted and again.deleted and again.refunded_now == 0


async def test_the_operator_disables_an_endpoint(operator, sdk):
    """disable_as_operator: disabled_reason operator, the same answer again; 404 for an unknown id and
    403 with an account's key."""
    endpoint = await sdk.endpoints.create("https://example.com/operator-off")
    disabled = await operator.endpoints.disable_as_operator(endpoint.id)
    assert (disabled.id, disabled.enabled, disabled.disabled_reason) == (endpoint.id, False, "operator")
    assert await operator.endpoints.disable_as_operator(endpoint.id) == disabled
    with pytest.raises(NotFoundError):
        await operator.endpoints.disable_as_operator(uuid.uuid4())
    other = await sdk.endpoints.create("https://example.com/still-on")
    with pytest.raises(PermissionDeniedError):
        await sdk.endpoints.disable_as_operator(other.id)
    assert (await sdk.endpoints.get(other.id)).enabled
