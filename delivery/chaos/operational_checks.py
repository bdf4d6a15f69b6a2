"""The chaos run's checks of operational events, read from the run's database and the receivers.

None lost, none invented: each cause in the database has exactly one event (each top-up, reversal
and reclaim entry; each dead delivery, not of a closing account, in exactly one delivery.dead
batch; each endpoint switched off, one endpoint.disabled at least). None stuck: every event of an
active account dispatched, every operational delivery finished; each one delivered was received
by the healthy receiver, signed, and answered 2xx.
"""

from __future__ import annotations

from collections import Counter

import asyncpg

from delivery.chaos.receivers import ReceiverFarm

DETAILS_MAX = 5

_EVENTS_BY_TYPE = "SELECT type, count(*) AS n FROM operational_events GROUP BY type"
_LEDGER_CAUSES = ("SELECT count(*) FILTER (WHERE kind = 'topup') AS topups,"
                  " count(*) FILTER (WHERE kind = 'topup_reversal') AS reversals,"
                  " count(*) FILTER (WHERE kind = 'reclaim') AS reclaims FROM ledger_entries")
_DEAD_IN_EVENTS = ("SELECT item->>'delivery_id' AS id FROM operational_events e,"
                   " jsonb_array_elements(e.data->'deliveries') AS item WHERE e.type = 'delivery.dead'")
_DEAD_DELIVERIES = ("SELECT id::text FROM deliveries WHERE dead_reason IS NOT NULL"
                    " AND dead_reason NOT IN ('account_closed', 'account_deleted')")
# balance.low: at most one per account between two top-ups (once per crossing, armed again by a top-up).
_BALANCE_LOW_TOO_OFTEN = (
    "SELECT e.account_id::text FROM operational_events e WHERE e.type = 'balance.low' GROUP BY e.account_id"
    " HAVING count(*) > 1 + (SELECT count(*) FROM ledger_entries l WHERE l.account_id = e.account_id"
    "   AND l.kind = 'topup')"
)
_DISABLED = ("SELECT count(*) FROM endpoints WHERE NOT enabled AND deleted_at IS NULL"
             " AND account_id IN (SELECT id FROM accounts WHERE status = 'active')")
_UNFINISHED = (
    "SELECT (SELECT count(*) FROM operational_events e JOIN accounts a ON a.id = e.account_id"
    "   WHERE e.dispatched_at IS NULL AND a.status = 'active') AS undispatched,"
    " (SELECT count(*) FROM operational_deliveries WHERE state IN ('pending', 'sending')) AS live,"
    " (SELECT count(*) FROM operational_deliveries WHERE state = 'dead' AND dead_reason <> 'account_closed') AS dead"
)
_DELIVERED_EVENTS = "SELECT DISTINCT event_id::text FROM operational_deliveries WHERE state = 'delivered'"


async def run(pool: asyncpg.Pool, receivers: ReceiverFarm) -> list[tuple[str, bool, str]]:
    """Each check as (name, passed, detail): delivery.chaos.checks makes them its Checks."""
    by_type = Counter({row["type"]: row["n"] for row in await pool.fetch(_EVENTS_BY_TYPE)})
    causes = await pool.fetchrow(_LEDGER_CAUSES)
    ledger_ok = (by_type["topup.applied"], by_type["topup.reversed"], by_type["delivery.recovered"]) == (
        causes["topups"], causes["reversals"], causes["reclaims"])
    in_events = Counter(row["id"] for row in await pool.fetch(_DEAD_IN_EVENTS))
    dead = {row["id"] for row in await pool.fetch(_DEAD_DELIVERIES)}
    twice = [delivery_id for delivery_id, n in in_events.items() if n > 1]
    missing = sorted(dead - set(in_events))
    invented = sorted(set(in_events) - dead)
    disabled = await pool.fetchval(_DISABLED)
    too_often = [row[0] for row in await pool.fetch(_BALANCE_LOW_TOO_OFTEN)]
    unfinished = await pool.fetchrow(_UNFINISHED)
    delivered = {row[0] for row in await pool.fetch(_DELIVERED_EVENTS)}
    unseen = [event_id for event_id in delivered
              if (r := receivers.receipts.get(event_id)) is None or not r.valid or not r.answered_2xx]
    return [
        ("operational events: one per top-up, reversal and reclaim", ledger_ok,
              f"events {dict(by_type)}; ledger {dict(causes)}"),
        ("operational events: each dead delivery in exactly one delivery.dead", not (twice or missing or invented),
              f"{len(dead)} dead, {sum(in_events.values())} in events; twice {twice[:DETAILS_MAX]},"
              f" missing {missing[:DETAILS_MAX]}, invented {invented[:DETAILS_MAX]}"),
        ("operational events: an endpoint.disabled for each disabled endpoint", by_type["endpoint.disabled"] >= disabled,
              f"{disabled} disabled endpoints, {by_type['endpoint.disabled']} endpoint.disabled events"),
        ("operational events: balance.low at most once per crossing", not too_often,
         f"{by_type['balance.low']} balance.low events; too many on {too_often[:DETAILS_MAX]}"),
        ("operational deliveries: all dispatched and finished, none dead", not any(unfinished.values()),
              f"{dict(unfinished)}"),
        ("operational deliveries: each delivered event received, signed, answered 2xx", not unseen,
              f"{len(delivered)} delivered, {len(unseen)} not seen so {sorted(unseen)[:DETAILS_MAX]}"),
    ]
