"""Endpoints that keep failing are disabled (with the reason stored); one success resets the streak."""

from __future__ import annotations

from billing.messages import MessageRequest, create_messages
from delivery.engine.endpoint_health import EndpointHealth
from delivery.engine.retry import AutoDisablePolicy
from engine_helpers import add_account, add_endpoint


async def _attempts(pool, account_id, endpoint_id, history: list[tuple[str, int]]) -> None:
    """One delivery per (age, status) pair, with one recorded attempt that finished that long ago."""
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in history], attempts_max=8)
    for (age, status), message in zip(history, created):
        (delivery,) = [d for d in message.deliveries if d.endpoint_id == endpoint_id]
        await pool.execute(
            "INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, finished_at, status_code)"
            " VALUES ($1, 1, $2, now() - $3::text::interval, now() - $3::text::interval, $4)",
            delivery.id, account_id, age, status)


async def test_an_endpoint_failing_for_five_days_is_disabled_with_its_reason(pool, keyring, receiver_factory):
    """Failures from 6 days ago to now, none succeeded: disabled, and the stored reason says why."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    await _attempts(pool, account_id, endpoint_id, [("6 days", 500), ("3 days", 503), ("1 minute", 500)])
    assert await EndpointHealth(pool, AutoDisablePolicy()).check_failing(account_id, endpoint_id) is True
    row = await pool.fetchrow("SELECT enabled, disabled_reason FROM endpoints WHERE id = $1", endpoint_id)
    assert row["enabled"] is False and "3 failures" in row["disabled_reason"]


async def test_a_success_resets_the_streak_and_a_short_streak_disables_nothing(pool, keyring, receiver_factory):
    """A success 2 days ago leaves a 2-day streak (under 5 days): still enabled. So is a fresh endpoint."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    await _attempts(pool, account_id, endpoint_id,
                    [("6 days", 500), ("2 days", 200), ("1 day", 500), ("1 minute", 500)])
    health = EndpointHealth(pool, AutoDisablePolicy())
    assert await health.check_failing(account_id, endpoint_id) is False
    assert await pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1", endpoint_id) is True
