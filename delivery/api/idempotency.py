"""Idempotency-Key on the creates other than messages: POST /v1/accounts, /v1/accounts/{id}/api-keys,
/v1/api-keys, /v1/endpoints, /v1/endpoints/{id}/secret/rotate and /v1/operational-endpoints. (POST /v1/messages and the
delivery replay keep theirs in the messages table, through the group commit; they share the
key's rule, `idempotency_key`, and the 409 and 422 answers.)

Stripe's semantics: the same key and request again answer the stored response with
`Idempotent-Replayed: true`; the same key with another request (method, route, path parameters,
body bytes) is 422 idempotency-key-reused; the key while its first request is still in progress
is 409 idempotency-key-in-use with Retry-After. A key belongs to its principal, the account or
the operator: another principal's same key is another key. Without the header nothing changes.

`once` runs the handler's write in one transaction on a pooled connection
(billing.database.resolved_transaction: a lost COMMIT answer is asked about, not guessed) that
takes the key's advisory lock (not granted: 409), looks for the stored answer, and otherwise runs
the write on that connection, where its own transaction becomes a savepoint, and stores the
answer beside what the write made. Both commit or neither does: a process that dies before the
COMMIT stored nothing and made nothing, and the retry simply runs again.

Only 2xx answers are stored. A refused request rolls back and leaves no row (the write raises its
refusal), so its corrected retry with the same key goes ahead: the key names an outcome, and a
refusal made nothing to name (Stripe does not keep a request that failed validation either).

Answers are kept at least 24 h and purged after 25 by the worker's sweep
(delivery.store.idempotent_responses). So a shown-once key or secret (a new API key, an endpoint's
signing secret) is kept that long too: sealed with the at-rest keyring, bound to its (principal,
key), never in plain text.

The `replay:` prefix that POST /v1/messages refuses is accepted here: it is reserved in the
messages' key space, where the operator's dead-letter replays key themselves so; these keys are
kept in a table of their own and cannot meet those.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from billing.database import Executor, OutcomeUnknown, resolved_transaction
from billing.errors import IdempotencyConflict
from billing.messages import IDEMPOTENCY_KEY_LENGTH_MAX
from delivery.store import idempotent_responses as stored
from delivery.api import problems
from delivery.api.context import CONTEXT
from delivery.api.problems import FieldError, validation
from signing import SigningError

log = structlog.get_logger("hookledger.api")
REPLAYED_HEADERS = {"Idempotent-Replayed": "true"}
JSON_CONTENT_TYPE = "application/json"

Write = Callable[[Executor], Awaitable[web.Response]]


def idempotency_key(request: web.Request) -> str | None:
    """The request's Idempotency-Key, None without one; 422 when it breaks the rule."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    # Printable ASCII (space to ~), as the OpenAPI document says: a header carries bytes, and
    # anything else depends on how each client encodes it.
    if not (1 <= len(key) <= IDEMPOTENCY_KEY_LENGTH_MAX and key.isascii() and key.isprintable()):
        raise validation([FieldError("Idempotency-Key",
                                     f"must be 1 to {IDEMPOTENCY_KEY_LENGTH_MAX} printable ASCII characters")])
    return key


def fingerprint(request: web.Request, body: bytes) -> bytes:
    """SHA-256 of the method, the route's template, its path parameters and the body's own SHA-256."""
    parts = [request.method, request.match_info.route.resource.canonical]
    parts += [f"{name}={value}" for name, value in sorted(request.match_info.items())]
    digest = hashlib.sha256()
    for part in parts:
        encoded = part.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(4, "big") + encoded)  # length first: parts cannot run together
    digest.update(hashlib.sha256(body).digest())
    return digest.digest()


async def once(request: web.Request, principal: str, write: Write, *, key: str | None = None) -> web.Response:
    """`write`'s answer, made at most once per (principal, Idempotency-Key); without a key, simply
    `write(pool)`. `write` raises its refusals (they are not stored). `key` stands for the
    header where a request cannot carry one (a dashboard form, keyed by the page it came from)."""
    ctx = request.config_dict[CONTEXT]  # the API's context, from the dashboard's sub-application too
    key = key or idempotency_key(request)
    if key is None:
        return await write(ctx.pool)
    request_fingerprint = fingerprint(request, await request.read())  # read before a connection is taken
    try:
        async with resolved_transaction(ctx.pool, wait_seconds=ctx.settings.api.commit_outcome_wait_seconds) as connection:
            if not await stored.try_lock(connection, principal, key):
                raise problems.key_in_use()
            found = await stored.find(connection, principal, key)
            if found is not None:
                if found.fingerprint != request_fingerprint:
                    raise IdempotencyConflict()
                try:
                    earlier = found.opened(principal, key, ctx.keyring)
                except SigningError as error:
                    log.error("stored answer cannot be opened", principal=principal, error=repr(error))
                    raise problems.stored_answer_unreadable() from None
                return web.Response(status=earlier.status, body=earlier.body, content_type=JSON_CONTENT_TYPE,
                                    headers=REPLAYED_HEADERS)
            response = await write(connection)
            if 200 <= response.status < 300:
                # A replay rebuilds the answer from its status and body alone.
                assert response.content_type == JSON_CONTENT_TYPE and set(response.headers) == {"Content-Type"}
                await stored.store(connection, principal, key, ctx.keyring,
                                   stored.StoredResponse(request_fingerprint, response.status, response.body))
    except OutcomeUnknown as error:  # the answer is stored with what it shows, or neither is
        log.error("write outcome unknown", method=request.method, path=request.path, error=repr(error))
        raise problems.write_outcome_unknown(keyed=True, made="its answer") from None
    return response
