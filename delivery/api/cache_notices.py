"""Every cache an API process keeps hears, at commit, of the changes made through any process.

The process keeps API keys (delivery.api.auth), accounts' event catalogs (delivery.api.event_catalog)
and application uids (delivery.api.application_uids). Each change to what they hold NOTIFYs a
channel of its own, with the key or account it concerns; one pooled connection per process LISTENs
on all of those channels (billing.database.listen_forever), and each notice drops what it names
from its cache. Whenever that connection starts or stops listening every cache is emptied, since a
notice may have gone by unheard; each cache's TTL bounds an entry's age in any case.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import asyncpg

from billing.database import listen_forever


class Heard(Protocol):
    """A cache that notices keep fresh."""

    def listeners(self) -> dict[str, Callable]:
        """Its channels, each with the asyncpg listener that drops what a notice names."""

    def clear(self) -> None:
        """Forget everything."""


async def listen(pool: asyncpg.Pool, caches: Sequence[Heard]) -> None:
    """Hold one pooled connection LISTENing on every cache's channels until cancelled; listen again
    when it drops, emptying every cache whenever listening starts or stops."""
    listeners: dict[str, Callable] = {}
    for cache in caches:
        channels = cache.listeners()
        assert not set(channels) & set(listeners), "two caches on one channel"
        listeners.update(channels)

    def clear_all() -> None:
        for cache in caches:
            cache.clear()

    await listen_forever(pool, listeners, on_unheard=clear_all, what="API cache notices")
