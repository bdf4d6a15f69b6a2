"""The direct create: PostgreSQL fans out, prices, checks and writes a whole batch in one statement.

The planned create (`billing.message_plan`) reads the batch's accounts and endpoints, decides
every request in Python, and writes what it decided: two round trips, and on the API's one core
about 40 µs of client CPU per message (encoding six delivery columns it made itself, ids, result
objects). Most batches need none of that deciding:
every account active, with a balance that covers everything the batch charges it, no
idempotency key seen before. For those, one autocommit statement does the fan-out itself:

  1. each request's subscribed endpoints, those of its application (one probe of
     ix_endpoints_application_id_account_id per request), numbered per message;
  2. the batch's accounts locked in id order (as every writer locks them, so none deadlocks),
     each kept only if it is active and its balance covers its share of the batch at its price
     as it stands once locked (a row changed by a concurrent write is checked on its newest
     version);
  3. "ok" only if every account of the batch was kept, every application named (other than an
     account's default, which is never deleted) is a live one of its account (one primary-key
     probe each) and still has the uid it was named by, if it was named by uid, no request's
     idempotency key is already used, and no message goes to more endpoints than its delivery
     ids can number;
  4. only if ok: the balances moved, and the messages, deliveries and charges inserted.

It answers ok and the deliveries it made. Not ok, it wrote nothing, and the caller decides the
batch the planned way, which refuses each failing request on its own. So a batch is written
wholly or not at all here too, and what it charges is what the planned way would have charged.

Ids: the message ids are made here (time-ordered UUIDv7s, as everywhere). A message's deliveries
take their ids from one more UUIDv7 made for it, whose last 16 bits the statement replaces by the
delivery's number (1, 2, ...): still time-ordered, and 58 random bits apart from every other
message's. The charge ids are derived from the delivery ids, as always.
"""

from __future__ import annotations

from collections.abc import Sequence

from billing import ids
from billing.message_plan import CHANNEL_SEPARATOR, CreatedDelivery, MessageCreated, MessageRequest, joined_channels

DELIVERIES_PER_MESSAGE_MAX = 0xFFFF  # what the 16 bits of a delivery's number can count


def applies(requests: Sequence[MessageRequest]) -> bool:
    """Whether the direct create can take this batch: none of it targets endpoints of its own
    (a replay), which only the planned way checks, or replays a delivery, whose replay_of only
    the planned way writes (so this statement, the hot path's, carries no column it never sets)."""
    return all(request.endpoint_ids is None and request.replay_of is None for request in requests)


class DirectBatch:
    """One batch's arguments for DIRECT_WRITE, and its results once the statement answers ok."""

    def __init__(self, requests: Sequence[MessageRequest], attempts_max: int) -> None:
        count = len(requests)
        fresh = ids.new_ids(2 * count)
        self.requests = requests
        self.message_ids = fresh[:count]
        self.delivery_bases = fresh[count:]
        self.attempts_max = attempts_max

    def arguments(self) -> tuple:
        requests = self.requests
        return (
            self.message_ids,
            [request.account_id for request in requests],
            [request.event_type for request in requests],
            [request.payload for request in requests],
            *self._keys(),
            self.delivery_bases,
            self.attempts_max,
            self._trace_contexts(),
            [request.application_id or request.account_id for request in requests],
            self._channels(),
            self._uids(),
        )

    def _uids(self) -> list | None:
        """The uid each request named its application by, or one NULL for a batch with none (sent by id)."""
        if all(request.application_uid is None for request in self.requests):
            return None
        return [request.application_uid for request in self.requests]

    def _trace_contexts(self) -> list | None:
        """The messages' trace contexts, or NULL for a batch with none (every batch while tracing is off)."""
        contexts = [request.trace_context for request in self.requests]
        return contexts if any(contexts) else None

    def _channels(self) -> list | None:
        """Each request's channels, joined, or one NULL for a batch without any (most)."""
        if all(request.channels is None for request in self.requests):
            return None
        return [joined_channels(request) for request in self.requests]

    def _keys(self) -> tuple[list | None, list | None]:
        """The idempotency keys and request hashes, or two NULLs for a batch with no key (most):
        unnest pads a NULL array with NULLs, and asyncpg encodes no element of it."""
        requests = self.requests
        if all(request.idempotency_key is None for request in requests):
            return None, None
        return ([request.idempotency_key for request in requests],
                [None if request.idempotency_key is None else request.request_hash() for request in requests])

    def results(self, row) -> list[MessageCreated]:
        """Each request's result from the statement's answer (ok, and the deliveries made).

        Each delivery comes with its request's position in the batch (1-based), so the answer is
        sorted to its requests by list index; grouping by message id hashed a UUID twice a
        message in Python (asyncpg's UUID hashes through a Python int each time)."""
        made: list[list[CreatedDelivery]] = [[] for _ in self.requests]
        if row["delivery_ids"] is not None:
            for position, delivery_id, endpoint_id, price in zip(
                    row["positions"], row["delivery_ids"], row["endpoint_ids"], row["prices"], strict=True):
                made[position - 1].append(CreatedDelivery(delivery_id, endpoint_id, price))
        results = []
        for message_id, request, deliveries in zip(self.message_ids, self.requests, made, strict=True):
            results.append(MessageCreated(message_id, request.account_id, request.event_type, tuple(deliveries),
                                          sum(delivery.price for delivery in deliveries), replayed=False))
        return results


# What a batch made, as the results need it: its deliveries' request (its position in the batch,
# from 1), id, endpoint and price, in id order. `position` is an expression of the query's rows.
def _deliveries_made(position: str) -> str:
    return (f" array_agg({position} ORDER BY d.id) AS positions, array_agg(d.id ORDER BY d.id) AS delivery_ids,"
            " array_agg(d.endpoint_id ORDER BY d.id) AS endpoint_ids, array_agg(d.price ORDER BY d.id) AS prices")


# $1 to $7: per request, its message id, account, event type, payload, idempotency key, request
# hash (keyed requests only; both arrays NULL when no request of the batch is keyed) and the base
# of its deliveries' ids; $8 attempts_max; $9 each message's trace context (NULL while tracing is off);
# $10 per request, its application (the account's id for its default application); $11 per
# request, its channels joined by CHANNEL_SEPARATOR (NULL: none; the whole array NULL when no
# request of the batch has any); $12 per request, the uid it named its application by (NULL: by
# id; the whole array NULL when no request of the batch named one so).
#
# The endpoint probe is LATERAL with OFFSET 0, one index probe per request whatever the
# statistics say, as in the planned read. The key check is a scalar subquery per keyed request,
# an index probe of the (account_id, idempotency_key) unique index: a plain join there let the
# planner hash all of messages. Keys are checked against the statement's snapshot; a key written
# since fails the insert on that index, and the statement writes nothing.
DIRECT_WRITE = (
    "WITH request AS ("
    "   SELECT r.*, string_to_array(r.joined_channels, '" + CHANNEL_SEPARATOR + "') AS channels"
    "   FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], $5::text[], $6::bytea[], $7::uuid[],"
    "     $9::text[], $10::uuid[], $11::text[], $12::text[]) WITH ORDINALITY AS r(message_id, account_id, event_type,"
    "       payload, idempotency_key, request_hash, delivery_base, trace_context, application_id, joined_channels,"
    "       application_uid, position)),"
    " fan_out AS ("
    "   SELECT r.account_id, r.message_id, r.delivery_base, e.id AS endpoint_id,"
    "     row_number() OVER (PARTITION BY r.message_id ORDER BY e.id) AS number"
    "   FROM request r CROSS JOIN LATERAL ("
    "     SELECT e.id FROM endpoints e"
    "     WHERE e.application_id = r.application_id AND e.account_id = r.account_id"
    "       AND e.account_id = ANY ($2::uuid[]) AND e.enabled AND e.deleted_at IS NULL"
    "       AND (e.event_types IS NULL OR r.event_type = ANY (e.event_types) OR (e.event_type_prefixes IS NOT NULL"
    "         AND EXISTS (SELECT FROM unnest(e.event_type_prefixes) AS p WHERE starts_with(r.event_type, p))))"
    "       AND (e.channels IS NULL OR e.channels && r.channels) OFFSET 0) e),"
    " charged AS (SELECT account_id, count(*) AS deliveries FROM fan_out GROUP BY account_id),"
    " locked AS ("
    "   SELECT a.id, a.price_per_delivery AS price, coalesce(c.deliveries, 0) * a.price_per_delivery AS total"
    "   FROM accounts a LEFT JOIN charged c ON c.account_id = a.id"
    "   WHERE a.id = ANY ($2::uuid[]) AND a.status = 'active'"
    "     AND a.balance >= coalesce(c.deliveries, 0) * a.price_per_delivery"
    "   ORDER BY a.id FOR UPDATE OF a),"
    " ok AS ("
    "   SELECT (SELECT count(*) FROM locked) = (SELECT count(DISTINCT account_id) FROM request)"
    "     AND NOT EXISTS (SELECT FROM request r WHERE (r.application_id <> r.account_id OR r.application_uid IS NOT NULL)"
    "       AND (SELECT ap.deleted_at IS NULL AND (r.application_uid IS NULL OR ap.uid = r.application_uid)"
    "            FROM applications ap"
    "            WHERE ap.id = r.application_id AND ap.account_id = r.account_id"
    "              AND ap.account_id = ANY ($2::uuid[])) IS NOT TRUE)"
    "     AND NOT EXISTS (SELECT FROM request r WHERE r.idempotency_key IS NOT NULL"
    "       AND (SELECT true FROM messages m"
    "            WHERE m.account_id = r.account_id AND m.account_id = ANY ($2::uuid[])"
    "              AND m.idempotency_key = r.idempotency_key LIMIT 1))"
    f"     AND coalesce((SELECT max(number) FROM fan_out), 0) <= {DELIVERIES_PER_MESSAGE_MAX} AS ok),"
    " gate AS ("
    "   UPDATE accounts a SET balance = a.balance - l.total, balance_exhausted_armed = true FROM locked l"
    "   WHERE (SELECT ok FROM ok) AND a.id = ANY ($2::uuid[]) AND a.id = l.id AND (l.total <> 0 OR NOT a.balance_exhausted_armed)),"
    " message_rows AS ("
    "   INSERT INTO messages (id, account_id, event_type, payload, idempotency_key, request_hash, trace_context,"
    "     application_id, channels)"
    "   SELECT message_id, account_id, event_type, payload, idempotency_key, request_hash, trace_context,"
    "     application_id, channels"
    "   FROM request"
    "   WHERE (SELECT ok FROM ok)),"
    " delivery_rows AS ("
    "   INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
    "   SELECT (left(f.delivery_base::text, 32) || lpad(to_hex(f.number), 4, '0'))::uuid,"
    "     f.account_id, f.message_id, f.endpoint_id, l.price, $8"
    "   FROM fan_out f JOIN locked l ON l.id = f.account_id WHERE (SELECT ok FROM ok)"
    "   RETURNING id, account_id, message_id, endpoint_id, price),"
    " charge_rows AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   SELECT 'charge:' || id, account_id, id, 'charge', -price FROM delivery_rows)"
    " SELECT (SELECT ok FROM ok) AS ok," + _deliveries_made("r.position")
    + " FROM delivery_rows d JOIN request r ON r.message_id = d.message_id"
)

# What a direct write made, in its answer's shape, read back when that answer was lost ($1 the
# batch's message ids, in the batch's order, $2 its accounts; through the deliveries' message_id index).
DIRECT_READ_BACK = ("SELECT true AS ok," + _deliveries_made("array_position($1::uuid[], d.message_id)")
                    + " FROM deliveries d WHERE d.account_id = ANY ($2::uuid[]) AND d.message_id = ANY ($1::uuid[])")
