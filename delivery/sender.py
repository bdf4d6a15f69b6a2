"""The sender: one HTTP attempt of one delivery, turned into a SendResult, never an exception.

No database and no queue here: the worker claims a delivery, builds a SendRequest (with the
Standard Webhooks headers already signed), awaits `Sender.send`, and records the result.
Network problems of every kind become a failed SendResult; only programmer errors raise.

This is the hot path of the throughput benchmark, so per-request work is kept small: parsed
URLs, timeouts and endpoint gates are reused from bounded caches.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.metadata
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import NamedTuple

import aiohttp
from yarl import URL

from delivery import retry, ssrf
from delivery.errors import (
    AddressRefusedError,
    InvalidEndpointUrlError,
    SenderOverloadedError,
    SenderSettingsError,
)

try:
    VERSION = importlib.metadata.version("hookledger")
except importlib.metadata.PackageNotFoundError:  # Running from a source tree that was never installed.
    VERSION = "0.0.0"
USER_AGENT = f"hookledger/{VERSION}"
# On every request, beside the Standard Webhooks headers (identity: see auto_decompress below).
SESSION_HEADERS = {"content-type": "application/json", "user-agent": USER_AGENT, "accept-encoding": "identity"}

TIMEOUT_MS_MIN = 1_000
TIMEOUT_MS_MAX = 60_000
ERROR_CHARS_MAX = 512
# Bounds on the sender's own caches; each is emptied when full, which costs only a re-parse.
PARSED_URLS_MAX = 4096
TIMEOUTS_CACHED_MAX = 256
# How far the cause chain of an exception is followed when classifying it.
CAUSE_CHAIN_LINKS_MAX = 16


@dataclass(frozen=True)
class SenderSettings:
    """Everything the sender needs to know; one frozen value built from the environment.

    sends_pending_max bounds concurrent `send` calls (waiting or in flight) and so also the
    number of endpoint gates alive at once; the worker's own concurrency must stay below it.
    """

    timeout_ms_default: int = 15_000
    timeout_ms_min: int = TIMEOUT_MS_MIN
    timeout_ms_max: int = TIMEOUT_MS_MAX
    excerpt_bytes_max: int = 4096
    connections_max: int = 256
    connections_per_host_max: int = 64
    sends_per_endpoint_max: int = 16
    sends_pending_max: int = 10_000
    endpoint_gates_max: int = 10_000
    allowed_networks: tuple[str, ...] = ()
    allow_loopback: bool = False
    address_policy: ssrf.AddressPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not TIMEOUT_MS_MIN <= self.timeout_ms_min <= self.timeout_ms_default <= self.timeout_ms_max <= TIMEOUT_MS_MAX:
            raise SenderSettingsError(
                f"need {TIMEOUT_MS_MIN} <= timeout_ms_min <= timeout_ms_default <= timeout_ms_max <= {TIMEOUT_MS_MAX}"
            )
        for name, low, high in (
            ("excerpt_bytes_max", 0, 1 << 20),
            ("connections_max", 1, 100_000),
            ("connections_per_host_max", 1, 100_000),
            ("sends_per_endpoint_max", 1, 100_000),
            ("sends_pending_max", 1, 1_000_000),
            ("endpoint_gates_max", 1, 1_000_000),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise SenderSettingsError(f"{name} must be {low} to {high}, got {value}")
        if self.endpoint_gates_max < self.sends_pending_max:
            # Each pending send holds at most one gate, so this is what keeps the gate dict bounded.
            raise SenderSettingsError("endpoint_gates_max must be at least sends_pending_max")
        try:
            policy = ssrf.AddressPolicy.from_strings(self.allowed_networks, self.allow_loopback)
        except ValueError as error:
            raise SenderSettingsError(str(error)) from None
        object.__setattr__(self, "address_policy", policy)


class SendRequest(NamedTuple):
    """One attempt to send. headers are the caller's (Standard Webhooks); the sender adds the rest.

    NamedTuples, not frozen dataclasses, for this and SendResult: one of each is made per send on
    the hot path, and a frozen dataclass pays an object.__setattr__ per field.
    """

    delivery_id: str
    attempt: int
    url: str
    body: bytes
    headers: Mapping[str, str]
    timeout_ms: int
    endpoint_id: str


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

    @property
    def outcome(self) -> retry.Outcome:
        return retry.classify(self.status_code)


class _EndpointGate:
    """A per-endpoint concurrency bound, and how many sends hold it or wait for it."""

    __slots__ = ("semaphore", "users")

    def __init__(self, sends_max: int) -> None:
        self.semaphore = asyncio.Semaphore(sends_max)
        self.users = 0


class Sender:
    """Owns one aiohttp session; create it inside the running event loop and close it when done."""

    def __init__(self, settings: SenderSettings | None = None) -> None:
        self._settings = settings or SenderSettings()
        self._policy = self._settings.address_policy
        self._session = _create_session(self._settings)
        self._timeouts: dict[int, aiohttp.ClientTimeout] = {}
        self._parsed_urls: dict[str, URL | str] = {}
        self._gates: dict[str, _EndpointGate] = {}  # per endpoint
        self._host_gates: dict[tuple, _EndpointGate] = {}  # per (host, port): the connector's per-host limit
        self._connections = asyncio.Semaphore(self._settings.connections_max)
        self._sends_pending = 0

    async def close(self) -> None:
        await self._session.close()

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exception_info: object) -> None:
        await self.close()

    async def send(self, request: SendRequest) -> SendResult:
        """Send one attempt; every network failure comes back as a failed SendResult."""
        if self._sends_pending >= self._settings.sends_pending_max:
            raise SenderOverloadedError(f"{self._sends_pending} sends pending")
        url = self._checked_url(request.url)
        if isinstance(url, str):
            return _failure(url, 0)
        gate = self._gate(self._gates, request.endpoint_id, self._settings.sends_per_endpoint_max)
        host = self._gate(self._host_gates, (url.raw_host, url.port), self._settings.connections_per_host_max)
        gate.users += 1
        host.users += 1
        self._sends_pending += 1
        try:
            # Queue here, on our own bounds, rather than inside aiohttp's connector: time spent
            # waiting for a connection would count against the attempt's timeout there (a send
            # could time out without ever leaving), and each waiter there costs a timer. The
            # endpoint's bound comes first, so a slow endpoint only ever holds its own share.
            async with gate.semaphore, host.semaphore, self._connections:
                return await self._attempt(request, url)
        finally:
            gate.users -= 1
            host.users -= 1
            self._sends_pending -= 1

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

    def _gate(self, gates: dict, key: object, sends_max: int) -> _EndpointGate:
        gate = gates.get(key)
        if gate is None:
            if len(gates) >= self._settings.endpoint_gates_max:
                self._evict_idle_gates(gates)
            gate = gates[key] = _EndpointGate(sends_max)
        return gate

    def _evict_idle_gates(self, gates: dict) -> None:
        idle = [key for key, gate in gates.items() if gate.users == 0]
        for key in idle:
            del gates[key]
        # Busy gates are at most sends_pending_max <= endpoint_gates_max, and this send is not
        # counted yet, so there is room now; if not, the counting above is broken.
        assert len(gates) < self._settings.endpoint_gates_max, "gate accounting is broken"

    def _timeout(self, timeout_ms: int) -> tuple[int, aiohttp.ClientTimeout]:
        settings = self._settings
        bounded_ms = min(max(timeout_ms, settings.timeout_ms_min), settings.timeout_ms_max)
        timeout = self._timeouts.get(bounded_ms)
        if timeout is None:
            if len(self._timeouts) >= TIMEOUTS_CACHED_MAX:
                self._timeouts.clear()
            timeout = self._timeouts[bounded_ms] = aiohttp.ClientTimeout(total=bounded_ms / 1000)
        return bounded_ms, timeout

    async def _attempt(self, request: SendRequest, url: URL) -> SendResult:
        timeout_ms, timeout = self._timeout(request.timeout_ms)
        started = time.perf_counter()
        try:
            async with self._session.post(
                url, data=request.body, headers=request.headers, timeout=timeout, allow_redirects=False
            ) as response:
                return await self._result_from(response, started, timeout_ms)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as error:
            return _failure(describe_failure(error, timeout_ms), _elapsed_ms(started))

    async def _result_from(self, response: aiohttp.ClientResponse, started: float, timeout_ms: int) -> SendResult:
        status_code = response.status
        body_error = None
        chunks: list[bytes] = []
        try:
            complete = await _read_excerpt(response, self._settings.excerpt_bytes_max, chunks)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as error:
            complete = False
            body_error = "response body: " + describe_failure(error, timeout_ms)
        if not complete:
            # Do not wait for (or drain) the rest of a body we will not keep: drop the connection.
            response.close()
        retry_after_seconds = None
        if status_code in retry.RETRY_AFTER_STATUSES:
            header = response.headers.get("Retry-After")
            retry_after_seconds = retry.retry_after_for(status_code, header, datetime.now(timezone.utc))
        success = 200 <= status_code <= 299
        error = body_error
        if error is None and not success:
            error = _status_text(status_code, response.reason)
        return SendResult(
            status_code=status_code,
            latency_ms=_elapsed_ms(started),
            error=error,
            response_excerpt=b"".join(chunks).decode("utf-8", "replace"),
            retry_after_seconds=retry_after_seconds,
            gone=status_code == retry.GONE_STATUS,
            success=success,
        )


def _create_session(settings: SenderSettings) -> aiohttp.ClientSession:
    policy = settings.address_policy
    connector = aiohttp.TCPConnector(
        limit=settings.connections_max,
        limit_per_host=settings.connections_per_host_max,
        resolver=ssrf.GuardedResolver(policy),
        socket_factory=ssrf.guarded_socket_factory(policy),
    )
    return aiohttp.ClientSession(
        connector=connector,
        # Webhooks are stateless: a receiver must not be able to plant cookies on later sends.
        cookie_jar=aiohttp.DummyCookieJar(),
        # We keep only a few KiB of the body for people to read. Decompressing would cost CPU on
        # the hot path and let a small gzip bomb expand in one chunk; ask for identity instead.
        auto_decompress=False,
        headers=SESSION_HEADERS,
        timeout=aiohttp.ClientTimeout(total=settings.timeout_ms_default / 1000),
        # Never take proxies from the environment: a proxy would connect on our behalf, past the guard.
        trust_env=False,
        raise_for_status=False,
    )


async def _read_excerpt(response: aiohttp.ClientResponse, excerpt_bytes_max: int, chunks: list[bytes]) -> bool:
    """Read up to excerpt_bytes_max bytes of the body into chunks; True when that was all of it.

    The caller owns chunks, so the bytes that did arrive are kept when the read fails midway.
    """
    content = response.content
    size = 0
    while size < excerpt_bytes_max:
        chunk = await content.read(excerpt_bytes_max - size)
        chunks.append(chunk)
        if not chunk or content.at_eof():
            # Checking at_eof saves a second read for the usual small body that arrived whole.
            return True
        size += len(chunk)
    return content.at_eof()


def _find_cause(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    current: BaseException | None = error
    for _ in range(CAUSE_CHAIN_LINKS_MAX):
        if current is None:
            return None
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
    return None


def _has_errno(error: BaseException, number: int) -> bool:
    current: BaseException | None = error
    for _ in range(CAUSE_CHAIN_LINKS_MAX):
        if current is None:
            return False
        if isinstance(current, OSError) and current.errno == number:
            return True
        current = current.__cause__ or current.__context__
    return False


def describe_failure(error: BaseException, timeout_ms: int) -> str:
    """A short, bounded, stable text for a failed attempt, as stored in delivery_attempts.error."""
    # TimeoutError is an OSError in Python 3.11, so it is tested first.
    if isinstance(error, asyncio.TimeoutError):
        return f"timeout after {timeout_ms} ms"
    refused = _find_cause(error, AddressRefusedError)
    if refused is not None:
        return _refusal_text(refused)  # type: ignore[arg-type]
    if isinstance(error, aiohttp.ClientConnectorDNSError):
        return _bounded(f"dns: {error.os_error.strerror or error.os_error} (host {error.host})")
    if isinstance(error, (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError)):
        return _bounded(f"tls: {error}")
    if _has_errno(error, errno.ECONNREFUSED):
        return "connection refused"
    if isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)) or _has_errno(
        error, errno.ECONNRESET
    ):
        return "connection reset"
    if isinstance(error, aiohttp.InvalidURL):
        return _bounded(f"invalid url: {error}")
    return _bounded(f"connection error: {type(error).__name__}: {error}")


def _refusal_text(refused: AddressRefusedError) -> str:
    return _bounded(f"ssrf: address {refused.address} refused ({refused.category})")


def _status_text(status_code: int, reason: str | None) -> str:
    text = f"http {status_code} {reason or ''}".rstrip()
    if 300 <= status_code <= 399:
        text += " (redirects are not followed)"
    return _bounded(text)


def _bounded(text: str) -> str:
    return text if len(text) <= ERROR_CHARS_MAX else text[: ERROR_CHARS_MAX - 3] + "..."


def _elapsed_ms(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


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
