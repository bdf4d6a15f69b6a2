"""An aiohttp handler factory for receivers: bound the body, verify, dedupe, then process.

Answers, in order of the checks:
- 413 when the body exceeds `body_bytes_max` (read in chunks, never buffered past the bound);
- 401 when verification fails, with the reason as problem+json;
- 400 when a verified body is not JSON;
- 200 without calling the handler when this webhook id was already processed;
- 409 with Retry-After when another copy of this id is being processed right now;
- the handler's response (or 200) otherwise; a 2xx `HTTPException` it raises is a response too.
  When the handler raises anything else or answers non-2xx, the claim is undone (released, or
  rolled back on PostgreSQL), so the sender's retry is processed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from signing.dedupe import ClaimScopes
from signing.errors import VerificationError
from signing.signatures import TOLERANCE_SECONDS_DEFAULT, Verifier

BODY_BYTES_MAX_DEFAULT = 1024 * 1024
IN_PROGRESS_RETRY_AFTER_SECONDS = 5
PROBLEM_CONTENT_TYPE = "application/problem+json"

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WebhookEvent:
    """A verified, first-time webhook."""

    id: str
    timestamp_seconds: int
    payload: Any
    body: bytes
    # With `PostgresDedupe`: the connection whose open transaction holds the claim. Write on it
    # and the writes commit together with the claim.
    connection: Any = None


WebhookHandler = Callable[[WebhookEvent], Awaitable[web.StreamResponse | None]]


class _Declined(Exception):
    """The handler answered non-2xx: undo the claim, then send its response."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__(response.status)
        self.response = response


def webhook_handler(
    handler: WebhookHandler,
    *,
    keys: Any,
    dedupe: ClaimScopes,
    tolerance_seconds: float = TOLERANCE_SECONDS_DEFAULT,
    body_bytes_max: int = BODY_BYTES_MAX_DEFAULT,
    clock: Callable[[], float] = time.time,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp request handler that calls `handler` once per verified webhook id.

    `keys`: what `verify` accepts (whsec_ / whpk_ text, parsed keys, or a `Verifier`).
    `dedupe`: a `MemoryDedupeStore`, `RedisDedupeStore` or `PostgresDedupe`.
    """
    verifier = Verifier.of(keys)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await _read_body_bounded(request, body_bytes_max)
        if body is None:
            return _problem(413, "The body is larger than this receiver accepts.", f"limit {body_bytes_max} bytes")
        try:
            verified = verifier.verify(request.headers, body, tolerance_seconds=tolerance_seconds, now=clock())
        except VerificationError as error:
            return _problem(401, error.reason, str(error))
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            return _problem(400, "The body is not JSON.", None)
        event = WebhookEvent(verified.id, verified.timestamp_seconds, payload, body)
        return await _process_once(handler, dedupe, event)

    return handle


async def _process_once(handler: WebhookHandler, dedupe: ClaimScopes, event: WebhookEvent) -> web.StreamResponse:
    try:
        async with dedupe.claimed(event.id) as claim:
            if claim.in_progress:
                response = _problem(409, "Another copy of this webhook is being processed.", event.id)
                response.headers["Retry-After"] = str(IN_PROGRESS_RETRY_AFTER_SECONDS)
                return response
            if not claim.first:
                return web.json_response({"id": event.id, "duplicate": True})
            event = WebhookEvent(event.id, event.timestamp_seconds, event.payload, event.body, claim.connection)
            response = await _call(handler, event)
            if response is not None and not 200 <= response.status < 300:
                raise _Declined(response)
    except _Declined as declined:
        return declined.response
    except web.HTTPException:
        # aiohttp's own "raise HTTPBadRequest()" style: the claim is already undone.
        raise
    except Exception:
        logger.exception("processing webhook %s failed; its claim is undone so the retry runs", event.id)
        return _problem(500, "The webhook could not be processed; retry later.", event.id)
    if isinstance(response, web.HTTPException):
        # A raised 2xx, raised again now that the claim is kept: aiohttp answers it.
        raise response
    return response if response is not None else web.json_response({"id": event.id, "received": True})


async def _call(handler: WebhookHandler, event: WebhookEvent) -> web.StreamResponse | None:
    """The handler's response; a 2xx `HTTPException` it raises (`raise HTTPNoContent()`) is one too."""
    try:
        return await handler(event)
    except web.HTTPException as raised:
        if not 200 <= raised.status < 300:
            raise
        return raised


async def _read_body_bounded(request: web.Request, body_bytes_max: int) -> bytes | None:
    """The body, or None once it is known to exceed `body_bytes_max`."""
    if request.content_length is not None and request.content_length > body_bytes_max:
        return None
    chunks = []
    size_bytes = 0
    async for chunk in request.content.iter_any():
        size_bytes += len(chunk)
        if size_bytes > body_bytes_max:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _problem(status: int, title: str, detail: str | None) -> web.Response:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    return web.json_response(body, status=status, content_type=PROBLEM_CONTENT_TYPE)
