"""Input the API takes or refuses as its document says: a payload's nesting depth, control
characters in query values, whole numbers written with a fraction or an exponent, and refusals
that list every wrong field at once, in words."""

from __future__ import annotations

import json
import re
import uuid

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delivery.api import validation

JSON = {"Content-Type": "application/json"}

_SUBSCRIPTION_WORDS = ("may contain only letters, digits and _ . : -, and may end in .* for every type that starts with"
                       " what comes before it (like invoice.*)")


def _fields(problem: dict) -> list[str]:
    return [error["field"] for error in problem.get("errors", [])]


async def _refused(response, status: int = 422, slug: str = "invalid-request") -> dict:
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert problem["type"].endswith("/" + slug) and problem["status"] == status, problem
    return problem


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# ---- a payload's depth -----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [validation.PAYLOAD_DEPTH_MAX + 1, 1_000, 40_000])
async def test_a_payload_nested_past_the_limit_is_422_naming_it_and_charges_nothing(api, depth, caplog):
    """1,000 levels once answered 500 with a RecursionError from the decoder: every depth past the
    documented limit, whether the decoder could follow it or not, is the same 422 that names the limit."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    for payload in (_nested(depth), b'{"a":' * depth + b"1" + b"}" * depth):
        response = await api.client.post("/v1/messages", data=b'{"event_type":"a","payload":' + payload + b"}",
                                         headers={**headers, **JSON})
        problem = await _refused(response)
        assert problem["errors"] == [{"field": "payload", "message": validation.PAYLOAD_TOO_DEEP}]
        assert str(validation.PAYLOAD_DEPTH_MAX) in validation.PAYLOAD_TOO_DEEP
    assert await api.snapshot() == before
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"


async def test_a_payload_at_the_limit_is_sent_byte_for_byte_and_brackets_in_strings_are_text(api):
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    deep = validation.PAYLOAD_DEPTH_MAX
    for payload in (_nested(deep), b'{"a":' * (deep - 1) + b'["[[[[' + b"[" * 200 + b'"]' + b"}" * (deep - 1),
                    b"[" + b",".join([b"[]"] * 500) + b"]"):
        response = await api.client.post("/v1/messages", data=b'{"event_type":"a","payload":' + payload + b"}",
                                         headers={**headers, **JSON})
        assert response.status == 202, await response.text()
        stored = await api.pool.fetchval("SELECT payload FROM messages WHERE id = $1",
                                         uuid.UUID((await response.json())["id"]))
        assert bytes(stored) == payload


@pytest.mark.parametrize("payload, depth", [
    (b"1", 0), (b"[]", 1), (b"{}", 1), (b'[{"a":[1,{"b":[]}]}]', 4), (b'["[[[[", {"x": "}}}]"}]', 2),
    (b'["\\"[[[["]', 1), (b"[" * 30 + b"]" * 30 + b"," + b"[" * 70 + b"]" * 70, 70),
])
def test_payload_too_deep_counts_nesting_not_brackets(payload, depth):
    """Against the depth Python's own parser builds: brackets inside strings (escaped quotes too) are text."""
    wrapped = b"[" + payload + b"]"  # a document whose top level is always an array
    assert json.loads(wrapped) is not None
    for limit in (1, 2, 3, 4, 69, 70, 71):
        assert validation.payload_too_deep(wrapped, limit) == (depth + 1 > limit), (payload, limit)


def _depth(value) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    return 1 + max(map(_depth, value), default=0) if isinstance(value, list) else 0


_TRICKY = st.text(alphabet='[]{}"\\a', max_size=6)  # strings that spell brackets, quotes and escapes


@settings(max_examples=400, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(value=st.recursive(st.none() | st.integers() | _TRICKY,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
                          max_leaves=60))
def test_payload_too_deep_agrees_with_the_depth_pythons_parser_builds(value):
    payload = json.dumps(value).encode()
    depth = _depth(value)
    for limit in range(0, depth + 2):
        assert validation.payload_too_deep(payload, limit) == (depth > limit), (payload, limit)


def test_the_document_and_the_readme_state_the_depth_limit():
    from pathlib import Path

    from delivery.api.openapi import document

    payload = document()["components"]["schemas"]["MessageCreate"]["properties"]["payload"]
    assert f"at most {validation.PAYLOAD_DEPTH_MAX} levels" in payload["description"]
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert f"{validation.PAYLOAD_DEPTH_MAX} levels" in readme


# ---- control characters in query values ------------------------------------------------------------


async def test_a_nul_or_control_character_in_a_query_value_is_422_naming_it(api):
    """datetime.fromisoformat stopped at a NUL: since=...Z%00garbage was read as that time and
    2026-01-01%0012:00:00Z as noon. Every parser of a query value refuses control characters."""
    account_id, headers = await api.account(balance=10)
    endpoint = await api.endpoint(headers)
    cases = [
        (f"/v1/endpoints/{endpoint['id']}/recover?since=2026-01-01T00:00:00Z%00garbage", "since"),
        (f"/v1/endpoints/{endpoint['id']}/recover?since=2026-01-01%0012:00:00Z", "since"),
        (f"/v1/endpoints/{endpoint['id']}/recover?since=2026-01-01T00:00:00Z&until=2026-02-01T00:00:00Z%0a", "until"),
        ("/v1/deliveries?created_after=2026-01-01T00:00:00Z%00x", "created_after"),
        ("/v1/deliveries?created_before=2026-01-01%0912:00:00Z", "created_before"),
        ("/v1/deliveries?state=dead%00", "state"),
        ("/v1/deliveries?limit=5%00", "limit"),
        (f"/v1/deliveries?endpoint_id=%1f{str(uuid.uuid4()).replace('-', '')[1:]}", "endpoint_id"),
        (f"/v1/deliveries?message_id=%7f{uuid.uuid4()}", "message_id"),
        (f"/v1/deliveries?cursor={uuid.uuid4()}%00", "cursor"),
        ("/v1/ledger?cursor=12%00", "cursor"),
        (f"/v1/ledger?delivery_id={uuid.uuid4()}%0d", "delivery_id"),
    ]
    for path, name in cases:
        response = await api.client.get(path, headers=headers)
        problem = await _refused(response)
        assert _fields(problem) == [name], (path, problem)
        assert "control characters" in problem["errors"][0]["message"]
    response = await api.client.get(f"/v1/dead-deliveries?cursor={uuid.uuid4()}%00", headers=api.operator)
    assert _fields(await _refused(response)) == ["cursor"]


async def test_times_that_are_not_rfc_3339_are_422(api):
    """fromisoformat also takes week dates, the basic format and any one character between date and time."""
    _, headers = await api.account()
    for value in ("2026-W01-1", "20260101T000000Z", "2026-01-01x12:00:00Z", "2026-01-01T12"):
        response = await api.client.get("/v1/deliveries", params={"created_after": value}, headers=headers)
        assert _fields(await _refused(response)) == ["created_after"], value
    for value in ("2026-01-01", "2026-01-01T12:00", "2026-01-01 12:00:00.5+02:00", "2026-01-01t12:00:00z"):
        response = await api.client.get("/v1/deliveries", params={"created_after": value}, headers=headers)
        assert response.status == 200, (value, await response.text())


async def test_a_path_id_with_spaces_underscores_or_braces_is_404(api):
    """uuid.UUID read " 1234..." and "1_234..." (through int()) as some other id."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    delivery_id = (await (await api.send(headers)).json())["deliveries"][0]["id"]
    hexed = uuid.UUID(delivery_id).hex
    for bad in (f"{{{delivery_id}}}", f"urn:uuid:{delivery_id}", "%20" + hexed[1:], hexed[0] + "_" + hexed[2:]):
        response = await api.client.get(f"/v1/deliveries/{bad}", headers=headers)
        await _refused(response, 404, "not-found")
    for good in (delivery_id, hexed, delivery_id.upper()):
        assert (await api.client.get(f"/v1/deliveries/{good}", headers=headers)).status == 200


# ---- whole numbers ------------------------------------------------------------------------------------


async def test_a_whole_number_written_with_a_fraction_or_an_exponent_is_taken_for_every_integer_field(api):
    """The document says "integer", which JSON Schema lets be 1.0: the server takes it, exactly, and
    refuses 1.5 in words."""
    account_id, headers = await api.account()
    response = await api.client.post("/v1/accounts", data=b'{"name":"n","price_per_delivery":2.0}',
                                     headers={**api.operator, **JSON})
    assert response.status == 201 and (await response.json())["account"]["price_per_delivery"] == 2
    path = f"/v1/accounts/{account_id}/topups"
    response = await api.client.post(path, data=b'{"order_id":"o-1","amount":1.0}', headers={**api.operator, **JSON})
    assert response.status == 201, await response.text()
    assert (await response.json())["balance"] == 1
    response = await api.client.post(path, data=b'{"order_id":"o-2","amount":1e2}', headers={**api.operator, **JSON})
    assert (await response.json())["balance"] == 101
    response = await api.client.post(path, data=b'{"order_id":"o-3","amount":25.00E-1}',
                                     headers={**api.operator, **JSON})
    problem = await _refused(response)
    assert problem["errors"] == [{"field": "amount", "message": "must be a whole number, not a number with a fraction"}]
    response = await api.client.post("/v1/endpoints", data=b'{"url":"https://example.com/h","timeout_ms":5e3}',
                                     headers={**headers, **JSON})
    assert response.status == 201 and (await response.json())["timeout_ms"] == 5000
    response = await api.client.get("/v1/ledger?limit=1.0", headers=headers)
    assert response.status == 200 and len((await response.json())["data"]) == 1
    response = await api.client.post(path, data=b'{"order_id":"o-4","amount":1.0000000000000000000001}',
                                      headers={**api.operator, **JSON})
    assert _fields(await _refused(response)) == ["amount"]  # read exactly: not rounded to 1


async def test_the_document_and_the_server_agree_on_integers(api):
    """Each body the document's own schema accepts with an integer written 1.0 is accepted by the server,
    and 1.5, which the schema refuses, is refused by both."""
    spec = await (await api.client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    account_id, _ = await api.account()

    def valid(name: str, body: dict) -> bool:
        resolver_schema = {**schemas[name], "components": {"schemas": schemas}}
        return jsonschema.Draft202012Validator(resolver_schema).is_valid(body)

    for amount, accepted in (("3.0", True), ("3", True), ("3.5", False)):
        body = f'{{"order_id":"o-{amount}","amount":{amount}}}'
        assert valid("TopupCreate", json.loads(body)) == accepted
        response = await api.client.post(f"/v1/accounts/{account_id}/topups", data=body.encode(),
                                         headers={**api.operator, **JSON})
        assert (response.status == 201) == accepted, await response.text()
    assert "whole value" in spec["info"]["description"]


# ---- refusals in words, every one at once --------------------------------------------------------------


_REGEX = re.compile(r"regex|\^\[|\$\(\?!|`")


async def test_every_wrong_field_is_listed_at_once_in_words(api):
    _, headers = await api.account()
    response = await api.client.post("/v1/endpoints", headers=headers, json={
        "url": "", "event_types": ["a b", "fine", "c\n"], "description": "x\u0000", "timeout_ms": 1.5,
        "secret": "whsec_!!!!!!!!!!", "colour": "blue",
    })
    problem = await _refused(response)
    errors = {error["field"]: error["message"] for error in problem["errors"]}
    assert errors == {
        "colour": "is not a field of this request",
        "url": "must not be empty",
        "event_types[0]": _SUBSCRIPTION_WORDS,
        "event_types[2]": _SUBSCRIPTION_WORDS,
        "description": "must not contain a NUL character",
        "timeout_ms": "must be a whole number, not a number with a fraction",
        "secret": "must be whsec_ followed by base64 (a Standard Webhooks secret)",
    }
    response = await api.client.post("/v1/accounts", json={"name": "tab\there", "price_per_delivery": -1},
                                     headers=api.operator)
    errors = (await _refused(response))["errors"]
    assert errors == [{"field": "name", "message": "must not contain control characters (a newline, a tab, NUL)"},
                      {"field": "price_per_delivery", "message": "must be at least 0"}]
    response = await api.client.post("/v1/accounts", json={}, headers=api.operator)
    assert (await _refused(response))["errors"] == [{"field": "name", "message": "is required"}]
    for error in errors:
        assert not _REGEX.search(error["message"]), error


async def test_a_body_of_thousands_of_wrong_names_answers_a_bounded_list(api):
    body = json.dumps({f"field{number}": number for number in range(5000)}).encode()
    response = await api.client.post("/v1/accounts", data=body, headers={**api.operator, **JSON})
    assert len((await _refused(response))["errors"]) == validation.ERRORS_MAX
