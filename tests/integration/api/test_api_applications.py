"""Applications through the API: their life, bad input, limits, fan-out to one application's
endpoints only, and isolation between accounts."""

from __future__ import annotations

import uuid

import pytest

from delivery.store.applications import APPLICATIONS_PER_ACCOUNT_MAX
from delivery.store.endpoints import ENDPOINTS_PER_APPLICATION_MAX


async def _application(api, headers: dict, **fields) -> dict:
    fields.setdefault("name", "Globex")
    response = await api.client.post("/v1/applications", json=fields, headers=headers)
    assert response.status == 201, await response.text()
    return await response.json()


async def _endpoint_in(api, headers: dict, application: str, **fields) -> dict:
    fields.setdefault("url", "https://example.com/hooks")
    response = await api.client.post(f"/v1/applications/{application}/endpoints", json=fields, headers=headers)
    assert response.status == 201, await response.text()
    return await response.json()


async def _applications_rows(api) -> list[tuple]:
    rows = await api.pool.fetch("SELECT id, account_id, uid, name, metadata, rate_limit_per_second, deleted_at"
                                " FROM applications ORDER BY id")
    return [tuple(row) for row in rows]


async def test_create_read_by_id_and_uid_list_patch_and_delete(api):
    """The whole life of an application, as its account sees it; the default application is listed
    first, is its account's own id, and cannot be deleted."""
    account_id, headers = await api.account()
    created = await _application(api, headers, uid="customer-1", metadata={"plan": "pro"}, rate_limit_per_second=50)
    assert (created["uid"], created["name"], created["metadata"], created["rate_limit_per_second"],
            created["is_default"]) == ("customer-1", "Globex", {"plan": "pro"}, 50, False)
    for reference in (created["id"], "customer-1"):
        response = await api.client.get(f"/v1/applications/{reference}", headers=headers)
        assert response.status == 200 and await response.json() == created
    second = await _application(api, headers, name="Initech")
    first_page = await (await api.client.get("/v1/applications?limit=2", headers=headers)).json()
    assert [item["id"] for item in first_page["data"]] == [str(account_id), created["id"]]
    assert first_page["data"][0]["is_default"] is True and first_page["next_cursor"] == created["id"]
    next_page = await (await api.client.get(f"/v1/applications?limit=2&cursor={first_page['next_cursor']}",
                                            headers=headers)).json()
    assert ([item["id"] for item in next_page["data"]], next_page["next_cursor"]) == ([second["id"]], None)

    patched = await api.client.patch(f"/v1/applications/customer-1", json={"name": "Globex Corp", "uid": "c-1",
                                                                           "rate_limit_per_second": None},
                                     headers=headers)
    assert patched.status == 200, await patched.text()
    body = await patched.json()
    assert (body["name"], body["uid"], body["rate_limit_per_second"]) == ("Globex Corp", "c-1", None)
    assert (await api.client.get("/v1/applications/customer-1", headers=headers)).status == 404

    endpoint = await _endpoint_in(api, headers, "c-1")
    assert endpoint["application_id"] == created["id"]
    deleted = await api.client.delete("/v1/applications/c-1", headers=headers)
    assert deleted.status == 200
    assert await deleted.json() == {"id": created["id"], "deleted": True, "endpoints_deleted": 1, "refunded_now": 0}
    assert (await api.client.get(f"/v1/applications/{created['id']}", headers=headers)).status == 404
    assert (await api.client.get(f"/v1/endpoints/{endpoint['id']}", headers=headers)).status == 404
    again = await _application(api, headers, uid="c-1")  # a deleted application's uid is free again
    assert again["id"] != created["id"]

    refused = await api.client.delete(f"/v1/applications/{account_id}", headers=headers)
    assert refused.status == 409 and (await refused.json())["type"].endswith("/default-application")
    assert (await api.client.get(f"/v1/applications/{account_id}", headers=headers)).status == 200


async def test_a_list_page_answers_each_application_as_reading_it_does(api):
    """The list writes each application's metadata as the database's JSON text, not parsed and
    encoded again: every item must still equal what reading that application answers, for metadata
    with quotes, backslashes, control characters, non-ASCII text and many keys, and for none."""
    _, headers = await api.account()
    tricky = {"quote": 'say "hi"', "back\\slash": "a\\b", "tab": "a\tb\n", "ünïcode": "日本語 ✓", "empty": ""}
    many_keys = {f"key-{number}": str(number) for number in range(50)}
    made = [await _application(api, headers, metadata=metadata, uid=f"c-{index}", rate_limit_per_second=index + 1)
            for index, metadata in enumerate((tricky, many_keys, {}))]
    page = await (await api.client.get("/v1/applications?limit=10", headers=headers)).json()
    assert page["next_cursor"] is None and len(page["data"]) == 4
    for item in page["data"]:
        response = await api.client.get(f"/v1/applications/{item['id']}", headers=headers)
        assert item == await response.json()
    assert [item["metadata"] for item in page["data"][1:]] == [tricky, many_keys, {}]
    assert [item["id"] for item in page["data"][1:]] == [application["id"] for application in made]


BAD_BODIES = {
    "uid shaped like an id": ({"name": "a", "uid": str(uuid.uuid4())}, "uid"),
    "uid with a space": ({"name": "a", "uid": "two words"}, "uid"),
    "uid too long": ({"name": "a", "uid": "u" * 257}, "uid"),
    "empty name": ({"name": ""}, "name"),
    "name with a newline": ({"name": "a\nb"}, "name"),
    "missing name": ({"uid": "x"}, "name"),
    "metadata not strings": ({"name": "a", "metadata": {"n": 1}}, "metadata"),
    "metadata too large": ({"name": "a", "metadata": {f"k{i}": "v" * 400 for i in range(45)}}, "metadata"),
    "metadata too many pairs": ({"name": "a", "metadata": {f"k{i}": "v" for i in range(51)}}, "metadata"),
    "rate limit zero": ({"name": "a", "rate_limit_per_second": 0}, "rate_limit_per_second"),
    "rate limit too high": ({"name": "a", "rate_limit_per_second": 100_001}, "rate_limit_per_second"),
    "unknown field": ({"name": "a", "owner": "me"}, "owner"),
}


@pytest.mark.parametrize("case", BAD_BODIES, ids=list(BAD_BODIES))
async def test_bad_input_is_422_naming_the_field_and_writes_nothing(api, case):
    """Each malformed create, and the same as a patch, answers 422 naming the field; nothing changes."""
    body, field = BAD_BODIES[case]
    _, headers = await api.account()
    application = await _application(api, headers, uid="kept")
    before = (await api.snapshot(), await _applications_rows(api))
    response = await api.client.post("/v1/applications", json=body, headers=headers)
    assert response.status == 422, await response.text()
    assert any(error["field"].split("[")[0] == field for error in (await response.json())["errors"]), field
    # The same field as a patch (every field of a patch is optional: a missing name is no error there).
    patch = {name: value for name, value in body.items() if (name == "name") == (field == "name")}
    if patch:
        response = await api.client.patch(f"/v1/applications/{application['id']}", json=patch, headers=headers)
        assert response.status == 422, await response.text()
    assert (await api.snapshot(), await _applications_rows(api)) == before


async def test_a_uid_is_unique_among_an_accounts_live_applications(api):
    """A second application with a taken uid, or a patch to it, is 409 uid-taken; another account may use it."""
    _, headers = await api.account()
    _, other_headers = await api.account()
    await _application(api, headers, uid="same")
    other = await _application(api, headers, uid="other")
    before = await _applications_rows(api)
    response = await api.client.post("/v1/applications", json={"name": "b", "uid": "same"}, headers=headers)
    assert response.status == 409 and (await response.json())["type"].endswith("/uid-taken")
    response = await api.client.patch(f"/v1/applications/{other['id']}", json={"uid": "same"}, headers=headers)
    assert response.status == 409 and (await response.json())["type"].endswith("/uid-taken")
    assert await _applications_rows(api) == before
    await _application(api, other_headers, uid="same")


async def test_applications_per_account_limit_is_named_and_writes_nothing(api):
    """At APPLICATIONS_PER_ACCOUNT_MAX live applications a create is 409 naming the limit; deleting
    one makes room again."""
    account_id, headers = await api.account()
    await api.pool.execute(
        "INSERT INTO applications (id, account_id, name) SELECT gen_random_uuid(), $1, 'filler'"
        " FROM generate_series(1, $2)", account_id, APPLICATIONS_PER_ACCOUNT_MAX - 2)
    last = await _application(api, headers)  # the default and the fillers leave room for this one
    count = await api.pool.fetchval("SELECT count(*) FROM applications WHERE account_id = $1", account_id)
    assert count == APPLICATIONS_PER_ACCOUNT_MAX
    response = await api.client.post("/v1/applications", json={"name": "one too many"}, headers=headers)
    assert response.status == 409
    problem = await response.json()
    assert problem["type"].endswith("/limit-reached") and "applications_per_account" in problem["detail"]
    assert str(APPLICATIONS_PER_ACCOUNT_MAX) in problem["detail"]
    assert await api.pool.fetchval("SELECT count(*) FROM applications WHERE account_id = $1", account_id) == count
    assert (await api.client.delete(f"/v1/applications/{last['id']}", headers=headers)).status == 200
    await _application(api, headers)
    # The bound is checked against a count the triggers keep; it is the count of live rows.
    assert await api.pool.fetchval("SELECT live FROM application_counts WHERE account_id = $1", account_id) == \
        await api.pool.fetchval("SELECT count(*) FROM applications WHERE account_id = $1 AND deleted_at IS NULL",
                                account_id) == APPLICATIONS_PER_ACCOUNT_MAX


async def test_endpoints_per_application_limit_is_named_and_per_application(api):
    """An application at ENDPOINTS_PER_APPLICATION_MAX refuses one more (409 naming the limit);
    another application and the default one still take endpoints."""
    account_id, headers = await api.account()
    full = await _application(api, headers, uid="full")
    await api.pool.execute(
        "INSERT INTO endpoints (id, account_id, application_id, url) SELECT gen_random_uuid(), $1, $2,"
        " 'https://example.com/filler' FROM generate_series(1, $3)",
        account_id, uuid.UUID(full["id"]), ENDPOINTS_PER_APPLICATION_MAX)
    before = await api.snapshot()
    response = await api.client.post("/v1/applications/full/endpoints", json={"url": "https://example.com/x"},
                                     headers=headers)
    assert response.status == 409
    problem = await response.json()
    assert "endpoints_per_application" in problem["detail"] and str(ENDPOINTS_PER_APPLICATION_MAX) in problem["detail"]
    assert await api.snapshot() == before
    await _endpoint_in(api, headers, (await _application(api, headers))["id"])
    await api.endpoint(headers)  # the default application


async def test_a_message_fans_out_to_its_applications_endpoints_only(api):
    """A message to an application (by id or uid) makes deliveries to its subscribed endpoints only;
    POST /v1/messages goes to the default application; each message records its application."""
    account_id, headers = await api.account(balance=100)
    a = await _application(api, headers, uid="a")
    b = await _application(api, headers, uid="b")
    a_all = await _endpoint_in(api, headers, "a")
    a_paid = await _endpoint_in(api, headers, "a", event_types=["invoice.paid"])
    await _endpoint_in(api, headers, "a", event_types=["invoice.failed"])
    b_all = await _endpoint_in(api, headers, "b")
    default = await api.endpoint(headers)

    async def send(path: str) -> dict:
        response = await api.client.post(path, json={"event_type": "invoice.paid", "payload": {"n": 1}},
                                         headers=headers)
        assert response.status == 202, await response.text()
        return await response.json()

    by_uid = await send("/v1/applications/a/messages")
    assert sorted(d["endpoint_id"] for d in by_uid["deliveries"]) == sorted([a_all["id"], a_paid["id"]])
    by_id = await send(f"/v1/applications/{b['id']}/messages")
    assert [d["endpoint_id"] for d in by_id["deliveries"]] == [b_all["id"]]
    plain = await send("/v1/messages")
    assert [d["endpoint_id"] for d in plain["deliveries"]] == [default["id"]]
    recorded = dict(await api.pool.fetch("SELECT id, application_id FROM messages WHERE account_id = $1", account_id))
    assert recorded == {uuid.UUID(by_uid["id"]): uuid.UUID(a["id"]), uuid.UUID(by_id["id"]): uuid.UUID(b["id"]),
                        uuid.UUID(plain["id"]): account_id}
    listed = await (await api.client.get("/v1/applications/b/endpoints", headers=headers)).json()
    assert [item["id"] for item in listed["data"]] == [b_all["id"]]
    listed = await (await api.client.get("/v1/endpoints", headers=headers)).json()
    assert [item["id"] for item in listed["data"]] == [default["id"]]


async def test_a_uid_moved_by_another_api_process_sends_to_the_application_that_has_it_now(api):
    """This process keeps the application a uid named for a few seconds; another API process (here:
    SQL behind this one's back) moves the uid to another application. The next send by that uid goes
    to the application that has it now, never to the one that had it; once no application has it,
    the send is 404 and writes nothing."""
    account_id, headers = await api.account(balance=100)
    first = await _application(api, headers, uid="customer-7")
    second = await _application(api, headers)
    first_endpoint = await _endpoint_in(api, headers, first["id"])
    second_endpoint = await _endpoint_in(api, headers, second["id"])

    async def send() -> tuple[int, dict]:
        response = await api.client.post("/v1/applications/customer-7/messages",
                                         json={"event_type": "invoice.paid", "payload": {}}, headers=headers)
        return response.status, await response.json()

    status, body = await send()  # this process now caches customer-7 -> first
    assert status == 202 and [d["endpoint_id"] for d in body["deliveries"]] == [first_endpoint["id"]]
    async with api.pool.acquire() as connection, connection.transaction():
        await connection.execute("UPDATE applications SET uid = NULL WHERE id = $1", uuid.UUID(first["id"]))
        await connection.execute("UPDATE applications SET uid = 'customer-7' WHERE id = $1", uuid.UUID(second["id"]))
    status, body = await send()
    assert status == 202 and [d["endpoint_id"] for d in body["deliveries"]] == [second_endpoint["id"]]
    assert await api.pool.fetchval("SELECT application_id FROM messages WHERE id = $1",
                                   uuid.UUID(body["id"])) == uuid.UUID(second["id"])

    await api.pool.execute("UPDATE applications SET uid = NULL WHERE id = $1", uuid.UUID(second["id"]))
    before = await api.snapshot()
    status, body = await send()
    assert status == 404 and body["type"].endswith("/not-found")
    assert await api.snapshot() == before
    assert await api.pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == 2


async def test_the_same_idempotency_key_for_another_application_conflicts(api):
    """A key is the account's: reused with the same body for another application it is 422, not a replay."""
    _, headers = await api.account(balance=10)
    await _application(api, headers, uid="a")
    await _application(api, headers, uid="b")
    body = {"event_type": "invoice.paid", "payload": {}}
    first = await api.client.post("/v1/applications/a/messages", json=body, headers={**headers, "Idempotency-Key": "k"})
    assert first.status == 202
    again = await api.client.post("/v1/applications/a/messages", json=body, headers={**headers, "Idempotency-Key": "k"})
    assert again.status == 202 and again.headers.get("Idempotent-Replayed") == "true"
    other = await api.client.post("/v1/applications/b/messages", json=body, headers={**headers, "Idempotency-Key": "k"})
    assert other.status == 422


async def test_a_deleted_application_takes_no_messages_and_its_pending_deliveries_are_refunded(api):
    """Deleting an application deletes its endpoints and refunds their pending deliveries at once."""
    account_id, headers = await api.account(balance=10)
    await _application(api, headers, uid="gone")
    await _endpoint_in(api, headers, "gone")
    await _endpoint_in(api, headers, "gone")
    sent = await api.client.post("/v1/applications/gone/messages", json={"event_type": "a", "payload": {}},
                                 headers=headers)
    assert sent.status == 202
    assert await api.pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 8
    deleted = await api.client.delete("/v1/applications/gone", headers=headers)
    assert (await deleted.json())["refunded_now"] == 2
    assert await api.pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 10
    before = await api.snapshot()
    for method, path in (("post", "/v1/applications/gone/messages"), ("post", "/v1/applications/gone/endpoints"),
                         ("get", "/v1/applications/gone/usage")):
        body = {"event_type": "a", "payload": {}} if path.endswith("messages") else {"url": "https://example.com/x"}
        response = await api.client.request(method, path, json=body if method == "post" else None, headers=headers)
        assert response.status == 404, (path, await response.text())
    assert await api.snapshot() == before


async def test_another_accounts_application_is_404_on_every_route_and_nothing_changes(api):
    """By id or by uid, another account's application is invisible: every route answers 404, writes nothing."""
    owner_id, owner = await api.account(balance=10)
    _, intruder = await api.account(balance=10)
    application = await _application(api, owner, uid="private")
    await _endpoint_in(api, owner, "private")
    before = (await api.snapshot(), await _applications_rows(api))
    for reference in (application["id"], "private", str(owner_id)):
        for method, path, body in (
            ("get", f"/v1/applications/{reference}", None),
            ("patch", f"/v1/applications/{reference}", {"name": "mine now"}),
            ("delete", f"/v1/applications/{reference}", None),
            ("post", f"/v1/applications/{reference}/messages", {"event_type": "a", "payload": {}}),
            ("post", f"/v1/applications/{reference}/endpoints", {"url": "https://example.com/steal"}),
            ("get", f"/v1/applications/{reference}/endpoints", None),
            ("get", f"/v1/applications/{reference}/usage", None),
        ):
            response = await api.client.request(method, path, json=body, headers=intruder)
            assert response.status == 404, (method, path, response.status)
    listed = await (await api.client.get("/v1/applications", headers=intruder)).json()
    assert application["id"] not in [item["id"] for item in listed["data"]]
    assert (await api.snapshot(), await _applications_rows(api)) == before
