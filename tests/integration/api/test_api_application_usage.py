"""An application's usage: its charges, refunds and reclaims, summed from the ledger, the same
entries the audit proves; the applications' usages add up to the account's delivery entries."""

from __future__ import annotations

import uuid

from billing import usage
from billing.audit import audit
from billing.settle import DeadReason, settle
from delivery.engine import claims, results


async def _send(api, headers: dict, path: str, count: int) -> list[uuid.UUID]:
    deliveries = []
    for number in range(count):
        response = await api.client.post(path, json={"event_type": "invoice.paid", "payload": {"n": number}},
                                         headers=headers)
        assert response.status == 202, await response.text()
        deliveries += [uuid.UUID(d["id"]) for d in (await response.json())["deliveries"]]
    return deliveries


async def _from_ledger(pool, application_id: uuid.UUID, since=None) -> dict[str, int]:
    """The application's delivery entries, found another way than the usage query: by each
    delivery's message's application."""
    rows = await pool.fetch(
        "SELECT l.kind, count(*) AS entries, sum(abs(l.amount)) AS credits FROM ledger_entries l"
        " JOIN deliveries d ON d.id = l.delivery_id JOIN messages m ON m.id = d.message_id"
        " WHERE m.application_id = $1 AND l.created_at >= coalesce($2::timestamptz, '-infinity') GROUP BY l.kind",
        application_id, since)
    found = {row["kind"]: (row["entries"], int(row["credits"])) for row in rows}
    return {"charges": found.get("charge", (0, 0))[0], "charged": found.get("charge", (0, 0))[1],
            "refunds": found.get("refund", (0, 0))[0], "refunded": found.get("refund", (0, 0))[1],
            "reclaims": found.get("reclaim", (0, 0))[0], "reclaimed": found.get("reclaim", (0, 0))[1]}


async def test_usage_sums_the_ledger_entries_of_the_applications_deliveries(api):
    """Charges, refunds (deliveries that died) and a reclaim (a dead one that arrived after all):
    the usage route answers what the ledger holds, per application, over a period; the audit is
    clean, and the usages add up to the account's delivery entries."""
    account_id, headers = await api.account(balance=1_000, price=3)
    for uid in ("a", "b"):
        assert (await api.client.post("/v1/applications", json={"name": uid, "uid": uid}, headers=headers)).status == 201
    for uid, count in (("a", 2), ("b", 1)):
        for _ in range(count):
            response = await api.client.post(f"/v1/applications/{uid}/endpoints", json={"url": "https://example.com/h"},
                                             headers=headers)
            assert response.status == 201
    await api.endpoint(headers)
    a_deliveries = await _send(api, headers, "/v1/applications/a/messages", 5)
    await _send(api, headers, "/v1/applications/b/messages", 3)
    await _send(api, headers, "/v1/messages", 2)
    middle = await api.pool.fetchval("SELECT clock_timestamp()")
    # The first is claimed and dies while its send is out, which then answers 2xx: the reclaim.
    (claimed,) = await claims.claim_ids(api.pool, [claims.DeliveryKey(account_id, a_deliveries[0])],
                                          lease_ms=3_600_000)
    await settle(api.pool, claimed.id, DeadReason.ENDPOINT_DISABLED, account_id=claimed.account_id, attempt=claimed.attempt)
    for delivery_id in a_deliveries[1:3]:
        await settle(api.pool, delivery_id, DeadReason.ENDPOINT_DELETED, account_id=claimed.account_id, attempt=0)
    late = results.AttemptResult(claimed.id, claimed.attempt, claimed.account_id, True, 12, status_code=200,
                                 error=None, retry_delay_seconds=0.0)
    assert (await results.record_results(api.pool, [late])).reclaimed == [claimed.id]
    a_id = (await (await api.client.get("/v1/applications/a", headers=headers)).json())["id"]

    body = await (await api.client.get("/v1/applications/a/usage", headers=headers)).json()
    expected = {"charges": 10, "charged": 30, "refunds": 3, "refunded": 9, "reclaims": 1, "reclaimed": 3}
    assert {name: body[name] for name in expected} == expected == await _from_ledger(api.pool, uuid.UUID(a_id))
    assert body["net"] == 30 - 9 + 3
    since = middle.isoformat().replace("+00:00", "Z")
    later = await (await api.client.get("/v1/applications/a/usage", params={"since": since}, headers=headers)).json()
    assert {name: later[name] for name in expected} == {
        "charges": 0, "charged": 0, "refunds": 3, "refunded": 9, "reclaims": 1, "reclaimed": 3
    } == await _from_ledger(api.pool, uuid.UUID(a_id), middle)
    before = await (await api.client.get("/v1/applications/a/usage", params={"until": since}, headers=headers)).json()
    assert (before["charges"], before["refunds"], before["net"]) == (10, 0, 30)

    report = await audit(api.pool, account_id)
    assert report.clean, report.to_json()
    total = 0
    for application_id in (uuid.UUID(a_id), uuid.UUID((await (await api.client.get("/v1/applications/b", headers=headers)).json())["id"]), account_id):
        total += (await usage.application_usage(api.pool, account_id, application_id)).net
    spent = await api.pool.fetchval("SELECT -sum(amount) FROM ledger_entries WHERE account_id = $1"
                                    " AND kind IN ('charge', 'refund', 'reclaim')", account_id)
    assert total == spent == (10 + 3 + 2) * 3 - 9 + 3


async def test_usage_query_string_is_checked(api):
    """A malformed time, an until not after since, or an unknown parameter: 422 naming it."""
    _, headers = await api.account()
    assert (await api.client.post("/v1/applications", json={"name": "a", "uid": "a"}, headers=headers)).status == 201
    for params, field in (({"since": "yesterday"}, "since"),
                          ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "until"),
                          ({"from": "2026-01-01T00:00:00Z"}, "from")):
        response = await api.client.get("/v1/applications/a/usage", params=params, headers=headers)
        assert response.status == 422, params
        assert [error["field"] for error in (await response.json())["errors"]] == [field]
