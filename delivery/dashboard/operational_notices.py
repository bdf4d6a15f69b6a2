"""The overview's notices: the account's newest operational events, each said in one sentence."""

from __future__ import annotations

import uuid

from delivery.store import operational as store

NOTICES_SHOWN = 5
_WHY = {"gone": "it answered 410 Gone", "failing": "it kept failing", "account": "you disabled it",
        "operator": "the operator disabled it"}


def sentence(event: store.OperationalEvent) -> str:
    """What happened, for a person (pure: the event's type and data only)."""
    data = event.data
    if event.type == "endpoint.disabled":
        refunds = data.get("refunds") or {}
        return (f"Endpoint {data.get('url')} was disabled: {_WHY.get(data.get('reason'), data.get('reason'))};"
                f" {refunds.get('deliveries', 0)} pending deliveries are refunded ({refunds.get('amount', 0)} credits).")
    if event.type == "endpoint.enabled":
        return f"Endpoint {data.get('url')} was enabled again."
    if event.type == "endpoint.failing":
        return f"An endpoint keeps failing: {data.get('failures')} failures in a row since {data.get('first_failure_at')}."
    if event.type == "delivery.dead":
        deliveries = data.get("deliveries") or []
        refunded = sum(item.get("refund_amount", 0) for item in deliveries)
        return f"{len(deliveries)} deliveries died and were refunded ({refunded} credits)."
    if event.type == "delivery.recovered":
        return f"A late success recovered delivery {data.get('delivery_id')}: {data.get('reclaimed_amount')} credits charged again."
    if event.type == "balance.low":
        return f"The balance fell to {data.get('balance')}, below your threshold of {data.get('threshold')} credits."
    if event.type == "balance.exhausted":
        return f"A message was refused: the balance ({data.get('balance')}) cannot pay for its deliveries."
    if event.type == "topup.applied":
        return f"{data.get('amount')} credits were added (order {data.get('order_id')})."
    if event.type == "topup.reversed":
        return f"A top-up was reversed: {-int(data.get('amount') or 0)} credits taken back (order {data.get('order_id')})."
    return event.type


async def notices(pool, account_id: uuid.UUID) -> list[dict]:
    """The newest operational events of the account, newest first, with their sentences."""
    events = await store.recent_events(pool, account_id, NOTICES_SHOWN)
    return [{"type": event.type, "at": event.created_at, "text": sentence(event),
             "warn": event.type not in ("endpoint.enabled", "topup.applied", "delivery.recovered")} for event in events]
