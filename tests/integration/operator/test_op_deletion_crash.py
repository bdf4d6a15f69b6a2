"""Account deletion killed after every step (in a subprocess, os._exit like SIGKILL), then run again."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from billing.errors import AccountNotActive
from billing.messages import MessageRequest, create_message
from delivery.operations import deletion
from operator_helpers import (add_endpoint, assert_audit_clean, balance_and_ledger, claim, create_many, make_account,
                              refunds_per_delivery)

LIVE = 60


async def _run_cli(database_url: str, account_id, *, crash_after: str | None) -> int:
    environment = {**os.environ, "DATABASE_URL": database_url}
    environment.pop(deletion.CRASH_AFTER_STEP_VARIABLE, None)
    if crash_after:
        environment[deletion.CRASH_AFTER_STEP_VARIABLE] = crash_after
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "delivery", "accounts", "delete", str(account_id), "--inline", "--yes",
        env=environment, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode in (0, 137), output.decode()
    return process.returncode


@pytest.mark.parametrize("step", deletion.STEPS)
async def test_crash_after_each_step_then_rerun(pool, database_url, step):
    """Killed right after `step` committed, a re-run finishes: every live delivery refunded exactly once,
    the balance closed out to zero, the report counts every settled delivery once, the audit clean."""
    account_id = await make_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id)
    live = await create_many(pool, account_id, endpoint_id, LIVE)
    await claim(pool, live[:20])  # some are `sending` with a lease
    assert await _run_cli(database_url, account_id, crash_after=step) == 137
    state = await deletion.read_deletion(pool, account_id)
    assert (state.status, state.step) == ("running", step)

    assert await _run_cli(database_url, account_id, crash_after=None) == 0
    state = await deletion.read_deletion(pool, account_id)
    assert state.status == "done"
    assert (state.report["locked"], state.report["refunded"], state.report["marked_dead"]) == (LIVE, LIVE, LIVE)
    assert state.report["refunded_credits"] == LIVE * 5
    assert state.report["owed_to_customer"] == 1000
    steps = [entry["step"] for entry in state.report["steps"]]
    assert set(steps) == set(deletion.STEPS) and steps[-1] == "report"
    assert await refunds_per_delivery(pool, account_id) == {"dead:1": LIVE}
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)
    with pytest.raises(AccountNotActive):
        await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    # A third run changes nothing.
    assert await _run_cli(database_url, account_id, crash_after=None) == 0
    assert await refunds_per_delivery(pool, account_id) == {"dead:1": LIVE}
