"""The SDK's endpoints.recover_plan / endpoints.recover against the real API, async and blocking:
typed results, the refusals as typed errors, and the Idempotency-Key that makes a retry (after a
lost answer too) answer the first call's replays instead of 409 total-changed."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from billing.audit import audit
from billing.settle import settle
from delivery.client import (
    AsyncClient,
    Client,
    ConflictError,
    NotFoundError,
    PaymentRequiredError,
    Recovered,
    RecoveredDelivery,
    RecoverPlan,
    RetryPolicy,
    ValidationError,
)
from delivery.client import transport

SINCE = datetime(2000, 1, 1, tzinfo=timezone.utc)


async def _dead(sdk, pool, endpoint_id: uuid.UUID, count: int) -> list[uuid.UUID]:
    """`count` deliveries to the endpoint, killed through the one settle function (as the worker does)."""
    dead = []
    for number in range(count):
        message = await sdk.send("invoice.paid", {"n": number})
        dead += [d.id for d in message.deliveries if d.endpoint_id == endpoint_id]
    for delivery_id in dead:
        owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
        await settle(pool, delivery_id, "out_of_retries", account_id=owner)
    return dead


async def test_plan_then_recover_returns_typed_results_and_charges_once(sdk, pool):
    """The plan names the dead deliveries and the total; recover replays exactly those as new
    pending deliveries, charged once; the answer carries the key it was sent with."""
    endpoint = await sdk.endpoints.create("https://example.com/recover")
    dead = await _dead(sdk, pool, endpoint.id, 3)
    plan = await sdk.endpoints.recover_plan(endpoint.id, SINCE)
    assert isinstance(plan, RecoverPlan) and plan.endpoint_enabled and not plan.more
    assert (plan.count, plan.total_charge, plan.dead_delivery_ids) == (3, 6, tuple(sorted(dead)))
    balance = (await sdk.balance()).balance
    recovered = await sdk.endpoints.recover(endpoint.id, plan.since, plan.until, confirm_total=plan.total_charge)
    assert isinstance(recovered, Recovered) and all(isinstance(r, RecoveredDelivery) for r in recovered.replayed)
    assert (recovered.replayed_count, recovered.total_charged, recovered.more) == (3, 6, False)
    assert not recovered.idempotent_replayed and recovered.idempotency_key  # generated
    assert {r.dead_delivery_id for r in recovered.replayed} == set(dead)
    for replay in recovered.replayed:
        detail = await sdk.deliveries.get(replay.delivery_id)
        assert (detail.state, detail.endpoint_id, detail.price) == ("pending", endpoint.id, 2)
        assert [(e.kind, e.amount) for e in detail.ledger_entries] == [("charge", -2)]
    assert (await sdk.balance()).balance == balance - 6
    assert (await sdk.endpoints.recover_plan(endpoint.id, SINCE)).count == 0
    assert (await audit(pool)).clean


async def test_the_same_key_answers_the_first_recovery(sdk, pool):
    """recover twice with one key: the second is the stored answer (idempotent_replayed), nothing more
    charged; without the key the repeat is told the total changed (to 0), as a ConflictError."""
    endpoint = await sdk.endpoints.create("https://example.com/recover-key")
    await _dead(sdk, pool, endpoint.id, 2)
    first = await sdk.endpoints.recover(endpoint.id, SINCE, confirm_total=4, idempotency_key="rk-1")
    balance = (await sdk.balance()).balance
    again = await sdk.endpoints.recover(endpoint.id, SINCE, confirm_total=4, idempotency_key="rk-1")
    assert (first.idempotent_replayed, again.idempotent_replayed) == (False, True)
    assert again.replayed == first.replayed and again.idempotency_key == "rk-1"
    assert (await sdk.balance()).balance == balance
    with pytest.raises(ConflictError) as changed:
        await sdk.endpoints.recover(endpoint.id, SINCE, confirm_total=4)
    assert changed.value.slug == "total-changed" and "0 credits" in changed.value.detail


async def test_refusals_are_typed_errors(sdk, pool, operator, account, base_url):
    """402 PaymentRequiredError (nothing replayed), 404 NotFoundError for another account's
    endpoint, 422 ValidationError for a time without a timezone or since after until."""
    endpoint = await sdk.endpoints.create("https://example.com/recover-refused")
    dead = await _dead(sdk, pool, endpoint.id, 2)
    created, _ = account
    await operator.accounts.reverse_top_up(created.account.id, "order-1")  # 100 credits less: below the total
    with pytest.raises(PaymentRequiredError):
        await sdk.endpoints.recover(endpoint.id, SINCE, confirm_total=4)
    assert (await sdk.endpoints.recover_plan(endpoint.id, SINCE)).dead_delivery_ids == tuple(sorted(dead))
    other = await operator.accounts.create("other")
    async with AsyncClient(base_url, other.api_key.key, retries=0) as intruder:
        with pytest.raises(NotFoundError):
            await intruder.endpoints.recover_plan(endpoint.id, SINCE)
        with pytest.raises(NotFoundError):
            await intruder.endpoints.recover(endpoint.id, SINCE, confirm_total=4)
    with pytest.raises(ValidationError) as naive:
        await sdk.endpoints.recover(endpoint.id, datetime(2000, 1, 1), confirm_total=4)
    assert [error.field for error in naive.value.errors] == ["since"]
    with pytest.raises(ValidationError) as backwards:
        await sdk.endpoints.recover_plan(endpoint.id, SINCE, SINCE - timedelta(days=1))
    assert [error.field for error in backwards.value.errors] == ["until"]


class _LoseFirstRecoverAnswer(httpx.AsyncBaseTransport):
    """Forwards every request; the first recover POST is carried out, but its answer is dropped
    (a broken connection after the server answered), as a lost answer looks to the client."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.lost = 0
        self.keys: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST" and request.url.path.endswith("/recover"):
            self.keys.append(request.headers["Idempotency-Key"])
            if not self.lost:
                await response.aread()
                await response.aclose()
                self.lost += 1
                raise httpx.ReadError("connection reset after the server answered", request=request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_recovery_whose_answer_was_lost_is_retried_with_its_key_and_answers_the_first(base_url, account, pool):
    """The first answer is lost after the server replayed: the SDK retries with the same generated
    key and gets the first call's replays (Idempotent-Replayed), not a 409; each dead delivery was
    replayed once and charged once."""
    _, key = account
    lossy = _LoseFirstRecoverAnswer()
    http = httpx.AsyncClient(base_url=base_url, headers=transport.default_headers(key), transport=lossy)
    naps: list[float] = []

    async def nap(seconds: float) -> None:
        naps.append(seconds)

    async with AsyncClient(base_url, key, retry_policy=RetryPolicy(retries=2), sleep=nap, http_client=http) as sdk:
        endpoint = await sdk.endpoints.create("https://example.com/recover-lost")
        dead = await _dead(sdk, pool, endpoint.id, 2)
        balance = (await sdk.balance()).balance
        recovered = await sdk.endpoints.recover(endpoint.id, SINCE, confirm_total=4)
        assert lossy.lost == 1 and len(naps) == 1 and len(set(lossy.keys)) == 1 and len(lossy.keys) == 2
        assert recovered.idempotent_replayed and recovered.idempotency_key == lossy.keys[0]
        assert {r.dead_delivery_id for r in recovered.replayed} == set(dead)
        assert (await sdk.balance()).balance == balance - 4
    replays = await pool.fetchval("SELECT count(*) FROM messages WHERE idempotency_key = ANY($1::text[])",
                                  [f"replay:{d}" for d in dead])
    assert replays == 2 and (await audit(pool)).clean


async def test_the_blocking_client_plans_and_recovers(base_url, account, sdk, pool):
    """Client (sync), run in a thread so the loop keeps serving: the same plan and recovery."""
    _, key = account
    endpoint = await sdk.endpoints.create("https://example.com/recover-sync")
    dead = await _dead(sdk, pool, endpoint.id, 2)

    def blocking() -> tuple[RecoverPlan, Recovered]:
        with Client(base_url, key, retries=0) as client:
            plan = client.endpoints.recover_plan(endpoint.id, SINCE.isoformat())
            return plan, client.endpoints.recover(endpoint.id, SINCE, plan.until, confirm_total=plan.total_charge,
                                                  idempotency_key="sync-1")

    plan, recovered = await asyncio.to_thread(blocking)
    assert (plan.count, plan.total_charge) == (2, 4)
    assert {r.dead_delivery_id for r in recovered.replayed} == set(dead) and recovered.idempotency_key == "sync-1"
    assert recovered.until == plan.until and recovered.total_charged == 4
