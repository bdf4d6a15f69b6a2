"""Endpoint controls through the API: the signing key's kind (HMAC or Ed25519) on create and
rotate, custom headers on create and PATCH, and each delivery's webhook_id. Every answer shows an
Ed25519 key's whpk_ only, a stored idempotent answer too; every bad value of a new field is a 422
problem naming the field, and writes nothing."""

from __future__ import annotations

import uuid

import pytest

from delivery.store.idempotent_responses import sealing_context
from signing import generate_secret, parse_verifying_key
from signing.at_rest import decrypt_secret, parse_keyring


def _fields(problem: dict) -> list[str]:
    return [error["field"] for error in problem.get("errors", [])]


async def _refused_422(response) -> list[str]:
    assert response.status == 422, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert problem["type"].endswith("/invalid-request") and problem["status"] == 422, problem
    return _fields(problem)


async def test_ed25519_endpoints_show_only_their_public_key_and_keep_their_kind(api):
    """Create Ed25519; read it back (whpk_ only); rotate with no type (Ed25519 again), to hmac,
    to a chosen whsec_; a keyed rotation's stored answer is the whpk_ too. No answer holds whsk_."""
    _, headers = await api.account()
    created = await api.endpoint(headers, signing_key_type="ed25519")
    endpoint_id = created["id"]
    assert created["signing_key_type"] == "ed25519" and created["headers"] is None
    keyring = parse_keyring(api.settings.secret_keyring)

    async def sealed_key() -> tuple[str, str]:
        row = await api.pool.fetchrow("SELECT secret, signing_key_type FROM endpoints WHERE id = $1",
                                      uuid.UUID(endpoint_id))
        key = decrypt_secret(bytes(row["secret"]), keyring, context=b"endpoint:" + endpoint_id.encode())
        return key, row["signing_key_type"]

    key, kind = await sealed_key()
    shown = await (await api.client.get(f"/v1/endpoints/{endpoint_id}/secret", headers=headers)).json()
    assert (kind, key[:5]) == ("ed25519", "whsk_")
    assert shown == {"secret": parse_verifying_key(key).serialize(), "signing_key_type": "ed25519"}
    answers = [shown]

    rotate = f"/v1/endpoints/{endpoint_id}/secret/rotate"
    keyed = {**headers, "Idempotency-Key": "rotate-1"}
    first = await api.client.post(rotate, headers=keyed)
    again = await api.client.post(rotate, headers=keyed)  # the stored answer, sealed: still the public key
    assert first.status == again.status == 200 and again.headers.get("Idempotent-Replayed") == "true"
    answers += [await first.json(), await again.json()]
    assert answers[1] == answers[2] and answers[1]["signing_key_type"] == "ed25519"
    key, kind = await sealed_key()
    assert kind == "ed25519" and answers[1]["secret"] == parse_verifying_key(key).serialize() != shown["secret"]

    to_hmac = await (await api.client.post(rotate, json={"signing_key_type": "hmac"}, headers=headers)).json()
    assert to_hmac["signing_key_type"] == "hmac" and to_hmac["secret"].startswith("whsec_")
    assert (await sealed_key()) == (to_hmac["secret"], "hmac")
    chosen = generate_secret()
    assert (await (await api.client.post(rotate, json={"secret": chosen, "signing_key_type": "hmac"},
                                         headers=headers)).json()) == {"secret": chosen, "signing_key_type": "hmac"}
    listed = await (await api.client.get("/v1/endpoints", headers=headers)).json()
    assert [item["signing_key_type"] for item in listed["data"]] == ["hmac"]
    assert not any("whsk_" in str(answer) for answer in answers)
    stored = await api.pool.fetch("SELECT principal, key, body FROM idempotent_responses")
    opened = [decrypt_secret(bytes(row["body"]), keyring, context=sealing_context(row["principal"], row["key"]))
              for row in stored]
    assert any(answers[1]["secret"] in text for text in opened) and not any("whsk_" in text for text in opened)


async def test_custom_headers_are_kept_shown_patched_and_cleared(api):
    """Headers given on create are kept as given and shown; PATCH replaces them; {} and null clear."""
    _, headers = await api.account()
    custom = {"X-Tenant": "acme", "Authorization": "Bearer t0k3n", "x-trace": "a=1; b=\"2\""}
    response = await api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "headers": custom},
                                     headers=headers)
    assert response.status == 201, await response.text()
    created = await response.json()
    assert created["headers"] == custom and created["signing_key_type"] == "hmac"
    path = f"/v1/endpoints/{created['id']}"
    assert (await (await api.client.get(path, headers=headers)).json())["headers"] == custom
    for value, expected in (({"X-One": "1"}, {"X-One": "1"}), ({}, None), ({"X-Two": "2"}, {"X-Two": "2"}),
                            (None, None)):
        response = await api.client.patch(path, json={"headers": value}, headers=headers)
        assert response.status == 200 and (await response.json())["headers"] == expected
    untouched = await api.client.patch(path, json={"description": "only this"}, headers=headers)
    assert (await untouched.json())["headers"] is None


async def test_every_delivery_shows_its_webhook_id(api):
    """A sent delivery's webhook_id is its own id, in the list, the detail and the operator's dead
    page alike; a replay's is the id of the delivery it replays."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    sent = await (await api.send(headers)).json()
    delivery_id = sent["deliveries"][0]["id"]
    await api.pool.execute("UPDATE deliveries SET state = 'delivered', finished_at = now() WHERE id = $1",
                           uuid.UUID(delivery_id))  # as if sent: a delivered delivery can be replayed
    replayed = await (await api.client.post(f"/v1/deliveries/{delivery_id}/replay", headers=headers)).json()
    replay_id = replayed["deliveries"][0]["id"]
    page = await (await api.client.get("/v1/deliveries", headers=headers)).json()
    assert {item["id"]: item["webhook_id"] for item in page["data"]} == {delivery_id: delivery_id,
                                                                         replay_id: delivery_id}
    detail = await (await api.client.get(f"/v1/deliveries/{replay_id}", headers=headers)).json()
    assert (detail["webhook_id"], detail["replay_of"], detail["endpoint_headers"]) == (delivery_id, delivery_id, None)


_HEADERS_REFUSED = [
    ([], "headers"),
    ({f"X-{n}": "v" for n in range(21)}, "headers"),
    ({"X-A": 5}, None),  # a value not text: msgspec names where
    ({"bad name": "v"}, "headers.bad name"),
    ({"X-Ä": "v"}, "headers.X-Ä"),
    ({"": "v"}, "headers."),
    ({"X-" + "a" * 63: "v"}, "headers.X-" + "a" * 62),  # the name cut to 64 characters in the field
    ({"Webhook-Id": "spoofed"}, "headers.Webhook-Id"),
    ({"webhook-signature": "v1,AAAA"}, "headers.webhook-signature"),
    ({"svix-id": "msg_1"}, "headers.svix-id"),
    ({"Host": "example.org"}, "headers.Host"),
    ({"Connection": "close"}, "headers.Connection"),
    ({"Transfer-Encoding": "chunked"}, "headers.Transfer-Encoding"),
    ({"Content-Type": "text/plain"}, "headers.Content-Type"),
    ({"Content-Length": "1"}, "headers.Content-Length"),
    ({"User-Agent": "me"}, "headers.User-Agent"),
    ({"X-A": "a\r\nX-Injected: 1"}, "headers.X-A"),
    ({"X-A": "a\nb"}, "headers.X-A"),
    ({"X-A": "tab\there"}, "headers.X-A"),
    ({"X-A": "é"}, "headers.X-A"),
    ({"X-A": ""}, "headers.X-A"),
    ({"X-A": " padded"}, "headers.X-A"),
    ({"X-A": "x" * 1025}, "headers.X-A"),
    ({"X-Tenant": "a", "x-tenant": "b"}, "headers.x-tenant"),
    ({f"X-{n}": "x" * 1000 for n in range(5)}, "headers"),  # 5,025 bytes in all
]


@pytest.mark.parametrize("value,field", _HEADERS_REFUSED, ids=[str(i) for i in range(len(_HEADERS_REFUSED))])
async def test_bad_custom_headers_are_422_naming_the_header_and_write_nothing(api, value, field):
    """On create and on PATCH: 422 problem+json whose errors name the header, rows unchanged."""
    _, headers = await api.account()
    endpoint = await api.endpoint(headers)
    before = await api.snapshot()
    created = await api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "headers": value},
                                    headers=headers)
    patched = await api.client.patch(f"/v1/endpoints/{endpoint['id']}", json={"headers": value}, headers=headers)
    for response in (created, patched):
        fields = await _refused_422(response)
        if field is None:
            assert len(fields) == 1 and fields[0].startswith("headers"), fields
        else:
            assert field in fields, fields
    assert await api.snapshot() == before


async def test_bad_signing_key_types_are_422_naming_the_field_and_write_nothing(api):
    """An unknown kind, or a whsec_ secret with ed25519, or a whsk_/whpk_ key as the secret (an
    Ed25519 key is never taken from the caller): 422 on create and rotate, nothing written."""
    _, headers = await api.account()
    endpoint = await api.endpoint(headers, signing_key_type="ed25519")
    rotate = f"/v1/endpoints/{endpoint['id']}/secret/rotate"
    private_key = "whsk_" + "A" * 43 + "="
    public_key = parse_verifying_key(private_key).serialize()
    before = await api.snapshot()
    refusals = [
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "signing_key_type": "rsa"},
                         headers=headers), "signing_key_type"),
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "signing_key_type": ["ed25519"]},
                         headers=headers), "signing_key_type"),
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "secret": generate_secret(),
                                                "signing_key_type": "ed25519"}, headers=headers), "signing_key_type"),
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "secret": private_key},
                         headers=headers), "secret"),
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "secret": public_key},
                         headers=headers), "secret"),
        (api.client.post(rotate, json={"signing_key_type": "ED25519"}, headers=headers), "signing_key_type"),
        (api.client.post(rotate, json={"signing_key_type": None, "secret": private_key}, headers=headers), "secret"),
        (api.client.post(rotate, json={"secret": generate_secret(), "signing_key_type": "ed25519"}, headers=headers),
         "signing_key_type"),
        (api.client.patch(f"/v1/endpoints/{endpoint['id']}", json={"signing_key_type": "hmac"}, headers=headers),
         "signing_key_type"),
    ]
    answers = []
    for request, field in refusals:
        answers.append((field, await _refused_422(await request)))
    assert [(field, fields) for field, fields in answers] == [(field, [field]) for _, field in refusals]
    assert await api.snapshot() == before
