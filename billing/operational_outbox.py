"""The outbox of operational events: each written in the same transaction as the change that causes it.

Most causes are changes of rows that several code paths write (a delivery marked dead by any of
the six ways it dies, an endpoint switched off by the engine, the account or a person in psql, a
ledger entry), so their events are written by triggers, which fire inside whatever transaction
makes the change: a crash between the change and its event cannot drop one or invent one, and
every path is covered without each remembering to. The migration creates them from the text here.

    event               cause (the row change)                                         written by
    endpoint.disabled   endpoints.enabled true -> false (410, failing too long, by the  trigger on endpoints
                        account, by the operator) of an active account; with the live
                        deliveries whose refunds it causes (the pre-send check refunds them)
    endpoint.enabled    endpoints.enabled false -> true, of an active account           trigger on endpoints
    delivery.dead       a delivery marked dead (not by its account's closing): joins    trigger on deliveries
                        the endpoint's open batch (at most OPERATIONAL_DEAD_BATCH_MAX,
                        dispatched a second after its first death) or opens one
    delivery.recovered  a reclaim entry (a late 2xx took a refund back)                trigger on ledger_entries
    topup.applied       a topup entry; arms balance.low again if the balance is above   trigger on ledger_entries
    topup.reversed      a topup_reversal entry                                          trigger on ledger_entries
    balance.low         the balance falls below low_balance_threshold while armed       trigger on accounts
                        (disarms it, under the account's row lock: one per crossing)
    balance.exhausted   a create refused for its balance while armed (disarms it);     balance_exhausted() here
                        the next accepted message arms it again (the create's own
                        write of the balance, billing.message_plan and
                        billing.message_direct: a top-up, a reversal or a reclaim
                        does not)
    endpoint.failing    the failure streak passed half of what disables the endpoint    record_event() here, with
                        (delivery.engine.endpoint_health), once per streak              a dedupe key

Every statement that writes events notifies WAKE_CHANNEL (a statement trigger on
operational_events; PostgreSQL delivers it when the transaction commits, and never if it rolls
back): the worker listens and sends at once (delivery.operations.operational_wake), with no Redis
involved; its cron remains the fallback for a notification missed.

The triggers on the hot tables are row triggers with a WHEN condition: PostgreSQL evaluates it
without calling any function, so a charge, a claim or a delivered result pays one comparison,
and only the rare rows that cause an event run PL/pgSQL. Nothing here moves money: events and
their deliveries live beside the ledger, never in it, and the audit counts them apart.
"""

from __future__ import annotations

import json
import uuid

from billing.database import Executor
from billing.tables import OPERATIONAL_DEAD_BATCH_MAX, OPERATIONAL_EVENT_TYPES

DEAD_BATCH_WINDOW_SECONDS = 1.0  # a delivery.dead batch is dispatched this long after its first death (or when full)

# A time-ordered UUID (version 7 layout, as billing.ids makes in Python) made by PostgreSQL.
EVENT_ID_FUNCTION = """
CREATE FUNCTION operational_event_id() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$
"""

ENDPOINT_FUNCTION = """
CREATE FUNCTION operational_endpoint_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    live_count bigint;
    live_price bigint;
BEGIN
    -- A closing account's endpoints are switched off by its deletion: nobody is left to tell.
    IF (SELECT status FROM accounts WHERE id = NEW.account_id) <> 'active' THEN
        RETURN NULL;
    END IF;
    IF NEW.enabled THEN
        INSERT INTO operational_events (id, account_id, type, data)
        VALUES (operational_event_id(), NEW.account_id, 'endpoint.enabled',
                jsonb_build_object('endpoint_id', NEW.id, 'url', NEW.url));
        RETURN NULL;
    END IF;
    SELECT count(*), coalesce(sum(price), 0) INTO live_count, live_price FROM deliveries
        WHERE endpoint_id = NEW.id AND state IN ('pending', 'sending');
    INSERT INTO operational_events (id, account_id, type, data)
    VALUES (operational_event_id(), NEW.account_id, 'endpoint.disabled', jsonb_build_object(
        'endpoint_id', NEW.id, 'url', NEW.url,
        'reason', CASE WHEN NEW.disabled_reason IS NULL THEN 'account'
                       WHEN NEW.disabled_reason LIKE '%410 Gone%' THEN 'gone'
                       WHEN NEW.disabled_reason LIKE 'every attempt failed%' THEN 'failing'
                       ELSE 'operator' END,
        'detail', NEW.disabled_reason,
        'refunds', jsonb_build_object('deliveries', live_count, 'amount', live_price)));
    RETURN NULL;
END;
$$
"""
ENDPOINT_TRIGGER = (
    "CREATE TRIGGER operational_endpoint_changed AFTER UPDATE OF enabled ON endpoints FOR EACH ROW"
    " WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled AND NEW.deleted_at IS NULL)"
    " EXECUTE FUNCTION operational_endpoint_changed()"
)

DELIVERY_DEAD_FUNCTION = f"""
CREATE FUNCTION operational_delivery_dead() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    item jsonb;
    key text := 'delivery.dead:' || NEW.endpoint_id;
    open_id uuid;
BEGIN
    item := jsonb_build_object(
        'delivery_id', NEW.id, 'message_id', NEW.message_id, 'reason', NEW.dead_reason, 'attempts', NEW.attempt,
        'last_status_code', (SELECT status_code FROM delivery_attempts WHERE delivery_id = NEW.id
                             ORDER BY attempt DESC LIMIT 1),
        'refund_amount', NEW.price);
    -- The endpoint's open batch, unless another transaction is adding to it: then a batch of our own.
    SELECT id INTO open_id FROM operational_events
        WHERE batch_key = key AND dispatched_at IS NULL AND batch_size < {OPERATIONAL_DEAD_BATCH_MAX}
        ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF open_id IS NULL THEN
        INSERT INTO operational_events (id, account_id, type, data, batch_key)
        VALUES (operational_event_id(), NEW.account_id, 'delivery.dead',
                jsonb_build_object('endpoint_id', NEW.endpoint_id, 'deliveries', jsonb_build_array(item)), key);
    ELSE
        UPDATE operational_events SET batch_size = batch_size + 1,
            data = jsonb_set(data, '{{deliveries}}', (data -> 'deliveries') || item)
        WHERE id = open_id;
    END IF;
    RETURN NULL;
END;
$$
"""
DELIVERY_DEAD_TRIGGER = (
    "CREATE TRIGGER operational_delivery_dead AFTER UPDATE OF state ON deliveries FOR EACH ROW"
    " WHEN (NEW.state = 'dead' AND OLD.state <> 'dead'"
    "   AND NEW.dead_reason NOT IN ('account_closed', 'account_deleted'))"
    " EXECUTE FUNCTION operational_delivery_dead()"
)

LEDGER_FUNCTION = """
CREATE FUNCTION operational_ledger_entry() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_balance bigint;
    delivery record;
BEGIN
    IF NEW.kind = 'topup' THEN
        -- A top-up that lifts the balance to the threshold or above arms balance.low again.
        UPDATE accounts SET low_balance_armed = true WHERE id = NEW.account_id AND NOT low_balance_armed
            AND low_balance_threshold IS NOT NULL AND balance >= low_balance_threshold;
    END IF;
    SELECT balance INTO current_balance FROM accounts WHERE id = NEW.account_id;
    IF NEW.kind = 'reclaim' THEN
        SELECT endpoint_id, message_id INTO delivery FROM deliveries WHERE id = NEW.delivery_id;
        INSERT INTO operational_events (id, account_id, type, data)
        VALUES (operational_event_id(), NEW.account_id, 'delivery.recovered', jsonb_build_object(
            'delivery_id', NEW.delivery_id, 'endpoint_id', delivery.endpoint_id, 'message_id', delivery.message_id,
            'reclaimed_amount', -NEW.amount, 'balance', current_balance));
    ELSE
        INSERT INTO operational_events (id, account_id, type, data)
        VALUES (operational_event_id(), NEW.account_id,
                CASE NEW.kind WHEN 'topup' THEN 'topup.applied' ELSE 'topup.reversed' END,
                jsonb_build_object('order_id', substr(NEW.id, position(':' IN NEW.id) + 1),
                                   'amount', NEW.amount, 'balance', current_balance));
    END IF;
    RETURN NULL;
END;
$$
"""
LEDGER_TRIGGER = (
    "CREATE TRIGGER operational_ledger_entry AFTER INSERT ON ledger_entries FOR EACH ROW"
    " WHEN (NEW.kind IN ('topup', 'topup_reversal', 'reclaim'))"
    " EXECUTE FUNCTION operational_ledger_entry()"
)

# BEFORE UPDATE: the function disarms the flag in the row being written, under its lock, so that
# of any number of concurrent charges crossing the threshold exactly one writes the event.
BALANCE_LOW_FUNCTION = """
CREATE FUNCTION operational_balance_low() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.low_balance_armed := false;
    INSERT INTO operational_events (id, account_id, type, data)
    VALUES (operational_event_id(), NEW.id, 'balance.low', jsonb_build_object(
        'balance', NEW.balance, 'threshold', NEW.low_balance_threshold));
    RETURN NEW;
END;
$$
"""
BALANCE_LOW_TRIGGER = (
    "CREATE TRIGGER operational_balance_low BEFORE UPDATE OF balance ON accounts FOR EACH ROW"
    " WHEN (NEW.balance < OLD.balance AND NEW.low_balance_armed AND NEW.low_balance_threshold IS NOT NULL"
    "   AND NEW.balance < NEW.low_balance_threshold)"
    " EXECUTE FUNCTION operational_balance_low()"
)
# What migration 0015 created to arm balance.exhausted again: any debit did (a reclaim or a top-up
# reversal too, not only an accepted message). Migration 0020 drops it (its downgrade restores it):
# the create statements set balance_exhausted_armed themselves.
EXHAUSTED_REARM_FUNCTION = """
CREATE FUNCTION operational_balance_exhausted_rearm() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.balance_exhausted_armed := true;
    RETURN NEW;
END;
$$
"""
EXHAUSTED_REARM_TRIGGER = (
    "CREATE TRIGGER operational_balance_exhausted_rearm BEFORE UPDATE OF balance ON accounts FOR EACH ROW"
    " WHEN (NEW.balance < OLD.balance AND NOT NEW.balance_exhausted_armed)"
    " EXECUTE FUNCTION operational_balance_exhausted_rearm()"
)

# Wakes the worker's operational sender when events are written (on commit; once per statement).
WAKE_CHANNEL = "hookledger_operational"
WAKE_FUNCTION = f"""
CREATE FUNCTION operational_event_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{WAKE_CHANNEL}', '');
    RETURN NULL;
END;
$$
"""
WAKE_TRIGGER = (
    "CREATE TRIGGER operational_event_written AFTER INSERT ON operational_events FOR EACH STATEMENT"
    " EXECUTE FUNCTION operational_event_written()"
)

# What migration 0015 creates, in order, and what it drops (functions with their triggers).
CREATE_STATEMENTS = (
    EVENT_ID_FUNCTION,
    ENDPOINT_FUNCTION, ENDPOINT_TRIGGER,
    DELIVERY_DEAD_FUNCTION, DELIVERY_DEAD_TRIGGER,
    LEDGER_FUNCTION, LEDGER_TRIGGER,
    BALANCE_LOW_FUNCTION, BALANCE_LOW_TRIGGER,
    EXHAUSTED_REARM_FUNCTION, EXHAUSTED_REARM_TRIGGER,
)
# The triggers on the tables of the create path, as migration 0020 leaves them
# (scripts/bench_ingest.py --operational-compare measures the create path without them, then with).
TRIGGERS = (ENDPOINT_TRIGGER, DELIVERY_DEAD_TRIGGER, LEDGER_TRIGGER, BALANCE_LOW_TRIGGER)
DROP_TRIGGERS = (
    "DROP TRIGGER operational_balance_low ON accounts",
    "DROP TRIGGER operational_ledger_entry ON ledger_entries",
    "DROP TRIGGER operational_delivery_dead ON deliveries",
    "DROP TRIGGER operational_endpoint_changed ON endpoints",
)
DROP_EXHAUSTED_REARM = (
    "DROP TRIGGER operational_balance_exhausted_rearm ON accounts",
    "DROP FUNCTION operational_balance_exhausted_rearm()",
)
# Migration 0015's downgrade (after 0020's has restored the rearm trigger).
DROP_STATEMENTS = (
    *DROP_EXHAUSTED_REARM,
    *DROP_TRIGGERS,
    "DROP FUNCTION operational_balance_low()",
    "DROP FUNCTION operational_ledger_entry()",
    "DROP FUNCTION operational_delivery_dead()",
    "DROP FUNCTION operational_endpoint_changed()",
    "DROP FUNCTION operational_event_id()",
)

# Disarm balance.exhausted and write the event, one statement: the accounts locked in id order,
# and only those still armed, so concurrent refusals of one account write one event.
_BALANCE_EXHAUSTED = (
    "WITH armed AS (SELECT id FROM accounts WHERE id = ANY($1::uuid[]) AND balance_exhausted_armed"
    "   AND status = 'active' ORDER BY id FOR UPDATE),"
    " disarmed AS (UPDATE accounts a SET balance_exhausted_armed = false FROM armed"
    "   WHERE a.id = ANY($1::uuid[]) AND a.id = armed.id"
    "   AND a.balance_exhausted_armed RETURNING a.id, a.balance, a.price_per_delivery)"
    " INSERT INTO operational_events (id, account_id, type, data)"
    " SELECT operational_event_id(), id, 'balance.exhausted',"
    "   jsonb_build_object('balance', balance, 'price_per_delivery', price_per_delivery) FROM disarmed"
)
_RECORD_EVENT = (
    "INSERT INTO operational_events (id, account_id, type, data, dedupe_key)"
    " VALUES (operational_event_id(), $1, $2, $3::jsonb, $4)"
    " ON CONFLICT (account_id, dedupe_key) DO NOTHING RETURNING id"
)


async def balance_exhausted(executor: Executor, account_ids: list[uuid.UUID]) -> None:
    """A create of these accounts was refused for its balance: balance.exhausted, once until a message is accepted."""
    if account_ids:
        await executor.execute(_BALANCE_EXHAUSTED, sorted(set(account_ids)))


async def record_event(executor: Executor, account_id: uuid.UUID, event_type: str, data: dict,
                       *, dedupe_key: str | None = None) -> uuid.UUID | None:
    """Write one event (in the caller's transaction when it has one); None when its dedupe key was seen."""
    assert event_type in OPERATIONAL_EVENT_TYPES, event_type
    return await executor.fetchval(_RECORD_EVENT, account_id, event_type, json.dumps(data), dedupe_key)


def _replaced(function: str, *changes: tuple[str, str]) -> str:
    """`function` as CREATE OR REPLACE, with each (old, new) text changed exactly once."""
    for old, new in changes:
        assert function.count(old) == 1, (old, function)
        function = function.replace(old, new)
    return function.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# Migration 0024: the trigger functions that looked rows up by a bare id (or locked another table's
# rows by a key of their own) name the account of the row that fired them, so that on tables
# distributed (or hash-partitioned) by account_id each statement goes to that account's shard.
# The events they write are the same.
ACCOUNT_NAMED_FUNCTIONS = (
    _replaced(ENDPOINT_FUNCTION, (
        "WHERE endpoint_id = NEW.id AND", "WHERE account_id = NEW.account_id AND endpoint_id = NEW.id AND")),
    _replaced(
        DELIVERY_DEAD_FUNCTION,
        ("FROM delivery_attempts WHERE delivery_id = NEW.id",
         "FROM delivery_attempts WHERE account_id = NEW.account_id AND delivery_id = NEW.id"),
        ("WHERE batch_key = key AND", "WHERE account_id = NEW.account_id AND batch_key = key AND"),
        ("WHERE id = open_id;", "WHERE account_id = NEW.account_id AND id = open_id;"),
    ),
    _replaced(LEDGER_FUNCTION, (
        "FROM deliveries WHERE id = NEW.delivery_id;",
        "FROM deliveries WHERE account_id = NEW.account_id AND id = NEW.delivery_id;")),
)
# Its downgrade: the functions as 0015 made them.
ACCOUNT_NAMED_RESET = tuple(
    function.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    for function in (ENDPOINT_FUNCTION, DELIVERY_DEAD_FUNCTION, LEDGER_FUNCTION)
)
