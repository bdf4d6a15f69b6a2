"""The SDK's operational webhooks: operational endpoints, operational events, the low balance threshold.

    client.operational.create_endpoint(url, event_types=[...])  -> OperationalEndpointCreated (with its secret)
    client.operational.events(type="balance.low")               -> Page[OperationalEvent], oldest first
    client.operational.set_low_balance_threshold(100)           -> Account

The same builders serve the sync and the async client (`Operational`, `AsyncOperational`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import msgspec

from delivery.client import models
from delivery.client.calls import (UNSET, Call, Id, _json, update_own_account, _keyed, _params, _reads, _reads_list, _reads_nothing,
                                   _reads_secret, _segment, key_or_new)


class OperationalEndpoint(msgspec.Struct, frozen=True):
    id: uuid.UUID
    url: str
    description: str
    event_types: tuple[str, ...] | None
    enabled: bool
    created_at: datetime
    updated_at: datetime
    disabled_reason: str | None = None  # why the worker switched it off (410 Gone, failing); None otherwise


class OperationalEndpointCreated(msgspec.Struct, frozen=True):
    endpoint: OperationalEndpoint
    secret: str  # the whsec_ secret its webhooks are signed with


class OperationalEvent(msgspec.Struct, frozen=True):
    """An event as its webhook carries it; `id` is the webhook-id it is sent under."""
    id: uuid.UUID
    seq: int
    type: str
    timestamp: datetime
    data: dict[str, Any]


_PATH = "/v1/operational-endpoints"


def create_endpoint(url: str, *, description: str, event_types: Sequence[str] | None, enabled: bool,
                    secret: str | None, idempotency_key: str) -> Call[OperationalEndpointCreated]:
    body = _json({"url": url, "description": description, "enabled": enabled,
                  "event_types": list(event_types) if event_types is not None else UNSET,
                  "secret": secret if secret is not None else UNSET})
    # Keyed, so a retry answers the first create instead of making a second endpoint (each event sent twice).
    return Call("POST", _PATH, True, _reads(OperationalEndpointCreated), body=body, headers=_keyed(idempotency_key))


def list_endpoints() -> Call[tuple[OperationalEndpoint, ...]]:
    return Call("GET", _PATH, True, _reads_list(OperationalEndpoint))


def get_endpoint(endpoint_id: Id) -> Call[OperationalEndpoint]:
    return Call("GET", f"{_PATH}/{_segment(endpoint_id)}", True, _reads(OperationalEndpoint))


def update_endpoint(endpoint_id: Id, changes: dict[str, Any]) -> Call[OperationalEndpoint]:
    fields = {name: (list(value) if name == "event_types" and value is not None and value is not UNSET else value)
              for name, value in changes.items()}
    return Call("PATCH", f"{_PATH}/{_segment(endpoint_id)}", True, _reads(OperationalEndpoint), body=_json(fields))


def delete_endpoint(endpoint_id: Id) -> Call[None]:
    return Call("DELETE", f"{_PATH}/{_segment(endpoint_id)}", True, _reads_nothing)


def get_secret(endpoint_id: Id) -> Call[str]:
    return Call("GET", f"{_PATH}/{_segment(endpoint_id)}/secret", True, _reads_secret)


def events(limit: int | None, cursor: str | None, event_type: str | None) -> Call[models.Page[OperationalEvent]]:
    return Call("GET", "/v1/operational-events", True, _reads(models.Page[OperationalEvent]),
                params=_params(limit=limit, cursor=cursor, type=event_type))


def get_event(event_id: Id) -> Call[OperationalEvent]:
    return Call("GET", f"/v1/operational-events/{_segment(event_id)}", True, _reads(OperationalEvent))


def set_low_balance_threshold(threshold: int | None) -> Call[models.Account]:
    return update_own_account(low_balance_threshold=threshold)


class Operational:
    """`client.operational` of the sync client."""

    def __init__(self, client: Any) -> None:
        self._run = client._run

    def create_endpoint(self, url: str, *, description: str = "", event_types: Sequence[str] | None = None,
                        enabled: bool = True, secret: str | None = None,
                        idempotency_key: str | None = None) -> OperationalEndpointCreated:
        """`event_types` None: every operational event type; `secret` None: one is made (answered here).
        Keyed (one is generated unless given) and retried with that key."""
        return self._run(create_endpoint(url, description=description, event_types=event_types, enabled=enabled,
                                         secret=secret, idempotency_key=key_or_new(idempotency_key)))

    def list_endpoints(self) -> tuple[OperationalEndpoint, ...]:
        return self._run(list_endpoints())

    def get_endpoint(self, endpoint_id: Id) -> OperationalEndpoint:
        return self._run(get_endpoint(endpoint_id))

    def update_endpoint(self, endpoint_id: Id, *, url: str = UNSET, description: str = UNSET,
                        event_types: Sequence[str] | None = UNSET, enabled: bool = UNSET) -> OperationalEndpoint:
        return self._run(update_endpoint(endpoint_id, dict(url=url, description=description, event_types=event_types,
                                                           enabled=enabled)))

    def delete_endpoint(self, endpoint_id: Id) -> None:
        return self._run(delete_endpoint(endpoint_id))

    def get_secret(self, endpoint_id: Id) -> str:
        return self._run(get_secret(endpoint_id))

    def events(self, *, limit: int | None = None, cursor: str | None = None,
               type: str | None = None) -> models.Page[OperationalEvent]:  # noqa: A002 - the API's name
        """One page of the account's operational events, oldest first."""
        return self._run(events(limit, cursor, type))

    def iterate_events(self, *, page_size: int | None = None, type: str | None = None) -> Iterator[OperationalEvent]:  # noqa: A002
        cursor = None
        while True:  # ends: each cursor is a later seq, and the last page has none
            page = self.events(limit=page_size, cursor=cursor, type=type)
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_event(self, event_id: Id) -> OperationalEvent:
        return self._run(get_event(event_id))

    def set_low_balance_threshold(self, threshold: int | None) -> models.Account:
        """balance.low once when the balance falls below `threshold`; None turns it off."""
        return self._run(set_low_balance_threshold(threshold))


class AsyncOperational:
    """`client.operational` of the async client."""

    def __init__(self, client: Any) -> None:
        self._run = client._run

    async def create_endpoint(self, url: str, *, description: str = "", event_types: Sequence[str] | None = None,
                              enabled: bool = True, secret: str | None = None,
                              idempotency_key: str | None = None) -> OperationalEndpointCreated:
        return await self._run(create_endpoint(url, description=description, event_types=event_types,
                                               enabled=enabled, secret=secret,
                                               idempotency_key=key_or_new(idempotency_key)))

    async def list_endpoints(self) -> tuple[OperationalEndpoint, ...]:
        return await self._run(list_endpoints())

    async def get_endpoint(self, endpoint_id: Id) -> OperationalEndpoint:
        return await self._run(get_endpoint(endpoint_id))

    async def update_endpoint(self, endpoint_id: Id, *, url: str = UNSET, description: str = UNSET,
                              event_types: Sequence[str] | None = UNSET, enabled: bool = UNSET) -> OperationalEndpoint:
        return await self._run(update_endpoint(endpoint_id, dict(url=url, description=description,
                                                                 event_types=event_types, enabled=enabled)))

    async def delete_endpoint(self, endpoint_id: Id) -> None:
        return await self._run(delete_endpoint(endpoint_id))

    async def get_secret(self, endpoint_id: Id) -> str:
        return await self._run(get_secret(endpoint_id))

    async def events(self, *, limit: int | None = None, cursor: str | None = None,
                     type: str | None = None) -> models.Page[OperationalEvent]:  # noqa: A002
        return await self._run(events(limit, cursor, type))

    async def iterate_events(self, *, page_size: int | None = None,
                             type: str | None = None) -> AsyncIterator[OperationalEvent]:  # noqa: A002
        cursor = None
        while True:
            page = await self.events(limit=page_size, cursor=cursor, type=type)
            for event in page.data:
                yield event
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_event(self, event_id: Id) -> OperationalEvent:
        return await self._run(get_event(event_id))

    async def set_low_balance_threshold(self, threshold: int | None) -> models.Account:
        return await self._run(set_low_balance_threshold(threshold))
