"""Webhook receivers on loopback with programmed behaviour, each verifying and counting what arrives.

One aiohttp server per behaviour, each on its own port, so that the `down` receiver can really
stop listening (connection refused) and come back. An endpoint's URL names a key the receiver
knows the secret of (`/e/<key>`); the key is registered before the endpoint is created, so even
an endpoint whose creation answer was lost (an API killed mid-request) is verified.

Every request is verified with `signing.verify` and counted per webhook-id: received, valid,
and answered 2xx. An id answered 2xx more than once is a duplicate a real receiver must dedupe.
Every signed body is also read as the workload's payload (a JSON object with its `n` and `text`):
one that is not (empty, say) would be a delivery sent with an erased payload.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from signing import SigningError, verify

BEHAVIOURS = ("healthy", "flaky", "slow", "reset", "gone", "down")
FLAKY_FAILURE_SHARE = 0.3
SLOW_SHARE = 0.5  # of requests to the slow receiver, answered only after the send timeout
RESET_SHARE = 0.4  # of requests to the resetting receiver, answered with a TCP reset
RECEIPTS_TRACKED_MAX = 2_000_000  # a bound on the per-id table (the long run has 100,000 ids)


@dataclass
class Receipts:
    """What one webhook-id's requests looked like at the receivers."""

    received: int = 0
    valid: int = 0
    answered_2xx: int = 0


@dataclass
class ReceiverFarm:
    """The receivers of one chaos run and everything they counted."""

    rng: random.Random
    slow_seconds: float
    gone_after_seconds: float
    secrets: dict[str, str] = field(default_factory=dict)  # endpoint key -> whsec_ secret
    receipts: dict[str, Receipts] = field(default_factory=dict)
    answers: Counter = field(default_factory=Counter)  # (behaviour, answer) -> requests
    invalid: int = 0
    bodies_read: int = 0  # signed bodies read as the workload's payload
    bodies_not_sent_by_the_workload: int = 0  # of those, the ones that are not a payload it sent
    operational_keys: set[str] = field(default_factory=set)  # endpoint keys of operational endpoints
    ports: dict[str, int] = field(default_factory=dict)
    _runners: dict[str, web.AppRunner] = field(default_factory=dict)
    _sites: dict[str, web.TCPSite] = field(default_factory=dict)
    _started_at: float = 0.0

    def restart_clock(self) -> None:
        """The `gone` receiver's time starts now (when the workload starts, not at setup)."""
        self._started_at = asyncio.get_running_loop().time()

    def url(self, behaviour: str, key: str, secret: str, *, operational: bool = False) -> str:
        """An endpoint's URL on this receiver; `operational`: an operational endpoint's, whose bodies
        are events (checked by operational_checks), not the workload's payloads."""
        self.secrets[key] = secret
        if operational:
            self.operational_keys.add(key)
        return f"http://127.0.0.1:{self.ports[behaviour]}/e/{key}"

    async def start(self) -> None:
        self._started_at = asyncio.get_running_loop().time()
        for behaviour in BEHAVIOURS:
            app = web.Application()
            app.router.add_post("/e/{key}", self._handler(behaviour))
            runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", self.ports.get(behaviour, 0), reuse_address=True)
            await site.start()
            self.ports[behaviour] = runner.addresses[0][1]
            self._runners[behaviour], self._sites[behaviour] = runner, site

    async def take_down(self) -> None:
        """Stop listening on the `down` receiver's port: connections are refused until `bring_back`."""
        await self._sites["down"].stop()

    async def bring_back(self) -> None:
        site = web.TCPSite(self._runners["down"], "127.0.0.1", self.ports["down"], reuse_address=True)
        await site.start()
        self._sites["down"] = site

    async def stop(self) -> None:
        for runner in self._runners.values():
            await runner.cleanup()

    def _handler(self, behaviour: str):
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            webhook_id = request.headers.get("webhook-id", "")
            receipts = self._receipts(webhook_id)
            receipts.received += 1
            secret = self.secrets.get(request.match_info["key"])
            try:
                if secret is None:
                    raise SigningError("no secret registered for this endpoint key")
                verify(request.headers, body, secret)
                receipts.valid += 1
            except SigningError:
                self.invalid += 1
                return self._answer(behaviour, "401", web.Response(status=401))
            if request.match_info["key"] not in self.operational_keys:
                self._read_body(body)
            return await self._behave(behaviour, request, receipts)

        return handle

    def _read_body(self, body: bytes) -> None:
        self.bodies_read += 1
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not (isinstance(payload, dict) and isinstance(payload.get("n"), int) and payload.get("text")):
            self.bodies_not_sent_by_the_workload += 1

    def _receipts(self, webhook_id: str) -> Receipts:
        receipts = self.receipts.get(webhook_id)
        if receipts is None:
            if len(self.receipts) >= RECEIPTS_TRACKED_MAX:
                raise RuntimeError(f"more than {RECEIPTS_TRACKED_MAX} webhook ids received")
            receipts = self.receipts[webhook_id] = Receipts()
        return receipts

    async def _behave(self, behaviour: str, request: web.Request, receipts: Receipts) -> web.StreamResponse:
        draw = self.rng.random()
        if behaviour == "flaky" and draw < FLAKY_FAILURE_SHARE:
            return self._answer(behaviour, "503", web.Response(status=503))
        if behaviour == "slow" and draw < SLOW_SHARE:
            await asyncio.sleep(self.slow_seconds)  # past the sender's timeout: it has given up
        if behaviour == "reset" and draw < RESET_SHARE:
            _reset(request)
            return self._answer(behaviour, "reset", web.Response(status=200))
        elapsed = asyncio.get_running_loop().time() - self._started_at
        if behaviour == "gone" and elapsed > self.gone_after_seconds:
            return self._answer(behaviour, "410", web.Response(status=410))
        receipts.answered_2xx += 1
        return self._answer(behaviour, "200", web.Response(status=200, text="ok"))

    def _answer(self, behaviour: str, answer: str, response: web.StreamResponse) -> web.StreamResponse:
        self.answers[(behaviour, answer)] += 1
        return response

    def duplicates(self) -> tuple[int, int]:
        """(ids answered 2xx more than once, extra 2xx copies): what receivers had to dedupe."""
        repeated = [r.answered_2xx - 1 for r in self.receipts.values() if r.answered_2xx > 1]
        return len(repeated), sum(repeated)


def _reset(request: web.Request) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), before any response byte."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
