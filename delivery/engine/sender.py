"""The sender: one HTTP attempt of one delivery, turned into a SendResult, never an exception.

No database and no queue here: the worker claims a delivery, builds a SendRequest (with the
Standard Webhooks headers already signed), awaits `Sender.send`, and records the result.
Network problems of every kind become a failed SendResult; only programmer errors raise.

The HTTP itself is one of two clients, SenderSettings.client: "wire" (delivery.engine.wire_pool,
a lean HTTP/1.1 client on asyncio.Protocol and httptools, the default) or "aiohttp"
(delivery.engine.sender_aiohttp, one pooled ClientSession, the fallback). Both answer a POST
with a send_outcome.Answer or a failure's text, the same texts from either.

This is the hot path of the throughput benchmark, so per-request work is kept small: parsed
URLs are reused from a bounded cache, and queued sends wait in send_lanes.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from yarl import URL

from delivery import event_loop, metrics
from delivery.engine import retry, ssrf
from delivery.engine.backpressure import Backpressure
from delivery.engine.send_lanes import Lanes
from delivery.engine.send_outcome import Answer, storable
from delivery.engine.send_outcome import bounded as _bounded
from delivery.engine.send_outcome import refusal_text as _refusal_text
from delivery.engine.sender_aiohttp import AiohttpClient
from delivery.engine.wire_pool import WireClient
from delivery.errors import InvalidEndpointUrlError, SenderOverloadedError, SenderSettingsError

try:
    VERSION = importlib.metadata.version("hookledger")
except importlib.metadata.PackageNotFoundError:  # Running from a source tree that was never installed.
    VERSION = "0.0.0"
USER_AGENT = f"hookledger/{VERSION}"
# On every request, beside the Standard Webhooks headers (identity: see auto_decompress below).
SESSION_HEADERS = {"content-type": "application/json", "user-agent": USER_AGENT, "accept-encoding": "identity"}

TIMEOUT_MS_MIN = 1_000
TIMEOUT_MS_MAX = 60_000
# delivery_attempts keeps at most this many characters of a response (its excerpt_length CHECK).
EXCERPT_BYTES_MAX_LIMIT = 4096
# Bound on the sender's cache of parsed URLs; emptied when full, which costs only a re-parse.
PARSED_URLS_MAX = 4096
# The HTTP clients SenderSettings.client names: the lean one (delivery.engine.wire_pool), and aiohttp's.
CLIENTS = ("wire", "aiohttp")


@dataclass(frozen=True)
class SenderSettings:
    """Everything the sender needs to know; one frozen value built from the environment.

    client is the HTTP client, one of CLIENTS: "wire" (the default) or "aiohttp".

    sends_pending_max bounds the sends queued or in flight at once (and so the sender's per-endpoint
    bookkeeping); the engine reserves room under it before each claim (delivery.engine.send_budget).
    """

    timeout_ms_default: int = 15_000
    timeout_ms_min: int = TIMEOUT_MS_MIN
    timeout_ms_max: int = TIMEOUT_MS_MAX
    excerpt_bytes_max: int = 4096
    connections_max: int = 256
    connections_per_host_max: int = 64
    sends_per_endpoint_max: int = 16
    sends_pending_max: int = 10_000
    allowed_networks: tuple[str, ...] = ()
    allow_loopback: bool = False
    client: str = "wire"
    address_policy: ssrf.AddressPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not TIMEOUT_MS_MIN <= self.timeout_ms_min <= self.timeout_ms_default <= self.timeout_ms_max <= TIMEOUT_MS_MAX:
            raise SenderSettingsError(
                f"need {TIMEOUT_MS_MIN} <= timeout_ms_min <= timeout_ms_default <= timeout_ms_max <= {TIMEOUT_MS_MAX}"
            )
        if self.client not in CLIENTS:
            raise SenderSettingsError(f"client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        for name, low, high in (
            ("excerpt_bytes_max", 0, EXCERPT_BYTES_MAX_LIMIT),
            ("connections_max", 1, 100_000),
            ("connections_per_host_max", 1, 100_000),
            ("sends_per_endpoint_max", 1, 100_000),
            ("sends_pending_max", 1, 1_000_000),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise SenderSettingsError(f"{name} must be {low} to {high}, got {value}")
        try:
            policy = ssrf.AddressPolicy.from_strings(self.allowed_networks, self.allow_loopback)
        except ValueError as error:
            raise SenderSettingsError(str(error)) from None
        object.__setattr__(self, "address_policy", policy)


class SendRequest(NamedTuple):
    """One attempt to send. headers are the caller's (Standard Webhooks), or a function that makes
    them as the send starts (the engine's: webhook-timestamp is then when the request left, not
    when it was queued behind its endpoint's other sends); the sender adds the rest.

    NamedTuples, not frozen dataclasses, for this and SendResult: one of each is made per send on
    the hot path, and a frozen dataclass pays an object.__setattr__ per field.
    """

    delivery_id: str
    attempt: int
    url: str
    body: bytes
    headers: Mapping[str, str] | Callable[[], Mapping[str, str]]
    timeout_ms: int
    endpoint_id: str
    # time.monotonic() by which the send must have ended (its lease's end, less a margin): one
    # still queued when its timeout no longer fits before then is not started (NOT_SENT_LATE).
    not_after: float | None = None


_Queued = tuple  # (SendRequest, URL, asyncio.Future[SendResult])


class SendResult(NamedTuple):
    """What happened. status_code is None when no response arrived; error then says why.

    A 2xx whose body broke off mid-read is still a success (the receiver accepted it), with
    the break noted in error.
    """

    status_code: int | None
    latency_ms: int
    error: str | None
    response_excerpt: str
    retry_after_seconds: float | None
    gone: bool
    success: bool
    # time.monotonic() when the request left and when its answer or error came in (0.0: never
    # sent); the engine records them as the attempt's started_at and finished_at.
    sent_at: float = 0.0
    answered_at: float = 0.0

    @property
    def outcome(self) -> retry.Outcome:
        return retry.classify(self.status_code)


# A send that waited in its endpoint's queue until it could no longer end before its not_after.
NOT_SENT_LATE = SendResult(None, 0, "not sent: it could not have ended within its lease", "", None, False, False)
NOT_SENT_HELD_ERROR = "not sent: held back (the endpoint is paused or at its rate limit)"


def not_sent_held(seconds: float) -> SendResult:
    """A send held back before it left (its endpoint paused, or at its rate limit): never on the
    wire, so it costs no attempt; retry_after_seconds says when to try it again."""
    return SendResult(None, 0, NOT_SENT_HELD_ERROR, "", seconds, False, False)


def was_held(result: SendResult) -> bool:
    return result.error is NOT_SENT_HELD_ERROR and not result.sent_at


class Client(Protocol):
    """What the sender asks of its HTTP client (wire_pool.WireClient, sender_aiohttp.AiohttpClient)."""

    @property
    def closed(self) -> bool: ...

    def post(self, url: URL, body: bytes, headers: Mapping[str, str], timeout_ms: int) -> Awaitable[Answer | str]: ...

    async def close(self) -> None: ...


def create_client(settings: SenderSettings) -> Client:
    """The HTTP client settings.client names, bounded by the settings' connection limits."""
    bounds = {"connections_max": settings.connections_max, "connections_per_host_max": settings.connections_per_host_max,
              "excerpt_bytes_max": settings.excerpt_bytes_max, "policy": settings.address_policy,
              "session_headers": SESSION_HEADERS}
    if settings.client == "aiohttp":
        return AiohttpClient(timeout_ms_default=settings.timeout_ms_default, **bounds)
    return WireClient(**bounds)


class Sender:
    """Sends attempts over one HTTP client's kept-alive connections, within the per-endpoint, per-host and total bounds.

    `submit` queues an attempt and returns a future of its SendResult; `send` awaits one. The
    attempts run in runner tasks that each go on with the next send their slot allows
    (send_lanes), so a worker with thousands of sends queued pays no task and no semaphore
    waiter per send. A caller that gives up (cancels its future) only unqueues a send that has
    not started; one already on the wire runs to its end or its timeout, and its result is
    dropped. `close` cancels the runners and every send still queued.
    """

    def __init__(self, settings: SenderSettings | None = None) -> None:
        self._settings = settings or SenderSettings()
        # Per endpoint: how many sends at once, and whether it is paused (Retry-After).
        self.backpressure = Backpressure(self._settings.sends_per_endpoint_max)
        self._policy = self._settings.address_policy
        self._client = create_client(self._settings)
        self._parsed_urls: dict[str, URL | str] = {}
        self._lanes: Lanes[_Queued] = Lanes(
            per_endpoint=self._settings.sends_per_endpoint_max,
            per_host=self._settings.connections_per_host_max,
            total=self._settings.connections_max,
            limit_of=self.backpressure.limit,
        )
        self._runners: set[asyncio.Task] = set()
        self._running_loop = event_loop.RunningLoop()
        # Sends allowed to start whose runner has not run yet; each runner takes one as it begins.
        # A runner cancelled before its first step leaves its send here, for close() to cancel.
        self._starting: collections.deque[tuple] = collections.deque()
        self._closing = False
        # Called as each send ends (delivery.engine.intake).
        self.on_send_end: Callable[[], None] | None = None

    async def close(self) -> None:
        self._closing = True
        for runner in list(self._runners):
            runner.cancel()
        await asyncio.gather(*self._runners, return_exceptions=True)
        while self._starting:
            self._abandon(self._starting.popleft())
        for _, _, future in self._lanes.drain():
            future.cancel()
        await self._client.close()

    @property
    def closed(self) -> bool:
        return self._client.closed

    @property
    def sends_pending_max(self) -> int:
        """How many sends may be queued or on the wire at once (submit refuses more)."""
        return self._settings.sends_pending_max

    @property
    def connections_max(self) -> int:
        return self._settings.connections_max

    @property
    def running(self) -> int:
        """Sends on the wire, or allowed to start and about to be."""
        return self._lanes.running

    @property
    def waiting(self) -> int:
        """Sends queued behind one of the bounds."""
        return self._lanes.waiting

    @property
    def pending(self) -> int:
        """Sends queued or on the wire."""
        return self._lanes.running + self._lanes.waiting

    @property
    def endpoints_pending(self) -> int:
        """Endpoints with a send queued or on the wire (the sender forgets idle ones at once)."""
        return self._lanes.endpoints

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exception_info: object) -> None:
        await self.close()

    async def send(self, request: SendRequest) -> SendResult:
        """Send one attempt; every network failure comes back as a failed SendResult."""
        return await self.submit(request)

    def submit(self, request: SendRequest) -> asyncio.Future[SendResult]:
        """Queue one attempt; the future's result is its SendResult, network failures included
        (only a bug in the sender sets an exception).

        Raises SenderOverloadedError when sends_pending_max sends are already pending.
        """
        if self._closing:
            raise RuntimeError("the sender is closed")
        if self.pending >= self._settings.sends_pending_max:
            raise SenderOverloadedError(f"{self.pending} sends pending")
        future: asyncio.Future[SendResult] = self._running_loop().create_future()
        url = self._checked_url(request.url)
        if isinstance(url, str):
            future.set_result(_failure(url, 0))
            return future
        # Queued here, on our own bounds, rather than inside the client: time spent waiting for a
        # connection would count against the attempt's timeout there (a send could time out
        # without ever leaving). The per-host bound is the client's, so a send that starts always
        # finds a connection.
        host = (url.raw_host, url.port)
        queued = (request, url, future)
        if self._lanes.offer(request.endpoint_id, host, queued):
            self._starting.append((request.endpoint_id, host, queued))
            runner = self._running_loop().create_task(self._run())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        return future

    async def _run(self) -> None:
        """Send, then go on with whatever the freed slot allows next, until nothing is waiting."""
        endpoint_id, host, queued = self._starting.popleft()
        while True:
            request, url, future = queued
            try:
                if not future.done():  # a caller that gave up before the send started
                    paused_for = self.backpressure.paused_for(endpoint_id)
                    if paused_for > 0:
                        result = not_sent_held(paused_for)
                        metrics.HELD_GIVEN_BACK.labels("paused").inc()
                    elif request.not_after is not None and not self._fits(request):
                        result = NOT_SENT_LATE
                    else:
                        result = await self._attempt(request, url)
                        if self.backpressure.observe(endpoint_id, result.status_code, result.error,
                                                     result.retry_after_seconds, result.sent_at):
                            self._start_allowed()
                    if not future.done():
                        future.set_result(result)
            except asyncio.CancelledError:
                # The sender is closing: this send and those its slot would have taken next end
                # here, their callers told so, and the bounds stay right.
                self._abandon((endpoint_id, host, queued))
                raise
            except Exception as error:  # a bug, not a network failure: its caller gets it; the runner goes on
                if not future.done():
                    future.set_exception(error)
            following = self._lanes.finish(endpoint_id, host)
            if self.on_send_end is not None:
                self.on_send_end()
            if following is None:
                return
            endpoint_id, host, queued = following

    def _start_allowed(self) -> None:
        """Start a runner for each waiting send that an endpoint's grown bound now allows."""
        while (allowed := self._lanes.next_allowed()) is not None:
            self._starting.append(allowed)
            runner = self._running_loop().create_task(self._run())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)

    def _abandon(self, following: tuple | None) -> None:
        """Cancel this counted-as-running send and every one its slot would take next, freeing the slots."""
        while following is not None:
            endpoint_id, host, (_, _, future) = following
            future.cancel()
            following = self._lanes.finish(endpoint_id, host)

    def _checked_url(self, raw_url: str) -> URL | str:
        """The parsed URL, or the error text when it is unparseable or its host is refused."""
        cached = self._parsed_urls.get(raw_url)
        if cached is not None:
            return cached
        try:
            url = URL(raw_url)
            if url.scheme not in ssrf.ALLOWED_SCHEMES or not url.raw_host:
                raise InvalidEndpointUrlError("not an http(s) URL with a host")
            refused = ssrf.host_refusal(url.raw_host, self._policy)
        except (ValueError, InvalidEndpointUrlError) as error:
            checked: URL | str = _bounded(f"invalid url: {error}")
        else:
            checked = url if refused is None else _refusal_text(refused)
        if len(self._parsed_urls) >= PARSED_URLS_MAX:
            self._parsed_urls.clear()
        self._parsed_urls[raw_url] = checked
        return checked

    def _fits(self, request: SendRequest) -> bool:
        """Whether the send, timing out at the latest, would still end by its not_after."""
        return time.monotonic() + self._timeout_ms(request.timeout_ms) / 1000 <= request.not_after

    def _timeout_ms(self, timeout_ms: int) -> int:
        settings = self._settings
        return min(max(timeout_ms, settings.timeout_ms_min), settings.timeout_ms_max)

    async def _attempt(self, request: SendRequest, url: URL) -> SendResult:
        timeout_ms = self._timeout_ms(request.timeout_ms)
        headers = request.headers
        if callable(headers):
            headers = headers()
        started = time.monotonic()
        answer = await self._client.post(url, request.body, headers, timeout_ms)
        answered = time.monotonic()
        result = _failure(answer, 0) if isinstance(answer, str) else _result_from(answer)
        # One reading of the clock for the latency and the answer's time, after the answer was read.
        return result._replace(latency_ms=round((answered - started) * 1000), sent_at=started, answered_at=answered)


def _result_from(answer: Answer) -> SendResult:
    """The SendResult of an answer whose head arrived. A 2xx whose body broke off is still a
    success (the receiver accepted it), with the break noted in error."""
    status_code = answer.status_code
    retry_after_seconds = None
    if status_code in retry.RETRY_AFTER_STATUSES:
        retry_after_seconds = retry.retry_after_for(status_code, answer.retry_after, retry.receiver_now(answer.date))
    success = 200 <= status_code <= 299
    error = answer.body_error
    if error is None and not success:
        error = _status_text(status_code, answer.reason)
    return SendResult(
        status_code=status_code,
        latency_ms=0,  # set by _attempt, with the times
        error=error,
        response_excerpt=storable(answer.excerpt.decode("utf-8", "replace")),
        retry_after_seconds=retry_after_seconds,
        gone=status_code == retry.GONE_STATUS,
        success=success,
    )


def _status_text(status_code: int, reason: str | None) -> str:
    text = f"http {status_code} {reason or ''}".rstrip()
    if 300 <= status_code <= 399:
        text += " (redirects are not followed)"
    return _bounded(text)


def _failure(error: str, latency_ms: int) -> SendResult:
    return SendResult(
        status_code=None,
        latency_ms=latency_ms,
        error=error,
        response_excerpt="",
        retry_after_seconds=None,
        gone=False,
        success=False,
    )
