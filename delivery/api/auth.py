"""Who is asking: `Authorization: Bearer <key>`, an account key or the operator key.

Account keys are looked up by hash and cached in memory for `auth_cache_ttl_ms` (30 s by default; the hot
ingest path would otherwise pay a query per request). Revoking a key drops it from this
process's cache at once; other API processes notice within the TTL. Unknown keys are never
cached. The operator key comes from configuration and is compared in constant time.
"""

from __future__ import annotations

import hmac
import time
import uuid

import asyncpg
from aiohttp import web

from delivery.api import api_keys
from delivery.api.problems import Problem

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
        self._cache: dict[bytes, tuple[uuid.UUID, float]] = {}

    def forget(self, digest: bytes) -> None:
        self._cache.pop(digest, None)

    def _bearer(self, request: web.Request) -> bytes:
        header = request.headers.get("Authorization")
        if not header:
            raise _unauthorized("send Authorization: Bearer <api key>")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key or len(key) > api_keys.KEY_LENGTH_MAX:
            raise _unauthorized("the Authorization header must be Bearer <api key>")
        return api_keys.key_hash(key)

    def is_operator(self, digest: bytes) -> bool:
        return hmac.compare_digest(digest, self._operator_hash)

    async def account(self, request: web.Request) -> uuid.UUID:
        """The account whose key signed this request; 401 without one, 403 for the operator key."""
        digest = self._bearer(request)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and cached[1] > now:
            return cached[0]
        if self.is_operator(digest):
            raise Problem(403, "this route needs an account API key, not the operator key", "forbidden")
        account_id = await api_keys.account_of_key(self._pool, digest)
        if account_id is None:
            raise _unauthorized("the API key is not valid")
        if self._ttl_seconds > 0:
            if len(self._cache) >= CACHED_KEYS_MAX:
                self._cache.clear()
            self._cache[digest] = (account_id, now + self._ttl_seconds)
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
