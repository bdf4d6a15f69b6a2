"""Receiver-side deduplication on `webhook-id`: process each webhook once, however often it comes.

A sender retries until it sees a 2xx, so a receiver sees the same id again whenever a response
is lost. Every store answers `claim(id)`: "is this the first time?" A claim then ends one of
two ways: `complete(id)` when processing succeeded, kept for the retention period so later
copies are answered 200 without processing; or `release(id)` when processing failed, so the
sender's retry is processed. `claimed()` wraps processing and does the right one.

While a claim is in progress (not yet completed), another copy of the id is *not* a finished
duplicate: answering it 200 would tell the sender "delivered" although the first copy may
still fail. The receiver answers such a copy 409 with Retry-After, so the sender tries again.
A claim in progress expires after `processing_seconds`, so a receiver that crashed mid-way
does not block the id for the whole retention period.

This module holds the in-memory store (one process) and the Redis store (many processes);
`signing.dedupe_postgres` holds the PostgreSQL one, which commits the claim together with the
receiver's own writes and so gives exactly-once processing.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

# Long enough to cover a sender's whole retry schedule (Standard Webhooks suggests about three
# days), because a retry keeps the id but carries a fresh timestamp.
RETENTION_SECONDS_DEFAULT = 7 * 24 * 3600
# Longer than any handler should run; after it, a crashed receiver's claim lapses.
PROCESSING_SECONDS_DEFAULT = 120
MEMORY_CAPACITY_DEFAULT = 100_000
# Expired entries removed per claim, so one claim never stalls the event loop on a big sweep.
MEMORY_EXPIRED_REMOVED_PER_CLAIM_MAX = 64
REDIS_KEY_PREFIX_DEFAULT = "webhook-receipt:"
REDIS_TOKEN_BYTES = 16
_REDIS_PROCESSING = b"processing"
_REDIS_DONE = b"done"
# Deletes KEYS[1] only while it holds ARGV[1], this claim's own value.
_REDIS_RELEASE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to "first time?"; for a repeat, whether the first copy is still in progress."""

    first: bool
    in_progress: bool = False
    # The PostgreSQL connection whose transaction holds the claim (PostgreSQL store only).
    connection: Any = None


class DedupeStore(Protocol):
    async def claim(self, webhook_id: str) -> bool:
        """True the first time `webhook_id` is claimed, False while a claim on it is kept.

        Also False when the store cannot take the claim now (the memory store full of claims
        in progress); `is_complete` is then False, so the copy is answered as in progress.
        """

    async def complete(self, webhook_id: str) -> None:
        """Processing succeeded: keep the claim for the retention period."""

    async def release(self, webhook_id: str) -> None:
        """Processing failed: forget the claim, so the next delivery is processed."""

    async def is_complete(self, webhook_id: str) -> bool:
        """True when a claim on `webhook_id` was completed and is still kept."""


class ClaimScopes(Protocol):
    """What the aiohttp receiver needs: a claim that is undone when processing raises."""

    def claimed(self, webhook_id: str) -> AbstractAsyncContextManager[Claim]:
        """Yields a `Claim`; completes it on a normal exit, undoes it on an exception."""


class ReleasingStore:
    """Gives a store with claim/complete/release the `claimed()` scope the receiver uses.

    A store whose claims carry a token (so that undoing one cannot undo another copy's) overrides
    `_claim_held` and whichever of `_complete_held` and `_release_held` must check the token; the
    scope passes the token from the claim to its end.
    """

    async def claim(self, webhook_id: str) -> bool:
        raise NotImplementedError

    async def complete(self, webhook_id: str) -> None:
        raise NotImplementedError

    async def release(self, webhook_id: str) -> None:
        raise NotImplementedError

    async def is_complete(self, webhook_id: str) -> bool:
        raise NotImplementedError

    async def _claim_held(self, webhook_id: str) -> Any:
        """What a first-time claim holds until it ends; None when it is not the first time."""
        return True if await self.claim(webhook_id) else None

    async def _complete_held(self, webhook_id: str, held: Any) -> None:
        await self.complete(webhook_id)

    async def _release_held(self, webhook_id: str, held: Any) -> None:
        await self.release(webhook_id)

    @asynccontextmanager
    async def claimed(self, webhook_id: str) -> AsyncIterator[Claim]:
        held = await self._claim_held(webhook_id)
        if held is None:
            yield Claim(first=False, in_progress=not await self.is_complete(webhook_id))
            return
        try:
            yield Claim(first=True)
        except BaseException:
            # Cancellation counts as failure too: the work may not have happened.
            await self._release_held(webhook_id, held)
            raise
        await self._complete_held(webhook_id, held)


class MemoryDedupeStore(ReleasingStore):
    """One process's memory: bounded by `capacity`, entries expire, least recently seen go first.

    Not shared between processes, and lost on restart: use it for one-process receivers and
    tests. Past `capacity`, the least recently seen completed ids are forgotten before their time,
    so size it above your peak rate times `retention_seconds` if duplicates must be caught for the
    whole period. A claim in progress is never forgotten early: when every entry is one, a new id
    is not claimed (answered 409, like a copy in progress), so the sender retries it later.

    In `claimed()`, undoing a claim forgets the id only while that claim still holds it: a copy
    whose claim lapsed mid-way (`processing_seconds`) cannot forget the claim of the copy that took
    the id over, as in the Redis store. A claim's expiry is its token: the id can be claimed again
    only once the expiry has passed, so the next claim's expiry is later and never equal.
    """

    def __init__(
        self,
        *,
        capacity: int = MEMORY_CAPACITY_DEFAULT,
        retention_seconds: float = RETENTION_SECONDS_DEFAULT,
        processing_seconds: float = PROCESSING_SECONDS_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert capacity >= 1 and retention_seconds > 0 and processing_seconds > 0
        self._capacity = capacity
        self._retention_seconds = retention_seconds
        self._processing_seconds = processing_seconds
        self._clock = clock
        # id -> expiry on `clock`. Claims in progress are in the order they were made, so the
        # earliest to lapse comes first; completed ids are least recently seen first.
        self._in_progress: OrderedDict[str, float] = OrderedDict()
        self._completed: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._in_progress) + len(self._completed)

    async def claim(self, webhook_id: str) -> bool:
        # No await in here: on one event loop, the check and the mark cannot interleave.
        now = self._clock()
        _remove_expired(self._in_progress, now)
        _remove_expired(self._completed, now)
        if _is_live(self._in_progress, webhook_id, now):
            return False
        if _is_live(self._completed, webhook_id, now):
            self._completed.move_to_end(webhook_id)
            return False
        self._forget(webhook_id)
        if len(self) >= self._capacity:
            if not self._completed:
                return False
            self._completed.popitem(last=False)
        self._in_progress[webhook_id] = now + self._processing_seconds
        return True

    async def complete(self, webhook_id: str) -> None:
        self._forget(webhook_id)
        self._completed[webhook_id] = self._clock() + self._retention_seconds
        if len(self) > self._capacity:
            self._completed.popitem(last=False)

    async def release(self, webhook_id: str) -> None:
        self._forget(webhook_id)

    async def is_complete(self, webhook_id: str) -> bool:
        return _is_live(self._completed, webhook_id, self._clock())

    async def _claim_held(self, webhook_id: str) -> float | None:
        return self._in_progress[webhook_id] if await self.claim(webhook_id) else None

    async def _release_held(self, webhook_id: str, held: float) -> None:
        if self._in_progress.get(webhook_id) == held:
            del self._in_progress[webhook_id]

    def _forget(self, webhook_id: str) -> None:
        self._in_progress.pop(webhook_id, None)
        self._completed.pop(webhook_id, None)


def _is_live(entries: OrderedDict[str, float], webhook_id: str, now: float) -> bool:
    expiry = entries.get(webhook_id)
    return expiry is not None and expiry > now


def _remove_expired(entries: OrderedDict[str, float], now: float) -> None:
    # Recently seen completed ids move to the end, so there the front is mostly, not strictly,
    # the earliest to expire; an expired entry behind a live one is caught by `_is_live`.
    for _ in range(MEMORY_EXPIRED_REMOVED_PER_CLAIM_MAX):
        if not entries:
            return
        oldest_id, expiry = next(iter(entries.items()))
        if expiry > now:
            return
        del entries[oldest_id]


class RedisDedupeStore(ReleasingStore):
    """Shared by every receiver process: `SET key processing:<token> NX EX seconds`, one round trip.

    `client` is a `redis.asyncio.Redis`. The claim and the receiver's own writes commit
    separately: a crash after the work but before `complete` means the work runs again once the
    processing claim lapses. When that matters, use the PostgreSQL store.

    Each claim in `claimed()` carries a random token, and undoing it deletes the key only while it
    still holds that token (a Lua script, atomic in Redis): a copy whose claim lapsed mid-way
    cannot delete the claim of the copy that took the id over. Completing marks the id done
    whoever holds it, since this copy's processing did succeed. The plain `release(id)` and
    `complete(id)` carry no token and act on the key unconditionally.
    """

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = REDIS_KEY_PREFIX_DEFAULT,
        retention_seconds: int = RETENTION_SECONDS_DEFAULT,
        processing_seconds: int = PROCESSING_SECONDS_DEFAULT,
    ) -> None:
        assert retention_seconds >= 1 and processing_seconds >= 1
        self._client = client
        self._key_prefix = key_prefix
        self._retention_seconds = int(retention_seconds)
        self._processing_seconds = int(processing_seconds)
        self._release_if_held = client.register_script(_REDIS_RELEASE_IF_HELD)

    async def claim(self, webhook_id: str) -> bool:
        return await self._claim_held(webhook_id) is not None

    async def complete(self, webhook_id: str) -> None:
        await self._client.set(self._key_prefix + webhook_id, _REDIS_DONE, ex=self._retention_seconds)

    async def release(self, webhook_id: str) -> None:
        await self._client.delete(self._key_prefix + webhook_id)

    async def is_complete(self, webhook_id: str) -> bool:
        value = await self._client.get(self._key_prefix + webhook_id)
        # A client made with decode_responses=True answers text instead of bytes.
        return value in (_REDIS_DONE, _REDIS_DONE.decode("ascii"))

    async def _claim_held(self, webhook_id: str) -> bytes | None:
        held = _REDIS_PROCESSING + b":" + secrets.token_hex(REDIS_TOKEN_BYTES).encode("ascii")
        was_set = await self._client.set(self._key_prefix + webhook_id, held, nx=True, ex=self._processing_seconds)
        return held if was_set else None

    async def _release_held(self, webhook_id: str, held: bytes) -> None:
        await self._release_if_held(keys=[self._key_prefix + webhook_id], args=[held])
