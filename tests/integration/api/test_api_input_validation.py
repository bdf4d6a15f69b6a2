"""Input the API refuses at the door, as problem+json, writing nothing: payloads that are not UTF-8,
names given twice, text with a trailing newline, bodies not declared JSON, query values past what
PostgreSQL or Python can hold, top-ups past the largest balance; and the document saying so."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import accounts as billing_accounts
from billing.audit import audit
from delivery.api import validation
from delivery.api.openapi import OPERATIONS
from delivery.api.problems import Problem
from signing import generate_secret

JSON = {"Content-Type": "application/json"}
BIGINT_MAX = 2**63 - 1  # accounts.balance


def _fields(problem: dict) -> list[str]:
    return [error["field"] for error in problem.get("errors", [])]


async def _refused(response, status: int, slug: str) -> dict:
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert problem["type"].endswith("/" + slug) and problem["status"] == status, problem
    return problem


# ---- payloads that are not UTF-8 ---------------------------------------------------------------


_NOT_UTF8 = (
    b'"\xff\xfe bad"',                 # bytes no UTF-8 text starts with
    b'{"k": "caf\xc3"}',               # a sequence cut short, inside an object
    b'["\xc0\xaf"]',                   # an overlong encoding of "/"
    b'"\xed\xa0\x80"',                 # an encoded surrogate
)


async def test_a_payload_that_is_not_utf8_is_400_and_charges_nothing(api):
    """The payload is sent byte for byte and receivers must parse it as JSON, which is UTF-8: refused as malformed.
    Real UTF-8 beyond ASCII is still sent as written."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    for payload in _NOT_UTF8:
        response = await api.client.post("/v1/messages", data=b'{"event_type":"a.c","payload":' + payload + b"}",
                                         headers={**headers, **JSON})
        await _refused(response, 400, "malformed-json")
    assert await api.snapshot() == before
    payload = '{"name": "Zoë", "city": "東京", "emoji": "🦆"}'.encode()
    response = await api.client.post("/v1/messages", data=b'{"event_type":"a","payload":' + payload + b"}",
                                     headers={**headers, **JSON})
    assert response.status == 202, await response.text()
    stored = await api.pool.fetchval("SELECT payload FROM messages WHERE id = $1", uuid.UUID((await response.json())["id"]))
    assert bytes(stored) == payload


# ---- a name given twice --------------------------------------------------------------------------


_GIVEN_TWICE = (
    (b'{"event_type":"a","payload":1,"event_type":"b"}', "event_type"),
    (b'{"payload":1,"event_type":"a","payload":2}', "payload"),
    (b'{"event_type":"a","payload":{"big":"' + b"x" * 5000 + b'"},"payload":1}', "payload"),
    (b'{"event_type":"a","payload":1,"event\\u005ftype":"b"}', "event_type"),  # the same name, escaped
    (b'{"event_type":"payload","payload":1,"payload":2}', "payload"),
)
_GIVEN_ONCE = (
    # The payload's own objects are the sender's JSON, sent as written: their names are not checked.
    (b'{"event_type":"a","payload":{"payload":1,"payload":2,"event_type":3}}', "a",
     b'{"payload":1,"payload":2,"event_type":3}'),
    (b'{"event_type":"payload","payload":{"event_type":"event_type"}}', "payload", b'{"event_type":"event_type"}'),
    (b'{"event_type":"event_type","payload":"\\"payload\\""}', "event_type", b'"\\"payload\\""'),
    (b'{"event_type":"a\\u002eb","payload":"\\\\"}', "a.b", b'"\\\\"'),  # escapes outside the payload
)


async def test_a_message_field_given_twice_is_422_and_charges_nothing(api):
    """Last-one-wins would send an event the sender may not have meant (and another parser may read the first).
    Names that repeat only inside the payload, or that the payload or the event type merely spell, are accepted."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    for body, field in _GIVEN_TWICE:
        response = await api.client.post("/v1/messages", data=body, headers={**headers, **JSON})
        assert _fields(await _refused(response, 422, "invalid-request")) == [field], body
    assert await api.snapshot() == before
    for body, event_type, payload in _GIVEN_ONCE:
        response = await api.client.post("/v1/messages", data=body, headers={**headers, **JSON})
        assert response.status == 202, await response.text()
        accepted = await response.json()
        assert accepted["event_type"] == event_type
        stored = await api.pool.fetchval("SELECT payload FROM messages WHERE id = $1", uuid.UUID(accepted["id"]))
        assert bytes(stored) == payload


_NAMES = st.sampled_from(["event_type", "payload", "event\\u005ftype", "p\\u0061yload"])
_VALUES = st.sampled_from(['"a"', '"payload"', '"event_type"', '"a\\u002eb"', "1", "12", "[1 , 2]",
                           '{"payload":1,"event_type":"x"}', '"\\\\"', '"\\"payload\\""', '["event_type", {"payload": null}]'])
_SPACE = st.sampled_from(["", " ", "\n", "\r\t "])


@settings(max_examples=500, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(members=st.lists(st.tuples(_NAMES, _VALUES, _SPACE), min_size=1, max_size=4), end=_SPACE)
def test_decode_message_refuses_exactly_the_bodies_with_a_repeated_top_level_name(members, end):
    """Against Python's parser, over bodies of every layout (escaped names, the names as values and inside the
    payload, whitespace): refused iff a top-level name repeats, whether the plain-envelope shortcut or the full
    parse decides; and the shortcut never passes a body with a repeated name."""
    body = ("{" + ",".join(f'{space}"{name}"{space}:{space}{value}' for name, value, space in members) + end + "}").encode()
    try:
        decoded = validation._decode(body, validation.MessageCreate)
    except Problem:
        return  # not a MessageCreate at all (a wrong type, a missing field): not this test's subject
    names = [name for name, _ in json.loads(body, object_pairs_hook=lambda pairs: pairs)]
    repeated = len(set(names)) != len(names)
    if validation._plain_envelope(body, len(bytes(decoded.payload))):
        assert not repeated, body
    try:
        validation.decode_message(body)
        refused = None
    except Problem as problem:
        refused = problem
    if repeated:
        assert refused is not None and refused.status == 422 and refused.errors[0].message == "given more than once", body
    else:
        assert refused is None, body


@pytest.mark.parametrize("path, body, field", [
    ("/v1/accounts", b'{"name":"a","name":"b"}', "name"),
    ("topups", b'{"order_id":"o-1","amount":1,"amount":2}', "amount"),
    ("/v1/endpoints", b'{"url":"https://example.com/a","url":"https://example.com/b"}', "url"),
])
async def test_other_bodies_with_a_field_given_twice_are_422_and_write_nothing(api, path, body, field):
    account_id, headers = await api.account()
    if path == "topups":
        path = f"/v1/accounts/{account_id}/topups"
    auth = headers if path == "/v1/endpoints" else api.operator
    before = await api.snapshot()
    response = await api.client.post(path, data=body, headers={**auth, **JSON})
    assert _fields(await _refused(response, 422, "invalid-request")) == [field]
    assert await api.snapshot() == before


# ---- text with a trailing newline ------------------------------------------------------------------


async def test_names_and_identifiers_with_a_trailing_newline_are_422_and_write_nothing(api):
    """`$` in a pattern also matches before a final newline; each of these fields refuses "...\\n"."""
    account_id, headers = await api.account(balance=10)
    endpoint = await api.endpoint(headers)
    secret = generate_secret()
    before = await api.snapshot()
    refusals = [
        (api.client.post("/v1/accounts", json={"name": "x\n"}, headers=api.operator), "name"),
        (api.client.post(f"/v1/accounts/{account_id}/topups", json={"order_id": "o1\n", "amount": 1},
                         headers=api.operator), "order_id"),
        (api.client.post("/v1/messages", json={"event_type": "a.b\n", "payload": 1}, headers=headers), "event_type"),
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "event_types": ["a\n"]},
                         headers=headers), "event_types[0]"),
        (api.client.patch(f"/v1/endpoints/{endpoint['id']}", json={"event_types": ["a", "b\n"]}, headers=headers),
         "event_types[1]"),
        (api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "secret": secret + "\n"},
                         headers=headers), "secret"),
        (api.client.post(f"/v1/endpoints/{endpoint['id']}/secret/rotate", json={"secret": secret + "\n"},
                         headers=headers), "secret"),
    ]
    answers = []
    for request, field in refusals:
        response = await request
        body = await response.json()
        answers.append((response.status, response.content_type, _fields(body) if response.status == 422 else body))
    assert answers == [(422, "application/problem+json", [field]) for _, field in refusals]
    assert await api.snapshot() == before
    # Inside a description a newline is text, as before.
    response = await api.client.patch(f"/v1/endpoints/{endpoint['id']}", json={"description": "two\nlines\n"},
                                      headers=headers)
    assert response.status == 200 and (await response.json())["description"] == "two\nlines\n"


# ---- bodies not declared JSON ------------------------------------------------------------------------


_NOT_JSON = ("text/plain", "application/x-www-form-urlencoded", "application/octet-stream",
             "multipart/form-data; boundary=x", "")


async def test_a_body_declared_as_another_type_is_415_on_every_json_route(api):
    """Each route that reads a JSON body answers 415 to a body declared otherwise, and writes nothing."""
    account_id, headers = await api.account(balance=10)
    endpoint = await api.endpoint(headers)
    before = await api.snapshot()
    routes = [
        ("post", "/v1/accounts", api.operator, {"name": "acme"}),
        ("post", f"/v1/accounts/{account_id}/topups", api.operator, {"order_id": "o-1", "amount": 5}),
        ("post", "/v1/api-keys", headers, {}),
        ("post", "/v1/endpoints", headers, {"url": "https://example.com/b"}),
        ("patch", f"/v1/endpoints/{endpoint['id']}", headers, {"enabled": False}),
        ("post", f"/v1/endpoints/{endpoint['id']}/secret/rotate", headers, {}),
        ("post", "/v1/messages", headers, {"event_type": "a", "payload": 1}),
    ]
    for content_type in _NOT_JSON:
        for method, path, auth, body in routes:
            response = await api.client.request(method, path, data=json.dumps(body).encode(),
                                                headers={**auth, "Content-Type": content_type})
            problem = await _refused(response, 415, "unsupported-media-type")
            assert "application/json" in problem["detail"]
    assert await api.snapshot() == before


async def test_json_types_and_an_undeclared_body_are_read_as_json_and_other_answers_stay(api):
    """application/json with parameters, in any case, and +json types are JSON; a body without Content-Type is
    read as JSON (scripts that post bytes send none). A text body to a route without that method is still 405, to
    no route 404, and a form to the dashboard is not the API's business."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    for content_type in (None, "application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json"):
        declared = {} if content_type is None else {"Content-Type": content_type}
        response = await api.client.post("/v1/messages", data=b'{"event_type":"a","payload":1}',
                                         headers={**headers, **declared}, skip_auto_headers=["Content-Type"])
        assert response.status == 202, await response.text()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert (await api.client.put("/v1/balance", data=b"a=1", headers=form)).status == 405
    assert (await api.client.post("/v1/nothing-here", data=b"a=1", headers=form)).status == 404
    response = await api.client.post("/dashboard/sign-in", data=b"key=nope", headers=form, allow_redirects=False)
    assert response.status != 415 and response.content_type != "application/problem+json"
    # And a text body is refused (without this, the above would pass with no check at all).
    response = await api.client.post("/v1/messages", data=b'{"event_type":"a","payload":1}',
                                     headers={**headers, "Content-Type": "text/plain"})
    await _refused(response, 415, "unsupported-media-type")


# ---- query values past what the database or Python holds ---------------------------------------------


async def test_a_time_outside_the_representable_range_in_utc_is_422(api):
    """Valid ISO text whose UTC instant falls before year 1 or after 9999 (the driver converts to UTC) is refused,
    naming the parameter; the first and last representable instants are accepted."""
    _, headers = await api.account()
    for name in ("created_after", "created_before"):
        for value in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
            response = await api.client.get("/v1/deliveries", params={name: value}, headers=headers)
            assert _fields(await _refused(response, 422, "invalid-request")) == [name]
    for after, before in (("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z"),
                          ("0001-01-01T00:00:00-14:00", "9999-12-31T23:59:59+14:00")):
        response = await api.client.get("/v1/deliveries", params={"created_after": after, "created_before": before},
                                        headers=headers)
        assert response.status == 200, await response.text()


async def test_a_ledger_cursor_past_bigint_is_422(api):
    """Digits are not enough: the seq must fit PostgreSQL's bigint."""
    _, headers = await api.account()
    for cursor in ("9223372036854775808", "9999999999999999999"):
        response = await api.client.get("/v1/ledger", params={"cursor": cursor}, headers=headers)
        assert _fields(await _refused(response, 422, "invalid-request")) == ["cursor"]
    response = await api.client.get("/v1/ledger", params={"cursor": "9223372036854775807"}, headers=headers)
    assert response.status == 200 and (await response.json())["data"] == []


@pytest.mark.parametrize("path", ["/v1/ledger", "/v1/deliveries"])
async def test_a_limit_of_thousands_of_digits_is_422(api, path):
    """Python refuses int() of more than 4300 digits (ValueError): the length is checked before."""
    _, headers = await api.account()
    response = await api.client.get(f"{path}?limit={'9' * 5000}", headers=headers)
    assert _fields(await _refused(response, 422, "invalid-request")) == ["limit"]


# ---- the largest balance ---------------------------------------------------------------------------------


async def _topped_up_to(api, account_id: uuid.UUID, count: int) -> int:
    """What `count` top-ups of the largest amount write (one ledger entry each, the balance their sum), in one
    statement: thousands of round trips would only repeat what the other top-up tests check."""
    async with api.pool.acquire() as connection, connection.transaction():
        await connection.execute(
            "INSERT INTO ledger_entries (id, account_id, kind, amount)"
            " SELECT 'topup:bulk-' || n, $1, 'topup', $2 FROM generate_series(1, $3) AS n",
            account_id, billing_accounts.AMOUNT_MAX, count)
        return await connection.fetchval(
            "UPDATE accounts SET balance = balance + $2::bigint * $3 WHERE id = $1 RETURNING balance",
            account_id, billing_accounts.AMOUNT_MAX, count)


async def test_a_top_up_past_the_largest_balance_is_409_and_writes_nothing(api):
    """The balance is a bigint: a top-up that would pass 2**63 - 1 (counting the credits in flight, which come
    back as refunds) is refused with a problem that says so, not a 500; up to the limit it is applied."""
    account_id, headers = await api.account(price=10)
    await api.endpoint(headers)
    count = BIGINT_MAX // billing_accounts.AMOUNT_MAX
    balance = await _topped_up_to(api, account_id, count)
    room = BIGINT_MAX - balance
    assert 0 < room < billing_accounts.AMOUNT_MAX
    assert (await api.send(headers)).status == 202  # 10 credits now in flight
    path = f"/v1/accounts/{account_id}/topups"
    before = await api.snapshot()
    for amount in (billing_accounts.AMOUNT_MAX, room + 1):
        response = await api.client.post(path, json={"order_id": f"o-{amount}", "amount": amount}, headers=api.operator)
        problem = await _refused(response, 409, "balance-limit-exceeded")
        assert str(BIGINT_MAX) in problem["detail"] and f"at most {room}" in problem["detail"]
    assert await api.snapshot() == before
    response = await api.client.post(path, json={"order_id": "o-last", "amount": room}, headers=api.operator)
    assert response.status == 201, await response.text()
    assert (await response.json())["balance"] == BIGINT_MAX - 10
    response = await api.client.post(path, json={"order_id": "o-one-more", "amount": 1}, headers=api.operator)
    await _refused(response, 409, "balance-limit-exceeded")
    report = await audit(api.pool, account_id)
    assert report.clean, report.violations


# ---- Idempotency-Key and the document ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["caf\u00e9", "\u6771\u4eac"])
async def test_an_idempotency_key_outside_printable_ascii_is_422(api, key):
    """The document says printable ASCII (space to ~); a UTF-8 key is refused as the document says, not kept."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    response = await api.send(headers, key=key)
    assert _fields(await _refused(response, 422, "invalid-request")) == ["Idempotency-Key"]
    assert await api.snapshot() == before
    assert (await api.send(headers, key="printable ascii ~!")).status == 202


async def test_the_document_describes_cursors_keys_and_body_refusals_as_checked(api):
    spec = await (await api.client.get("/openapi.json")).json()
    paths = spec["paths"]

    def parameter(path: str, name: str, method: str = "get") -> dict:
        return next(p for p in paths[path][method]["parameters"] if p["name"] == name)

    assert parameter("/v1/ledger", "cursor")["schema"] == {"type": "string", "pattern": "^[0-9]{1,19}$"}
    for path in ("/v1/deliveries", "/v1/dead-deliveries"):
        assert parameter(path, "cursor")["schema"] == {"type": "string", "format": "uuid"}
    assert parameter("/v1/messages", "Idempotency-Key", "post")["schema"]["pattern"] == "^[\\x20-\\x7e]+$"
    with_bodies = [(path, method) for path, methods in paths.items() for method, operation in methods.items()
                   if "requestBody" in operation]
    assert len(with_bodies) == sum(op.body is not None for op in OPERATIONS) >= 9
    for path, method in with_bodies:
        assert {"400", "413", "415"} <= set(paths[path][method]["responses"]), (path, method)
    event_type = spec["components"]["schemas"]["MessageCreate"]["properties"]["event_type"]["pattern"]
    assert event_type.endswith("$(?!\\n)")
