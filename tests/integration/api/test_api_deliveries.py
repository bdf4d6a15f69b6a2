"""Delivery routes: filtered, paginated lists; one delivery with its attempts and ledger entries;
replay as a new charged delivery; the operator's dead-delivery view; isolation between accounts."""

from __future__ import annotations

import contextlib
import json
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.audit import audit
from billing.ids import new_ids
from billing.settle import settle
from delivery.operations import dead_letters
from delivery.platform.web_app import create_app


async def _dead(api, delivery_id: str) -> None:
    """Kill a delivery through the one settle function, as the worker would after its last attempt."""
    owner = await api.pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", uuid.UUID(delivery_id))
    await settle(api.pool, uuid.UUID(delivery_id), "out_of_retries", account_id=owner)


async def test_list_filters_and_pages_newest_first(api):
    """Pages of 2 walk every delivery once, newest first; state, endpoint_id and message_id filters narrow the list."""
    _, headers = await api.account(balance=100)
    first = await api.endpoint(headers)
    second = await api.endpoint(headers)
    sent = [await (await api.send(headers)).json() for _ in range(3)]
    await _dead(api, sent[0]["deliveries"][0]["id"])
    seen, cursor = [], None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await (await api.client.get("/v1/deliveries", params=params, headers=headers)).json()
        seen += page["data"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == 6 and [d["id"] for d in seen] == sorted((d["id"] for d in seen), reverse=True)
    dead = await (await api.client.get("/v1/deliveries", params={"state": "dead"}, headers=headers)).json()
    assert [d["id"] for d in dead["data"]] == [sent[0]["deliveries"][0]["id"]]
    by_endpoint = await (await api.client.get("/v1/deliveries", params={"endpoint_id": second["id"]}, headers=headers)).json()
    assert {d["endpoint_id"] for d in by_endpoint["data"]} == {second["id"]} and len(by_endpoint["data"]) == 3
    by_message = await (await api.client.get("/v1/deliveries", params={"message_id": sent[1]["id"]}, headers=headers)).json()
    assert {d["endpoint_id"] for d in by_message["data"]} == {first["id"], second["id"]}
    later = await (await api.client.get("/v1/deliveries", params={"created_after": "2999-01-01T00:00:00Z"}, headers=headers)).json()
    assert later["data"] == []
    earlier = await (await api.client.get("/v1/deliveries", params={"created_before": "2999-01-01T00:00:00+00:00"}, headers=headers)).json()
    assert len(earlier["data"]) == 6


async def test_invalid_filters_are_422_naming_each(api):
    """Bad limit, state, ids, timestamps and cursors are listed together in one 422."""
    _, headers = await api.account()
    params = {"limit": "500", "state": "lost", "endpoint_id": "x", "created_after": "yesterday", "cursor": "nope"}
    response = await api.client.get("/v1/deliveries", params=params, headers=headers)
    assert response.status == 422
    assert {error["field"] for error in (await response.json())["errors"]} == set(params)


async def test_one_delivery_with_attempts_and_ledger_entries(api):
    """GET /v1/deliveries/{id} shows its recorded attempts and its charge and refund."""
    account_id, headers = await api.account(balance=10, price=3)
    await api.endpoint(headers)
    delivery_id = (await (await api.send(headers)).json())["deliveries"][0]["id"]
    await api.pool.execute(
        "INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, latency_ms, error)"
        " VALUES ($1, 1, $2, now(), 503, 12, 'HTTP 503')", uuid.UUID(delivery_id), account_id)
    await _dead(api, delivery_id)
    body = await (await api.client.get(f"/v1/deliveries/{delivery_id}", headers=headers)).json()
    assert (body["state"], body["dead_reason"], body["price"]) == ("dead", "out_of_retries", 3)
    assert [(a["attempt"], a["status_code"], a["error"]) for a in body["attempts"]] == [(1, 503, "HTTP 503")]
    assert [(e["kind"], e["amount"]) for e in body["ledger_entries"]] == [("charge", -3), ("refund", 3)]


async def test_replay_makes_a_new_charged_delivery_to_the_same_endpoint(api):
    """Replaying a dead delivery creates a new message and delivery to that endpoint only, charged anew; the old refund stays."""
    _, headers = await api.account(balance=10, price=2)
    target = await api.endpoint(headers)
    await api.endpoint(headers)
    sent = await (await api.send(headers)).json()
    old = next(d for d in sent["deliveries"] if d["endpoint_id"] == target["id"])
    pending = await api.client.post(f"/v1/deliveries/{old['id']}/replay", headers=headers)
    assert pending.status == 409
    await _dead(api, old["id"])
    replay = await api.client.post(f"/v1/deliveries/{old['id']}/replay", headers=headers)
    assert replay.status == 202
    body = await replay.json()
    assert [d["endpoint_id"] for d in body["deliveries"]] == [target["id"]] and body["total_charged"] == 2
    assert body["deliveries"][0]["id"] != old["id"] and body["id"] != sent["id"]
    assert (await (await api.client.get("/v1/balance", headers=headers)).json()) == {"balance": 6, "in_flight": 4}  # 10 - 2*2 + 2 refund - 2 replay
    old_ledger = await (await api.client.get(f"/v1/deliveries/{old['id']}", headers=headers)).json()
    assert [e["kind"] for e in old_ledger["ledger_entries"]] == ["charge", "refund"]
    await api.client.delete(f"/v1/endpoints/{target['id']}", headers=headers)
    await _dead(api, body["deliveries"][0]["id"])
    before = await api.snapshot()
    gone = await api.client.post(f"/v1/deliveries/{old['id']}/replay", headers=headers)
    assert gone.status == 422 and target["id"] in (await gone.json())["detail"]
    assert await api.snapshot() == before
    assert (await audit(api.pool)).clean


async def test_replay_without_balance_is_402(api):
    """A replay the balance cannot cover writes nothing."""
    _, headers = await api.account(balance=1)
    await api.endpoint(headers)
    delivery_id = (await (await api.send(headers)).json())["deliveries"][0]["id"]
    await api.pool.execute("UPDATE deliveries SET state = 'delivered', finished_at = now() WHERE id = $1", uuid.UUID(delivery_id))
    before = await api.snapshot()
    assert (await api.client.post(f"/v1/deliveries/{delivery_id}/replay", headers=headers)).status == 402
    assert await api.snapshot() == before


async def test_another_accounts_deliveries_are_404_and_invisible(api):
    """Another account's delivery id answers 404 on read and replay, and never appears in its lists."""
    _, owner = await api.account(balance=10)
    _, intruder = await api.account(balance=10)
    await api.endpoint(owner)
    delivery_id = (await (await api.send(owner)).json())["deliveries"][0]["id"]
    await _dead(api, delivery_id)
    before = await api.snapshot()
    for path in (f"/v1/deliveries/{delivery_id}", f"/v1/deliveries/{uuid.uuid4()}", "/v1/deliveries/nope"):
        assert (await api.client.get(path, headers=intruder)).status == 404
        assert (await api.client.post(path + "/replay", headers=intruder)).status == 404
    listed = await (await api.client.get("/v1/deliveries", headers=intruder)).json()
    assert listed["data"] == []
    assert await api.snapshot() == before


async def test_operator_sees_dead_deliveries_across_accounts(api):
    """GET /v1/dead-deliveries lists every account's dead deliveries, newest first, page by page."""
    ids = []
    for _ in range(3):
        _, headers = await api.account(balance=5)
        await api.endpoint(headers)
        delivery_id = (await (await api.send(headers)).json())["deliveries"][0]["id"]
        await _dead(api, delivery_id)
        ids.append(delivery_id)
    first = await (await api.client.get("/v1/dead-deliveries", params={"limit": "2"}, headers=api.operator)).json()
    rest = await (await api.client.get("/v1/dead-deliveries", params={"cursor": first["next_cursor"]}, headers=api.operator)).json()
    assert [d["id"] for d in first["data"] + rest["data"]] == sorted(ids, reverse=True)
    assert rest["next_cursor"] is None
    assert len({d["account_id"] for d in first["data"] + rest["data"]}) == 3


async def test_a_replay_with_an_idempotency_key_is_made_once(api):
    """The same key replays once: the second call answers the first one's response, charged once;
    without a key each call replays again; another delivery under that key is 422."""
    _, headers = await api.account(balance=10, price=2)
    await api.endpoint(headers)
    first, second = [(await (await api.send(headers)).json())["deliveries"][0]["id"] for _ in range(2)]
    for delivery_id in (first, second):
        await _dead(api, delivery_id)
    keyed = {**headers, "Idempotency-Key": "replay-once"}
    made = await api.client.post(f"/v1/deliveries/{first}/replay", headers=keyed)
    again = await api.client.post(f"/v1/deliveries/{first}/replay", headers=keyed)
    assert (made.status, again.status) == (202, 202)
    assert "Idempotent-Replayed" not in made.headers and again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json()) == (await made.json())
    assert (await (await api.client.get("/v1/balance", headers=headers)).json())["balance"] == 10 - 2
    other = await api.client.post(f"/v1/deliveries/{second}/replay", headers={**headers, "Idempotency-Key": "replay-once"})
    assert other.status == 422 and (await other.json())["type"].endswith("idempotency-key-reused")
    unkeyed = [await api.client.post(f"/v1/deliveries/{first}/replay", headers=headers) for _ in range(2)]
    assert [response.status for response in unkeyed] == [202, 202]
    assert len({(await response.json())["id"] for response in unkeyed}) == 2
    assert (await audit(api.pool)).clean


async def test_a_replay_body_other_than_empty_or_an_empty_object_is_refused_and_writes_nothing(api):
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    delivery_id = (await (await api.send(headers)).json())["deliveries"][0]["id"]
    await _dead(api, delivery_id)
    before = await api.snapshot()
    unknown = await api.client.post(f"/v1/deliveries/{delivery_id}/replay", json={"foo": 1}, headers=headers)
    garbage = await api.client.post(f"/v1/deliveries/{delivery_id}/replay", data=b"garbage",
                                    headers={**headers, "Content-Type": "application/json"})
    assert (unknown.status, garbage.status) == (422, 400)
    assert await api.snapshot() == before
    assert (await api.client.post(f"/v1/deliveries/{delivery_id}/replay", json={}, headers=headers)).status == 202


async def test_idempotency_keys_in_the_operators_replay_namespace_are_refused(api):
    """`replay:<id>` keys are the dead-letter replays' own: a customer's would block them."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    response = await api.send(headers, key="replay:" + str(uuid.uuid4()))
    assert response.status == 422 and (await response.json())["errors"][0]["field"] == "Idempotency-Key"
    assert await api.snapshot() == before


# ---- query plans: a page reads about a page of rows, however the account's rows lie ----------------

async def _bulk_deliveries(pool, account_id: uuid.UUID, count: int, *, dead_every: int = 0,
                           endpoint_id: uuid.UUID | None = None) -> None:
    """`count` delivered deliveries (each with its message) written by SQL, oldest first: a page
    read needs rows, not money, so no charges are written. Every `dead_every`-th one is dead.
    To the given endpoint, or to one of the account's."""
    if endpoint_id is None:
        endpoint_id = await pool.fetchval("SELECT id FROM endpoints WHERE account_id = $1 LIMIT 1", account_id)
    message_ids = new_ids(count)
    await pool.execute(
        "INSERT INTO messages (id, account_id, event_type, payload, created_at)"
        " SELECT m, $2, 'invoice.paid', '{}', now() - (n || ' ms')::interval"
        " FROM unnest($1::uuid[]) WITH ORDINALITY AS u(m, n)", message_ids[::-1], account_id)
    await pool.execute(
        "INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, state, attempt, attempts_max,"
        "   dead_reason, created_at, finished_at)"
        " SELECT m.id, m.account_id, m.id, $2, 1, CASE WHEN d THEN 'dead' ELSE 'delivered' END, 1, 3,"
        "   CASE WHEN d THEN 'out_of_retries' END, m.created_at, m.created_at"
        " FROM messages m, LATERAL (SELECT $3 > 0 AND (('x' || right(m.id::text, 4))::bit(16)::int % $3 = 0) AS d) s"
        " WHERE m.id = ANY($1::uuid[])", message_ids, endpoint_id, dead_every)


class _PlanLog:
    """Every statement's plan as PostgreSQL ran it (auto_explain with ANALYZE), sent to the client
    as a NOTICE: what a request read is then counted, not timed."""

    SERVER_SETTINGS = {"session_preload_libraries": "auto_explain", "auto_explain.log_min_duration": "0",
                       "auto_explain.log_analyze": "on", "auto_explain.log_timing": "off",
                       "auto_explain.log_format": "json", "auto_explain.log_level": "notice"}

    def __init__(self) -> None:
        self.plans: list[dict] = []
        self.recording = False

    async def listen(self, connection) -> None:
        """Each time the pool hands the connection out (a release drops the listeners)."""
        connection.add_log_listener(self._notice)

    def _notice(self, connection, message) -> None:
        text = message.message
        if self.recording and "plan:" in text:
            self.plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    async def rows_read(self, call):
        """Deliveries rows the statements run while awaiting `call` read, and what it answered."""
        self.plans.clear()
        self.recording = True
        try:
            answer = await call
        finally:
            self.recording = False
        return self.deliveries_rows_read(), answer

    def deliveries_rows_read(self) -> int:
        """Rows the recorded statements took from the deliveries table (kept or filtered out)."""
        def walk(node) -> int:
            own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1) \
                if node.get("Relation Name") == "deliveries" else 0
            return own + sum(walk(child) for child in node.get("Plans", ()))
        return sum(walk(plan) for plan in self.plans)

    def other_states_read(self) -> int:
        """Deliveries rows the recorded statements read and then dropped for their state: rows of
        other states than the one asked for."""
        def walk(node) -> int:
            own = node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1) \
                if node.get("Relation Name") == "deliveries" and "state" in node.get("Filter", "") else 0
            return own + sum(walk(child) for child in node.get("Plans", ()))
        return sum(walk(plan) for plan in self.plans)


@contextlib.asynccontextmanager
async def _planned_app(api, database_url, queue, **server_settings):
    """The app on a one-connection pool whose plans are logged: every request reuses the
    connection's prepared statements (and, after five runs, whatever plan PostgreSQL settled on)."""
    log = _PlanLog()
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, statement_cache_size=256,
                                     server_settings={**log.SERVER_SETTINGS, **server_settings}, setup=log.listen)
    async with TestClient(TestServer(create_app(api.settings, pool, queue), host="127.0.0.1")) as client:
        yield type(api)(client, pool, api.settings), log
    await pool.close()


@pytest.fixture
async def planned(api, database_url, queue):
    async with _planned_app(api, database_url, queue) as planned:
        yield planned


async def _accounts_with_deliveries(api, count: int, deliveries: int) -> list[dict]:
    accounts = []
    for _ in range(count):
        account_id, headers = await api.account()
        await api.endpoint(headers)
        await _bulk_deliveries(api.pool, account_id, deliveries)
        accounts.append(headers)
    return accounts


async def _page_read(api, log, headers: dict, params: dict | None = None, **each) -> tuple[int, str | None]:
    """Deliveries rows one full page of GET /v1/deliveries read, and its next cursor; every row of
    the page has the fields given as `each` (state=..., endpoint_id=...)."""
    read, response = await log.rows_read(api.client.get("/v1/deliveries", params=params or {}, headers=headers))
    body = await response.json()
    assert response.status == 200 and len(body["data"]) == 50, (response.status, len(body.get("data", ())))
    for field, value in each.items():
        assert {d[field] for d in body["data"]} == {value}, field
    return read, body["next_cursor"]


@pytest.mark.filterwarnings("ignore:.*active log listener")
async def test_a_page_reads_about_a_page_whichever_accounts_pages_came_before(planned):
    """The page statement is prepared once per connection, and after five runs PostgreSQL may keep
    a generic plan. Whichever accounts' pages made it, a page of a big account, of a small one
    whose deliveries are older than the big one's, and a page deep in the big one read about a
    page of deliveries, not the account's or the table's."""
    api, log = planned
    old_small = await _accounts_with_deliveries(api, 10, 150)
    big_id, big = await api.account()
    await api.endpoint(big)
    await _bulk_deliveries(api.pool, big_id, 20_000)
    new_small = await _accounts_with_deliveries(api, 10, 150)
    await api.pool.execute("ANALYZE deliveries; ANALYZE messages")
    for headers in new_small:
        await _page_read(api, log, headers)
    assert (await _page_read(api, log, big))[0] < 200
    for _ in range(10):
        await _page_read(api, log, big)
    assert (await _page_read(api, log, old_small[0]))[0] < 200
    deep = str(await api.pool.fetchval(
        "SELECT id FROM deliveries WHERE account_id = $1 ORDER BY id DESC OFFSET 15000 LIMIT 1", big_id))
    for _ in range(10):
        await _page_read(api, log, big, {"cursor": deep})
    assert (await _page_read(api, log, big, {"cursor": deep}))[0] < 200



async def _dead_page_read(api, log, cursor: str | None) -> tuple[int, str]:
    """Deliveries rows one page of GET /v1/dead-deliveries read, and its next cursor."""
    read, response = await log.rows_read(api.client.get(
        "/v1/dead-deliveries", params={"cursor": cursor} if cursor else {}, headers=api.operator))
    body = await response.json()
    assert response.status == 200 and len(body["data"]) == 50 and {d["state"] for d in body["data"]} == {"dead"}
    return read, body["next_cursor"]


async def _list_dead_read(api, log, cursor: str | None, filters=dead_letters.DeadFilter(), **each) -> tuple[int, str]:
    """Deliveries rows one page of dead_letters.list_dead (the CLI's and the dashboard's) read, and
    its next cursor; every row of the page has the fields given as `each` (account_id=...)."""
    read, page = await log.rows_read(dead_letters.list_dead(api.pool, filters, cursor=cursor, limit=50))
    assert len(page.rows) == 50 and page.next_cursor is not None
    for field, value in each.items():
        assert {row[field] for row in page.rows} == {value}, field
    return read, page.next_cursor


@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan", "force_generic_plan"])
async def test_a_page_of_dead_deliveries_reads_about_a_page_however_deep(api, database_url, queue, plan_cache_mode):
    """The operator's dead deliveries, GET /v1/dead-deliveries and dead_letters.list_dead, one in
    twenty of 20,000 deliveries: the first page, the next ones and a page deep in them each read
    about a page of deliveries rows, whichever plan PostgreSQL runs. Without an index of the dead
    ones in id order a custom plan walked the primary key past twenty deliveries for each dead one,
    and a generic plan (where the cursor was a filter, not an index condition) past every row newer
    than the cursor too; with list_dead's filters each an "$n IS NULL OR", a generic plan read every
    dead one and sorted them (1,050 rows), filtered or not."""
    account_id, headers = await api.account()
    await api.endpoint(headers)
    await _bulk_deliveries(api.pool, account_id, 20_000, dead_every=20)
    await api.pool.execute("ANALYZE deliveries; ANALYZE messages")
    deep = str(await api.pool.fetchval(
        "SELECT id FROM deliveries WHERE state = 'dead' ORDER BY id DESC OFFSET 800 LIMIT 1"))
    async with _planned_app(api, database_url, queue, plan_cache_mode=plan_cache_mode) as (planned, log):
        cursor = None
        for _ in range(8):  # past the five custom plans after which PostgreSQL may keep a generic one
            read, cursor = await _dead_page_read(planned, log, cursor)
            assert read < 200
        for _ in range(8):
            assert (await _dead_page_read(planned, log, deep))[0] < 200
        assert (await _dead_page_read(planned, log, None))[0] < 200
        for cursor in [None] * 8 + [deep] * 8:
            assert (await _list_dead_read(planned, log, cursor))[0] < 200
        for filters in (dead_letters.DeadFilter(account_id=account_id), dead_letters.DeadFilter(reason="out_of_retries")):
            for cursor in [None] * 8 + [deep] * 8:
                assert (await _list_dead_read(planned, log, cursor, filters))[0] < 200


@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan", "force_generic_plan"])
async def test_a_page_of_one_state_reads_about_a_page_however_rare_the_state(api, database_url, queue, plan_cache_mode):
    """GET /v1/deliveries?state=...: an account's dead deliveries (one in twenty of 20,000), its
    pending ones (one in forty) and its delivered ones, beside a newer account half of whose
    deliveries are dead, the first page, the next ones and a page
    deep in them, each read about a page of deliveries rows, whichever plan PostgreSQL runs (or,
    where it expects few rows of the state, those rows alone, read whole and sorted). With
    the state an "$n IS NULL OR" filter on the account's pages in id order, a page of dead ones
    read twenty rows for each it kept (a thousand) in a custom plan, and every row of the account
    in a generic one; through the index of all dead deliveries, the other account's first."""
    account_id, headers = await api.account()
    await api.endpoint(headers)
    await _bulk_deliveries(api.pool, account_id, 20_000, dead_every=20)
    await api.pool.execute(
        "UPDATE deliveries SET state = 'pending', dead_reason = NULL, finished_at = NULL, next_attempt_at = now()"
        " WHERE account_id = $1 AND state = 'delivered' AND ('x' || right(id::text, 4))::bit(16)::int % 40 = 1",
        account_id)
    noisy_id, noisy = await api.account()  # newer, and half of its deliveries dead
    await api.endpoint(noisy)
    await _bulk_deliveries(api.pool, noisy_id, 10_000, dead_every=2)
    await api.pool.execute("ANALYZE deliveries; ANALYZE messages")
    async with _planned_app(api, database_url, queue, plan_cache_mode=plan_cache_mode) as (planned, log):
        for state in ("dead", "pending", "delivered"):
            deep = str(await api.pool.fetchval(
                "SELECT id FROM deliveries WHERE account_id = $1 AND state = $2 ORDER BY id DESC OFFSET 300 LIMIT 1",
                account_id, state))
            of_state = await api.pool.fetchval(
                "SELECT count(*) FROM deliveries WHERE account_id = $1 AND state = $2", account_id, state)

            def about_a_page(read: int) -> bool:
                # A page, or the account's rows of that state alone: where PostgreSQL expects few
                # of them (a few hundred pending here), it may read them all and sort, which is
                # no pathology; reading rows of other states, or a generic plan's every row, is.
                return read < 200 or (log.other_states_read() == 0 and read <= of_state + 51)

            cursor = None
            for _ in range(6):  # past the five custom plans after which PostgreSQL may keep a generic one
                read, cursor = await _page_read(planned, log, headers, {"state": state, **({"cursor": cursor} if cursor else {})}, state=state)
                assert about_a_page(read), f"{state}: {read} rows read by {json.dumps(log.plans)}"
            for _ in range(6):
                read, _ = await _page_read(planned, log, headers, {"state": state, "cursor": deep}, state=state)
                assert about_a_page(read), f"{state}: {read} rows read by {json.dumps(log.plans)}"


@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan"])
async def test_a_page_of_one_endpoint_reads_about_a_page(api, database_url, queue, plan_cache_mode):
    """GET /v1/deliveries?endpoint_id=...: a page of a busy endpoint (20,000 deliveries) walks the
    account's pages, and of a quiet one (120, older) reads its own through (endpoint_id, state),
    after any number of either. PostgreSQL keeps custom plans here (a generic one cannot tell a
    quiet endpoint from a busy one, and forced, it read 20,051 rows for the quiet one's page);
    this test fails if the statement stops letting it choose."""
    account_id, headers = await api.account()
    busy = uuid.UUID((await api.endpoint(headers))["id"])
    quiet = uuid.UUID((await api.endpoint(headers, url="https://example.com/quiet"))["id"])
    await _bulk_deliveries(api.pool, account_id, 120, endpoint_id=quiet)
    await _bulk_deliveries(api.pool, account_id, 20_000, endpoint_id=busy)
    await api.pool.execute("ANALYZE deliveries; ANALYZE messages")
    async with _planned_app(api, database_url, queue, plan_cache_mode=plan_cache_mode) as (planned, log):
        for endpoint in (busy,) * 8 + (quiet,) * 2 + (busy, quiet) * 3:
            params = {"endpoint_id": str(endpoint), "limit": "50"}
            read, cursor = await _page_read(planned, log, headers, params, endpoint_id=str(endpoint))
            assert read < 200, (endpoint == quiet, read)
            read, _ = await _page_read(planned, log, headers, {**params, "cursor": cursor}, endpoint_id=str(endpoint))
            assert read < 200, (endpoint == quiet, read)


@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan", "force_generic_plan"])
async def test_the_operators_dead_deliveries_of_one_account_read_about_a_page(api, database_url, queue,
                                                                               plan_cache_mode):
    """dead_letters.list_dead filtered by an account (the CLI's `deliveries dead --account` and the
    dashboard's): an older account's dead deliveries (one in twenty of 4,000) beside a newer account
    with 10,000 dead ones. Walking the index of every dead delivery from the newest would read all
    of the newer account's first; the first page, the next ones and one deep in them each read
    about a page, through the account's own dead index, whichever plan PostgreSQL runs."""
    account_id, headers = await api.account()
    await api.endpoint(headers)
    await _bulk_deliveries(api.pool, account_id, 4_000, dead_every=20)
    noisy_id, noisy = await api.account()  # newer, and half of its deliveries dead
    await api.endpoint(noisy)
    await _bulk_deliveries(api.pool, noisy_id, 20_000, dead_every=2)
    await api.pool.execute("ANALYZE deliveries; ANALYZE messages")
    deep = str(await api.pool.fetchval(
        "SELECT id FROM deliveries WHERE account_id = $1 AND state = 'dead' ORDER BY id DESC OFFSET 100 LIMIT 1",
        account_id))
    filters = dead_letters.DeadFilter(account_id=account_id)
    async with _planned_app(api, database_url, queue, plan_cache_mode=plan_cache_mode) as (planned, log):
        cursor = None
        for _ in range(3):
            read, cursor = await _list_dead_read(planned, log, cursor, filters, account_id=account_id)
            assert read < 200, read
        for cursor in [None] * 6 + [deep] * 6:
            assert (await _list_dead_read(planned, log, cursor, filters, account_id=account_id))[0] < 200
