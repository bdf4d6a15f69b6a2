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
_REDIS_PROCESSING = b"processing"
_REDIS_DONE = b"done"


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to "first time?"; for a repeat, whether the first copy is still in progress."""

    first: bool
    in_progress: bool = False
    # The PostgreSQL connection whose transaction holds the claim (PostgreSQL store only).
    connection: Any = None


class DedupeStore(Protocol):
    async def claim(self, webhook_id: str) -> bool:
        """True the first time `webhook_id` is claimed, False while a claim on it is kept."""

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
    """Gives a store with claim/complete/release the `claimed()` scope the receiver uses."""

    async def claim(self, webhook_id: str) -> bool:
        raise NotImplementedError

    async def complete(self, webhook_id: str) -> None:
        raise NotImplementedError

    async def release(self, webhook_id: str) -> None:
        raise NotImplementedError

    async def is_complete(self, webhook_id: str) -> bool:
        raise NotImplementedError

    @asynccontextmanager
    async def claimed(self, webhook_id: str) -> AsyncIterator[Claim]:
        if not await self.claim(webhook_id):
            yield Claim(first=False, in_progress=not await self.is_complete(webhook_id))
            return
        try:
            yield Claim(first=True)
        except BaseException:
            # Cancellation counts as failure too: the work may not have happened.
            await self.release(webhook_id)
            raise
        await self.complete(webhook_id)


class MemoryDedupeStore(ReleasingStore):
    """One process's memory: bounded by `capacity`, entries expire, least recently seen go first.

    Not shared between processes, and lost on restart: use it for one-process receivers and
    tests. Past `capacity`, the oldest ids are forgotten before their time, so size it above
    your peak rate times `retention_seconds` if duplicates must be caught for the whole period.
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
        # id -> (expiry on `clock`, completed); order is least recently seen first.
        self._entries: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, webhook_id: str) -> bool:
        # No await in here: on one event loop, the check and the mark cannot interleave.
        now = self._clock()
        self._remove_expired(now)
        if self._live_entry(webhook_id, now) is not None:
            self._entries.move_to_end(webhook_id)
            return False
        self._remember(webhook_id, now + self._processing_seconds, completed=False)
        return True

    async def complete(self, webhook_id: str) -> None:
        self._remember(webhook_id, self._clock() + self._retention_seconds, completed=True)

    async def release(self, webhook_id: str) -> None:
        self._entries.pop(webhook_id, None)

    async def is_complete(self, webhook_id: str) -> bool:
        entry = self._live_entry(webhook_id, self._clock())
        return entry is not None and entry[1]

    def _live_entry(self, webhook_id: str, now: float) -> tuple[float, bool] | None:
        entry = self._entries.get(webhook_id)
        return entry if entry is not None and entry[0] > now else None

    def _remember(self, webhook_id: str, expiry: float, *, completed: bool) -> None:
        self._entries[webhook_id] = (expiry, completed)
        self._entries.move_to_end(webhook_id)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def _remove_expired(self, now: float) -> None:
        # Recently seen entries move to the end, so the front is mostly, not strictly, the
        # earliest to expire; an expired entry behind a live one is caught by `_live_entry`.
        for _ in range(MEMORY_EXPIRED_REMOVED_PER_CLAIM_MAX):
            if not self._entries:
                return
            oldest_id, (expiry, _completed) = next(iter(self._entries.items()))
            if expiry > now:
                return
            del self._entries[oldest_id]


class RedisDedupeStore(ReleasingStore):
    """Shared by every receiver process: `SET key processing NX EX seconds`, one round trip.

    `client` is a `redis.asyncio.Redis`. The claim and the receiver's own writes commit
    separately: a crash after the work but before `complete` means the work runs again once the
    processing claim lapses. When that matters, use the PostgreSQL store.
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

    async def claim(self, webhook_id: str) -> bool:
        key = self._key_prefix + webhook_id
        was_set = await self._client.set(key, _REDIS_PROCESSING, nx=True, ex=self._processing_seconds)
        return bool(was_set)

    async def complete(self, webhook_id: str) -> None:
        await self._client.set(self._key_prefix + webhook_id, _REDIS_DONE, ex=self._retention_seconds)

    async def release(self, webhook_id: str) -> None:
        await self._client.delete(self._key_prefix + webhook_id)

    async def is_complete(self, webhook_id: str) -> bool:
        value = await self._client.get(self._key_prefix + webhook_id)
        # A client made with decode_responses=True answers text instead of bytes.
        return value in (_REDIS_DONE, _REDIS_DONE.decode("ascii"))
