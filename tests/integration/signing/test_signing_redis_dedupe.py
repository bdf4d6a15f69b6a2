"""The Redis dedupe store on a real server: NX claims, lifetimes, release (fenced by each claim's
token), and text clients."""

from __future__ import annotations

import asyncio

from signing.dedupe import RedisDedupeStore


async def test_concurrent_claims_of_one_id_succeed_once(redis_client):
    """50 simultaneous claims of one id on real Redis: exactly one is "first time"."""
    store = RedisDedupeStore(redis_client)
    results = await asyncio.gather(*(store.claim("evt_race") for _ in range(50)))
    assert results.count(True) == 1


async def test_claim_lives_for_processing_then_completion_keeps_it_for_retention(redis_client):
    """A claim expires after `processing_seconds`; `complete` extends it to `retention_seconds`."""
    store = RedisDedupeStore(redis_client, key_prefix="test:", processing_seconds=30, retention_seconds=3600)
    assert await store.claim("evt_ttl")
    assert 0 < await redis_client.ttl("test:evt_ttl") <= 30
    assert not await store.is_complete("evt_ttl")
    await store.complete("evt_ttl")
    assert 30 < await redis_client.ttl("test:evt_ttl") <= 3600
    assert await store.is_complete("evt_ttl")


async def test_release_lets_the_next_claim_through(redis_client):
    """After `release`, the same id is "first time" again (the sender's retry is processed)."""
    store = RedisDedupeStore(redis_client)
    assert await store.claim("evt_release")
    await store.release("evt_release")
    assert await store.claim("evt_release")


async def test_a_client_decoding_responses_to_text_works_too(redis_url):
    """Receivers often create their client with decode_responses=True; completion is still seen."""
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        store = RedisDedupeStore(client)
        assert await store.claim("evt_text")
        await store.complete("evt_text")
        assert await store.is_complete("evt_text")
    finally:
        await client.aclose()



async def lapse(redis_client, key: str) -> None:
    """Ends a processing claim as `processing_seconds` would, without waiting for it."""
    await redis_client.pexpire(key, 1)
    while await redis_client.exists(key):
        await asyncio.sleep(0.005)


async def overlap(store, redis_client, *, first_fails: bool, second_fails: bool) -> list[tuple[bool, bool]]:
    """Copy A claims, its claim lapses, copy B claims the id; then A ends (fails or succeeds) while
    B still runs, and a third copy claims; then B ends. Returns what the third copy was told."""
    a_lapsed, b_claimed, a_ended = asyncio.Event(), asyncio.Event(), asyncio.Event()
    third = []

    async def copy_a() -> None:
        async with store.claimed("evt_lapsed") as claim:
            assert claim.first
            await lapse(redis_client, "test:evt_lapsed")
            a_lapsed.set()
            await b_claimed.wait()
            if first_fails:
                raise RuntimeError("copy A fails after its claim lapsed")

    async def copy_b() -> None:
        await a_lapsed.wait()
        async with store.claimed("evt_lapsed") as claim:
            assert claim.first
            b_claimed.set()
            await a_ended.wait()
            async with store.claimed("evt_lapsed") as copy_c:
                third.append((copy_c.first, copy_c.in_progress))
            if second_fails:
                raise RuntimeError("copy B fails")

    task_b = asyncio.create_task(copy_b())
    try:
        await copy_a()
    except RuntimeError:
        assert first_fails
    a_ended.set()
    try:
        await task_b
    except RuntimeError:
        assert second_fails
    return third


async def test_a_lapsed_copy_that_fails_leaves_the_claim_of_the_copy_that_took_over(redis_client):
    """A's release must not delete B's claim: a third copy is told "in progress" instead of
    running beside B, and B's success is kept."""
    store = RedisDedupeStore(redis_client, key_prefix="test:")
    assert await overlap(store, redis_client, first_fails=True, second_fails=False) == [(False, True)]
    assert await store.is_complete("evt_lapsed")


async def test_a_lapsed_copy_that_succeeds_stays_done_when_the_copy_that_took_over_fails(redis_client):
    """A's processing succeeded, so the id is done; B's later failure must not delete that mark,
    or the sender's next retry would process the webhook a third time."""
    store = RedisDedupeStore(redis_client, key_prefix="test:")
    assert await overlap(store, redis_client, first_fails=False, second_fails=True) == [(False, False)]
    assert await store.is_complete("evt_lapsed")
    assert not await store.claim("evt_lapsed")
