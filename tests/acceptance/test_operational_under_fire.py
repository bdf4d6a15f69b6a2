"""Operational events survive a killed worker and a PostgreSQL restart while they are due.

A real worker process is SIGKILLed mid-send of an operational event; PostgreSQL (an embedded one
of the test's own) restarts while events wait; more causes happen after it. A second worker then
sends them all: every event arrives (a receiver may see the one cut off twice, under the same
webhook-id), verified with the standardwebhooks library, and the database holds each event once
and one delivery of it."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from billing import accounts
from billing.audit import audit
from billing.database import create_pool
from delivery.platform import migrate, services
from engine_helpers import add_account, fast_environment, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_worker_processes import start_worker, stop, worker_log  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "engine"))
from operational_helpers import (add_operational_endpoint, all_received, check_each_received_once,  # noqa: E402
                                 start_operational_receiver)

pytestmark = pytest.mark.slow
TOPUPS_BEFORE = 6
TOPUPS_AFTER = 4


async def test_a_killed_worker_and_a_postgresql_restart_lose_and_double_no_event(redis_url, keyring, tmp_path):
    data_dir = tmp_path / "pg"
    server_url = services.start_embedded_postgres(data_dir, delete_on_exit=True)
    await migrate.upgrade_async(server_url)
    pool = await create_pool(server_url, size_min=1, size_max=4)
    first_request = asyncio.Event()

    def stall_first(number):
        if number == 1:
            first_request.set()
            return asyncio.sleep(30, result=204)  # cut off by the kill: never answered to that worker
        return 204

    runners: list = []
    receiver = await start_operational_receiver(runners, behaviour=stall_first)
    environment = fast_environment(server_url, redis_url, keyring, HOOKLEDGER_LEASE_MS="3500")
    worker = successor = None
    try:
        account_id = await add_account(pool, balance=0)
        await add_operational_endpoint(pool, account_id, receiver, keyring)
        for number in range(TOPUPS_BEFORE):
            await accounts.top_up(pool, account_id, f"before-{number}", 10)
        worker = start_worker(environment)
        await asyncio.wait_for(first_request.wait(), 30)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        await pool.close()
        await asyncio.to_thread(services.restart_embedded_postgres, data_dir)
        pool = await create_pool(server_url, size_min=1, size_max=4)
        for number in range(TOPUPS_AFTER):
            await accounts.top_up(pool, account_id, f"after-{number}", 10)
        successor = start_worker(environment)
        await wait_for(lambda: all_received(pool, account_id, receiver), timeout_seconds=60)
        events = await pool.fetch("SELECT id, data->>'order_id' AS order_id FROM operational_events"
                                  " WHERE account_id = $1", account_id)
        assert sorted(event["order_id"] for event in events) == sorted(
            [f"before-{n}" for n in range(TOPUPS_BEFORE)] + [f"after-{n}" for n in range(TOPUPS_AFTER)])
        await check_each_received_once(pool, account_id, receiver)
        per_event = await pool.fetch("SELECT event_id, count(*) AS n FROM operational_deliveries GROUP BY event_id")
        assert len(per_event) == len(events) and {row["n"] for row in per_event} == {1}
        # The one cut off was received again under the same webhook-id (receivers dedupe on it).
        ids = [entry["webhook_id"] for entry in receiver.received]
        assert len(set(ids)) == len(events) and ids.count(ids[0]) >= 2
        assert (await audit(pool)).clean
    except AssertionError:
        if successor is not None:
            print(worker_log(successor))
        raise
    finally:
        for process in (worker, successor):
            if process is not None:
                stop(process)
        await pool.close()
        for runner in runners:
            await runner.cleanup()
