"""Ed25519 endpoints and custom headers, end to end: the API, a real worker, loopback receivers.

An Ed25519 endpoint's deliveries carry a `v1a` signature that verifies with its `whpk_` public
key, through our `signing` and through the Standard Webhooks format checked with `cryptography`
directly (the `standardwebhooks` Python package verifies `v1` only: it takes a whsec_ secret and
compares `v1,` entries, so a `v1a` entry is simply no match to it). A rotation from HMAC to
Ed25519 signs with both during the overlap: either key verifies, the whsec_ one through the
`standardwebhooks` package too. An endpoint's custom headers are on every request, outside the
signature, and leave the Standard Webhooks headers and ours alone.
"""

from __future__ import annotations

import base64
import uuid

import pytest
from multidict import CIMultiDict
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook

from delivery.engine.sender import USER_AGENT
from delivery.platform import config
from delivery.platform.web_app import create_app
from delivery.store.signer_cache import endpoint_secret_context
from engine_helpers import fast_environment, running_worker, wait_for
from signing import decrypt_secret, generate_key_pair, generate_secret, parse_verifying_key, verify

OPERATOR_KEY = "op_ed25519_headers_" + "k" * 32


def _signatures(entry: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for item in entry["headers"]["webhook-signature"].split():
        version, _, signature = item.partition(",")
        found.setdefault(version, []).append(signature)
    return found


def _verifies_by_the_spec_with_cryptography(entry: dict, public_key: str) -> bool:
    """Standard Webhooks v1a, checked without our code: Ed25519 over `{id}.{timestamp}.{body}`,
    the key the base64 after `whpk_`, each signature the base64 after `v1a,`."""
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_")))
    headers = entry["headers"]
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + entry["body"]
    for signature in _signatures(entry).get("v1a", []):
        try:
            key.verify(base64.b64decode(signature), signed)
            return True
        except Exception:  # noqa: BLE001 - InvalidSignature: try the next one
            continue
    return False


@pytest.fixture
async def platform(pool, database_url, redis_url, keyring, arq_queue):
    """The API (a client with an account's key) and a worker, on this test's database."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_OPERATOR_KEY=OPERATOR_KEY))
    async with TestClient(TestServer(create_app(settings, pool, arq_queue), host="127.0.0.1")) as api, \
            running_worker(settings, pool):
        operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        created = await (await api.post("/v1/accounts", json={"name": "keys", "price_per_delivery": 1},
                                        headers=operator)).json()
        response = await api.post(f"/v1/accounts/{created['account']['id']}/topups",
                                  json={"order_id": "o-1", "amount": 100}, headers=operator)
        assert response.status == 201
        api.account_headers = {"Authorization": f"Bearer {created['api_key']['key']}"}
        yield api


async def _deliver(api, pool, event_type: str = "invoice.paid") -> uuid.UUID:
    response = await api.post("/v1/messages", json={"event_type": event_type, "payload": {"n": 1}},
                              headers=api.account_headers)
    assert response.status == 202, await response.text()
    delivery_id = uuid.UUID((await response.json())["deliveries"][0]["id"])
    await wait_for(lambda: pool.fetchval("SELECT state = 'delivered' FROM deliveries WHERE id = $1", delivery_id))
    return delivery_id


async def test_an_ed25519_endpoint_signs_v1a_that_its_public_key_verifies(platform, pool, receiver_factory, keyring):
    """Created with signing_key_type ed25519: the answers show the whpk_ only, the whsk_ is sealed
    at rest, and each delivery carries one v1a signature that the whpk_ verifies (ours, and the
    spec's format with cryptography); no whsec_ signs anything."""
    api, receiver = platform, await receiver_factory()
    response = await api.post("/v1/endpoints", json={"url": receiver.url, "signing_key_type": "ed25519"},
                              headers=api.account_headers)
    assert response.status == 201, await response.text()
    endpoint = await response.json()
    assert endpoint["signing_key_type"] == "ed25519"
    shown = await (await api.get(f"/v1/endpoints/{endpoint['id']}/secret", headers=api.account_headers)).json()
    public_key = shown["secret"]
    assert shown["signing_key_type"] == "ed25519" and public_key.startswith("whpk_")
    sealed = await pool.fetchval("SELECT secret FROM endpoints WHERE id = $1", uuid.UUID(endpoint["id"]))
    private_key = decrypt_secret(bytes(sealed), keyring, context=endpoint_secret_context(uuid.UUID(endpoint["id"])))
    assert private_key.startswith("whsk_") and private_key.encode() not in bytes(sealed)
    assert parse_verifying_key(private_key).serialize() == public_key

    receiver.secret = public_key
    delivery_id = await _deliver(api, pool)
    (entry,) = receiver.received
    assert entry["valid"] and entry["id"] == str(delivery_id)
    assert list(_signatures(entry)) == ["v1a"] and len(_signatures(entry)["v1a"]) == 1
    assert verify(entry["headers"], entry["body"], public_key).id == str(delivery_id)
    assert _verifies_by_the_spec_with_cryptography(entry, public_key)
    assert not _verifies_by_the_spec_with_cryptography(entry, generate_key_pair()[1])  # another key: no match


async def test_a_rotation_from_hmac_to_ed25519_verifies_with_either_key_during_the_overlap(
        platform, pool, receiver_factory):
    """HMAC -> Ed25519: the header carries v1 (old secret) and v1a (new key); the whsec_ verifies
    it (ours and the standardwebhooks package), and so does the whpk_ (ours and cryptography).
    A rotation without a type keeps the kind: Ed25519 again, both Ed25519 keys sign."""
    api, receiver = platform, await receiver_factory()
    secret = generate_secret()
    endpoint = await (await api.post("/v1/endpoints", json={"url": receiver.url, "secret": secret},
                                     headers=api.account_headers)).json()
    assert endpoint["signing_key_type"] == "hmac"
    rotated = await api.post(f"/v1/endpoints/{endpoint['id']}/secret/rotate", json={"signing_key_type": "ed25519"},
                             headers=api.account_headers)
    assert rotated.status == 200, await rotated.text()
    answer = await rotated.json()
    public_key = answer["secret"]
    assert answer["signing_key_type"] == "ed25519" and public_key.startswith("whpk_")
    read = await (await api.get(f"/v1/endpoints/{endpoint['id']}", headers=api.account_headers)).json()
    assert read["signing_key_type"] == "ed25519"

    receiver.secret = secret
    await _deliver(api, pool)
    entry = receiver.received[-1]
    assert sorted(_signatures(entry)) == ["v1", "v1a"]
    assert verify(entry["headers"], entry["body"], secret)
    Webhook(secret).verify(entry["body"], entry["headers"])  # the reference library, with the old secret
    assert verify(entry["headers"], entry["body"], public_key)
    assert _verifies_by_the_spec_with_cryptography(entry, public_key)

    again = await (await api.post(f"/v1/endpoints/{endpoint['id']}/secret/rotate",
                                  headers=api.account_headers)).json()
    assert again["signing_key_type"] == "ed25519" and again["secret"] not in (public_key, secret)
    await _deliver(api, pool)
    entry = receiver.received[-1]
    assert list(_signatures(entry)) == ["v1a"] and len(_signatures(entry)["v1a"]) == 2
    assert _verifies_by_the_spec_with_cryptography(entry, public_key)
    assert _verifies_by_the_spec_with_cryptography(entry, again["secret"])


async def test_custom_headers_go_with_every_request_outside_the_signature(platform, pool, receiver_factory):
    """An endpoint's headers arrive on each request beside ours and the Standard Webhooks ones,
    which they cannot replace; the signature still verifies; a PATCH changes what the next
    request carries and null clears them; the delivery's detail shows the endpoint's headers now,
    and each attempt the headers it was sent with (NULL in the row when the endpoint had none)."""
    api, receiver = platform, await receiver_factory()
    custom = {"X-Tenant": "acme-eu", "Authorization": "Bearer gateway-token", "X-Trace": "a=b; c"}
    response = await api.post("/v1/endpoints", json={"url": receiver.url, "secret": receiver.secret,
                                                     "headers": custom}, headers=api.account_headers)
    assert response.status == 201, await response.text()
    endpoint = await response.json()
    assert endpoint["headers"] == custom
    delivery_id = await _deliver(api, pool)
    entry = receiver.received[-1]
    assert entry["valid"]
    received = CIMultiDict(entry["headers"])
    assert {name: received.getall(name) for name in custom} == {name: [value] for name, value in custom.items()}
    assert (received["Content-Type"], received["User-Agent"]) == ("application/json", USER_AGENT)
    assert received["webhook-id"] == str(delivery_id)
    detail = await (await api.get(f"/v1/deliveries/{delivery_id}", headers=api.account_headers)).json()
    assert detail["endpoint_headers"] == custom
    assert [attempt["sent_headers"] for attempt in detail["attempts"]] == [custom]

    path = f"/v1/endpoints/{endpoint['id']}"
    patched = await api.patch(path, json={"headers": {"X-Tenant": "acme-us"}}, headers=api.account_headers)
    assert patched.status == 200 and (await patched.json())["headers"] == {"X-Tenant": "acme-us"}
    patched_delivery_id = await _deliver(api, pool)
    received = CIMultiDict(receiver.received[-1]["headers"])
    assert received["X-Tenant"] == "acme-us" and "Authorization" not in received
    first = await (await api.get(f"/v1/deliveries/{delivery_id}", headers=api.account_headers)).json()
    assert first["endpoint_headers"] == {"X-Tenant": "acme-us"}, "the endpoint's headers now"
    assert [attempt["sent_headers"] for attempt in first["attempts"]] == [custom], "what the attempt was sent with"
    second = await (await api.get(f"/v1/deliveries/{patched_delivery_id}", headers=api.account_headers)).json()
    assert [attempt["sent_headers"] for attempt in second["attempts"]] == [{"X-Tenant": "acme-us"}]
    cleared = await api.patch(path, json={"headers": None}, headers=api.account_headers)
    assert (await cleared.json())["headers"] is None
    assert await pool.fetchval("SELECT headers FROM endpoints WHERE id = $1", uuid.UUID(endpoint["id"])) is None
    cleared_delivery_id = await _deliver(api, pool)
    assert "X-Tenant" not in CIMultiDict(receiver.received[-1]["headers"]) and receiver.received[-1]["valid"]
    third = await (await api.get(f"/v1/deliveries/{cleared_delivery_id}", headers=api.account_headers)).json()
    assert [attempt["sent_headers"] for attempt in third["attempts"]] == [None]
    assert await pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE delivery_id = $1 AND sent_headers IS NULL",
                               cleared_delivery_id) == 1


async def test_a_failed_attempt_keeps_its_headers_and_an_expunge_erases_them(platform, pool, receiver_factory):
    """The receiver answers 500, then 200: both attempts record the headers they were sent with
    (a failure is written by another statement than a batch of successes). Expunging the message
    erases them with the response excerpts; the attempts' rows stay."""
    api, receiver = platform, await receiver_factory(lambda number: 500 if number == 1 else 200)
    custom = {"X-Tenant": "acme-eu"}
    response = await api.post("/v1/endpoints", json={"url": receiver.url, "secret": receiver.secret,
                                                     "headers": custom}, headers=api.account_headers)
    assert response.status == 201, await response.text()
    delivery_id = await _deliver(api, pool)
    detail = await (await api.get(f"/v1/deliveries/{delivery_id}", headers=api.account_headers)).json()
    assert [(attempt["status_code"], attempt["sent_headers"]) for attempt in detail["attempts"]] == [
        (500, custom), (200, custom)]
    expunged = await api.post(f"/v1/messages/{detail['message_id']}/expunge", headers=api.account_headers)
    assert expunged.status == 200, await expunged.text()
    detail = await (await api.get(f"/v1/deliveries/{delivery_id}", headers=api.account_headers)).json()
    assert [(attempt["status_code"], attempt["sent_headers"]) for attempt in detail["attempts"]] == [
        (500, None), (200, None)]
    assert await pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE delivery_id = $1 AND sent_headers IS NULL",
                               delivery_id) == 2
