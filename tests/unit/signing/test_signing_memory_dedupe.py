"""The in-memory dedupe store: first-time answers, expiry, the capacity bound, and claim scopes."""

from __future__ import annotations

import pytest

from signing.dedupe import MemoryDedupeStore


class FakeClock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


async def test_first_claim_is_true_and_repeats_are_false():
    """Only the first claim of an id answers "first time"."""
    store = MemoryDedupeStore()
    assert await store.claim("a") is True
    assert await store.claim("a") is False
    assert await store.claim("b") is True


async def test_processing_claims_lapse_and_completed_ones_last_the_retention():
    """An unfinished claim lapses after `processing_seconds`; a completed one after `retention_seconds`."""
    clock = FakeClock()
    store = MemoryDedupeStore(processing_seconds=10, retention_seconds=100, clock=clock)
    assert await store.claim("crashed")
    clock.seconds = 11
    assert await store.claim("crashed"), "a crashed receiver's claim must not block the id forever"
    await store.complete("crashed")
    clock.seconds = 100
    assert not await store.claim("crashed") and await store.is_complete("crashed")
    clock.seconds = 112
    assert await store.claim("crashed")


async def test_capacity_evicts_the_least_recently_seen_completed_id():
    """Past `capacity`, the completed id seen longest ago is forgotten first; a repeat counts as seen."""
    store = MemoryDedupeStore(capacity=2)
    for webhook_id in ("a", "b"):
        assert await store.claim(webhook_id)
        await store.complete(webhook_id)
    assert not await store.claim("a")  # "a" is now more recently seen than "b"
    assert await store.claim("c")
    assert len(store) == 2
    assert not await store.claim("a") and await store.is_complete("a")
    await store.complete("c")
    assert await store.claim("b"), "b was least recently seen and so was evicted"


async def test_a_full_store_keeps_its_claims_in_progress_and_refuses_new_ids_as_in_progress():
    """Claims in progress are never evicted: with the store full of them, a new id is refused as
    in progress (the receiver's 409, so the sender retries), and a copy of a claimed id still
    learns it is in progress; once one completes, its place can be taken."""
    store = MemoryDedupeStore(capacity=2)
    assert await store.claim("a") and await store.claim("b")
    async with store.claimed("c") as refused:
        assert not refused.first and refused.in_progress
    async with store.claimed("a") as copy:
        assert not copy.first and copy.in_progress
    assert len(store) == 2
    await store.complete("a")
    assert await store.claim("c"), "the completed id makes room"
    assert not await store.claim("b"), "b is still in progress"


async def test_claimed_scope_completes_on_success_and_releases_on_failure():
    """A scope that exits normally completes the claim; one that raises releases it."""
    store = MemoryDedupeStore()
    with pytest.raises(RuntimeError):
        async with store.claimed("id") as claim:
            assert claim.first
            raise RuntimeError("handler failed")
    async with store.claimed("id") as claim:
        assert claim.first, "the failed attempt must not leave the id marked"
    async with store.claimed("id") as claim:
        assert not claim.first and not claim.in_progress


async def test_a_repeat_during_processing_is_reported_in_progress():
    """While the first copy is still being processed, a second copy learns it is in progress."""
    store = MemoryDedupeStore()
    async with store.claimed("id") as first:
        async with store.claimed("id") as second:
            assert first.first and not second.first and second.in_progress


async def _overlap(*, first_fails: bool, second_fails: bool) -> tuple[MemoryDedupeStore, tuple[bool, bool]]:
    """Copy A claims and its claim lapses; copy B claims the id; A ends (fails or succeeds) while B
    still runs and a third copy claims; then B ends. Returns the store and what the third copy was told."""
    clock = FakeClock()
    store = MemoryDedupeStore(processing_seconds=10, clock=clock)
    scope_a = store.claimed("evt")
    assert (await scope_a.__aenter__()).first
    clock.seconds = 11
    scope_b = store.claimed("evt")
    assert (await scope_b.__aenter__()).first, "A's claim lapsed, so B takes the id over"
    if first_fails:
        assert not await scope_a.__aexit__(RuntimeError, RuntimeError("A fails after its claim lapsed"), None)
    else:
        await scope_a.__aexit__(None, None, None)
    async with store.claimed("evt") as copy_c:
        third = (copy_c.first, copy_c.in_progress)
    if second_fails:
        assert not await scope_b.__aexit__(RuntimeError, RuntimeError("B fails"), None)
    else:
        await scope_b.__aexit__(None, None, None)
    return store, third


async def test_a_lapsed_copy_that_fails_leaves_the_claim_of_the_copy_that_took_over():
    """A's failure must not forget B's claim: a third copy is told "in progress" instead of
    running beside B, and B's success is kept."""
    store, third = await _overlap(first_fails=True, second_fails=False)
    assert third == (False, True)
    assert await store.is_complete("evt")


async def test_a_lapsed_copy_that_succeeds_stays_done_when_the_copy_that_took_over_fails():
    """A's processing succeeded, so the id is done; B's later failure must not forget that, or the
    sender's next retry would process the webhook a third time."""
    store, third = await _overlap(first_fails=False, second_fails=True)
    assert third == (False, False)
    assert await store.is_complete("evt")
