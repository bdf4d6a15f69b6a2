"""The settle function: the only way a delivery dies, and the reclaim that undoes a refund.

Every path that gives up on a single delivery calls `settle` with its reason:

    out_of_retries      the last attempt failed                      (delivery.engine.results)
    endpoint_deleted    the endpoint is gone when a retry comes      (delivery.engine.presend)
    account_closed      the pre-send check finds the account closed  (delivery.engine.presend)
    endpoint_disabled   the pre-send check finds the endpoint off    (delivery.engine.presend)
    attempts_exhausted  a claim finds the attempt limit reached      (delivery.engine.claims)
    (run twice)         the same path again finds the refund and adds nothing

Account deletion settles in bulk (billing.closeout) with the same checks, set-based.

One transaction, one lock order everywhere: the account row, then the delivery row. The
refund is the last write, inserted with ON CONFLICT DO NOTHING under its derived id, and the
balance moves only if the refund row was inserted. Anything wrong with the charge raises and
rolls back: a stuck delivery beats a made-up refund, and the audit reports stuck ones.
"""

from __future__ import annotations

import collections
import enum
import uuid
from dataclasses import dataclass

from billing.database import Executor, transaction
from billing.errors import DeliveryNotFound, InvalidInput, LedgerMismatch

# Credits moved by this process since it started, by kind: "refunded" (settle and the bulk settle of
# billing.closeout) and "reclaimed", counted once the write's own transaction (or savepoint) is
# done. Plain counters: billing never imports delivery, whose metrics read them at each scrape.
CREDITS_MOVED: collections.Counter[str] = collections.Counter()


class DeadReason(enum.StrEnum):
    OUT_OF_RETRIES = "out_of_retries"
    ENDPOINT_DELETED = "endpoint_deleted"
    ACCOUNT_CLOSED = "account_closed"
    ENDPOINT_DISABLED = "endpoint_disabled"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    ACCOUNT_DELETED = "account_deleted"


class Outcome(enum.StrEnum):
    REFUNDED = "refunded"  # this call marked it dead and inserted the refund
    ALREADY_SETTLED = "already_settled"  # it was dead and refunded already: nothing added
    DELIVERED = "delivered"  # it was delivered: nothing to refund
    STALE = "stale"  # the caller quoted an attempt the delivery is no longer on
    RECLAIMED = "reclaimed"  # a stale success on a refunded delivery took the refund back
    NOT_RECLAIMED = "not_reclaimed"  # nothing to reclaim (never refunded, already reclaimed, or account not active)


@dataclass(frozen=True)
class Settled:
    delivery_id: uuid.UUID
    outcome: Outcome
    amount: int  # credits moved by this call: +price for a refund, -price for a reclaim, else 0
    reason: DeadReason | None = None  # the reason a refund was made for (outcome REFUNDED)


_LOCK_ACCOUNT_OF_DELIVERY = (
    "SELECT a.id, a.status FROM accounts a"
    " WHERE a.id = (SELECT account_id FROM deliveries WHERE id = $1) FOR UPDATE OF a"
)
_LOCK_DELIVERY_WITH_ENTRIES = (
    "SELECT d.account_id, d.price, d.state, d.attempt,"
    "   c.account_id AS charge_account_id, c.amount AS charge_amount,"
    "   EXISTS (SELECT 1 FROM ledger_entries WHERE id = 'refund:' || d.id) AS refunded,"
    "   EXISTS (SELECT 1 FROM ledger_entries WHERE id = 'reclaim:' || d.id) AS reclaimed"
    " FROM deliveries d LEFT JOIN ledger_entries c ON c.id = 'charge:' || d.id"
    " WHERE d.id = $1 FOR UPDATE OF d"
)
# Mark dead, then refund, then credit only if the refund row was inserted: one statement.
_MARK_DEAD_AND_REFUND = (
    "WITH dead AS ("
    "   UPDATE deliveries SET state = 'dead', dead_reason = coalesce(dead_reason, $2),"
    "       leased_until = NULL, finished_at = coalesce(finished_at, now())"
    "   WHERE id = $1 RETURNING id, account_id, price),"
    " refund AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   SELECT 'refund:' || id, account_id, id, 'refund', price FROM dead"
    "   ON CONFLICT (account_id, id) DO NOTHING RETURNING account_id, amount),"
    " credit AS ("
    "   UPDATE accounts SET balance = balance + refund.amount FROM refund"
    "   WHERE accounts.id = refund.account_id RETURNING refund.amount)"
    " SELECT amount FROM credit"
)
_RECLAIM = (
    "WITH reclaim AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   VALUES ('reclaim:' || $1::uuid, $2, $1, 'reclaim', -$3::bigint)"
    "   ON CONFLICT (account_id, id) DO NOTHING RETURNING amount),"
    " delivered AS ("
    "   UPDATE deliveries SET state = 'delivered', leased_until = NULL, finished_at = now()"
    "   WHERE id = $1 AND EXISTS (SELECT 1 FROM reclaim) RETURNING id),"
    " debit AS ("
    "   UPDATE accounts SET balance = balance + reclaim.amount FROM reclaim"
    "   WHERE accounts.id = $2 RETURNING reclaim.amount)"
    " SELECT amount FROM debit"
)


async def settle(
    executor: Executor, delivery_id: uuid.UUID, reason: DeadReason | str, *, attempt: int | None = None
) -> Settled:
    """Give up on a delivery: mark it dead and refund its charge exactly once.

    `attempt`, when given, is the attempt the caller acted on; if the delivery has moved on,
    nothing changes (fencing). Idempotent: a second call finds the refund and adds nothing.
    """
    reason = _reason(reason)
    async with transaction(executor) as connection:
        account = await connection.fetchrow(_LOCK_ACCOUNT_OF_DELIVERY, delivery_id)
        if account is None:
            raise DeliveryNotFound(f"no delivery {delivery_id}")
        delivery = await connection.fetchrow(_LOCK_DELIVERY_WITH_ENTRIES, delivery_id)
        if attempt is not None and delivery["attempt"] != attempt:
            return Settled(delivery_id, Outcome.STALE, 0)
        if delivery["state"] == "delivered":
            return Settled(delivery_id, Outcome.DELIVERED, 0)
        _check_charge(delivery_id, delivery)
        if delivery["state"] == "dead" and delivery["refunded"]:
            return Settled(delivery_id, Outcome.ALREADY_SETTLED, 0)
        refunded = await connection.fetchval(_MARK_DEAD_AND_REFUND, delivery_id, str(reason))
    if refunded is None:
        return Settled(delivery_id, Outcome.ALREADY_SETTLED, 0)
    CREDITS_MOVED["refunded"] += refunded
    return Settled(delivery_id, Outcome.REFUNDED, refunded, reason)


async def reclaim(executor: Executor, delivery_id: uuid.UUID) -> Settled:
    """A stale attempt succeeded after the delivery was refunded: take the refund back, once.

    The delivery did arrive, so it is paid for once: append reclaim:<id> (only after a refund,
    at most once), mark it delivered, and debit the balance, the only write that may take a
    balance below zero. Never on an account that is not active: the audit lists those.
    """
    async with transaction(executor) as connection:
        account = await connection.fetchrow(_LOCK_ACCOUNT_OF_DELIVERY, delivery_id)
        if account is None:
            raise DeliveryNotFound(f"no delivery {delivery_id}")
        delivery = await connection.fetchrow(_LOCK_DELIVERY_WITH_ENTRIES, delivery_id)
        if (
            account["status"] != "active"
            or delivery["state"] != "dead"
            or not delivery["refunded"]
            or delivery["reclaimed"]
        ):
            return Settled(delivery_id, Outcome.NOT_RECLAIMED, 0)
        _check_charge(delivery_id, delivery)
        amount = await connection.fetchval(_RECLAIM, delivery_id, delivery["account_id"], delivery["price"])
    if amount is None:
        return Settled(delivery_id, Outcome.NOT_RECLAIMED, 0)
    CREDITS_MOVED["reclaimed"] += -amount
    return Settled(delivery_id, Outcome.RECLAIMED, amount)


def _reason(reason: DeadReason | str) -> DeadReason:
    try:
        return DeadReason(reason)
    except ValueError:
        raise InvalidInput(f"unknown dead reason {reason!r}") from None


def _check_charge(delivery_id: uuid.UUID, delivery) -> None:
    if delivery["charge_amount"] is None:
        raise LedgerMismatch(f"delivery {delivery_id} has no charge entry", delivery_id=delivery_id)
    if delivery["charge_account_id"] != delivery["account_id"]:
        raise LedgerMismatch(f"the charge of delivery {delivery_id} belongs to another account", delivery_id=delivery_id)
    if delivery["charge_amount"] != -delivery["price"]:
        raise LedgerMismatch(
            f"the charge of delivery {delivery_id} is {delivery['charge_amount']}, expected {-delivery['price']}",
            delivery_id=delivery_id,
        )
