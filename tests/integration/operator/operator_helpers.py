"""Helpers for the operator-tool tests: accounts with deliveries in chosen states, raw corruption,
and read-backs of the end state (refunds per delivery, balances)."""

from __future__ import annotations

import uuid

import asyncpg

from billing import accounts, ids
from billing.audit import audit
from billing.messages import MessageRequest, create_messages
from delivery.engine import claims

LEASE_MS_LONG = 3_600_000


async def make_account(pool: asyncpg.Pool, *, balance: int, price: int = 5) -> uuid.UUID:
    account = await accounts.create_account(pool, "operator test", price_per_delivery=price)
    await accounts.top_up(pool, account.id, f"order-{account.id}", balance)
    return account.id


async def add_endpoint(pool: asyncpg.Pool, account_id: uuid.UUID, url: str | None = None) -> uuid.UUID:
    """An endpoint row (no secret): for tests where no worker sends to it."""
    endpoint_id = ids.new_id()
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, $3)",
        endpoint_id, account_id, url or f"https://example.com/hooks/{endpoint_id}",
    )
    return endpoint_id


async def create_many(pool, account_id, endpoint_id, count: int, *, attempts_max: int = 3) -> list[uuid.UUID]:
    """`count` messages targeted at one endpoint, in batches; returns the delivery ids."""
    delivery_ids = []
    for start in range(0, count, 500):
        requests = [MessageRequest(account_id, "test.event", b'{"n": %d}' % n, endpoint_ids=(endpoint_id,))
                    for n in range(start, min(count, start + 500))]
        for result in await create_messages(pool, requests, attempts_max=attempts_max):
            assert not isinstance(result, Exception), result
            delivery_ids.append(result.deliveries[0].id)
    return delivery_ids


async def claim(pool, delivery_ids) -> None:
    """Put deliveries into `sending` with a long lease (a worker that holds them)."""
    rows = await pool.fetch("SELECT account_id, id FROM deliveries WHERE id = ANY($1::uuid[])", list(delivery_ids))
    claimed = await claims.claim_ids(pool, [claims.DeliveryKey(*row) for row in rows], lease_ms=LEASE_MS_LONG)
    assert len(claimed) == len(delivery_ids)


async def refunds_per_delivery(pool, account_id) -> dict[str, int]:
    """How many deliveries have 0, 1, 2... refunds, and the states, for the account (one query)."""
    rows = await pool.fetch(
        "SELECT d.state, count(r.id) AS refunds, count(*) AS n FROM deliveries d"
        " LEFT JOIN ledger_entries r ON r.id = 'refund:' || d.id WHERE d.account_id = $1"
        " GROUP BY d.state, d.id", account_id)
    summary: dict[str, int] = {}
    for row in rows:
        key = f"{row['state']}:{row['refunds']}"
        summary[key] = summary.get(key, 0) + 1
    return summary


async def balance_and_ledger(pool, account_id) -> tuple[int, int, str]:
    row = await pool.fetchrow(
        "SELECT balance, status, (SELECT coalesce(sum(amount), 0)::bigint FROM ledger_entries WHERE account_id = $1)"
        " AS total FROM accounts WHERE id = $1", account_id)
    return row["balance"], row["total"], row["status"]


async def assert_audit_clean(pool, account_id=None):
    report = await audit(pool, account_id)
    assert report.clean, report.to_json()["violations"]
    return report


async def raw_delivery(pool, account_id, endpoint_id, *, price: int = 5, charge: int | None = -5,
                       refund: int | None = None, created_at_sql: str = "now()") -> uuid.UUID:
    """BYPASSES THE APP: a live delivery with whatever ledger rows the test wants (balance kept = ledger)."""
    message_id, delivery_id = ids.new_id(), ids.new_id()
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(
            f"INSERT INTO messages (id, account_id, event_type, payload, created_at)"
            f" VALUES ($1, $2, 'raw.sql', '\\x00', {created_at_sql})", message_id, account_id)
        await connection.execute(
            f"INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max, created_at)"
            f" VALUES ($1, $2, $3, $4, $5, 3, {created_at_sql})", delivery_id, account_id, message_id, endpoint_id, price)
        for kind, amount in (("charge", charge), ("refund", refund)):
            if amount is None:
                continue
            await connection.execute(
                f"INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount, created_at)"
                f" VALUES ($1, $2, $3, $4, $5, {created_at_sql})",
                f"{kind}:{delivery_id}", account_id, delivery_id, kind, amount)
            await connection.execute("UPDATE accounts SET balance = balance + $2 WHERE id = $1", account_id, amount)
    return delivery_id
