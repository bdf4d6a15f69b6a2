"""billing.database.ask_within: the asker's deadline holds even when the abandoned call's cleanup
does not end (a pooled connection's reset on a server that stopped answering); asyncio.wait_for,
which it replaced, waits for that cleanup."""

from __future__ import annotations

import asyncio

import pytest

from billing.database import ask_within


async def _stuck_call(cleanup_started: asyncio.Event, release: asyncio.Event) -> str:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cleanup_started.set()
        await release.wait()  # a cleanup that waits on a silent server
        raise
    return "never"


async def test_the_deadline_holds_when_the_abandoned_calls_cleanup_hangs():
    cleanup_started, release = asyncio.Event(), asyncio.Event()
    with pytest.raises(asyncio.TimeoutError):
        await ask_within(_stuck_call(cleanup_started, release), 0.05)
    await asyncio.sleep(0)
    assert cleanup_started.is_set() and not release.is_set()  # returned while the cleanup still waits
    # asyncio.wait_for, for contrast, is still waiting on the same kind of call.
    second_started, second_release = asyncio.Event(), asyncio.Event()
    waiting = asyncio.ensure_future(asyncio.wait_for(_stuck_call(second_started, second_release), 0.05))
    await second_started.wait()
    await asyncio.sleep(0.05)
    assert not waiting.done()
    second_release.set()
    release.set()
    with pytest.raises(asyncio.TimeoutError):
        await waiting


async def test_an_answer_in_time_is_returned_and_an_error_raised():
    async def answer() -> int:
        return 7

    async def fail() -> int:
        raise ValueError("no")

    assert await ask_within(answer(), 1) == 7
    with pytest.raises(ValueError):
        await ask_within(fail(), 1)
