"""Idempotency-Key on the creates other than messages (delivery.api.idempotency), against the real
app and database: POST /v1/accounts, /v1/accounts/{id}/api-keys, /v1/api-keys, /v1/endpoints and
/v1/endpoints/{id}/secret/rotate.

Each route is tested for: the same key and request twice make one thing and answer the stored
response again; another request with the key is 422 and makes nothing; another principal's same
key is another key; two at once with one key make one thing; an invalid key is 422; a refused
request stores nothing, so its corrected retry with the key goes ahead; the stored answer is
sealed. Then a lost COMMIT answer with a key, and the purge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing import closeout
from delivery.store import idempotent_responses
from delivery.platform.web_app import create_app
from delivery.store.endpoints import ENDPOINTS_PER_ACCOUNT_MAX, open_secret
from delivery.engine.pipeline import Engine, EngineSettings
from delivery.engine.sender import Sender
from delivery.store.signer_cache import SignerCache
from signing import (Keyring, TamperedCiphertextError, decrypt_secret, format_keyring, generate_at_rest_key,
                     generate_secret, parse_keyring)

OTHER_SECRET = generate_secret()


@dataclasses.dataclass(frozen=True)
class Scene:
    """An account (its id and auth headers) with one endpoint."""

    account_id: uuid.UUID
    headers: dict
    endpoint_id: uuid.UUID


async def _scene(api) -> Scene:
    account_id, headers = await api.account()
    endpoint = await api.endpoint(headers, url="https://example.com/scene")
    return Scene(account_id, headers, uuid.UUID(endpoint["id"]))


async def _count(pool: asyncpg.Pool, query: str, *args) -> int:
    return await pool.fetchval(query, *args)


async def _secrets(api, scene: Scene) -> tuple[str, str | None]:
    """The endpoint's current and previous signing secrets, opened."""
    row = await api.pool.fetchrow("SELECT secret, previous_secret FROM endpoints WHERE id = $1", scene.endpoint_id)
    keyring = parse_keyring(api.settings.secret_keyring)
    previous = row["previous_secret"]
    return (open_secret(row["secret"], keyring, scene.endpoint_id),
            None if previous is None else open_secret(previous, keyring, scene.endpoint_id))


@dataclasses.dataclass(frozen=True)
class Route:
    name: str
    operator: bool
    path: Callable[[Scene], str]
    body: bytes | None  # what the tests send (None: no body)
    other_body: bytes  # another request on the same path
    invalid_body: bytes  # refused by the route's validation
    made: Callable[..., Awaitable[object]]  # (api, scene) -> what the route has made so far
    made_once: Callable[[object, object], bool]  # (before, after) -> exactly one thing more was made
    shown: Callable[[dict], str]  # a value of the answer (a secret shown once where there is one)
    rounds: int  # concurrent rounds


def _one_more(before: int, after: int) -> bool:
    return after == before + 1


def _rotated_once(before: tuple, after: tuple) -> bool:
    # Rotated twice, the previous secret would be the first rotation's, not the one before.
    return after[1] == before[0] and after[0] != before[0]


ROUTES = {
    route.name: route
    for route in (
        Route("account", True, lambda scene: "/v1/accounts", b'{"name": "idem"}', b'{"name": "other"}', b'{"name": ""}',
              lambda api, scene: _count(api.pool, "SELECT count(*) FROM accounts"), _one_more,
              lambda answer: answer["api_key"]["key"], 5),
        Route("operator key", True, lambda scene: f"/v1/accounts/{scene.account_id}/api-keys", None, b"{}", b'{"x": 1}',
              lambda api, scene: _count(api.pool, "SELECT count(*) FROM api_keys WHERE account_id = $1", scene.account_id),
              _one_more, lambda answer: answer["key"], 5),
        Route("account key", False, lambda scene: "/v1/api-keys", None, b"{}", b'{"x": 1}',
              lambda api, scene: _count(api.pool, "SELECT count(*) FROM api_keys WHERE account_id = $1", scene.account_id),
              _one_more, lambda answer: answer["key"], 5),
        Route("endpoint", False, lambda scene: "/v1/endpoints", b'{"url": "https://example.com/idem"}',
              b'{"url": "https://example.com/other"}', b'{"url": "ftp://example.com/"}',
              lambda api, scene: _count(api.pool, "SELECT count(*) FROM endpoints WHERE account_id = $1", scene.account_id),
              _one_more, lambda answer: answer["url"], 20),
        Route("rotate", False, lambda scene: f"/v1/endpoints/{scene.endpoint_id}/secret/rotate", b"{}",
              b'{"secret": "%s"}' % OTHER_SECRET.encode(), b'{"secret": "whsec_nope"}',
              _secrets, _rotated_once, lambda answer: answer["secret"], 10),
    )
}
PRINCIPAL_OPERATOR = idempotent_responses.OPERATOR_PRINCIPAL


def _auth(api, route: Route, scene: Scene) -> dict:
    return api.operator if route.operator else scene.headers


def _principal(route: Route, scene: Scene) -> str:
    return PRINCIPAL_OPERATOR if route.operator else str(scene.account_id)


async def _post(api, route: Route, scene: Scene, key: str | None, body: bytes | None = None, path: str | None = None):
    headers = {**_auth(api, route, scene), "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    body = route.body if body is None else body
    return await api.client.post(path or route.path(scene), data=body, headers=headers)


async def _stored(api, principal: str, key: str) -> int:
    return await api.pool.fetchval(
        "SELECT count(*) FROM idempotent_responses WHERE principal = $1 AND key = $2", principal, key)


async def _slug(response) -> str:
    return (await response.json())["type"].rsplit("/", 1)[1]


routes = pytest.mark.parametrize("route", list(ROUTES.values()), ids=list(ROUTES))


@routes
async def test_the_same_key_and_request_make_one_thing_and_answer_it_again(api, route):
    """Twice with one key: one thing made (in the database), the second answer the first's bytes
    with Idempotent-Replayed: true, and one stored row. Without a key, each call makes one more."""
    scene = await _scene(api)
    before = await route.made(api, scene)
    first = await _post(api, route, scene, "k-1")
    assert 200 <= first.status < 300, await first.text()
    assert "Idempotent-Replayed" not in first.headers
    made = await route.made(api, scene)
    assert route.made_once(before, made)
    second = await _post(api, route, scene, "k-1")
    assert (second.status, await second.read()) == (first.status, await first.read())
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.headers["Content-Type"].startswith("application/json")
    assert await route.made(api, scene) == made
    assert await _stored(api, _principal(route, scene), "k-1") == 1
    # No header: as before, nothing stored, and each call makes one more.
    rows = await api.pool.fetchval("SELECT count(*) FROM idempotent_responses")
    unkeyed = await _post(api, route, scene, None, route.other_body)
    assert 200 <= unkeyed.status < 300 and "Idempotent-Replayed" not in unkeyed.headers
    after_unkeyed = await route.made(api, scene)
    assert route.made_once(made, after_unkeyed)
    again = await _post(api, route, scene, None, route.other_body)
    assert 200 <= again.status < 300 and "Idempotent-Replayed" not in again.headers
    if route.name != "rotate":  # rotating to the secret already current changes nothing, by design
        assert route.made_once(after_unkeyed, await route.made(api, scene))
    assert await api.pool.fetchval("SELECT count(*) FROM idempotent_responses") == rows


@routes
async def test_the_same_key_with_another_request_is_422_and_makes_nothing(api, route):
    """Another body, or (for a path with an id) another path, with a used key: 422
    idempotency-key-reused, and nothing more is made."""
    scene = await _scene(api)
    first = await _post(api, route, scene, "k-1")
    assert 200 <= first.status < 300, await first.text()
    made = await route.made(api, scene)
    other = await _post(api, route, scene, "k-1", route.other_body)
    assert other.status == 422 and await _slug(other) == "idempotency-key-reused", await other.text()
    assert await route.made(api, scene) == made
    if route.name in ("operator key", "rotate"):
        # The same body to another account's path (operator) or another endpoint (rotate) is another request.
        if route.name == "operator key":
            elsewhere_scene = await _scene(api)
        else:
            endpoint = await api.endpoint(scene.headers, url="https://example.com/elsewhere")
            elsewhere_scene = dataclasses.replace(scene, endpoint_id=uuid.UUID(endpoint["id"]))
        untouched = await route.made(api, elsewhere_scene)
        elsewhere = await _post(api, route, scene, "k-1", path=route.path(elsewhere_scene))
        assert elsewhere.status == 422 and await _slug(elsewhere) == "idempotency-key-reused"
        assert await route.made(api, elsewhere_scene) == untouched
        assert await route.made(api, scene) == made
    assert await _stored(api, _principal(route, scene), "k-1") == 1


@routes
async def test_another_principals_same_key_is_another_key(api, route):
    """An account's routes: another account's same key and body make its own thing, not a replay of
    the first's (which would show it another account's key). The operator's routes: an account's
    use of the key first leaves the operator's key free."""
    scene, other = await _scene(api), await _scene(api)
    if route.operator:
        used = await api.client.post("/v1/api-keys", headers={**other.headers, "Idempotency-Key": "shared"})
    else:
        used = await _post(api, route, other, "shared")
    assert 200 <= used.status < 300 and "Idempotent-Replayed" not in used.headers, await used.text()
    before = await route.made(api, scene)
    mine = await _post(api, route, scene, "shared")
    assert 200 <= mine.status < 300 and "Idempotent-Replayed" not in mine.headers, await mine.text()
    assert route.made_once(before, await route.made(api, scene))
    assert await mine.read() != await used.read()


@routes
async def test_two_at_once_with_one_key_make_one_thing(api, route):
    """Concurrent pairs with one key, round after round: exactly one thing made each round; one
    answer is the write's, the other its replay or 409 idempotency-key-in-use with Retry-After: 1."""
    scene = await _scene(api)
    seen = {"replayed": 0, "in use": 0}
    for number in range(route.rounds):
        key = f"race-{number}"
        before = await route.made(api, scene)
        answers = await asyncio.gather(_post(api, route, scene, key), _post(api, route, scene, key))
        assert route.made_once(before, await route.made(api, scene)), number
        written = [a for a in answers if 200 <= a.status < 300 and "Idempotent-Replayed" not in a.headers]
        assert len(written) == 1, [a.status for a in answers]
        (other,) = [a for a in answers if a is not written[0]]
        if other.status == 409:
            assert await _slug(other) == "idempotency-key-in-use" and other.headers["Retry-After"] == "1"
            seen["in use"] += 1
        else:
            assert other.headers.get("Idempotent-Replayed") == "true", other.status
            assert (other.status, await other.read()) == (written[0].status, await written[0].read())
            seen["replayed"] += 1
        assert await _stored(api, _principal(route, scene), key) == 1
    assert sum(seen.values()) == route.rounds


@routes
@pytest.mark.parametrize("key", ["caf\u00e9", "k" * 256])
async def test_an_invalid_key_is_422_and_makes_nothing(api, route, key):
    """The messages' rule: 1 to 255 printable ASCII characters."""
    scene = await _scene(api)
    before = await route.made(api, scene)
    response = await _post(api, route, scene, key)
    assert response.status == 422 and await _slug(response) == "invalid-request"
    assert [error["field"] for error in (await response.json())["errors"]] == ["Idempotency-Key"]
    assert await route.made(api, scene) == before
    assert await api.pool.fetchval("SELECT count(*) FROM idempotent_responses") == 0


async def test_the_replay_prefix_is_reserved_for_messages_only(api):
    """`replay:` keys are the operator's dead-letter replays in the messages' key space; here they
    are an ordinary key."""
    scene = await _scene(api)
    route = ROUTES["endpoint"]
    first = await _post(api, route, scene, "replay:mine")
    assert first.status == 201, await first.text()
    assert (await _post(api, route, scene, "replay:mine")).headers["Idempotent-Replayed"] == "true"
    message = await api.client.post("/v1/messages", json={"event_type": "t", "payload": 1},
                                    headers={**scene.headers, "Idempotency-Key": "replay:mine"})
    assert message.status == 422 and await _slug(message) == "invalid-request"


@routes
async def test_a_request_refused_by_validation_stores_nothing_and_its_corrected_retry_goes_ahead(api, route):
    scene = await _scene(api)
    before = await route.made(api, scene)
    refused = await _post(api, route, scene, "k-fix", route.invalid_body)
    assert refused.status == 422 and await _slug(refused) == "invalid-request", await refused.text()
    assert await route.made(api, scene) == before
    assert await _stored(api, _principal(route, scene), "k-fix") == 0
    corrected = await _post(api, route, scene, "k-fix")
    assert 200 <= corrected.status < 300 and "Idempotent-Replayed" not in corrected.headers
    assert route.made_once(before, await route.made(api, scene))


async def test_a_write_refused_inside_the_keyed_transaction_stores_nothing(api):
    """Refusals raised by the write itself, after the key's lock and lookup (404 for a missing
    account or endpoint, 409 at the endpoint limit): rolled back, no row, and the retry with the same
    key (the request corrected) is made and answered as a first request."""
    scene = await _scene(api)
    # The operator's key for an account that does not exist, then for one that does.
    route = ROUTES["operator key"]
    missing = await _post(api, route, scene, "k-404", path=f"/v1/accounts/{uuid.uuid4()}/api-keys")
    assert missing.status == 404
    assert await _stored(api, PRINCIPAL_OPERATOR, "k-404") == 0
    before = await route.made(api, scene)
    made = await _post(api, route, scene, "k-404")
    assert made.status == 201 and "Idempotent-Replayed" not in made.headers
    assert route.made_once(before, await route.made(api, scene))
    # A rotation of a deleted endpoint, then of a live one.
    route = ROUTES["rotate"]
    gone = await api.endpoint(scene.headers, url="https://example.com/gone")
    assert (await api.client.delete(f"/v1/endpoints/{gone['id']}", headers=scene.headers)).status == 200
    missing = await _post(api, route, scene, "k-rot", path=f"/v1/endpoints/{gone['id']}/secret/rotate")
    assert missing.status == 404
    assert await _stored(api, str(scene.account_id), "k-rot") == 0
    before = await route.made(api, scene)
    rotated = await _post(api, route, scene, "k-rot")
    assert rotated.status == 200 and route.made_once(before, await route.made(api, scene))
    # An endpoint past the account's limit, then after one was deleted.
    route = ROUTES["endpoint"]
    live = "SELECT count(*) FROM endpoints WHERE account_id = $1 AND deleted_at IS NULL"
    await api.pool.execute(
        "INSERT INTO endpoints (id, account_id, url) SELECT gen_random_uuid(), $1, 'https://example.com/filler'"
        " FROM generate_series(1, $2)", scene.account_id, ENDPOINTS_PER_ACCOUNT_MAX - await _count(api.pool, live, scene.account_id))
    assert await _count(api.pool, live, scene.account_id) == ENDPOINTS_PER_ACCOUNT_MAX
    before = await route.made(api, scene)
    full = await _post(api, route, scene, "k-full")
    assert full.status == 409 and await _slug(full) == "limit-reached"
    assert await _stored(api, str(scene.account_id), "k-full") == 0 and await route.made(api, scene) == before
    assert (await api.client.delete(f"/v1/endpoints/{scene.endpoint_id}", headers=scene.headers)).status == 200
    created = await _post(api, route, scene, "k-full")
    assert created.status == 201 and "Idempotent-Replayed" not in created.headers
    assert await _stored(api, str(scene.account_id), "k-full") == 1


@routes
async def test_the_stored_answer_is_sealed_and_bound_to_its_key(api, route):
    """The table holds no plain text of the answer (an API key, a secret, the endpoint's URL); it
    opens with the at-rest keyring only under its own (principal, key)."""
    scene = await _scene(api)
    response = await _post(api, route, scene, "k-seal")
    answer_bytes = await response.read()
    shown = route.shown(await response.json())
    principal = _principal(route, scene)
    sealed = bytes(await api.pool.fetchval(
        "SELECT body FROM idempotent_responses WHERE principal = $1 AND key = $2", principal, "k-seal"))
    assert shown.encode() not in sealed and answer_bytes not in sealed
    assert not await api.pool.fetchval(
        "SELECT count(*) FROM idempotent_responses WHERE position(convert_to($1, 'UTF8') IN body) > 0", shown)
    keyring = parse_keyring(api.settings.secret_keyring)
    context = idempotent_responses.sealing_context(principal, "k-seal")
    assert decrypt_secret(sealed, keyring, context=context).encode() == answer_bytes
    with pytest.raises(TamperedCiphertextError):
        decrypt_secret(sealed, keyring, context=idempotent_responses.sealing_context(principal, "k-other"))


# ---- a lost COMMIT answer with a key -------------------------------------------------------------


async def test_a_lost_commit_answer_with_a_key_is_answered_by_the_retry(api, cut_pool, cutter, queue):
    """Through a proxy that breaks the connection at COMMIT: the COMMIT held (cannot tell), 503
    write-outcome-unknown saying to retry with the key; the retry while it is held, 409 (its
    transaction still holds the key); once it commits, the retry answers the endpoint that was
    made, once. Not written (the COMMIT dropped), 503 write-failed, and the retry makes it."""
    settings = dataclasses.replace(api.settings, api=dataclasses.replace(api.settings.api,
                                                                          commit_outcome_wait_seconds=1))
    scene = await _scene(api)
    count = "SELECT count(*) FROM endpoints WHERE account_id = $1"
    async with TestClient(TestServer(create_app(settings, cut_pool, queue), host="127.0.0.1")) as client:
        async def post(key: str):
            return await client.post("/v1/endpoints", json={"url": f"https://example.com/{key}"},
                                     headers={**scene.headers, "Idempotency-Key": key})

        assert (await client.get("/v1/balance", headers=scene.headers)).status == 200  # the key is cached
        before = await api.pool.fetchval(count, scene.account_id)
        cutter.arm("hold")
        unknown = await post("held")
        problem = await unknown.json()
        assert unknown.status == 503 and problem["type"].endswith("/write-outcome-unknown"), problem
        assert "same Idempotency-Key" in problem["detail"]
        # Bounded: without the key's lock it would wait on the held transaction's account lock.
        in_use = await asyncio.wait_for(post("held"), 10)
        assert in_use.status == 409 and await _slug(in_use) == "idempotency-key-in-use"
        cutter.release()
        for _ in range(200):
            if await api.pool.fetchval(count, scene.account_id) == before + 1:
                break
            await asyncio.sleep(0.05)
        retried = await post("held")
        assert retried.status == 201 and retried.headers["Idempotent-Replayed"] == "true"
        made = await api.pool.fetchval("SELECT id FROM endpoints WHERE account_id = $1 AND url = $2",
                                       scene.account_id, "https://example.com/held")
        assert uuid.UUID((await retried.json())["id"]) == made
        cutter.arm("before")
        failed = await post("dropped")
        assert failed.status == 503 and (await failed.json())["type"].endswith("/write-failed")
        assert await api.pool.fetchval(count, scene.account_id) == before + 1
        again = await post("dropped")
        assert again.status == 201 and "Idempotent-Replayed" not in again.headers
        assert cutter.cuts == 2
    assert await api.pool.fetchval(count, scene.account_id) == before + 2


# ---- retention ----------------------------------------------------------------------------------


async def _insert_aged(pool: asyncpg.Pool, key: str, age: timedelta) -> None:
    await pool.execute(
        "INSERT INTO idempotent_responses (principal, key, fingerprint, status, body, created_at)"
        " VALUES ('operator', $1, $2, 201, '\\x00', now() - $3::interval)", key, b"\x00" * 32, age)


async def test_the_purge_deletes_answers_past_25_hours_in_bounded_chunks(pool):
    """Rows older than 25 h go, at most chunk_rows a statement and chunks_max statements a call;
    younger ones (24 h 30 min, a second) stay."""
    for number in range(5):
        await _insert_aged(pool, f"old-{number}", timedelta(hours=25, minutes=1 + number))
    await _insert_aged(pool, "kept-day", timedelta(hours=24, minutes=30))
    await _insert_aged(pool, "kept-new", timedelta(seconds=1))
    assert await idempotent_responses.purge_expired(pool, chunk_rows=2, chunks_max=2) == 4
    assert await idempotent_responses.purge_expired(pool, chunk_rows=2, chunks_max=2) == 1
    assert await idempotent_responses.purge_expired(pool) == 0
    keys = {row["key"] for row in await pool.fetch("SELECT key FROM idempotent_responses")}
    assert keys == {"kept-day", "kept-new"}


async def test_the_sweep_purges(pool):
    """The worker's periodic sweep (Engine.sweep) is what runs the purge."""
    await _insert_aged(pool, "old", timedelta(hours=26))
    await _insert_aged(pool, "new", timedelta(hours=1))
    sender = Sender()
    try:
        await Engine(pool, sender, None, SignerCache(None), EngineSettings()).sweep()
    finally:
        await sender.close()
    assert [row["key"] for row in await pool.fetch("SELECT key FROM idempotent_responses")] == ["new"]


async def test_an_account_deleted_takes_its_stored_answers_with_it(api):
    """The closeout erases secrets, so it deletes the account's stored answers too (they hold its
    shown-once keys and secrets, sealed); the operator's, such as the account's first key, expire."""
    scene = await _scene(api)
    assert (await _post(api, ROUTES["endpoint"], scene, "k-gone")).status == 201
    assert (await _post(api, ROUTES["account"], scene, "k-operator")).status == 201
    await closeout.begin_closing(api.pool, scene.account_id)
    await closeout.close_out(api.pool, scene.account_id)
    assert await _stored(api, str(scene.account_id), "k-gone") == 0
    assert await _stored(api, PRINCIPAL_OPERATOR, "k-operator") == 1


async def test_a_stored_answer_the_keyring_cannot_open_is_409_and_another_request_still_422(api, settings, pool, queue):
    """An instance whose keyring cannot open the stored answer (a key replaced under the same id,
    as a dev-mode restart does): the same request is 409 idempotency-answer-unreadable and makes
    nothing again; another request with the key is still 422, judged before anything is opened.
    Both were 500 internal for the retention's 25 h (found in review)."""
    _, headers = await api.account()
    keyed = {**headers, "Idempotency-Key": "k-ring"}
    assert (await api.client.post("/v1/endpoints", json={"url": "https://example.com/a"}, headers=keyed)).status == 201
    other_ring = format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1"))
    restarted = dataclasses.replace(settings, secret_keyring=other_ring)
    async with TestClient(TestServer(create_app(restarted, pool, queue), host="127.0.0.1")) as client:
        same = await client.post("/v1/endpoints", json={"url": "https://example.com/a"}, headers=keyed)
        other = await client.post("/v1/endpoints", json={"url": "https://example.com/other"}, headers=keyed)
        assert same.status == 409 and (await same.json())["type"].endswith("/idempotency-answer-unreadable")
        assert other.status == 422
    assert await pool.fetchval("SELECT count(*) FROM endpoints") == 1
