"""One delivery's bad input fails that delivery's attempt alone, never the batch it was claimed in.

A batch's results are recorded in one transaction, across accounts. Whatever a receiver answers
(a NUL in its body or reason phrase, a status outside 100..599, bytes that are not UTF-8) and
whatever an endpoint's stored secret holds (sealed under a key the keyring no longer has) must be
recorded as that delivery's attempt, while the other deliveries of the claim are recorded as
delivered. Before, one such answer rolled back the whole batch's record: every delivery in it
stayed leased, was sent again, and died refunded although its receiver had answered 200.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from billing import ids
from billing.audit import audit
from billing.messages import MessageRequest, create_message
from delivery.engine.pipeline import Engine, EngineSettings
from delivery.engine.retry import RetrySchedule, RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.store.signer_cache import SignerCache, endpoint_secret_context
from engine_helpers import add_account, add_endpoint, ledger_of, states, keys_of
from signing import Keyring, encrypt_secret, generate_at_rest_key


def _engine(pool, sender: Sender, keyring: Keyring) -> Engine:
    settings = EngineSettings(lease_ms=5000, retry=RetrySettings(schedule=RetrySchedule((60,))))
    return Engine(pool, sender, None, SignerCache(keyring), settings, random.Random(1))


async def _one_delivery(pool, account_id):
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    return created.deliveries[0].id


async def _attempt_row(pool, delivery_id):
    return await pool.fetchrow(
        "SELECT status_code, error, response_excerpt FROM delivery_attempts WHERE delivery_id = $1", delivery_id)


async def _raw_receiver(answer: bytes) -> tuple[asyncio.Server, str, list[int]]:
    """A TCP server on loopback that answers every request with these exact bytes."""
    hits: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            hits.append(1)
            writer.write(answer)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook", hits


def _http(status_line: bytes, body: bytes) -> bytes:
    return (status_line + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n" + body)


# (the raw answer, whether it is a success, the status and excerpt it is recorded with, how its error starts)
ANSWERS = {
    "2xx with a NUL in its body": (_http(b"HTTP/1.1 200 OK", b"ok\x00!"), True, 200, "ok\ufffd!", None),
    "5xx with a binary body": (_http(b"HTTP/1.1 500 Oops", b"\x00\x01\xff"), False, 500, "\ufffd\x01\ufffd", "http 500 Oops"),
    "a NUL in the reason phrase": (_http(b"HTTP/1.1 503 A\x00B", b""), False, 503, None, "http 503 A\ufffdB"),
    "a reason phrase that is not UTF-8": (_http(b"HTTP/1.1 502 bad \xff gateway", b""), False, 502, None, "http 502 bad "),
    "status 999": (_http(b"HTTP/1.1 999 Odd", b"no"), False, None, None, "invalid http status 999"),
    "status 600": (_http(b"HTTP/1.1 600 Odd", b"no"), False, None, None, "invalid http status 600"),
    "status 099": (_http(b"HTTP/1.1 099 Odd", b"no"), False, None, None, "invalid http status 99"),
}


@pytest.mark.parametrize("case", ANSWERS, ids=list(ANSWERS))
async def test_any_answer_is_recorded_for_its_delivery_and_the_batch_beside_it(pool, receiver_factory, keyring, case):
    answer, success, status_code, excerpt, error_start = ANSWERS[case]
    good = await receiver_factory(lambda number: 200)
    server, url, hits = await _raw_receiver(answer)
    good_account, odd_account = await add_account(pool), await add_account(pool)
    await add_endpoint(pool, good_account, good, keyring)
    odd = type(good)(secret=good.secret, url=url)
    await add_endpoint(pool, odd_account, odd, keyring)
    good_delivery, odd_delivery = await _one_delivery(pool, good_account), await _one_delivery(pool, odd_account)
    async with server, Sender(SenderSettings(allow_loopback=True)) as sender:
        report = await _engine(pool, sender, keyring).deliver_ids(await keys_of(pool, [good_delivery, odd_delivery]))
    assert report.sent == 2 and len(good.received) == 1 and len(hits) == 1
    assert set(report.summary.delivered) == ({good_delivery, odd_delivery} if success else {good_delivery})
    assert report.summary.retrying == ([] if success else [odd_delivery])
    found = await states(pool, [good_delivery, odd_delivery])
    assert found[good_delivery]["state"] == "delivered"
    assert found[odd_delivery]["state"] == ("delivered" if success else "pending")
    row = await _attempt_row(pool, odd_delivery)
    assert row["status_code"] == status_code
    assert row["response_excerpt"] == excerpt
    if error_start is None:
        assert row["error"] is None
    else:
        assert row["error"].startswith(error_start) and "\x00" not in row["error"]
    assert (await audit(pool)).violations == []


async def test_a_secret_that_cannot_be_decrypted_fails_its_delivery_alone(pool, receiver_factory, keyring):
    """Sealed under a key the keyring no longer holds: that delivery's attempt fails unsent and
    is retried like any failure (refunded if it never recovers); the rest of its batch is sent
    and recorded."""
    good = await receiver_factory(lambda number: 200)
    stranded = await receiver_factory(lambda number: 200)
    account_id = await add_account(pool)
    good_endpoint = await add_endpoint(pool, account_id, good, keyring)
    stranded_endpoint = ids.new_id()
    retired = Keyring({"k0": generate_at_rest_key()}, "k0")
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url, secret, timeout_ms) VALUES ($1, $2, $3, $4, 1000)",
        stranded_endpoint, account_id, stranded.url,
        encrypt_secret(stranded.secret, retired, context=endpoint_secret_context(stranded_endpoint)))
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    by_endpoint = {delivery.endpoint_id: delivery.id for delivery in created.deliveries}
    async with Sender(SenderSettings(allow_loopback=True)) as sender:
        report = await _engine(pool, sender, keyring).deliver_ids(await keys_of(pool, list(by_endpoint.values())))
    assert report.summary.delivered == [by_endpoint[good_endpoint]]
    assert report.summary.retrying == [by_endpoint[stranded_endpoint]]
    assert len(good.received) == 1 and good.verified == 1 and stranded.received == []
    row = await _attempt_row(pool, by_endpoint[stranded_endpoint])
    assert row["status_code"] is None and row["error"] == "not sent: the endpoint's signing secret cannot be decrypted"
    assert await ledger_of(pool, by_endpoint[good_endpoint]) == {"charge": -5}


async def test_a_previous_secret_that_cannot_be_decrypted_leaves_the_current_one_signing(pool, receiver_factory, keyring):
    receiver = await receiver_factory(lambda number: 200)
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    retired = Keyring({"k0": generate_at_rest_key()}, "k0")
    await pool.execute("UPDATE endpoints SET previous_secret = $2, previous_secret_expires_at = now() + interval '1 hour'"
                       " WHERE id = $1", endpoint_id,
                       encrypt_secret("whsec_" + "A" * 32, retired, context=endpoint_secret_context(endpoint_id)))
    delivery_id = await _one_delivery(pool, account_id)
    async with Sender(SenderSettings(allow_loopback=True)) as sender:
        report = await _engine(pool, sender, keyring).deliver_ids(await keys_of(pool, [delivery_id]))
    assert report.summary.delivered == [delivery_id]
    assert receiver.verified == 1
    assert receiver.received[0]["headers"]["webhook-signature"].count("v1,") == 1
