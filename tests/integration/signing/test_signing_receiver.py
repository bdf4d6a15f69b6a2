"""The aiohttp receiver over loopback: status codes, and exactly-once processing per store."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from signing.dedupe import MemoryDedupeStore
from signing.dedupe_postgres import PostgresDedupe
from signing.keys import generate_secret
from signing.receiver import WebhookEvent, webhook_handler
from signing.signatures import webhook_headers

SECRET = generate_secret()
PAYLOAD = {"type": "invoice.paid", "data": {"id": "inv_1"}}
BODY = json.dumps(PAYLOAD).encode()
DUPLICATE_COPIES = 50


def signed(webhook_id: str, body: bytes = BODY, timestamp: int | None = None) -> dict[str, str]:
    headers = webhook_headers(webhook_id, int(time.time()) if timestamp is None else timestamp, body, [SECRET])
    return {**headers, "content-type": "application/json"}


class Recorder:
    """A handler that records its calls and, on the first `failures` calls, raises."""

    def __init__(self, *, failures: int = 0, delay_seconds: float = 0.0, response=None) -> None:
        self.events: list[WebhookEvent] = []
        self.failures = failures
        self.delay_seconds = delay_seconds
        self.response = response

    async def __call__(self, event: WebhookEvent):
        self.events.append(event)
        if event.connection is not None:
            await event.connection.execute("INSERT INTO processed_events VALUES ($1)", event.id)
        await asyncio.sleep(self.delay_seconds)
        if len(self.events) <= self.failures:
            if self.response is not None:
                return self.response()
            raise RuntimeError("the receiver's processing failed")
        return None


async def processed_rows(dedupe, webhook_id: str) -> int | None:
    if not isinstance(dedupe, PostgresDedupe):
        return None
    return await dedupe._pool.fetchval("SELECT count(*) FROM processed_events WHERE webhook_id = $1", webhook_id)


async def test_a_valid_webhook_reaches_the_handler_with_the_verified_event(serve, http):
    """A signed request calls the handler once with id, timestamp, parsed payload and raw body."""
    recorder = Recorder()
    url = await serve(webhook_handler(recorder, keys=SECRET, dedupe=MemoryDedupeStore()))
    headers = signed("evt_valid")
    async with http.post(url, data=BODY, headers=headers) as response:
        assert response.status == 200
        assert await response.json() == {"id": "evt_valid", "received": True}
    [event] = recorder.events
    assert (event.id, event.timestamp_seconds) == ("evt_valid", int(headers["webhook-timestamp"]))
    assert event.payload == PAYLOAD and event.body == BODY and event.connection is None


@pytest.mark.parametrize(
    "mutate, title",
    [
        (lambda headers: headers.pop("webhook-signature"), "A required header"),
        (
            lambda headers: headers.update({"webhook-timestamp": str(int(time.time()) - 3600)}),
            "The webhook-timestamp is older",
        ),
        (lambda headers: headers.update({"webhook-signature": "v1,AAAA"}), "A signature has the wrong length"),
        (lambda headers: headers.update({"webhook-id": "evt_other"}), "No signature in webhook-signature matches"),
    ],
)
async def test_a_bad_request_is_401_problem_json_with_the_reason(serve, http, mutate, title):
    """Missing header, stale time, malformed or wrong signature: 401, problem+json, handler not called."""
    recorder = Recorder()
    url = await serve(webhook_handler(recorder, keys=[SECRET], dedupe=MemoryDedupeStore()))
    headers = signed("evt_bad")
    mutate(headers)
    async with http.post(url, data=BODY, headers=headers) as response:
        assert response.status == 401
        assert response.content_type == "application/problem+json"
        problem = await response.json()
    assert problem["status"] == 401 and problem["title"].startswith(title)
    assert recorder.events == []


async def test_oversized_bodies_are_413_whether_announced_or_streamed(serve, http):
    """A body over the bound is refused with 413, by Content-Length or while streaming chunks."""
    url = await serve(webhook_handler(Recorder(), keys=SECRET, dedupe=MemoryDedupeStore(), body_bytes_max=1000))
    big = b"x" * 1001
    async with http.post(url, data=big, headers=signed("evt_big", big)) as response:
        assert response.status == 413

    async def chunks():
        for _ in range(4):
            yield b"y" * 400

    async with http.post(url, data=chunks(), headers=signed("evt_chunked", b"y" * 1600)) as response:
        assert response.status == 413


async def test_a_verified_body_that_is_not_json_is_400(serve, http):
    """A correctly signed body that does not parse as JSON is a 400 and is not claimed."""
    store = MemoryDedupeStore()
    url = await serve(webhook_handler(Recorder(), keys=SECRET, dedupe=store))
    async with http.post(url, data=b"not json", headers=signed("evt_text", b"not json")) as response:
        assert response.status == 400
    assert len(store) == 0


async def test_duplicates_sent_at_once_run_the_handler_exactly_once(serve, http, dedupe):
    """50 copies of one id at once over loopback: the handler runs once; no copy is refused as bad."""
    recorder = Recorder(delay_seconds=0.05)
    url = await serve(webhook_handler(recorder, keys=SECRET, dedupe=dedupe))
    headers = signed("evt_concurrent")

    async def deliver() -> int:
        async with http.post(url, data=BODY, headers=headers) as response:
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(deliver() for _ in range(DUPLICATE_COPIES)))
    assert len(recorder.events) == 1
    # 409 means "the first copy is still being processed, retry": never 2xx before the work is done.
    assert set(statuses) <= {200, 409} and statuses.count(200) >= 1
    assert await processed_rows(dedupe, "evt_concurrent") in (None, 1)
    async with http.post(url, data=BODY, headers=headers) as response:
        assert response.status == 200 and await response.json() == {"id": "evt_concurrent", "duplicate": True}
    assert len(recorder.events) == 1


async def test_a_failing_handler_leaves_the_id_unmarked_so_the_retry_is_processed(serve, http, dedupe):
    """When the handler raises, the sender gets 500 and its retry is processed (and only that one)."""
    recorder = Recorder(failures=1)
    url = await serve(webhook_handler(recorder, keys=SECRET, dedupe=dedupe))
    statuses = []
    for _ in range(3):
        async with http.post(url, data=BODY, headers=signed("evt_retry")) as response:
            statuses.append(response.status)
            if response.status == 500:
                assert response.content_type == "application/problem+json"
    assert statuses == [500, 200, 200]
    assert len(recorder.events) == 2, "the failure and the retry; the third copy is a duplicate"
    # On PostgreSQL the failed attempt's own write was rolled back with its claim.
    assert await processed_rows(dedupe, "evt_retry") in (None, 1)


async def test_a_handler_answering_non_2xx_also_releases_the_id(serve, http, dedupe):
    """A handler that answers 503 passes that answer on, and the retry is processed."""
    recorder = Recorder(failures=1, response=lambda: web.Response(status=503, text="busy"))
    url = await serve(webhook_handler(recorder, keys=SECRET, dedupe=dedupe))
    statuses = []
    for _ in range(2):
        async with http.post(url, data=BODY, headers=signed("evt_declined")) as response:
            statuses.append(response.status)
    assert statuses == [503, 200]
    assert len(recorder.events) == 2
    assert await processed_rows(dedupe, "evt_declined") in (None, 1)


@pytest.mark.parametrize(
    "raised, statuses",
    [
        (web.HTTPNoContent, [204, 200, 200]),
        (web.HTTPAccepted, [202, 200, 200]),
        (web.HTTPServiceUnavailable, [503, 503, 503]),
    ],
)
async def test_a_raised_http_exception_counts_by_its_status(serve, http, dedupe, raised, statuses):
    """aiohttp's `raise HTTPNoContent()` style: a raised 2xx is a success, so the claim is kept
    (on PostgreSQL the handler's write commits) and later copies are duplicates; a raised non-2xx
    is a refusal, so every copy is processed again."""
    calls = []

    async def on_webhook(event):
        calls.append(event.id)
        if event.connection is not None:
            await event.connection.execute("INSERT INTO processed_events VALUES ($1)", event.id)
        raise raised()

    url = await serve(webhook_handler(on_webhook, keys=SECRET, dedupe=dedupe))
    answered = []
    for _ in range(3):
        async with http.post(url, data=BODY, headers=signed("evt_raised")) as response:
            answered.append(response.status)
    assert answered == statuses
    succeeded = statuses[0] < 300
    assert len(calls) == (1 if succeeded else 3)
    assert await processed_rows(dedupe, "evt_raised") in (None, 1 if succeeded else 0)
