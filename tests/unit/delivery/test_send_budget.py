"""SendBudget: room for sends taken before a claim, waited for in order, never lost to a cancel."""

from __future__ import annotations

import asyncio

import pytest

from delivery.engine.send_budget import SendBudget


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_take_holds_room_until_it_is_given_back() -> None:
    budget = SendBudget(10)
    assert await budget.take(7) == 7 and budget.free == 3
    waiting = asyncio.create_task(budget.take(5))
    await _settle()
    assert not waiting.done()  # 5 do not fit in 3
    budget.give(2)  # a claim that filled only 5 of its 7 hands back the rest at once
    await _settle()
    assert waiting.done() and budget.free == 0
    budget.give(5)
    budget.give(5)
    assert budget.free == 10


async def test_waiters_are_served_in_order_so_a_large_one_is_not_starved() -> None:
    budget = SendBudget(10)
    await budget.take(8)
    served: list[str] = []

    async def take(name: str, count: int) -> None:
        await budget.take(count)
        served.append(name)

    large = asyncio.create_task(take("large", 9))
    await _settle()
    small = asyncio.create_task(take("small", 1))  # would fit in the 2 free, but waits its turn
    await _settle()
    assert served == []
    budget.give(8)
    await asyncio.gather(large, small)
    assert served == ["large", "small"] and budget.free == 0


async def test_a_cancelled_waiter_holds_nothing_and_lets_the_next_one_in() -> None:
    budget = SendBudget(10)
    await budget.take(5)
    blocked = asyncio.create_task(budget.take(10))
    await _settle()
    behind = asyncio.create_task(budget.take(5))
    await _settle()
    assert not behind.done()  # behind the large waiter, though it would fit
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)
    await _settle()
    assert behind.done() and budget.free == 0


async def test_room_granted_in_the_same_turn_as_a_cancel_is_handed_back() -> None:
    budget = SendBudget(4)
    await budget.take(4)
    waiter = asyncio.create_task(budget.take(3))
    await _settle()
    budget.give(4)  # grants the waiter its 3 ...
    waiter.cancel()  # ... and it is cancelled before it runs again
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled() and budget.free == 4


async def test_a_cancel_racing_a_give_neither_breaks_nor_leaks() -> None:
    """The waiter's future is cancelled, then room is given before its task runs again."""
    budget = SendBudget(4)
    await budget.take(4)
    first = asyncio.create_task(budget.take(2))
    second = asyncio.create_task(budget.take(2))
    await _settle()
    first.cancel()
    budget.give(4)  # first's future is already cancelled: skipped, second is served
    await asyncio.gather(first, second, return_exceptions=True)
    assert first.cancelled() and second.result() == 2 and budget.free == 2


@pytest.mark.parametrize("count", [-1, 11])
async def test_a_request_outside_the_budget_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        await SendBudget(10).take(count)


def test_giving_back_more_than_was_taken_is_refused() -> None:
    budget = SendBudget(3)
    with pytest.raises(ValueError, match="cannot give back"):
        budget.give(1)
    with pytest.raises(ValueError, match="at least one"):
        SendBudget(0)
