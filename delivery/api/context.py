"""What every handler needs, kept on the application under one typed key."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web

from delivery.api.application_uids import ApplicationUids
from delivery.api.auth import Authenticator
from delivery.api.event_catalog import EventCatalog
from delivery.api.group_commit import Coalescer
from delivery.engine.queue import Queue
from delivery.engine.ssrf import AddressPolicy
from signing import Keyring

if TYPE_CHECKING:  # built by delivery.platform.web_app, which sits above the API
    from delivery.platform.config import Settings


@dataclass
class ApiContext:
    settings: "Settings"
    pool: asyncpg.Pool
    queue: Queue | None
    keyring: Keyring
    policy: AddressPolicy
    auth: Authenticator
    coalescer: Coalescer
    catalog: EventCatalog  # the accounts' event catalogs, for the create path
    uids: ApplicationUids  # application uid -> id, for sends by uid

    async def account(self, request: web.Request) -> uuid.UUID:
        return await self.auth.account(request)

    async def operator(self, request: web.Request) -> None:
        await self.auth.operator(request)


CONTEXT = web.AppKey("hookledger", ApiContext)


def context(request: web.Request) -> ApiContext:
    return request.app[CONTEXT]
