"""Every API process hears, at commit, a change made through another: an event type given a schema
or archived, an application's uid moved or freed. Two apps on two pools of one database stand for
two API processes. The caches' clocks stand still, so no entry expires: only a notice can have
dropped one. A lost listening connection empties the caches, since a notice may have gone by."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.database import SERVER_SETTINGS
from delivery.api import application_uids, event_catalog
from delivery.api.context import CONTEXT
from delivery.platform.web_app import create_app
from listeners import until_listening
from delivery.store import event_types as event_types_store

HEARD_WITHIN_SECONDS = 20  # a notice takes milliseconds; this only bounds a test that would otherwise hang
_SCHEMA = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer", "minimum": 0}}}


class _Clock:
    """The caches' clock (event_catalog and application_uids read time.monotonic()), standing still."""

    now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(event_catalog, "time", clock)  # the modules' `time`, not the event loop's
    monkeypatch.setattr(application_uids, "time", clock)
    return clock


@pytest.fixture
def other_statements() -> list[str]:
    """Every statement the second process's pool sends."""
    return []


@pytest.fixture
async def other_pool(database_url, other_statements):
    """The second process's own pool, as billing.database.create_pool makes it and sized as the
    `pool` fixture (so it listens too), each statement it sends kept in other_statements."""
    statements = other_statements

    async def init(connection: asyncpg.Connection) -> None:
        connection.add_query_logger(lambda logged: statements.append(logged.query))

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=40, statement_cache_size=256,
                                     server_settings=SERVER_SETTINGS, init=init)
    yield pool
    await pool.close()


@pytest.fixture
async def other(api, settings, other_pool, queue, pool, clock):
    """A second API process on the same database: its client, once both apps listen."""
    async with TestClient(TestServer(create_app(settings, other_pool, queue), host="127.0.0.1")) as client:
        await until_listening(pool)  # first: (re)starting to listen empties the caches
        yield client




def _catalog_cached(client, account_id: uuid.UUID) -> bool:
    return account_id in client.app[CONTEXT].catalog._catalogs


def _uids_cached(client, account_id: uuid.UUID) -> bool:
    return account_id in client.app[CONTEXT].uids._by_account


async def _until_dropped(cached, client, account_id: uuid.UUID) -> float:
    """Wait until the notice dropped the account from the other process's cache; the seconds it took."""
    started = time.monotonic()
    while cached(client, account_id):
        assert time.monotonic() - started < HEARD_WITHIN_SECONDS, "the other process never heard the change"
        await asyncio.sleep(0.001)
    return time.monotonic() - started


async def _send(client, headers: dict, event_type: str, payload, path: str = "/v1/messages"):
    response = await client.post(path, json={"event_type": event_type, "payload": payload}, headers=headers)
    return response.status, await response.json()


async def _post(client, path: str, headers: dict, body: dict, status: int = 201) -> dict:
    response = await client.post(path, json=body, headers=headers)
    assert response.status == status, await response.text()
    return await response.json()


@pytest.mark.parametrize("repeat", range(3))
async def test_a_schema_or_an_archive_made_through_one_process_is_applied_by_another_at_once(api, other, repeat):
    """B has the account's catalog cached (empty: any payload passes). A schema added through A, then
    a type archived through A: once B heard each notice, B's very next message is 422 (the failing
    path named) and nothing is written, on both routes; a passing payload is still sent."""
    account_id, headers = await api.account(balance=100)
    await api.endpoint(headers)
    for event_type in ("invoice.paid", "old.type"):
        assert (await _send(other, headers, event_type, {"amount": "ten"}))[0] == 202  # warms B's catalog
    assert _catalog_cached(other, account_id)

    await _post(api.client, "/v1/event-types", headers, {"name": "invoice.paid", "schema": _SCHEMA})
    await _until_dropped(_catalog_cached, other, account_id)
    before = await api.snapshot()
    for path in ("/v1/messages", f"/v1/applications/{account_id}/messages"):
        status, body = await _send(other, headers, "invoice.paid", {"amount": "ten"}, path)
        assert status == 422 and [error["field"] for error in body["errors"]] == ["payload.amount"], body
    assert await api.snapshot() == before
    assert (await _send(other, headers, "invoice.paid", {"amount": 3}))[0] == 202

    assert _catalog_cached(other, account_id)
    patched = await api.client.patch("/v1/event-types/old.type", json={"archived": True}, headers=headers)
    assert patched.status == 404  # not in the catalog yet: nothing changed, nothing to hear
    await _post(api.client, "/v1/event-types", headers, {"name": "old.type", "archived": True})
    await _until_dropped(_catalog_cached, other, account_id)
    before = await api.snapshot()
    status, body = await _send(other, headers, "old.type", {})
    assert status == 422 and [error["field"] for error in body["errors"]] == ["event_type"], body
    assert await api.snapshot() == before

    # Un-archived through A: B takes the type again.
    assert (await _send(other, headers, "invoice.paid", {"amount": 4}))[0] == 202  # B caches the catalog again
    patched = await api.client.patch("/v1/event-types/old.type", json={"archived": False}, headers=headers)
    assert patched.status == 200
    await _until_dropped(_catalog_cached, other, account_id)
    assert (await _send(other, headers, "old.type", {}))[0] == 202


async def test_a_notice_drops_only_its_own_accounts_catalog(api, other):
    """Another account's catalog, cached in B, stays: a change costs the other accounts no query."""
    account_id, headers = await api.account(balance=10)
    bystander_id, bystander = await api.account(balance=10)
    for account_headers in (headers, bystander):
        await api.endpoint(account_headers)
        assert (await _send(other, account_headers, "invoice.paid", {}))[0] == 202
    await _post(api.client, "/v1/event-types", headers, {"name": "invoice.paid", "schema": _SCHEMA})
    await _until_dropped(_catalog_cached, other, account_id)
    assert _catalog_cached(other, bystander_id)


async def test_a_change_rolled_back_is_not_heard(api, other, pool):
    """The notice is sent at commit, by the writing statement: an event type written in a transaction
    that rolls back leaves B's cache alone. (Notices arrive in commit order: once B heard a later
    change of another account, it would have heard the rolled-back one before.)"""
    account_id, headers = await api.account(balance=10)
    bystander_id, bystander = await api.account(balance=10)
    for account_headers in (headers, bystander):
        await api.endpoint(account_headers)
        assert (await _send(other, account_headers, "invoice.paid", {}))[0] == 202
    with pytest.raises(RuntimeError):
        async with pool.acquire() as connection, connection.transaction():
            await event_types_store.create_event_type(connection, account_id, "invoice.paid", description="",
                                                      schema=_SCHEMA, archived=False)
            raise RuntimeError("roll back")
    await event_types_store.create_event_type(pool, bystander_id, "invoice.paid", description="", schema=_SCHEMA,
                                              archived=False)
    await _until_dropped(_catalog_cached, other, bystander_id)
    assert _catalog_cached(other, account_id)
    assert (await _send(other, headers, "invoice.paid", {"amount": "ten"}))[0] == 202


@pytest.mark.parametrize("repeat", range(3))
async def test_a_catalog_read_across_a_notice_is_not_kept(api, other, monkeypatch, repeat):
    """B's read of the catalog began before A's change committed, and the notice came while it was in
    flight: the messages that waited on the read get its answer, but B keeps nothing of it, so its
    next message reads the catalog again and meets the schema."""
    account_id, headers = await api.account(balance=10)
    await api.endpoint(headers)
    answered, release = asyncio.Event(), asyncio.Event()
    real = event_types_store.catalog

    async def held_read(executor, read_account_id):
        entries = await real(executor, read_account_id)
        if read_account_id == account_id and not release.is_set():
            answered.set()
            await release.wait()
        return entries

    monkeypatch.setattr(event_types_store, "catalog", held_read)
    waiting = asyncio.create_task(_send(other, headers, "invoice.paid", {"amount": "ten"}))
    try:
        await answered.wait()  # B read the catalog empty
        await _post(api.client, "/v1/event-types", headers, {"name": "invoice.paid", "schema": _SCHEMA})
        reading = other.app[CONTEXT].catalog._reading
        started = time.monotonic()
        while account_id in reading:  # the notice dropped the read in flight
            assert time.monotonic() - started < HEARD_WITHIN_SECONDS, "the other process never heard the change"
            await asyncio.sleep(0.001)
    finally:
        release.set()
    assert (await waiting)[0] == 202  # it came before the change: the read's answer is its answer
    assert not _catalog_cached(other, account_id)
    before = await api.snapshot()
    status, body = await _send(other, headers, "invoice.paid", {"amount": "ten"})
    assert status == 422 and [error["field"] for error in body["errors"]] == ["payload.amount"], body
    assert await api.snapshot() == before


async def test_a_uid_moved_through_one_process_is_looked_up_afresh_by_another(api, other):
    """B sent by uid, so keeps customer-7 -> first. A moves the uid to the second application: B's
    next send by it goes to the second at its first write (B forgot the uid, so looked it up), then
    A deletes that application: B's next send by the uid is 404 and writes nothing."""
    account_id, headers = await api.account(balance=100)
    first = await _post(api.client, "/v1/applications", headers, {"name": "First", "uid": "customer-7"})
    second = await _post(api.client, "/v1/applications", headers, {"name": "Second"})
    for application in (first, second):
        await _post(api.client, f"/v1/applications/{application['id']}/endpoints", headers,
                    {"url": "https://example.com/hooks"})
    path = "/v1/applications/customer-7/messages"
    status, body = await _send(other, headers, "invoice.paid", {}, path)
    assert status == 202 and _uids_cached(other, account_id)

    response = await api.client.patch(f"/v1/applications/{first['id']}", json={"uid": None}, headers=headers)
    assert response.status == 200
    await _until_dropped(_uids_cached, other, account_id)
    await api.client.patch(f"/v1/applications/{second['id']}", json={"uid": "customer-7"}, headers=headers)
    status, body = await _send(other, headers, "invoice.paid", {}, path)
    assert status == 202
    assert await api.pool.fetchval("SELECT application_id FROM messages WHERE id = $1",
                                   uuid.UUID(body["id"])) == uuid.UUID(second["id"])

    assert _uids_cached(other, account_id)
    assert (await api.client.delete(f"/v1/applications/{second['id']}", headers=headers)).status == 200
    await _until_dropped(_uids_cached, other, account_id)
    before = await api.snapshot()
    status, body = await _send(other, headers, "invoice.paid", {}, path)
    assert status == 404 and body["type"].endswith("/not-found")
    assert await api.snapshot() == before


async def test_a_rename_is_not_a_uid_change(api, other):
    """A change that leaves the uid alone sends no notice: B keeps the account's uids."""
    account_id, headers = await api.account(balance=10)
    application = await _post(api.client, "/v1/applications", headers, {"name": "First", "uid": "c-1"})
    await _post(api.client, f"/v1/applications/{application['id']}/endpoints", headers,
                {"url": "https://example.com/hooks"})
    assert (await _send(other, headers, "invoice.paid", {}, "/v1/applications/c-1/messages"))[0] == 202
    response = await api.client.patch(f"/v1/applications/{application['id']}", json={"name": "Renamed"},
                                      headers=headers)
    assert response.status == 200
    # A uid change of another account afterwards is heard: by then the rename's notice, had it been
    # sent, would have been heard before it.
    other_account, other_headers = await api.account(balance=10)
    moved = await _post(api.client, "/v1/applications", other_headers, {"name": "X", "uid": "x"})
    assert (await _send(other, other_headers, "invoice.paid", {}, "/v1/applications/x/messages"))[0] == 202
    assert _uids_cached(other, other_account)
    await api.client.patch(f"/v1/applications/{moved['id']}", json={"uid": "y"}, headers=other_headers)
    await _until_dropped(_uids_cached, other, other_account)
    assert _uids_cached(other, account_id)


async def test_a_lost_listening_connection_empties_the_caches(api, other, pool):
    """The listening connections die (a PostgreSQL restart, a proxy timeout): a notice may have gone
    by unheard, so B empties its catalogs and uids; listening again on a new connection, it hears
    the next change."""
    account_id, headers = await api.account(balance=10)
    application = await _post(api.client, "/v1/applications", headers, {"name": "First", "uid": "c-1"})
    await _post(api.client, f"/v1/applications/{application['id']}/endpoints", headers,
                {"url": "https://example.com/hooks"})
    assert (await _send(other, headers, "invoice.paid", {}, "/v1/applications/c-1/messages"))[0] == 202
    assert _catalog_cached(other, account_id) and _uids_cached(other, account_id)

    ended = await pool.fetch("SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity"
                             " WHERE datname = current_database() AND query LIKE 'LISTEN%'")
    assert len(ended) == 2 and all(row["pg_terminate_backend"] for row in ended)
    await _until_dropped(_catalog_cached, other, account_id)
    assert not _uids_cached(other, account_id)
    await until_listening(pool, not_on=[row["pid"] for row in ended])

    # Cached anew after listening again: only a notice heard on the new connection can drop it.
    assert (await _send(other, headers, "invoice.paid", {}, "/v1/applications/c-1/messages"))[0] == 202
    assert _catalog_cached(other, account_id)
    await _post(api.client, "/v1/event-types", headers, {"name": "invoice.paid", "schema": _SCHEMA})
    await _until_dropped(_catalog_cached, other, account_id)
    status, body = await _send(other, headers, "invoice.paid", {"amount": "ten"})
    assert status == 422 and [error["field"] for error in body["errors"]] == ["payload.amount"], body


async def test_a_malformed_notice_empties_the_cache(api, other, pool):
    """A notice on the catalog's channel that names no account (a person in psql) is not ignored:
    B reads every catalog again rather than guess which changed."""
    account_id, headers = await api.account(balance=10)
    await api.endpoint(headers)
    assert (await _send(other, headers, "invoice.paid", {}))[0] == 202
    await pool.execute("SELECT pg_notify($1, 'not an account')", event_types_store.CHANGED_CHANNEL)
    await _until_dropped(_catalog_cached, other, account_id)


_CATALOG_READ = "FROM event_types WHERE account_id = $1"  # delivery.store.event_types.catalog
_UID_LOOKUP = "FROM applications WHERE account_id = $1 AND uid = $2"  # delivery.store.applications.find_id_by_uid


async def test_the_create_path_asks_nothing_more_while_its_caches_hold(api, other, other_statements):
    """Listening costs the requests nothing: after B's first send by uid to a type with a schema, 20
    more read neither the catalog nor the uid again. A change heard costs one read of that account's
    catalog, at the next send, and then none again."""
    account_id, headers = await api.account(balance=100)
    application = await _post(api.client, "/v1/applications", headers, {"name": "First", "uid": "c-1"})
    await _post(api.client, f"/v1/applications/{application['id']}/endpoints", headers,
                {"url": "https://example.com/hooks"})
    await _post(api.client, "/v1/event-types", headers, {"name": "invoice.paid", "schema": _SCHEMA})
    path = "/v1/applications/c-1/messages"

    def asked(fragment: str) -> int:
        return sum(fragment in statement for statement in other_statements)

    assert (await _send(other, headers, "invoice.paid", {"amount": 1}, path))[0] == 202
    assert (asked(_CATALOG_READ), asked(_UID_LOOKUP)) == (1, 1)
    for amount in range(20):
        assert (await _send(other, headers, "invoice.paid", {"amount": amount}, path))[0] == 202
    assert (asked(_CATALOG_READ), asked(_UID_LOOKUP)) == (1, 1)

    response = await api.client.patch("/v1/event-types/invoice.paid", json={"description": "Paid"}, headers=headers)
    assert response.status == 200
    await _until_dropped(_catalog_cached, other, account_id)
    for amount in range(5):
        assert (await _send(other, headers, "invoice.paid", {"amount": amount}, path))[0] == 202
    assert (asked(_CATALOG_READ), asked(_UID_LOOKUP)) == (2, 1)
