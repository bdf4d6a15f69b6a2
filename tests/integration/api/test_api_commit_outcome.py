"""A create whose COMMIT answer is lost (the connection breaks while COMMIT is in flight) asks the
database what happened. Written: its requests get their results, as if nothing had broken. Not
written: 503 write-failed, which is then true. No answer in time: 503 write-outcome-unknown, and a
retry with the same Idempotency-Key returns the message if it was written, never a second one.

The breaks are real: a TCP proxy between the pool and PostgreSQL (commit_cutter.py) closes the
client's side at the COMMIT and lets the server commit, roll back, commit late, commit and linger,
or wait for the COMMIT as long as the test likes."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing import accounts
from billing.audit import audit
from billing.database import create_pool
from billing.messages import CreateOutcomeUnknown, MessageCreated, MessageRequest, create_messages
from delivery import metrics
from delivery.api.app import create_app
from delivery.api.group_commit import BatchFailed, BatchOutcomeUnknown, Coalescer

from commit_cutter import CommitCutter


@pytest.fixture
async def cutter(database_url):
    cutter = await CommitCutter(database_url).start()
    yield cutter
    await cutter.close()


@pytest.fixture
async def cut_pool(cutter):
    pool = await create_pool(cutter.url(), size_min=1, size_max=4)
    yield pool
    try:  # a failed test may leave a coalescer holding connections, which close() would wait for
        await asyncio.wait_for(pool.close(), 5)
    except asyncio.TimeoutError:
        pool.terminate()


async def _account(pool: asyncpg.Pool, balance: int) -> uuid.UUID:
    account = await accounts.create_account(pool, "cut", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", balance)
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                       uuid.uuid4(), account.id)
    return account.id


def _outcomes(outcome: str) -> float:
    return metrics.COMMIT_OUTCOMES.labels(outcome)._value.get()


async def _state(pool: asyncpg.Pool, account_id: uuid.UUID) -> tuple[set[uuid.UUID], int]:
    messages = {row["id"] for row in await pool.fetch("SELECT id FROM messages WHERE account_id = $1", account_id)}
    return messages, await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)


@pytest.mark.parametrize("mode", ["after", "late", "linger"])
@pytest.mark.parametrize("round_number", range(3))
async def test_a_commit_that_took_effect_answers_the_results(pool, cut_pool, cutter, mode, round_number):
    """"after": the server commits as the client loses it. "late": the server gets the COMMIT half a
    second after the client lost it, so an answer that took "still in progress" for "not written"
    would deny a message that exists. "linger": the server commits but its backend stays."""
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


@pytest.mark.parametrize("round_number", range(3))
async def test_a_commit_that_did_not_take_effect_fails_its_batch_and_wrote_nothing(pool, cut_pool, cutter,
                                                                                     round_number):
    account_id = await _account(pool, 100)
    coalescer = Coalescer(cut_pool, attempts_max=3, concurrency=1)
    not_written_before = _outcomes("not_written")
    cutter.arm("before")
    failed = await asyncio.gather(coalescer.submit(MessageRequest(account_id, "t", b"1", "k")),
                                  return_exceptions=True)
    assert cutter.cuts == 1 and isinstance(failed[0], BatchFailed), failed
    assert await _state(pool, account_id) == (set(), 100)
    assert _outcomes("not_written") == not_written_before + 1
    retried = await coalescer.submit(MessageRequest(account_id, "t", b"1", "k"))
    assert not retried.replayed and await _state(pool, account_id) == ({retried.message_id}, 99)
    await coalescer.close()


async def test_no_answer_in_time_is_outcome_unknown_and_the_key_then_finds_the_message(pool, cut_pool, cutter):
    """The COMMIT reaches the server only after the wait: the transaction is still in progress when
    the batch must answer, so it says the outcome is unknown, not "nothing was written", which
    here would be untrue once the COMMIT lands."""
    account_id = await _account(pool, 100)
    coalescer = Coalescer(cut_pool, attempts_max=3, concurrency=1, outcome_wait_seconds=1)
    unknown_before = _outcomes("unknown")
    cutter.arm("hold")
    failed = await asyncio.gather(coalescer.submit(MessageRequest(account_id, "t", b"1", "k")),
                                  return_exceptions=True)
    assert isinstance(failed[0], BatchOutcomeUnknown), failed
    assert _outcomes("unknown") == unknown_before + 1
    cutter.release()  # the COMMIT goes on; the retry waits for the account's row lock, so for it
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


async def test_create_messages_on_a_connection_leaves_the_outcome_to_the_caller(pool, cut_pool, cutter):
    account_id = await _account(pool, 100)
    cutter.arm("after")
    async with cut_pool.acquire() as connection:
        with pytest.raises(CreateOutcomeUnknown) as raised:
            await create_messages(connection, [MessageRequest(account_id, "t", b"1")], attempts_max=3)
    assert len(raised.value.message_ids) == 1 and raised.value.transaction_id > 0
    assert isinstance(raised.value.__cause__, asyncpg.PostgresConnectionError)


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
        cutter.arm("hold")
        unknown = await send("c")
        problem = await unknown.json()
        assert unknown.status == 503 and problem["type"].endswith("/write-outcome-unknown"), problem
        assert "same Idempotency-Key" in problem["detail"] and unknown.headers["Retry-After"] == "1"
        cutter.release()  # the COMMIT goes on; the retry waits for the account's row lock, so for it
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


async def _until(read, expected, seconds: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while (value := await read()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"{value} != {expected}"
        await asyncio.sleep(0.05)
