"""Send operational events: dispatch the outbox, claim what is due, sign, send, record, retry.

The worker runs `run_once` every OPERATIONAL_SECONDS (its `operational` cron) and the same work
needs no Redis: everything is in PostgreSQL, and a step lost to a killed worker or a PostgreSQL
restart is done again from there.

1. Dispatch (one statement): events not yet dispatched (a delivery.dead batch once it is full or
   DEAD_BATCH_WINDOW_SECONDS old) get one operational delivery per subscribed, enabled
   operational endpoint of their account (if it is active), and are marked dispatched. Unique (event, endpoint):
   a dispatch run twice makes nothing twice.
2. Expire leases: a delivery left `sending` past its lease (its worker died) is due again, or dead
   when that was its last attempt.
3. Claim (SKIP LOCKED): due deliveries go `sending` on their next attempt, leased.
4. Send each with the Standard Webhooks headers signed by the operational endpoint's own secret:
   webhook-id is the event's id, the body `{"type", "timestamp", "data"}`, the same bytes on
   every attempt. The existing sender (SSRF guard at connect time, bounded reads, timeouts).
5. Record, fenced by attempt as deliveries are: 2xx delivered; else the next attempt on the
   retry schedule (Retry-After honoured), or dead (`out_of_retries`) after the last.
6. Health: a 410 Gone, or a failure streak that meets the auto-disable policy, switches the
   operational endpoint off and ends its pending deliveries (delivery.operations.operational_health).

Operational deliveries are never charged and never touch the ledger or the deliveries table.

Accounts. Recording a result and the health writes name the delivery's account. The dispatch, the
lease expiry and the claim find work across accounts. On one server each locks what it finds
(FOR UPDATE SKIP LOCKED) in one statement, as the delivery claims do; with
HOOKLEDGER_ACCOUNT_SHARDS above 1 each reads without a lock, then locks and writes shard by shard,
every statement naming the accounts of one shard (delivery.engine.claims does the same).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

import asyncpg

from billing.operational_outbox import DEAD_BATCH_WINDOW_SECONDS
from billing.shards import by_shard
from billing.tables import OPERATIONAL_DEAD_BATCH_MAX
from delivery.engine import retry
from delivery.engine.sender import Sender, SendRequest, SendResult
from delivery.operations import operational_health
from delivery.store.operational import open_secret
from signing import Keyring, Signer

logger = logging.getLogger(__name__)

DISPATCH_BATCH_MAX = 500  # events dispatched per statement
CLAIM_BATCH_MAX = 100  # deliveries claimed per run
LEASE_MS = 60_000  # the default; the worker passes its own (HOOKLEDGER_LEASE_MS)
SEND_TIMEOUT_MS = 10_000  # the default; a send ends within half its lease in any case
ERROR_CHARS_MAX = 1000


@dataclass(frozen=True)
class RunReport:
    dispatched: int = 0
    expired: int = 0
    sent: int = 0
    delivered: int = 0
    retrying: int = 0
    dead: int = 0


# Each step below comes in two forms. On one server (HOOKLEDGER_ACCOUNT_SHARDS at 1) one statement
# finds the work of every account and locks it as it reads (FOR UPDATE SKIP LOCKED). With more
# shards, as the delivery claims do (delivery.engine.claims), the work is read without a lock (a
# read across shards is fine on a distributed engine), then locked shard by shard: each statement is
# given the keys of one shard's accounts, (account, id) pairwise, and names those accounts in every
# table it reads (`account_id = ANY(...)`, the form a distributed engine prunes shards by); each row
# is checked again under its lock, so a row another worker took meanwhile is skipped.
def _one_shard(statement: str, accounts: str | None) -> str:
    """`statement` with its `{named:x}` marks filled: nothing on one server, or with `accounts`
    (a parameter) `AND x.account_id = ANY(accounts)`."""
    for alias in ("a", "d", "e", "o"):
        column = "id" if alias == "a" else "account_id"
        statement = statement.replace("{named:" + alias + "}",
                                      "" if accounts is None else f" AND {alias}.{column} = ANY({accounts})")
    return statement


def _locked(table: str, columns: str, where: str, order: str, accounts: str | None, ids: str | None) -> str:
    """The rows of `table` matching `where`, locked: the first $1 by `order` of every account, or
    (with `accounts` and `ids`) those of these keys still matching."""
    if accounts is None:
        return f"SELECT {columns} FROM {table} WHERE {where} ORDER BY {order} LIMIT $1 FOR UPDATE SKIP LOCKED"
    picked = ", ".join("p." + column.strip() for column in columns.split(","))
    return (f"SELECT {picked} FROM unnest({accounts}, {ids}) AS k(account_id, id) CROSS JOIN LATERAL ("
            f"SELECT {columns} FROM {table} WHERE account_id = k.account_id AND id = k.id"
            f" AND account_id = ANY({accounts}) AND {where} OFFSET 0 FOR UPDATE SKIP LOCKED) p LIMIT $1")


_READY = ("dispatched_at IS NULL AND (batch_key IS NULL OR batch_size >= $2"
          " OR created_at <= now() - $3 * interval '1 second')")


def _dispatch(accounts: str | None = None, ids: str | None = None) -> str:
    """Mark ready events dispatched and make one delivery per subscribed operational endpoint."""
    return _one_shard(
        "WITH ready AS (" + _locked("operational_events", "id, account_id, type", _READY, "seq", accounts, ids) + "),"
        " marked AS (UPDATE operational_events e SET dispatched_at = now() FROM ready"
        "   WHERE e.account_id = ready.account_id AND e.id = ready.id{named:e} RETURNING e.id),"
        " made AS ("
        "   INSERT INTO operational_deliveries (id, account_id, event_id, endpoint_id, attempts_max)"
        "   SELECT operational_event_id(), r.account_id, r.id, o.id, $4 FROM ready r"
        "   JOIN accounts a ON a.id = r.account_id AND a.status = 'active'{named:a}"
        "   JOIN operational_endpoints o ON o.account_id = r.account_id AND o.enabled AND o.deleted_at IS NULL"
        "     AND (o.event_types IS NULL OR r.type = ANY (o.event_types)){named:o}"
        "   ON CONFLICT (account_id, event_id, endpoint_id) DO NOTHING RETURNING id)"
        " SELECT (SELECT count(*) FROM marked) AS events, (SELECT count(*) FROM made) AS deliveries",
        accounts)


_LEASE_EXPIRED = "state = 'sending' AND leased_until < now()"


def _expire_leases(accounts: str | None = None, ids: str | None = None) -> str:
    """Deliveries left `sending` past their lease: due again, or dead if that was their last attempt."""
    return _one_shard(
        "WITH expired AS (" + _locked("operational_deliveries", "account_id, id", _LEASE_EXPIRED, "id", accounts, ids) + ")"
        " UPDATE operational_deliveries d SET leased_until = NULL,"
        "   state = CASE WHEN attempt >= attempts_max THEN 'dead' ELSE 'pending' END,"
        "   dead_reason = CASE WHEN attempt >= attempts_max THEN 'attempts_exhausted' END,"
        "   finished_at = CASE WHEN attempt >= attempts_max THEN now() END,"
        "   last_error = 'lease expired before a result was recorded', next_attempt_at = now()"
        " FROM expired WHERE d.account_id = expired.account_id AND d.id = expired.id{named:d}",
        accounts)


_DUE = "state = 'pending' AND next_attempt_at <= now()"


def _claim(accounts: str | None = None, ids: str | None = None) -> str:
    """Due deliveries, claimed, with what sending them needs. An endpoint disabled or deleted since
    the dispatch, or an account no longer active: its delivery dies unsent (in the same statement)."""
    return _one_shard(
        "WITH due AS (" + _locked("operational_deliveries", "account_id, id", _DUE, "next_attempt_at", accounts, ids) + "),"
        " claimed AS ("
        "   UPDATE operational_deliveries d SET"
        "     state = CASE WHEN o.enabled AND a.status = 'active' THEN 'sending' ELSE 'dead' END,"
        "     dead_reason = CASE WHEN a.status <> 'active' THEN 'account_closed' WHEN o.enabled THEN NULL"
        "       WHEN o.deleted_at IS NULL THEN 'endpoint_disabled' ELSE 'endpoint_deleted' END,"
        "     finished_at = CASE WHEN o.enabled AND a.status = 'active' THEN NULL ELSE now() END,"
        "     attempt = d.attempt + CASE WHEN o.enabled AND a.status = 'active' THEN 1 ELSE 0 END,"
        "     leased_until = CASE WHEN o.enabled AND a.status = 'active' THEN now() + $2 * interval '1 millisecond' END"
        "   FROM due, operational_endpoints o, accounts a"
        "   WHERE d.account_id = due.account_id AND d.id = due.id AND o.account_id = d.account_id"
        "     AND o.id = d.endpoint_id AND a.id = d.account_id{named:d}{named:o}{named:a}"
        "   RETURNING d.id, d.account_id, d.event_id, d.endpoint_id, d.attempt, d.attempts_max, d.state, o.url, o.secret)"
        " SELECT c.*, e.type, e.created_at, e.data FROM claimed c"
        " JOIN operational_events e ON e.account_id = c.account_id AND e.id = c.event_id{named:e}",
        accounts)


_DISPATCH, _EXPIRE_LEASES, _CLAIM = _dispatch(), _expire_leases(), _claim()
_DISPATCH_KEYS = _dispatch("$5::uuid[]", "$6::uuid[]")
_EXPIRE_LEASES_KEYS = _expire_leases("$2::uuid[]", "$3::uuid[]")
_CLAIM_KEYS = _claim("$3::uuid[]", "$4::uuid[]")
# What each step would take, read without a lock (with more than one shard).
_FIND_READY = "SELECT account_id, id FROM operational_events WHERE " + _READY + " ORDER BY seq LIMIT $1"
_FIND_LEASE_EXPIRED = "SELECT account_id, id FROM operational_deliveries WHERE " + _LEASE_EXPIRED + " ORDER BY id LIMIT $1"
_FIND_DUE = "SELECT account_id, id FROM operational_deliveries WHERE " + _DUE + " ORDER BY next_attempt_at LIMIT $1"
_DELIVERED = (
    "UPDATE operational_deliveries SET state = 'delivered', leased_until = NULL, finished_at = now(),"
    "   last_status_code = $3, last_error = NULL"
    " WHERE account_id = $4 AND id = $1 AND attempt = $2 AND state = 'sending'"
)
_RETRY = (
    "UPDATE operational_deliveries SET state = 'pending', leased_until = NULL,"
    "   next_attempt_at = now() + $5 * interval '1 second', last_status_code = $3, last_error = $4"
    " WHERE account_id = $6 AND id = $1 AND attempt = $2 AND state = 'sending' AND attempt < attempts_max"
)
_DEAD = (
    "UPDATE operational_deliveries SET state = 'dead', dead_reason = 'out_of_retries', leased_until = NULL,"
    "   finished_at = now(), last_status_code = $3, last_error = $4"
    " WHERE account_id = $5 AND id = $1 AND attempt = $2 AND state = 'sending'"
)


def _count(status: str) -> int:
    """The row count of a command status ("UPDATE 3")."""
    return int(status.split()[-1])


def event_body(event_type: str, created_at, data: str) -> bytes:
    """The payload (Standard Webhooks structure), the same bytes on every attempt of the event."""
    return json.dumps({"type": event_type, "timestamp": created_at.isoformat(), "data": json.loads(data)},
                      separators=(",", ":")).encode()


class OperationalSender:
    def __init__(self, pool: asyncpg.Pool, sender: Sender, keyring: Keyring | None,
                 settings: retry.RetrySettings, rng: random.Random | None = None, *, lease_ms: int = LEASE_MS,
                 timeout_ms: int = SEND_TIMEOUT_MS, shards: int = 1, shard_hash: str = "postgres") -> None:
        self.lease_ms = lease_ms
        self.shards = shards  # HOOKLEDGER_ACCOUNT_SHARDS: above 1, each locking step runs per shard
        self.shard_hash = shard_hash
        self.timeout_ms = max(1000, min(timeout_ms, lease_ms // 2))
        self.pool = pool
        self.sender = sender
        self.keyring = keyring
        self.settings = settings
        self.rng = rng or random.Random()

    async def run_once(self) -> RunReport:
        """Dispatch, expire leases, claim, send and record one bounded round."""
        dispatched = await self._dispatch()
        expired = await self._expire_leases()
        claimed = await self._claim()
        sending = [row for row in claimed if row["state"] == "sending"]
        results = await asyncio.gather(*(self._send(row) for row in sending))
        outcomes = [await self._record(row, result) for row, result in zip(sending, results, strict=True)]
        return RunReport(dispatched=dispatched, expired=expired, sent=len(sending),
                         delivered=outcomes.count("delivered"), retrying=outcomes.count("retrying"),
                         dead=outcomes.count("dead") + len(claimed) - len(sending))

    async def _dispatch(self) -> int:
        arguments = (DISPATCH_BATCH_MAX, OPERATIONAL_DEAD_BATCH_MAX, DEAD_BATCH_WINDOW_SECONDS,
                     self.settings.schedule.attempts_max)
        if self.shards == 1:
            return (await self.pool.fetchrow(_DISPATCH, *arguments))["events"]
        dispatched = 0
        for accounts, ids in await self._found(_FIND_READY, *arguments[:3]):
            dispatched += (await self.pool.fetchrow(_DISPATCH_KEYS, *arguments, accounts, ids))["events"]
        return dispatched

    async def _expire_leases(self) -> int:
        if self.shards == 1:
            return _count(await self.pool.execute(_EXPIRE_LEASES, CLAIM_BATCH_MAX))
        expired = 0
        for accounts, ids in await self._found(_FIND_LEASE_EXPIRED, CLAIM_BATCH_MAX):
            expired += _count(await self.pool.execute(_EXPIRE_LEASES_KEYS, CLAIM_BATCH_MAX, accounts, ids))
        return expired

    async def _claim(self) -> list[asyncpg.Record]:
        if self.shards == 1:
            return await self.pool.fetch(_CLAIM, CLAIM_BATCH_MAX, self.lease_ms)
        claimed: list[asyncpg.Record] = []
        for accounts, ids in await self._found(_FIND_DUE, CLAIM_BATCH_MAX):
            claimed += await self.pool.fetch(_CLAIM_KEYS, CLAIM_BATCH_MAX, self.lease_ms, accounts, ids)
        return claimed

    async def _found(self, statement: str, *arguments: object) -> list[tuple[list, list]]:
        """The (account, id) keys `statement` finds, without a lock, as one (accounts, ids) pair of
        lists per shard of their accounts."""
        keys = [(row[0], row[1]) for row in await self.pool.fetch(statement, *arguments)]
        return [([key[0] for key in group], [key[1] for key in group])
                for group in by_shard(keys, self.shards, self.shard_hash)]

    async def _send(self, row) -> SendResult:
        try:
            secret = (open_secret(row["secret"], self.keyring, row["endpoint_id"])
                      if self.keyring and row["secret"] is not None else None)
        except Exception as error:  # noqa: BLE001 - a secret that cannot be opened fails this attempt
            logger.warning("operational endpoint %s: its secret cannot be decrypted (%r)", row["endpoint_id"], error)
            secret = None
        if secret is None:
            return SendResult(None, 0, "not sent: the operational endpoint's secret cannot be decrypted", "", None,
                              False, False)
        body = event_body(row["type"], row["created_at"], row["data"])
        signer = Signer([secret])
        event_id = str(row["event_id"])
        request = SendRequest(str(row["id"]), row["attempt"], row["url"], body,
                              lambda: signer.headers(event_id, int(time.time()), body), self.timeout_ms,
                              str(row["endpoint_id"]))
        return await self.sender.send(request)

    async def _record(self, row, result: SendResult) -> str:
        outcome = await self._record_result(row, result)
        if outcome == "delivered":
            await operational_health.succeeded(self.pool, row["account_id"], row["endpoint_id"])
        elif outcome != "stale":
            gone = retry.classify(result.status_code) is retry.Outcome.GONE
            await operational_health.failed(self.pool, row["account_id"], row["endpoint_id"], gone,
                                            self.settings.auto_disable)
        return outcome

    async def _record_result(self, row, result: SendResult) -> str:
        error = result.error[:ERROR_CHARS_MAX] if result.error else None
        if result.success:
            if await self.pool.execute(_DELIVERED, row["id"], row["attempt"], result.status_code,
                                       row["account_id"]) != "UPDATE 1":
                return "stale"
            return "delivered"
        delay = retry.delay_before(row["attempt"] + 1, self.settings.schedule, self.rng)
        if delay is not None:
            if result.retry_after_seconds is not None:
                delay = max(delay, min(result.retry_after_seconds, self.settings.delay_cap_seconds))
            if await self.pool.execute(_RETRY, row["id"], row["attempt"], result.status_code, error,
                                       float(delay), row["account_id"]) == "UPDATE 1":
                return "retrying"
        if await self.pool.execute(_DEAD, row["id"], row["attempt"], result.status_code, error,
                                       row["account_id"]) != "UPDATE 1":
            return "stale"
        return "dead"


async def operational_counts(pool: asyncpg.Pool) -> dict[str, int]:
    """Operational deliveries by state (for the audit's report: counted apart, never charged)."""
    rows = await pool.fetch("SELECT state, count(*) AS n FROM operational_deliveries GROUP BY state")
    return {row["state"]: row["n"] for row in rows}
