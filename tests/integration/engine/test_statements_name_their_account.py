"""Every statement the API and the engine send that writes or locks a distributed table reaches only
the partitions of the accounts it names (issue 47's runtime proof).

With the database migrated with HOOKLEDGER_ACCOUNT_PARTITIONS=N (migration 0023), every table of
billing.distribution.DISTRIBUTED is hash-partitioned by its account. The accounts of this test all
fall in partition 0 (`satisfies_hash_partition`). A full life runs through the API and a worker on
one pool whose every connection logs the statements it sends (asyncpg's query logger): messages
created through the API to a loopback receiver and delivered, a failing endpoint retried until its
deliveries die and are refunded, a replay, reads by id, an endpoint's update and deletion, a top-up.
Then each logged statement that writes or locks a distributed table is EXPLAINed with its logged
arguments (custom plans, so the arguments prune as they do when the statement runs) in a
transaction that is rolled back, and its plan must touch no partition but `<table>_p0`. An INSERT's
tuple routing shows no scan; an UPDATE, a DELETE and a locking read must be pruned to p0. The
statements allowed to span accounts are ALLOWED_TO_SPAN below, each with its reason.

Without the variable the tables are plain and nothing can be told: the tests skip, saying so.
`test_a_planted_statement_that_names_no_account_is_caught` shows the check fails on a statement
that finds a delivery by its bare id.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine_helpers import all_finished, create_logged_pool, keyring, receiver_factory, running_worker, settings, states, wait_for
from operational_helpers import add_operational_endpoint, start_operational_receiver

from billing import accounts, distribution, ids, messages
from billing.messages import MessageRequest, create_messages
from delivery.engine import claims, results
from delivery.engine import queue as job_queue
from delivery.engine.retry import RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.operations import dead_letters
from delivery.operations.operational_sender import OperationalSender
from delivery.platform.web_app import create_app

__all__ = ["keyring", "receiver_factory", "settings"]  # fixtures, used by name

OPERATOR_KEY = "op_statements_" + "x" * 40
PARTITIONS = distribution.account_partitions()
pytestmark = pytest.mark.skipif(
    PARTITIONS < 2,
    reason=f"needs the database migrated with {distribution.PARTITIONS_VARIABLE}=8 (CI runs the integration suite"
           " once with it): on plain tables no plan shows which accounts a statement reaches")

# Statements allowed to write or lock rows of many accounts at once, by a pattern of their text.
ALLOWED_TO_SPAN = {
    "the claims of due deliveries (delivery.engine.claims: due rows of every account, or woken ids)":
        (re.compile(r"SELECT (account_id, )?id FROM deliveries\s+WHERE (id = ANY\(\$1::uuid\[\]\) AND )?state = 'pending'"
                    r" AND next_attempt_at <= now\(\)"),
         "with HOOKLEDGER_ACCOUNT_SHARDS=1 the sweep claims the due deliveries of every account on one server"
         " (with more, it reads them unlocked and claims per shard), and a job of the previous version names bare"
         " ids"),
    "the lease sweep (delivery.engine.results.expire_leases)":
        (re.compile(r"SELECT id, account_id, attempt FROM deliveries WHERE state = 'sending' AND leased_until < now\(\)"),
         "with HOOKLEDGER_ACCOUNT_SHARDS=1 a sweep locks the expired leases of every account on one server (with"
         " more, it reads them unlocked and locks them per shard: test_the_sweeps_by_shard_reach_only_their_partition)"),
    "the operational dispatch, lease expiry and claim (delivery.operations.operational_sender)":
        (re.compile(r"FROM operational_(events|deliveries) WHERE (dispatched_at IS NULL|state = 'sending' AND leased_until"
                    r"|state = 'pending' AND next_attempt_at)"),
         "with HOOKLEDGER_ACCOUNT_SHARDS=1 each locks the operational work of every account in one statement (with"
         " more, per shard: test_the_sweeps_by_shard_reach_only_their_partition)"),
    "the retention batch (delivery.operations.retention)":
        (re.compile(r"WITH candidates AS \(\s*SELECT c\.id, c\.account_id, c\.created_at FROM accounts a"),
         "one batch erases the oldest payloads of every account; each row is addressed by its account and id"),
}

_WRITES_OR_LOCKS = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|FOR\s+(NO\s+KEY\s+)?UPDATE|FOR\s+(KEY\s+)?SHARE)\b",
                              re.I)
_TABLES = re.compile(r"\b(" + "|".join(distribution.DISTRIBUTED) + r")\b")
EXAMPLES_PER_STATEMENT = 3  # each statement is explained with up to this many of its logged arguments


@dataclasses.dataclass(eq=False)  # hashed by identity: asyncpg keeps its loggers in a set
class StatementLog:
    """What one pool's connections sent: each statement's text with some of its arguments."""

    examples: dict[str, list[tuple]] = dataclasses.field(default_factory=dict)

    def __call__(self, record) -> None:
        if record.exception is not None:
            return
        seen = self.examples.setdefault(record.query, [])
        if len(seen) < EXAMPLES_PER_STATEMENT:
            seen.append(tuple(record.args or ()))

    def checked(self) -> dict[str, list[tuple]]:
        """The statements that write or lock a distributed table."""
        return {query: args for query, args in self.examples.items()
                if _WRITES_OR_LOCKS.search(query) and _TABLES.search(query)}


@contextlib.asynccontextmanager
async def logged_pool(database_url: str):
    """A pool as billing.database.create_pool makes it, each connection logging what it sends."""
    log = StatementLog()
    pool = await create_logged_pool(database_url, log, size_max=20)
    try:
        yield pool, log
    finally:
        await pool.close()


def allowed(query: str) -> str | None:
    return next((name for name, (pattern, _) in ALLOWED_TO_SPAN.items() if pattern.search(query)), None)


def _relations(plan) -> set[str]:
    """Every relation an EXPLAIN (FORMAT JSON) plan reads or writes."""
    found = set()
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            found.add(plan["Relation Name"])
        for value in plan.values():
            found |= _relations(value)
    elif isinstance(plan, list):
        for item in plan:
            found |= _relations(item)
    return found


async def other_partitions(connection: asyncpg.Connection, query: str, arguments: tuple) -> set[str]:
    """The partitions other than p0 the statement's plan touches, with these arguments."""
    transaction = connection.transaction()
    await transaction.start()
    try:  # rolled back whatever happens: an EXPLAIN without ANALYZE writes nothing, and nothing else may
        await connection.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        plan = await connection.fetchval("EXPLAIN (FORMAT JSON) " + query, *arguments)
    finally:
        await transaction.rollback()
    relations = _relations(json.loads(plan) if isinstance(plan, str) else plan)
    return {name for name in relations
            if distribution.is_partition_name(name) and not name.endswith("_p0")}


async def unpruned(connection: asyncpg.Connection, log: StatementLog) -> dict[str, set[str]]:
    """Each checked statement not allowed to span accounts whose plan reaches past p0, with what it reaches."""
    found = {}
    for query, examples in log.checked().items():
        if allowed(query):
            continue
        for arguments in examples:
            reached = await other_partitions(connection, query, arguments)
            if reached:
                found[query] = reached
                break
    return found


async def account_in_partition_0(pool: asyncpg.Pool, name: str, price: int) -> uuid.UUID:
    """A new account whose id hashes to partition 0 of every distributed table."""
    for _ in range(1000):
        account_id = ids.new_id()
        if await pool.fetchval("SELECT satisfies_hash_partition('accounts'::regclass, $1, 0, $2::uuid)",
                               PARTITIONS, account_id):
            await pool.execute("INSERT INTO accounts (id, name, price_per_delivery) VALUES ($1, $2, $3)",
                               account_id, name, price)
            return account_id
    raise AssertionError("no id of 1000 fell in partition 0")


async def _json(response, status: int):
    assert response.status == status, await response.text()
    return await response.json()


class Api:
    """The API on loopback over the logged pool; every call of the life goes through it."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}

    async def key(self, account_id: uuid.UUID) -> dict:
        body = await _json(await self.client.post(f"/v1/accounts/{account_id}/api-keys", headers=self.operator), 201)
        return {"Authorization": f"Bearer {body['key']}"}

    async def top_up(self, account_id: uuid.UUID, amount: int) -> None:
        await _json(await self.client.post(f"/v1/accounts/{account_id}/topups", headers=self.operator,
                                           json={"order_id": f"o-{uuid.uuid4().hex}", "amount": amount}), 201)

    async def endpoint(self, key: dict, url: str) -> str:
        return (await _json(await self.client.post("/v1/endpoints", headers=key, json={"url": url}), 201))["id"]

    async def send(self, key: dict, number: int) -> list[uuid.UUID]:
        body = await _json(await self.client.post("/v1/messages", headers=key,
                                                  json={"event_type": "invoice.paid", "payload": {"n": number}}), 202)
        return [uuid.UUID(delivery["id"]) for delivery in body["deliveries"]]


@contextlib.asynccontextmanager
async def api_on(pool: asyncpg.Pool, settings, redis_url: str):
    api_settings = dataclasses.replace(settings, api=dataclasses.replace(settings.api, operator_key=OPERATOR_KEY,
                                                                         dev_mode=True))
    redis = await job_queue.connect(redis_url)
    try:
        app = create_app(api_settings, pool, job_queue.Queue(redis))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield Api(client)
    finally:
        await redis.aclose()


async def _life(api: Api, pool: asyncpg.Pool, receiver_factory) -> None:
    """A full life of two accounts through the API and the worker."""
    good = await receiver_factory()
    failing = await receiver_factory(lambda number: 503)
    first = await account_in_partition_0(pool, "first", 2)
    second = await account_in_partition_0(pool, "second", 3)
    keys = {first: await api.key(first), second: await api.key(second)}
    for account_id in (first, second):
        await api.top_up(account_id, 1000)
    endpoints = {account_id: (await api.endpoint(key, good.url), await api.endpoint(key, failing.url))
                 for account_id, key in keys.items()}
    # Concurrent creates of both accounts: the group commit writes them together.
    sent = await asyncio.gather(*(api.send(keys[account_id], number)
                                  for number in range(6) for account_id in (first, second)))
    delivery_ids = [delivery_id for deliveries in sent for delivery_id in deliveries]
    await wait_for(lambda: all_finished(pool, delivery_ids), timeout_seconds=60)
    found = await states(pool, delivery_ids)
    dead = [delivery_id for delivery_id, row in found.items() if row["state"] == "dead"]
    assert len(dead) == len(delivery_ids) // 2 and {found[d]["dead_reason"] for d in dead} == {"out_of_retries"}

    # Reads by id, a replay of a dead delivery (dies again at the failing endpoint), an endpoint
    # updated and another deleted, and one more top-up.
    for delivery_id in (dead[0], delivery_ids[0]):
        account_id = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
        await _json(await api.client.get(f"/v1/deliveries/{delivery_id}", headers=keys[account_id]), 200)
    account_id = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", dead[0])
    replay = await _json(await api.client.post(f"/v1/deliveries/{dead[0]}/replay", headers=keys[account_id]), 202)
    replayed = [uuid.UUID(delivery["id"]) for delivery in replay["deliveries"]]
    await wait_for(lambda: all_finished(pool, replayed), timeout_seconds=60)
    good_endpoint, failing_endpoint = endpoints[first]
    await _json(await api.client.patch(f"/v1/endpoints/{good_endpoint}", headers=keys[first],
                                       json={"description": "renamed"}), 200)
    await _json(await api.client.get(f"/v1/endpoints/{good_endpoint}", headers=keys[first]), 200)
    await api.send(keys[first], 99)  # a pending delivery to the endpoint about to be deleted, maybe
    response = await api.client.delete(f"/v1/endpoints/{failing_endpoint}", headers=keys[first])
    assert response.status in (200, 204), await response.text()
    await api.top_up(second, 50)
    await _json(await api.client.get("/v1/balance", headers=keys[second]), 200)
    await wait_for(lambda: _all_of_accounts_finished(pool, (first, second)), timeout_seconds=60)


async def _all_of_accounts_finished(pool: asyncpg.Pool, account_ids) -> bool:
    return not await pool.fetchval(
        "SELECT count(*) FROM deliveries WHERE account_id = ANY($1::uuid[]) AND state IN ('pending', 'sending')",
        list(account_ids))


async def test_every_statement_of_a_full_life_reaches_only_its_accounts_partition(
        pool, database_url, redis_url, settings, receiver_factory):
    """A full life through the API and the worker; every statement that writes or locks a
    distributed table is pruned to partition 0, where all its accounts are, but those allowed to span."""
    async with logged_pool(database_url) as (logged, log):
        async with api_on(logged, settings, redis_url) as api, running_worker(settings, logged):
            await _life(api, pool, receiver_factory)
    checked = log.checked()
    assert len(checked) >= 15, f"too few statements logged to prove anything: {list(checked)}"
    assert any("INSERT INTO ledger_entries" in query for query in checked)  # the creates, the settles
    assert any("UPDATE deliveries" in query for query in checked)  # the results
    async with pool.acquire() as connection:
        reached = await unpruned(connection, log)
    assert not reached, "statements that reach past their accounts' partition:\n" + "\n\n".join(
        f"{sorted(partitions)}: {query}" for query, partitions in reached.items())


async def test_a_planted_statement_that_names_no_account_is_caught(pool, database_url):
    """The check is not vacuous: a lookup of a delivery by its bare id, locked, reaches every
    partition and is reported; the same lookup naming its account is not."""
    account_id = await account_in_partition_0(pool, "planted", 1)
    planted = "SELECT state FROM deliveries WHERE id = $1 FOR UPDATE"
    named = "SELECT state FROM deliveries WHERE account_id = $2 AND id = $1 FOR UPDATE"
    async with logged_pool(database_url) as (logged, log):
        async with logged.acquire() as connection, connection.transaction():
            await connection.fetchval(planted, ids.new_id())
            await connection.fetchval(named, ids.new_id(), account_id)
    async with pool.acquire() as connection:
        reached = await unpruned(connection, log)
    assert set(reached) == {planted}
    assert reached[planted] == {f"deliveries_p{n}" for n in range(1, PARTITIONS)}


async def test_the_sweeps_by_shard_reach_only_their_partition(pool, database_url, keyring):
    """With HOOKLEDGER_ACCOUNT_SHARDS at the partition count, the sweeps that lock work across
    accounts on one server lock it per shard: the due claim, the lease sweep, and the operational
    dispatch, lease expiry and claim. Each of their locking statements is pruned to p0, with no
    statement allowed to span."""
    account_id = await account_in_partition_0(pool, "sweeps", 1)
    runners: list = []
    receiver = await start_operational_receiver(runners)
    await add_operational_endpoint(pool, account_id, receiver, keyring)
    await accounts.top_up(pool, account_id, f"o-{account_id}", 100)  # a topup.applied event
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                       ids.new_id(), account_id)
    await create_messages(pool, [MessageRequest(account_id, "t", b"{}") for _ in range(3)], attempts_max=3)
    sender = Sender(SenderSettings(allow_loopback=True))
    try:
        async with logged_pool(database_url) as (logged, log):
            claimed = await claims.claim_due(logged, batch_size=10, lease_ms=60_000, shards=PARTITIONS)
            assert len(claimed) == 3
            await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second'")
            assert len(await results.expire_leases(logged, batch_size=10, delay_seconds=lambda attempt: 0.0,
                                                   shards=PARTITIONS)) == 3
            operational = OperationalSender(logged, sender, keyring, RetrySettings(), shards=PARTITIONS)
            assert (await operational.run_once()).delivered == 1
            await pool.execute("UPDATE operational_deliveries SET state = 'sending', finished_at = NULL,"
                               " leased_until = now() - interval '1 second'")
            report = await operational.run_once()
            assert (report.expired, report.delivered) == (1, 1)
    finally:
        await sender.close()
        for runner in runners:
            await runner.cleanup()
    checked = log.checked()
    for expected in ("SET state = 'sending'", "SELECT id, account_id, attempt FROM deliveries WHERE account_id = k.account_id",
                     "UPDATE operational_events e SET dispatched_at", "UPDATE operational_deliveries d SET leased_until",
                     "UPDATE operational_deliveries d SET state"):
        assert any(expected in " ".join(query.split()) for query in checked), f"no statement with {expected!r} was logged"
    spanning = [query for query in checked if allowed(query)]
    assert not spanning, f"statements that lock across shards: {spanning}"
    async with pool.acquire() as connection:
        reached = await unpruned(connection, log)
    assert not reached, "statements that reach past their accounts' partition:\n" + "\n\n".join(
        f"{sorted(partitions)}: {query}" for query, partitions in reached.items())


# Reads allowed to reach every partition in the operator's look-up of a delivery by its id alone
# and in a top-up, with why.
ALLOWED_READS = {
    "the accounts of a delivery's ledger entries (delivery.operations.dead_letters)":
        "SELECT DISTINCT account_id FROM ledger_entries WHERE delivery_id = ANY($1::uuid[])",
    "an order's top-up on any account (billing.accounts.top_up)":
        "SELECT account_id, amount FROM ledger_entries WHERE id = $1 AND kind = 'topup'",
}


async def test_the_operators_look_up_by_a_delivery_id_reads_only_its_accounts_partition(pool, database_url):
    """The operator names a delivery by its id alone (migration 0025 dropped the index on bare ids):
    its account is read from its ledger entries, and every other statement of the look-up, as of a
    top-up, reads only the partition of that account; a look-up of an id of no delivery is the one
    that reads every partition (a scan: see dead_letters._DELIVERY_BY_BARE_ID)."""
    account_id = await account_in_partition_0(pool, "looked-up", 1)
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://e.test')",
                       ids.new_id(), account_id)
    async with logged_pool(database_url) as (logged, log):
        await accounts.top_up(logged, account_id, f"order-{account_id}", 10)
        created = await messages.create_message(logged, messages.MessageRequest(account_id, "t", b"{}", None),
                                                attempts_max=3)
        (delivery,) = created.deliveries
        found = await dead_letters.inspect(logged, delivery.id)
        assert found["delivery"]["account_id"] == account_id and found["ledger"]
        looked_up = set(log.examples)
        with pytest.raises(dead_letters.DeliveryNotFound):
            await dead_letters.inspect(logged, ids.new_id())
    reads = [query for query in looked_up if _TABLES.search(query) and query not in ALLOWED_READS.values()]
    assert dead_letters._DELIVERY in reads and dead_letters._ATTEMPTS in reads
    async with pool.acquire() as connection:
        reached = {query: await other_partitions(connection, query, log.examples[query][0]) for query in reads}
        bare = await other_partitions(connection, dead_letters._DELIVERY_BY_BARE_ID, (delivery.id,))
    assert not any(reached.values()), {query: partitions for query, partitions in reached.items() if partitions}
    assert dead_letters._DELIVERY_BY_BARE_ID in log.examples and bare
