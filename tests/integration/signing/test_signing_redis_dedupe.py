"""The Redis dedupe store on a real server: NX claims, lifetimes, release, and text clients."""

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
