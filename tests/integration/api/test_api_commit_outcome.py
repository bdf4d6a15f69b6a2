"""A create whose COMMIT answer is lost (the connection breaks while COMMIT is in flight) asks the
database what happened. A create runs direct first (or, targeted, unlocked): its write is one
autocommit statement, which commits as it runs, so there the cut is at that statement, and the
database is asked by ending the backend that ran it and then looking for its messages (a direct
batch then reads back the deliveries it made). Written: its requests get their results, as if nothing had broken. Not
written: 503 write-failed, which is then true. No answer in time: 503 write-outcome-unknown, and a
retry with the same Idempotency-Key returns the message if it was written, never a second one.

The breaks are real: a TCP proxy between the pool and PostgreSQL (commit_cutter.py) closes the
client's side at the COMMIT and lets the server commit, roll back, commit late, commit and linger,
or wait for the COMMIT as long as the test likes."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing import accounts
from billing.audit import audit
from billing.database import create_pool
from billing.messages import WRITES, CreateOutcomeUnknown, MessageCreated, MessageRequest, create_messages, resolve_outcome
from delivery import metrics
from delivery.platform.web_app import create_app
from delivery.api.group_commit import BatchFailed, BatchOutcomeUnknown, Coalescer

from commit_cutter import CommitCutter


async def _account(pool: asyncpg.Pool, balance: int) -> uuid.UUID:
    account = await accounts.create_account(pool, "cut", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", balance)
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                       uuid.uuid4(), account.id)
    return account.id


async def _endpoint(pool: asyncpg.Pool, account_id: uuid.UUID) -> uuid.UUID:
    return await pool.fetchval("SELECT id FROM endpoints WHERE account_id = $1", account_id)


def _outcomes(outcome: str) -> float:
    return metrics.COMMIT_OUTCOMES.labels(outcome)._value.get()


async def _state(pool: asyncpg.Pool, account_id: uuid.UUID) -> tuple[set[uuid.UUID], int]:
    messages = {row["id"] for row in await pool.fetch("SELECT id FROM messages WHERE account_id = $1", account_id)}
    return messages, await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)


# How long "late" holds a write back: the client must have given up and ended the backend before it
# goes on, which takes milliseconds; the rest is room for a loaded machine.
LATE_SECONDS = 2.0


@pytest.mark.parametrize("mode", ["after", "linger"])
@pytest.mark.parametrize("round_number", range(3))
async def test_a_write_that_took_effect_answers_the_results(pool, cut_pool, cutter, mode, round_number):
    """"after": the server runs the write as the client loses it. "linger": the server runs it but
    its backend stays, as over a half-open connection: ending it must not undo the write."""
    account_id = await _account(pool, 100)
    coalescer = Coalescer(cut_pool, attempts_max=3, concurrency=1)
    written_before = _outcomes("written")
    cutter.arm(mode, delay=0.5)
    try:
        results = await asyncio.gather(*(coalescer.submit(MessageRequest(account_id, "t", b"%d" % n, f"k{n}"))
                                         for n in range(6)))
    finally:
        cutter.release()
    assert cutter.cuts == 1
    assert all(isinstance(result, MessageCreated) and not result.replayed for result in results), results
    messages, balance = await _state(pool, account_id)
    assert messages == {result.message_id for result in results} and balance == 94
    assert _outcomes("written") == written_before + 1
    replay = await coalescer.submit(MessageRequest(account_id, "t", b"0", "k0"))
    assert replay.replayed and replay.message_id == results[0].message_id
    await coalescer.close()
    assert (await audit(pool)).clean


@pytest.mark.parametrize("mode", ["before", "late", "hold"])
@pytest.mark.parametrize("round_number", range(2))
async def test_a_write_that_did_not_take_effect_fails_its_batch_and_wrote_nothing(pool, cut_pool, cutter, mode,
                                                                                    round_number):
    """"before": the write never reaches the server. "late" and "hold": it would reach the server's
    backend after the client gave up on the connection (LATE_SECONDS later, or once released), so
    an answer that only looked for the messages could say "not written" and then see them appear.
    The backend is ended first; the write arriving later finds it gone."""
    account_id = await _account(pool, 100)
    coalescer = Coalescer(cut_pool, attempts_max=3, concurrency=1)
    not_written_before = _outcomes("not_written")
    cutter.arm(mode, delay=LATE_SECONDS)
    failed = await asyncio.gather(coalescer.submit(MessageRequest(account_id, "t", b"1", "k")),
                                  return_exceptions=True)
    assert cutter.cuts == 1 and isinstance(failed[0], BatchFailed), failed
    assert await _state(pool, account_id) == (set(), 100)
    cutter.release()
    await cutter.until_cuts_done()  # the late or held write went on to the server: it landed nowhere
    assert await _state(pool, account_id) == (set(), 100)
    assert _outcomes("not_written") == not_written_before + 1
    retried = await coalescer.submit(MessageRequest(account_id, "t", b"1", "k"))
    assert not retried.replayed and await _state(pool, account_id) == ({retried.message_id}, 99)
    await coalescer.close()


async def test_no_answer_in_time_is_outcome_unknown_and_the_key_then_finds_the_message(pool, cut_pool, cutter):
    """The database is unreachable for the whole wait and the write reaches the server only after
    it, so the batch says the outcome is unknown, not "nothing was written", which here would be
    untrue once the write lands."""
    account_id = await _account(pool, 100)
    coalescer = Coalescer(cut_pool, attempts_max=3, concurrency=1, outcome_wait_seconds=1)
    unknown_before = _outcomes("unknown")
    cutter.arm("blackout")
    failed = await asyncio.gather(coalescer.submit(MessageRequest(account_id, "t", b"1", "k")),
                                  return_exceptions=True)
    assert isinstance(failed[0], BatchOutcomeUnknown), failed
    assert _outcomes("unknown") == unknown_before + 1
    cutter.release()  # the write goes on
    await _until(lambda: _state(pool, account_id), (await _eventually_one_message(pool, account_id), 99))
    retried = await coalescer.submit(MessageRequest(account_id, "t", b"1", "k"))
    assert retried.replayed
    assert await _state(pool, account_id) == ({retried.message_id}, 99)  # written, and charged once
    await coalescer.close()


async def test_create_messages_on_a_pool_resolves_the_outcome_itself(pool, cut_pool, cutter):
    """The path of dead-letter replays: a batch of five written behind a lost COMMIT returns its
    results; one not written raises the connection's error and wrote nothing."""
    account_id = await _account(pool, 100)
    requests = [MessageRequest(account_id, "t", b"%d" % n) for n in range(5)]
    cutter.arm("after")
    results = await create_messages(cut_pool, requests, attempts_max=3)
    assert cutter.cuts == 1 and all(isinstance(result, MessageCreated) for result in results)
    messages, balance = await _state(pool, account_id)
    assert messages == {result.message_id for result in results} and balance == 95
    cutter.arm("before")
    with pytest.raises(asyncpg.PostgresConnectionError):
        await create_messages(cut_pool, requests, attempts_max=3)
    assert cutter.cuts == 2 and await _state(pool, account_id) == (messages, 95)


@pytest.mark.parametrize("mode", ["after", "before"])
async def test_a_batch_decided_again_locked_asks_about_its_transaction(pool, database_url, mode):
    """The account is repriced between the unlocked read and write (a transaction holds its row lock
    until the write waits on it), so the batch is decided again the locked way, and that COMMIT is
    cut: written, it answers at the new price; not written, the connection's error, nothing written.
    The request targets its endpoint, so it goes the planned way (a direct write has no read to
    be overtaken: it would take the new price in its one statement)."""
    cutter = await CommitCutter(database_url).start()  # cuts at COMMIT only
    cut_pool = await create_pool(cutter.url(), size_min=1, size_max=2)
    try:
        account_id = await _account(pool, 100)
        targeted = MessageRequest(account_id, "t", b"1", endpoint_ids=(await _endpoint(pool, account_id),))
        writes_before = WRITES.copy()
        cutter.arm(mode)
        async with pool.acquire() as holder, holder.transaction():
            await holder.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
            task = asyncio.create_task(create_messages(cut_pool, [targeted], attempts_max=3))
            await _until(lambda: pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                               " AND query LIKE 'WITH locked AS%'"), 1)
            await holder.execute("UPDATE accounts SET price_per_delivery = 2 WHERE id = $1", account_id)
        if mode == "after":
            (created,) = await task
            assert created.total_charged == 2
            assert await _state(pool, account_id) == ({created.message_id}, 98)
            assert WRITES - writes_before == Counter({"fell_back": 1})  # written, found so, and counted
        else:
            with pytest.raises(asyncpg.PostgresConnectionError):
                await task
            assert await _state(pool, account_id) == (set(), 100)
            assert WRITES == writes_before
        assert cutter.cuts == 1
    finally:
        await cut_pool.close()
        await cutter.close()


async def test_create_messages_on_a_connection_leaves_the_outcome_to_the_caller(pool, cut_pool, cutter):
    """The unknown names the backend that ran the write; asked through a database that cannot be
    reached, it stays unknown; asked through one that can, it is written, and the direct write's
    results, lost with its answer, are read back: the delivery it made, at its price."""
    account_id = await _account(pool, 100)
    cutter.arm("after")
    async with cut_pool.acquire() as connection:
        pid = connection.get_server_pid()
        with pytest.raises(CreateOutcomeUnknown) as raised:
            await create_messages(connection, [MessageRequest(account_id, "t", b"1")], attempts_max=3)
    unknown = raised.value
    assert len(unknown.message_ids) == 1 and unknown.unlocked.backend_pid == pid
    assert unknown.unlocked.message_id == unknown.message_ids[0]
    assert isinstance(unknown.__cause__, asyncpg.PostgresConnectionError)
    unreachable = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:9/test", min_size=0)  # nothing listens
    try:
        with pytest.raises(CreateOutcomeUnknown):
            await resolve_outcome(unreachable, unknown, wait_seconds=0.5)
    finally:
        await unreachable.close()
    assert unknown.results == [None]  # a direct write's results came in the answer that was lost
    (created,) = await resolve_outcome(pool, unknown)
    assert isinstance(created, MessageCreated) and created.message_id == unknown.message_ids[0]
    (delivery,) = created.deliveries
    stored = await pool.fetchrow("SELECT message_id, endpoint_id, price FROM deliveries WHERE id = $1", delivery.id)
    assert tuple(stored) == (created.message_id, await _endpoint(pool, account_id), 1) and delivery.price == 1
    assert created.total_charged == 1 and not created.replayed
    assert await _state(pool, account_id) == (set(unknown.message_ids), 99)


async def test_the_api_answers_each_outcome(api, cut_pool, cutter, queue):
    """POST /v1/messages through an app whose pool runs through the proxy: 202 when the lost COMMIT
    took effect, 503 write-failed when it did not, 503 write-outcome-unknown (with how to retry)
    when it cannot be told, and the retry with the same key then answers the written message."""
    settings = dataclasses.replace(api.settings, api=dataclasses.replace(api.settings.api,
                                                                          commit_outcome_wait_seconds=1))
    account_id, headers = await api.account(balance=100)
    await api.endpoint(headers)
    async with TestClient(TestServer(create_app(settings, cut_pool, queue), host="127.0.0.1")) as client:
        async def send(key: str):
            return await client.post("/v1/messages", json={"event_type": "t", "payload": {"k": key}},
                                     headers={**headers, "Idempotency-Key": key})

        assert (await send("warm")).status == 202  # the key is looked up and cached before any cut
        cutter.arm("after")
        written = await send("a")
        assert written.status == 202, await written.text()
        cutter.arm("before")
        failed = await send("b")
        assert failed.status == 503 and failed.headers["Retry-After"] == "1"
        assert (await failed.json())["type"].endswith("/write-failed")
        cutter.arm("blackout")
        unknown = await send("c")
        problem = await unknown.json()
        assert unknown.status == 503 and problem["type"].endswith("/write-outcome-unknown"), problem
        assert "same Idempotency-Key" in problem["detail"] and unknown.headers["Retry-After"] == "1"
        cutter.release()  # the write goes on
        await _until(lambda: api.pool.fetchval(
            "SELECT count(*) FROM messages WHERE account_id = $1 AND idempotency_key = 'c'", account_id), 1)
        retried = await send("c")
        assert retried.status == 202 and retried.headers.get("Idempotent-Replayed") == "true"
        assert cutter.cuts == 3
    stored = await api.pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id)
    assert stored == 3  # warm, a and c: b was not written, c once
    assert await api.pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 97


# Creates that are not idempotent and show something once: the account with its first key, a new
# key, an endpoint (a second endpoint to the same URL would receive, and charge, every message twice).
_CREATES = {
    # name: (table, the request, where the 503 detail points when it cannot tell)
    "account": ("accounts", lambda api, headers: ("/v1/accounts", {"name": "cut"}, api.operator), "GET /v1/accounts/"),
    "api key": ("api_keys", lambda api, headers: ("/v1/api-keys", None, headers), "in GET /v1/api-keys"),
    "endpoint": ("endpoints", lambda api, headers: ("/v1/endpoints", {"url": "https://example.com/hook"}, headers),
                 "GET /v1/endpoints/"),
}


@pytest.mark.parametrize("create", sorted(_CREATES))
async def test_creates_that_show_something_once_resolve_a_lost_commit(api, cut_pool, cutter, queue, create):
    """Through the proxy: written behind a lost COMMIT, 201 with what was made (shown once, not lost);
    not written, 503 write-failed (safe to retry: the SDK does); cannot tell, 503 write-outcome-unknown
    naming what to look for, and once the COMMIT goes through the row exists once. Before, the first
    two answered 503 database-unavailable ("may have completed"), and a retry made a second one."""
    table, request, pointer = _CREATES[create]
    settings = dataclasses.replace(api.settings, api=dataclasses.replace(api.settings.api,
                                                                          commit_outcome_wait_seconds=1))
    _, headers = await api.account(balance=10)
    path, body, auth = request(api, headers)
    rows = f"SELECT count(*) FROM {table}"
    async with TestClient(TestServer(create_app(settings, cut_pool, queue), host="127.0.0.1")) as client:
        async def post():
            return await client.post(path, json=body, headers=auth) if body is not None else \
                await client.post(path, headers=auth)

        assert (await post()).status == 201  # the key is looked up and cached before any cut
        before = await api.pool.fetchval(rows)
        cutter.arm("after")
        written = await post()
        assert written.status == 201, await written.text()
        made = await written.json()
        assert await api.pool.fetchval(rows) == before + 1
        cutter.arm("before")
        failed = await post()
        problem = await failed.json()
        assert failed.status == 503 and problem["type"].endswith("/write-failed"), problem
        assert await api.pool.fetchval(rows) == before + 1
        cutter.arm("hold")
        unknown = await post()
        problem = await unknown.json()
        assert unknown.status == 503 and problem["type"].endswith("/write-outcome-unknown"), problem
        assert pointer in problem["detail"], problem["detail"]
        cutter.release()
        await _until(lambda: api.pool.fetchval(rows), before + 2)
        assert cutter.cuts == 3
    if create == "account":
        assert made["api_key"]["key"] and made["account"]["id"]
    elif create == "api key":
        assert made["key"]
    else:
        assert made["id"] and made["url"] == "https://example.com/hook"


async def _eventually_one_message(pool: asyncpg.Pool, account_id: uuid.UUID) -> set[uuid.UUID]:
    await _until(lambda: pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id), 1)
    return (await _state(pool, account_id))[0]


async def _until(read, expected, seconds: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while (value := await read()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"{value} != {expected}"
        await asyncio.sleep(0.05)
