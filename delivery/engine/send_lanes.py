"""Which send runs next: the sender's three bounds (per endpoint, per host, in all) as one scheduler.

Pure bookkeeping, no I/O. The sender offers every send; `offer` says whether it may start now.
When a send ends, `finish` frees its slot and returns the send that takes the slot over (already
counted as running), or None. The sender's runner then goes straight on with that send, so a
backlog of thousands costs no task, no semaphore waiter and no wake-up per send: a gather of
tasks queued on three semaphores cost the worker about a third more CPU per send than this.

The rules:
- at most `per_endpoint` sends of one endpoint run at once (fewer while `limit_of` says so: an
  endpoint slowed down by delivery.engine.backpressure), at most `per_host` to one host and
  port, at most `total` in all;
- sends of one endpoint start in the order they were offered;
- endpoints of one host take turns, and so do hosts that wait for a slot of the total bound;
- a slot is never left free while a send that its bounds allow is waiting (`check` asserts it).
Endpoints and hosts with nothing running and nothing waiting are forgotten at once, so the maps
hold at most one entry per pending send.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class _Endpoint:
    __slots__ = ("key", "host", "waiting", "running", "listed")

    def __init__(self, key: Hashable, host: _Host) -> None:
        self.key = key  # the endpoint's own key, without the host
        self.host = host
        self.waiting: collections.deque = collections.deque()
        self.running = 0
        self.listed = False  # in host.ready


class _Host:
    __slots__ = ("key", "ready", "running", "listed")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.ready: collections.deque[_Endpoint] = collections.deque()  # endpoints with a send their bound allows
        self.running = 0
        self.listed = False  # in Lanes._blocked


class Lanes(Generic[Item]):
    def __init__(self, *, per_endpoint: int, per_host: int, total: int,
                 limit_of: Callable[[Hashable], int] | None = None) -> None:
        if min(per_endpoint, per_host, total) < 1:
            raise ValueError("every bound must be at least 1")
        self._per_endpoint = per_endpoint
        # An endpoint's own bound now (at most per_endpoint); when it grows, call next_allowed.
        self._limit_of = limit_of
        self._per_host = per_host
        self._total = total
        self._endpoints: dict[Hashable, _Endpoint] = {}
        self._hosts: dict[Hashable, _Host] = {}
        # Hosts with a ready endpoint and room under their own bound: they wait for the total bound.
        self._blocked: collections.deque[_Host] = collections.deque()
        self.running = 0
        self.waiting = 0

    @property
    def endpoints(self) -> int:
        """Endpoints with a send running or waiting."""
        return len(self._endpoints)

    def offer(self, endpoint_key: Hashable, host_key: Hashable, item: Item) -> bool:
        """True: the send may start now (it counts as running). False: it waits its turn."""
        host = self._hosts.get(host_key)
        if host is None:
            host = self._hosts[host_key] = _Host(host_key)
        # Keyed with the host: an endpoint whose URL changes while its sends are out has two lanes
        # for a while, each within the bounds.
        endpoint = self._endpoints.get((endpoint_key, host_key))
        if endpoint is None:
            endpoint = self._endpoints[(endpoint_key, host_key)] = _Endpoint(endpoint_key, host)
        if (not endpoint.waiting and endpoint.running < self._bound(endpoint) and host.running < self._per_host
                and self.running < self._total):
            self._start(endpoint)
            return True
        endpoint.waiting.append(item)
        self.waiting += 1
        self._list(endpoint)
        return False

    def finish(self, endpoint_key: Hashable, host_key: Hashable) -> tuple[Hashable, Hashable, Item] | None:
        """Free the slot of a send of this endpoint and host that ended; (endpoint key, host key,
        item) of the send that now runs in its place, or None when nothing waiting may start."""
        endpoint = self._endpoints.get((endpoint_key, host_key))
        if endpoint is None or endpoint.running < 1:
            raise ValueError(f"no send of endpoint {endpoint_key!r} to {host_key!r} is running")
        host = endpoint.host
        endpoint.running -= 1
        host.running -= 1
        self.running -= 1
        self._list(endpoint)
        chosen = self._next()
        self._forget(endpoint)
        return chosen

    def next_allowed(self) -> tuple[Hashable, Hashable, Item] | None:
        """A waiting send that its bounds allow now, counted as running (call until None after an
        endpoint's bound grew); None when there is none."""
        for endpoint in self._endpoints.values():
            if endpoint.waiting and not endpoint.listed:
                self._list(endpoint)
        return self._next()

    def _bound(self, endpoint: _Endpoint) -> int:
        if self._limit_of is None:
            return self._per_endpoint
        return min(self._per_endpoint, self._limit_of(endpoint.key))

    def _start(self, endpoint: _Endpoint) -> None:
        endpoint.running += 1
        endpoint.host.running += 1
        self.running += 1

    def _list(self, endpoint: _Endpoint) -> None:
        """Put the endpoint in its host's turn, and the host in the total bound's turn, when they may go."""
        host = endpoint.host
        if endpoint.waiting and endpoint.running < self._bound(endpoint) and not endpoint.listed:
            endpoint.listed = True
            host.ready.append(endpoint)
        if host.ready and host.running < self._per_host and not host.listed:
            host.listed = True
            self._blocked.append(host)

    def _next(self) -> tuple[Hashable, Hashable, Item] | None:
        while self._blocked and self.running < self._total:
            host = self._blocked.popleft()
            host.listed = False
            endpoint = self._ready_endpoint(host) if host.running < self._per_host else None
            if endpoint is None:
                continue  # listed again when one of its sends ends
            item = endpoint.waiting.popleft()
            self.waiting -= 1
            self._start(endpoint)
            self._list(endpoint)  # to the back of its host's turn, and the host to the back of the total's
            return endpoint.key, host.key, item
        return None

    def _ready_endpoint(self, host: _Host) -> _Endpoint | None:
        """The host's next endpoint in turn that its own bound allows (one whose bound shrank
        since it was listed leaves the turn, listed again when one of its sends ends)."""
        while host.ready:
            endpoint = host.ready.popleft()
            endpoint.listed = False
            if endpoint.running < self._bound(endpoint):
                return endpoint
        return None

    def _forget(self, endpoint: _Endpoint) -> None:
        if endpoint.running == 0 and not endpoint.waiting:
            del self._endpoints[(endpoint.key, endpoint.host.key)]
            host = endpoint.host
            if host.running == 0 and not host.ready:
                del self._hosts[host.key]

    def drain(self) -> list[Item]:
        """Every waiting send, in no particular order, removed (for a sender that is closing)."""
        items = [item for endpoint in self._endpoints.values() for item in endpoint.waiting]
        self._blocked.clear()
        for host in self._hosts.values():
            host.ready.clear()
            host.listed = False
        for endpoint in list(self._endpoints.values()):
            endpoint.waiting.clear()
            endpoint.listed = False
            self._forget(endpoint)
        self.waiting = 0
        return items

    def check(self) -> None:
        """Assert the bounds and that no slot is left free while an allowed send waits (for tests)."""
        assert 0 <= self.running <= self._total
        assert self.running == sum(host.running for host in self._hosts.values())
        assert self.waiting == sum(len(endpoint.waiting) for endpoint in self._endpoints.values())
        for endpoint in self._endpoints.values():
            assert 0 <= endpoint.running <= self._per_endpoint
            assert endpoint.running or endpoint.waiting, "an idle endpoint was kept"
            allowed = (endpoint.waiting and endpoint.running < self._bound(endpoint)
                       and endpoint.host.running < self._per_host and self.running < self._total)
            assert not allowed, f"endpoint {endpoint.key!r} waits although its bounds allow a send"
        for host in self._hosts.values():
            assert 0 <= host.running <= self._per_host
            assert host.running == sum(e.running for e in self._endpoints.values() if e.host is host)
