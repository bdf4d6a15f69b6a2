"""The lease sweep and the operational sender lock one shard's accounts per statement, and still
never take a row twice.

With HOOKLEDGER_ACCOUNT_SHARDS at 1 each of them is one statement that locks as it reads, as
before; at 8, the work is read without a lock, then locked and written shard by shard, each
statement naming the accounts of one shard. Several sweepers (or senders) race over the rows of 20
accounts, round after round; each row is taken exactly once, and every locking statement, captured
as PostgreSQL receives it (asyncpg's query logger), names the accounts of one shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from engine_helpers import create_logged_pool, keyring
from operational_helpers import add_operational_endpoint, start_operational_receiver

from billing import accounts, shards
from billing.messages import MessageRequest, create_messages
from delivery.engine import claims, results
from delivery.engine.retry import RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.operations.operational_sender import OperationalSender

__all__ = ["keyring"]  # a fixture, used by name

LEASE_MS = 60_000
ACCOUNTS = 20
DELIVERIES_PER_ACCOUNT = 10
SWEEPERS = 4
ROUNDS = 15
TOP_UPS_PER_ACCOUNT = 4  # each makes one topup.applied operational event
SENDERS = 3


class Statements:
    """What a logged pool sent: each statement with its arguments."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple]] = []

    def __call__(self, record) -> None:
        if record.exception is None:
            self.sent.append((record.query, tuple(record.args or ())))

    def locking(self, table: str) -> list[tuple[str, tuple]]:
        return [(query, args) for query, args in self.sent if "FOR UPDATE" in query and table in query]


def check_one_shard_each(locking: list[tuple[str, tuple]], shard_count: int, account_ids: set[uuid.UUID]) -> None:
    """Each locking statement names the accounts of one shard: its first array argument holds them
    (the keys' accounts, pairwise with the second). With one shard, the one statement of old."""
    assert locking, "no locking statement was captured: the check below proved nothing"
    if shard_count == 1:
        assert all("LIMIT $1 FOR UPDATE SKIP LOCKED" in query for query, _ in locking)
        return
    seen = set()
    for query, args in locking:
        named, ids = [argument for argument in args if isinstance(argument, list)][:2]
        assert named and len(named) == len(ids) and set(named) <= account_ids, query
        statement_shards = {shards.shard_of(account_id, shard_count) for account_id in named}
        assert len(statement_shards) == 1, f"one statement named accounts of shards {statement_shards}: {query}"
        seen |= statement_shards
    assert len(seen) > 1, "every account fell in one shard: the check proved nothing"


async def _deliveries(pool) -> set[uuid.UUID]:
    """ACCOUNTS accounts with one endpoint each and their pending deliveries."""
    for number in range(ACCOUNTS):
        account = await accounts.create_account(pool, f"sweep test {number}", price_per_delivery=1)
        await accounts.top_up(pool, account.id, f"o-{account.id}", 1_000)
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                           uuid.uuid4(), account.id)
        await create_messages(pool, [MessageRequest(account.id, "t", b"{}") for _ in range(DELIVERIES_PER_ACCOUNT)],
                              attempts_max=ROUNDS + 1)
    return {row["id"] for row in await pool.fetch("SELECT id FROM deliveries")}


@pytest.mark.parametrize("shard_count", [1, 8])
async def test_racing_lease_sweeps_expire_each_lease_once(pool, database_url, shard_count):
    """4 sweepers race over 200 expired leases of 20 accounts, 15 rounds: each round every lease is
    expired exactly once (one lease-expired attempt on record per delivery and attempt), and the
    deliveries are pending again; with 8 shards every locking statement names one shard's accounts."""
    every = await _deliveries(pool)
    account_ids = {row["account_id"] for row in await pool.fetch("SELECT account_id FROM deliveries")}
    log = Statements()
    logged = await create_logged_pool(database_url, log)
    try:
        for round_number in range(1, ROUNDS + 1):
            claimed = await claims.claim_due(pool, batch_size=claims.CLAIM_BATCH_MAX, lease_ms=LEASE_MS)
            assert {delivery.id for delivery in claimed} == every
            await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second'")
            start = asyncio.Event()

            async def sweeper() -> list[uuid.UUID]:
                await start.wait()
                expired = []
                while found := await results.expire_leases(logged, batch_size=40, delay_seconds=lambda attempt: 0.0,
                                                           shards=shard_count):
                    expired += found
                return expired

            tasks = [asyncio.create_task(sweeper()) for _ in range(SWEEPERS)]
            start.set()
            expired = [delivery_id for task in await asyncio.gather(*tasks) for delivery_id in task]
            expired += await results.expire_leases(logged, batch_size=claims.CLAIM_BATCH_MAX,
                                                   delay_seconds=lambda attempt: 0.0, shards=shard_count)
            assert len(expired) == len(set(expired)), f"round {round_number}: a lease expired twice"
            assert set(expired) == every, f"round {round_number}: not every lease expired"
            states = await pool.fetch("SELECT state, attempt, count(*) FROM deliveries GROUP BY 1, 2")
            assert [tuple(row) for row in states] == [("pending", round_number, len(every))]
            attempts = await pool.fetchval(
                "SELECT count(*) FROM delivery_attempts WHERE attempt = $1 AND error = $2", round_number,
                results.LEASE_EXPIRED_ERROR)
            assert attempts == len(every), f"round {round_number}: {attempts} lease-expired attempts"
    finally:
        await logged.close()
    check_one_shard_each(log.locking("FROM deliveries"), shard_count, account_ids)
    if shard_count > 1:  # the first read takes no lock
        reads = [query for query, _ in log.sent if query.startswith("SELECT account_id, id FROM deliveries")]
        assert reads and not any("FOR UPDATE" in query for query in reads)


@contextlib.asynccontextmanager
async def _senders(logged, keyring, shard_count: int):
    sender = Sender(SenderSettings(allow_loopback=True, timeout_ms_default=5000, timeout_ms_max=5000))
    try:
        yield [OperationalSender(logged, sender, keyring, RetrySettings(), lease_ms=LEASE_MS, shards=shard_count)
               for _ in range(SENDERS)]
    finally:
        await sender.close()


@pytest.mark.parametrize("shard_count", [1, 8])
async def test_racing_operational_senders_send_each_event_once(pool, database_url, keyring, shard_count):
    """3 operational senders race over 80 events of 20 accounts: the dispatch makes one delivery per
    event, each is claimed and sent once (the receiver sees each webhook-id once, every delivery
    ends delivered on its first attempt). Then every lease is made to expire: the racing senders
    expire each once, claim it once more and send it again. With 8 shards every locking statement
    names one shard's accounts."""
    runners: list = []
    receiver = await start_operational_receiver(runners)
    log = Statements()
    logged = await create_logged_pool(database_url, log)
    try:
        account_ids = set()
        for number in range(ACCOUNTS):
            account = await accounts.create_account(pool, f"operational sweep {number}", price_per_delivery=1)
            await add_operational_endpoint(pool, account.id, receiver, keyring, event_types=["topup.applied"])
            for top_up in range(TOP_UPS_PER_ACCOUNT):
                await accounts.top_up(pool, account.id, f"o-{account.id}-{top_up}", 10)
            account_ids.add(account.id)
        events = ACCOUNTS * TOP_UPS_PER_ACCOUNT
        async with _senders(logged, keyring, shard_count) as senders:
            await asyncio.gather(*(sender.run_once() for sender in senders))
            while (await senders[0].run_once()).sent:
                pass
            webhook_ids = [entry["webhook_id"] for entry in receiver.received]
            assert len(webhook_ids) == len(set(webhook_ids)) == events
            states = await pool.fetch("SELECT state, attempt, count(*) FROM operational_deliveries GROUP BY 1, 2")
            assert [tuple(row) for row in states] == [("delivered", 1, events)]

            # Every delivery back to `sending` on its attempt, its lease expired: as if its worker died.
            await pool.execute("UPDATE operational_deliveries SET state = 'sending', finished_at = NULL,"
                               " leased_until = now() - interval '1 second'")
            reports = await asyncio.gather(*(sender.run_once() for sender in senders))
            while (report := await senders[0].run_once()).sent or report.expired:
                reports.append(report)
        assert sum(report.expired for report in reports) == events
        assert sum(report.sent for report in reports) == events
        assert len(receiver.received) == 2 * events
        states = await pool.fetch("SELECT state, attempt, count(*) FROM operational_deliveries GROUP BY 1, 2")
        assert [tuple(row) for row in states] == [("delivered", 2, events)]
    finally:
        await logged.close()
        for runner in runners:
            await runner.cleanup()
    for table in ("FROM operational_events", "FROM operational_deliveries WHERE account_id = k.account_id"
                  if shard_count > 1 else "FROM operational_deliveries"):
        check_one_shard_each(log.locking(table), shard_count, account_ids)
