"""DELETE /v1/accounts/{id} starts the deletion job on the worker; GET .../deletion shows its progress and report."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from billing.audit import audit
from delivery.platform.worker import build_worker


@contextlib.asynccontextmanager
async def _worker(settings, pool):
    worker = build_worker(settings, settings.redis.url, handle_signals=False, pool=pool)
    task = asyncio.create_task(worker.async_run())
    try:
        yield
    finally:
        # As the worker process stops: its poll loop ends first (cancelled), then close() runs.
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.5)
        try:
            await worker.close()
        finally:
            # Cancelled is how it is meant to end; an exception (it crashed mid-test) fails the test.
            if not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"the worker ended with {task.exception()!r}") from task.exception()


async def test_operator_deletes_an_account_and_reads_the_report(api):
    """202 with the job; the worker refunds every live delivery once, closes out the balance, revokes the
    keys; the report says what was refunded and what is owed to the customer; the audit is clean."""
    account_id, headers = await api.account(balance=50, price=2)
    await api.endpoint(headers)
    await api.endpoint(headers)
    for number in range(3):
        assert (await api.send(headers, payload={"n": number})).status == 202
    async with _worker(api.settings, api.pool):
        response = await api.client.delete(f"/v1/accounts/{account_id}", headers=api.operator)
        assert response.status == 202, await response.text()
        assert response.headers["Location"] == f"/v1/accounts/{account_id}/deletion"
        deadline = time.monotonic() + 30
        while True:
            state = await (await api.client.get(f"/v1/accounts/{account_id}/deletion", headers=api.operator)).json()
            if state["status"] != "running" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert state["status"] == "done", state
    report = state["report"]
    assert report["refunded"] == 6 and report["refunded_credits"] == 12
    assert report["owed_to_customer"] == 50
    account = await api.pool.fetchrow("SELECT status, balance FROM accounts WHERE id = $1", account_id)
    assert (account["status"], account["balance"]) == ("deleted", 0)
    # Keys are revoked in the database (API processes drop cached keys within auth_cache_ttl_ms).
    assert await api.pool.fetchval("SELECT bool_and(revoked_at IS NOT NULL) FROM api_keys WHERE account_id = $1",
                                   account_id)
    assert (await audit(api.pool)).clean


async def test_deletion_routes_refuse_account_keys_and_unknown_accounts(api):
    """An account key may not delete (403); an unknown or malformed id answers 404 and writes nothing."""
    account_id, headers = await api.account(balance=5)
    before = await api.snapshot()
    assert (await api.client.delete(f"/v1/accounts/{account_id}", headers=headers)).status == 403
    assert (await api.client.delete(f"/v1/accounts/{uuid.uuid4()}", headers=api.operator)).status == 404
    assert (await api.client.delete("/v1/accounts/not-an-id", headers=api.operator)).status == 404
    assert (await api.client.get(f"/v1/accounts/{account_id}/deletion", headers=api.operator)).status == 404
    assert (await api.client.delete(f"/v1/accounts/{account_id}")).status == 401
    assert await api.snapshot() == before
