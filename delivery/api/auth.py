"""Who is asking: `Authorization: Bearer <key>`, an account key or the operator key.

Account keys are looked up by hash and cached in memory for `auth_cache_ttl_ms` (30 s by default; the hot
ingest path would otherwise pay a query per request). Every revocation, whichever process or
path commits it, reaches every API process at once: a trigger on api_keys NOTIFYs at commit
(billing.tables.KEY_REVOKED_CHANNEL) and the process's listener (delivery.api.cache_notices)
drops the key from the cache.
While that listening connection is down the cache is emptied and the TTL is the bound again.
Unknown keys are never cached. The operator key comes from configuration and is compared in
constant time.

A key's lookups are single-flight: the requests that find it missing or expired at once (a hot
key's whole concurrency, every TTL) wait on one query, not one each on the pool the group commit
needs. A key in use is looked up again in the background in the last quarter of its TTL, while
its entry, still within the TTL, keeps answering; so a busy key never expires on the hot path,
and no entry answers past its TTL, as before. A lookup during which any revocation was heard
answers the requests that were waiting on it but caches nothing, and the requests that come
after the revocation do not join it: it may have read the key before that revocation committed,
and its notice, already handled, would not come again to drop it.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
import uuid

import asyncpg
from aiohttp import web

from billing.tables import KEY_REVOKED_CHANNEL
from delivery.api import api_keys
from delivery.api.problems import Problem

logger = logging.getLogger(__name__)
CACHED_KEYS_MAX = 100_000
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="hookledger"'}


def _unauthorized(detail: str) -> Problem:
    return Problem(401, detail, "unauthorized", headers=dict(_CHALLENGE))


class Authenticator:
    def __init__(self, pool: asyncpg.Pool, operator_key: str, cache_ttl_ms: int) -> None:
        assert operator_key, "an operator key is required"
        self._pool = pool
        self._operator_hash = api_keys.key_hash(operator_key)
        self._ttl_seconds = cache_ttl_ms / 1000
        self._refresh_within = self._ttl_seconds / 4  # a key in use is looked up again this close to expiry
        self._cache: dict[bytes, tuple[uuid.UUID, float]] = {}
        self._lookups: dict[bytes, asyncio.Task] = {}  # digest -> its one lookup in flight
        self._forgotten = 0  # revocations heard and cache clears: a lookup across one caches nothing

    def forget(self, digest: bytes) -> None:
        """Drop the key, and its lookup in flight from those that come next: that lookup may have
        read the key before the revocation, and its answer is for the requests that came before."""
        self._forgotten += 1
        self._cache.pop(digest, None)
        self._lookups.pop(digest, None)

    def clear(self) -> None:
        """Forget every key: a revocation may have gone by unheard."""
        self._forgotten += 1
        self._cache.clear()
        self._lookups.clear()

    def _on_revoked(self, connection, pid: int, channel: str, payload: str) -> None:
        try:
            self.forget(bytes.fromhex(payload))
        except ValueError:
            logger.warning("ignored a malformed key revocation notice: %r", payload[:80])

    def listeners(self) -> dict[str, object]:
        """The channel revocations are heard on, with its asyncpg listener."""
        return {KEY_REVOKED_CHANNEL: self._on_revoked}

    def _bearer(self, request: web.Request) -> bytes:
        header = request.headers.get("Authorization")
        if not header:
            raise _unauthorized("send Authorization: Bearer <api key>")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key or len(key) > api_keys.KEY_LENGTH_MAX:
            raise _unauthorized("the Authorization header must be Bearer <api key>")
        return api_keys.key_hash(key)

    def digest(self, request: web.Request) -> bytes:
        """The SHA-256 of the request's bearer key (401 without one): to name the key that did something."""
        return self._bearer(request)

    def is_operator(self, digest: bytes) -> bool:
        return hmac.compare_digest(digest, self._operator_hash)

    async def account(self, request: web.Request) -> uuid.UUID:
        """The account whose key signed this request; 401 without one, 403 for the operator key."""
        digest = self._bearer(request)
        cached = self._cache.get(digest)
        if cached is not None:
            account_id, expires = cached
            left = expires - time.monotonic()
            if left > 0:
                if left < self._refresh_within and digest not in self._lookups:
                    self._start_lookup(digest)  # in the background: this request answers from the cache
                return account_id
        if self.is_operator(digest):
            raise Problem(403, "this route needs an account API key, not the operator key", "forbidden")
        if self._ttl_seconds > 0:
            # Shielded: a request whose client went away must not cancel the lookup others wait on.
            account_id = await asyncio.shield(self._lookups.get(digest) or self._start_lookup(digest))
        else:  # no cache: every request asks the database itself
            account_id = await api_keys.account_of_key(self._pool, digest)
        if account_id is None:
            raise _unauthorized("the API key is not valid")
        return account_id

    def _start_lookup(self, digest: bytes) -> asyncio.Task:
        """The key's one lookup, started now; it caches what it finds and leaves _lookups when done."""
        task = asyncio.get_running_loop().create_task(self._fetch_and_cache(digest))
        self._lookups[digest] = task
        task.add_done_callback(functools.partial(self._lookup_done, digest))
        return task

    def _lookup_done(self, digest: bytes, task: asyncio.Task) -> None:
        if self._lookups.get(digest) is task:
            del self._lookups[digest]
        if not task.cancelled() and task.exception() is not None:
            # Its waiters, if any, have it; a background refresh that failed (the database away)
            # leaves the entry to expire, and the next request then looks the key up itself.
            logger.debug("a key lookup failed: %r", task.exception())

    async def _fetch_and_cache(self, digest: bytes) -> uuid.UUID | None:
        forgotten = self._forgotten
        account_id = await api_keys.account_of_key(self._pool, digest)
        if account_id is None:
            self._cache.pop(digest, None)  # revoked or unknown: a background refresh drops its entry
        elif forgotten == self._forgotten:
            if len(self._cache) >= CACHED_KEYS_MAX and digest not in self._cache:
                self._cache.clear()
            self._cache[digest] = (account_id, time.monotonic() + self._ttl_seconds)
        return account_id

    async def operator(self, request: web.Request) -> None:
        """Pass only the operator key: 401 without a valid key, 403 for an account key."""
        digest = self._bearer(request)
        if self.is_operator(digest):
            return
        known = digest in self._cache or await api_keys.account_of_key(self._pool, digest) is not None
        if known:
            raise Problem(403, "this route is for the operator", "forbidden")
        raise _unauthorized("the API key is not valid")


