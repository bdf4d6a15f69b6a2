"""Bad input gets the right BillingError subclass with a clear message, and writes no row."""

from __future__ import annotations

import pytest

from billing import accounts, closeout, ids, messages
from billing.errors import AccountNotActive, AccountNotFound, BillingError, InvalidInput
from ledger_helpers import add_endpoint, balance, make_account, row_counts


@pytest.fixture
async def account_id(pool):
    account_id = await make_account(pool, balance=100)
    await add_endpoint(pool, account_id)
    return account_id


async def _refused(pool, call, error: type[BillingError], match: str) -> BillingError:
    before = await row_counts(pool)
    with pytest.raises(error, match=match) as raised:
        await call
    assert await row_counts(pool) == before
    assert isinstance(raised.value, BillingError) and str(raised.value) == raised.value.detail
    return raised.value


@pytest.mark.parametrize(
    ("amount", "match"),
    [
        (0, "between 1 and"),
        (-5, "between 1 and"),
        (accounts.AMOUNT_MAX + 1, "between 1 and"),
        (1.5, "integer number of credits, got 1.5"),
        (10.0, "integer number of credits, got 10.0"),
        (True, "integer number of credits, got True"),
        ("10", "integer number of credits, got '10'"),
        (None, "integer number of credits, got None"),
    ],
)
async def test_top_up_refuses_bad_amounts(pool, account_id, amount, match):
    """Zero, negative, too large, float, bool, string or missing amounts raise InvalidInput; the balance stays 100."""
    await _refused(pool, accounts.top_up(pool, account_id, "order-x", amount), InvalidInput, match)
    assert await balance(pool, account_id) == 100


async def test_top_up_refuses_unknown_and_non_active_accounts(pool, account_id):
    """Unknown accounts raise AccountNotFound; a closing or deleted one raises AccountNotActive; nothing written."""
    await _refused(pool, accounts.top_up(pool, ids.new_id(), "order-x", 5), AccountNotFound, "no account")
    await _refused(pool, accounts.reverse_top_up(pool, ids.new_id(), "order-x"), AccountNotFound, "no account")
    await _refused(pool, accounts.get_balance(pool, ids.new_id()), AccountNotFound, "no account")
    await _refused(pool, accounts.get_account(pool, ids.new_id()), AccountNotFound, "no account")
    await closeout.begin_closing(pool, account_id)
    await _refused(pool, accounts.top_up(pool, account_id, "order-x", 5), AccountNotActive, "is closing")
    await closeout.bulk_settle(pool, account_id)
    await closeout.close_out(pool, account_id)
    await _refused(pool, accounts.top_up(pool, account_id, "order-y", 5), AccountNotActive, "is deleted")


@pytest.mark.parametrize(
    ("order", "match"),
    [("x" * 201, "201 characters; the limit is 200"), ("", "non-empty"), ("   ", "non-empty"), (None, "non-empty"),
     (42, "non-empty")],
)
async def test_order_ids_are_bounded(pool, account_id, order, match):
    """Order ids over 200 characters, empty or not strings raise InvalidInput for top-ups and reversals."""
    await _refused(pool, accounts.top_up(pool, account_id, order, 5), InvalidInput, match)
    await _refused(pool, accounts.reverse_top_up(pool, account_id, order), InvalidInput, match)


async def test_order_id_at_the_limit_is_accepted(pool, account_id):
    """Control: a 200-character order id tops up and reverses (the derived ledger ids fit their column)."""
    order = "y" * 200
    assert (await accounts.top_up(pool, account_id, order, 5)).applied
    assert (await accounts.reverse_top_up(pool, account_id, order)).applied
    assert await balance(pool, account_id) == 100


@pytest.mark.parametrize(
    ("name", "price", "match"),
    [
        ("n" * 201, 1, "201 characters; the limit is 200"),
        ("", 1, "non-empty"),
        ("  ", 1, "non-empty"),
        ("acme", -1, "between 0 and"),
        ("acme", accounts.PRICE_MAX + 1, "between 0 and"),
        ("acme", 1.5, "must be an integer, got 1.5"),
        ("acme", True, "must be an integer, got True"),
    ],
)
async def test_create_account_refuses_bad_input(pool, name, price, match):
    """Names over 200 characters or blank, and negative, huge or non-integer prices raise InvalidInput; no account row."""
    await _refused(pool, accounts.create_account(pool, name, price_per_delivery=price), InvalidInput, match)


def _request(account_id, *, event_type="a", payload=b"{}", key=None):
    return messages.MessageRequest(account_id, event_type, payload, key)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"event_type": "e" * 257}, "event_type is longer than 256"),
        ({"event_type": ""}, "event_type must be a non-empty string"),
        ({"event_type": None}, "event_type must be a non-empty string"),
        ({"key": "k" * 256}, "idempotency key must be 1 to 255"),
        ({"key": ""}, "idempotency key must be 1 to 255"),
        ({"key": 7}, "idempotency key must be 1 to 255"),
        ({"payload": "text"}, "payload must be bytes"),
        ({"payload": b"x" * (messages.PAYLOAD_BYTES_MAX + 1)}, "the limit is 1048576"),
    ],
)
async def test_create_message_refuses_bad_fields(pool, account_id, fields, match):
    """Oversized or malformed event types, idempotency keys and payloads raise InvalidInput and charge nothing."""
    await _refused(pool, messages.create_message(pool, _request(account_id, **fields), attempts_max=3), InvalidInput, match)
    assert await balance(pool, account_id) == 100


async def test_fields_at_their_limits_are_accepted(pool, account_id):
    """Control: a 256-character event type and a 255-character key create a message (the schema agrees with the code)."""
    created = await messages.create_message(
        pool, _request(account_id, event_type="e" * 256, key="k" * 255), attempts_max=3)
    assert len(created.deliveries) == 1 and await balance(pool, account_id) == 99


@pytest.mark.parametrize("attempts_max", [0, -1, 51, 2.5, True, None])
async def test_create_message_refuses_bad_attempt_limits(pool, account_id, attempts_max):
    """An attempt limit outside 1..50 or not an integer raises InvalidInput (not a driver error) and writes nothing."""
    await _refused(pool, messages.create_message(pool, _request(account_id), attempts_max=attempts_max),
                   InvalidInput, "attempts_max")


async def test_bad_request_in_a_batch_is_refused_alone(pool, account_id):
    """In a batch, a malformed request gets its InvalidInput back while the valid ones commit."""
    outcome = await messages.create_messages(
        pool, [_request(account_id), _request(account_id, event_type="e" * 257), _request(account_id)], attempts_max=3)
    assert [type(o) for o in outcome] == [messages.MessageCreated, InvalidInput, messages.MessageCreated]
    assert await balance(pool, account_id) == 98


@pytest.mark.parametrize("size", [0, messages.BATCH_REQUESTS_MAX + 1])
async def test_batch_size_is_bounded(pool, account_id, size):
    """An empty batch or one over the limit raises InvalidInput and writes nothing."""
    await _refused(pool, messages.create_messages(pool, [_request(account_id)] * size, attempts_max=3),
                   InvalidInput, "a batch holds")


async def test_unknown_and_non_active_accounts_cannot_send(pool, account_id):
    """A message for an unknown account raises AccountNotFound; for a closing one AccountNotActive; nothing written."""
    await _refused(pool, messages.create_message(pool, _request(ids.new_id()), attempts_max=3), AccountNotFound,
                   "no account")
    await closeout.begin_closing(pool, account_id)
    await _refused(pool, messages.create_message(pool, _request(account_id), attempts_max=3), AccountNotActive,
                   "is closing")
