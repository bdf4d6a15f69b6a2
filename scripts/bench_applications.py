"""Applications for scripts/bench_ingest.py --applications N: the accounts that send to one
application and to N, and the timings of creating and listing applications with 1 and with N.

The N applications and their endpoints (one each by default, `endpoints` each with
--endpoints-per-application, every event type) are inserted by SQL in two statements: what is
measured is sending to them, not making 20,000 API calls first. The one application has as many.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aiohttp
import asyncpg

CREATES = 100  # applications created one after another, per timing
PAGES = 50  # list calls per timing
PAGE_LIMIT = 100  # applications per list page (the `limit` of each list call)
TOP_UP = 10**12


async def _account(session: aiohttp.ClientSession, api_url: str, operator_key: str, name: str) -> tuple[str, str]:
    """A topped-up account through the API: its id and key."""
    operator = {"Authorization": f"Bearer {operator_key}"}
    async with session.post(f"{api_url}/v1/accounts", json={"name": name}, headers=operator) as response:
        created = await response.json()
    account_id = created["account"]["id"]
    async with session.post(f"{api_url}/v1/accounts/{account_id}/topups", headers=operator,
                            json={"order_id": f"bench-{account_id}", "amount": TOP_UP}) as response:
        assert response.status == 201, await response.text()
    return account_id, created["api_key"]["key"]


async def setup(api_url: str, database_url: str, operator_key: str, count: int,
                endpoints: int = 1) -> dict[str, tuple[list, list]]:
    """Label -> (keys, paths) for bench_ingest's load: one application, and `count` applications of one account."""
    async with aiohttp.ClientSession() as session:
        _, single_key = await _account(session, api_url, operator_key, "bench one application")
        headers = {"Authorization": f"Bearer {single_key}"}
        async with session.post(f"{api_url}/v1/applications", json={"name": "only"}, headers=headers) as response:
            single = (await response.json())["id"]
        for number in range(endpoints):
            async with session.post(f"{api_url}/v1/applications/{single}/endpoints", headers=headers,
                                    json={"url": f"https://example.com/h{number}"}) as response:
                assert response.status == 201, await response.text()
        many_account, many_key = await _account(session, api_url, operator_key, f"bench {count} applications")
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "INSERT INTO applications (id, account_id, uid, name) SELECT gen_random_uuid(), $1, 'customer-' || n, 'customer'"
            " FROM generate_series(1, $2) AS n RETURNING id", uuid.UUID(many_account), count)
        await connection.execute(
            "INSERT INTO endpoints (id, account_id, application_id, url)"
            " SELECT gen_random_uuid(), $1, id, 'https://example.com/h' || k"
            " FROM unnest($2::uuid[]) AS id CROSS JOIN generate_series(1, $3) AS k",
            uuid.UUID(many_account), [row["id"] for row in rows], endpoints)
    finally:
        await connection.close()
    return {
        "one application": ([single_key], [f"/v1/applications/{single}/messages"]),
        f"{count} applications": ([many_key] * count, [f"/v1/applications/{row['id']}/messages" for row in rows]),
    }


# What bench_ingest's fan-out 1 body ({"n":1,"text":"hello"}) passes: a few keywords to check.
PAYLOAD_SCHEMA = {"type": "object", "required": ["n", "text"],
                  "properties": {"n": {"type": "integer", "minimum": 0}, "text": {"type": "string", "maxLength": 100}}}


async def schema_case(api_url: str, operator_key: str) -> dict[str, tuple[list, list]]:
    """Label -> (keys, paths): one account sending fanout1 (one endpoint) with PAYLOAD_SCHEMA on that type."""
    async with aiohttp.ClientSession() as session:
        _, key = await _account(session, api_url, operator_key, "bench schema")
        headers = {"Authorization": f"Bearer {key}"}
        async with session.post(f"{api_url}/v1/event-types", headers=headers,
                                json={"name": "fanout1", "schema": PAYLOAD_SCHEMA}) as response:
            assert response.status == 201, await response.text()
        async with session.post(f"{api_url}/v1/endpoints", headers=headers, json={"url": "https://example.com/h"}) as response:
            assert response.status == 201, await response.text()
    return {"one account, schema": ([key], ["/v1/messages"])}


async def _timed(session: aiohttp.ClientSession, method: str, url: str, headers: dict, times: int, **fields) -> float:
    """Milliseconds per call, over `times` calls one after another (each must succeed)."""
    started = time.perf_counter()
    for number in range(times):
        json = {key: value.format(number=number) for key, value in fields.items()} or None
        async with session.request(method, url, json=json, headers=headers) as response:
            assert response.status < 300, await response.text()
            await response.read()
    return (time.perf_counter() - started) / times * 1000


async def routes(api_url: str, operator_key: str, count: int) -> dict:
    """Creating applications and listing them (first page, and a page from a cursor halfway), in an
    account with one application, in one with a full page of them (PAGE_LIMIT) and in one with
    `count`: milliseconds per call, side by side. The one application's page holds one; the other
    two's hold PAGE_LIMIT, so the full page is what the `count` account's list compares with."""
    timings: dict = {}
    async with aiohttp.ClientSession() as session:
        _, small_key = await _account(session, api_url, operator_key, "bench list one")
        _, page_key = await _account(session, api_url, operator_key, "bench list a page")
        _, large_key = await _account(session, api_url, operator_key, f"bench list {count}")
        large = {"Authorization": f"Bearer {large_key}"}

        async def create(headers: dict, number: int) -> None:
            async with session.post(f"{api_url}/v1/applications", json={"name": f"c{number}"}, headers=headers) as made:
                assert made.status == 201, await made.text()

        # Through the API, 100 at a time; the account's default application makes one more.
        for key, applications in ((page_key, PAGE_LIMIT), (large_key, count)):
            headers = {"Authorization": f"Bearer {key}"}
            for start in range(0, applications, 100):
                await asyncio.gather(*(create(headers, number) for number in range(start, min(applications, start + 100))))
        async with session.get(f"{api_url}/v1/applications?limit={PAGE_LIMIT}", headers=large) as response:
            cursor = (await response.json())["next_cursor"]
        for _ in range(count // (2 * PAGE_LIMIT) - 1):  # a cursor halfway, read by paging
            async with session.get(f"{api_url}/v1/applications?limit={PAGE_LIMIT}&cursor={cursor}",
                                   headers=large) as response:
                cursor = (await response.json())["next_cursor"]
        middle = cursor
        for label, key in (("1 application", small_key), (f"{PAGE_LIMIT + 1} applications", page_key),
                           (f"{count} applications", large_key)):
            headers = {"Authorization": f"Bearer {key}"}
            timings[label] = {
                "list_first_page_ms": await _timed(session, "GET", f"{api_url}/v1/applications?limit={PAGE_LIMIT}",
                                                   headers, PAGES),
                "create_ms": await _timed(session, "POST", f"{api_url}/v1/applications", headers, CREATES,
                                          name="timed {number}"),
            }
        timings[f"{count} applications"]["list_page_halfway_ms"] = await _timed(
            session, "GET", f"{api_url}/v1/applications?limit={PAGE_LIMIT}&cursor={middle}", large, PAGES)
    for label, figures in timings.items():
        print(f"applications routes, {label:20}: " + ", ".join(f"{name} {value:.2f}" for name, value in figures.items()))
    return timings
