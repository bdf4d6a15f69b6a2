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


async def test_capacity_evicts_the_least_recently_seen_id():
    """Past `capacity`, the id seen longest ago is forgotten first; a repeat counts as seen."""
    store = MemoryDedupeStore(capacity=2)
    assert await store.claim("a") and await store.claim("b")
    assert not await store.claim("a")  # "a" is now more recently seen than "b"
    assert await store.claim("c")
    assert len(store) == 2
    assert not await store.claim("a")
    assert await store.claim("b"), "b was least recently seen and so was evicted"


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
