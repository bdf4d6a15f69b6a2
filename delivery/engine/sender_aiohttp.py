"""The sender's aiohttp client: one pooled ClientSession, the fallback an operator can choose
(HOOKLEDGER_SENDER_CLIENT=aiohttp) and the comparison of the delivery benchmark.

`post` answers with a send_outcome.Answer or the text of the failure, as delivery.engine.wire_pool's
client does. The SSRF guard runs inside aiohttp's connector: GuardedResolver on every name's
answers, guarded_socket_factory on the exact address about to be connected to.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Mapping

import aiohttp
from yarl import URL

from delivery.engine import send_outcome, ssrf
from delivery.engine.send_outcome import Answer
from delivery.errors import AddressRefusedError

# Bound on the cache of ClientTimeout values, one per timeout in ms; emptied when full.
TIMEOUTS_CACHED_MAX = 256
# How far the cause chain of an exception is followed when classifying it.
CAUSE_CHAIN_LINKS_MAX = 16


class AiohttpClient:
    """POSTs over one aiohttp.ClientSession, within the connector's per-host and total bounds."""

    def __init__(self, *, connections_max: int, connections_per_host_max: int, excerpt_bytes_max: int,
                 timeout_ms_default: int, policy: ssrf.AddressPolicy, session_headers: Mapping[str, str]) -> None:
        self._excerpt_bytes_max = excerpt_bytes_max
        self._timeouts: dict[int, aiohttp.ClientTimeout] = {}
        connector = aiohttp.TCPConnector(
            limit=connections_max,
            limit_per_host=connections_per_host_max,
            resolver=ssrf.GuardedResolver(policy),
            socket_factory=ssrf.guarded_socket_factory(policy),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Webhooks are stateless: a receiver must not be able to plant cookies on later sends.
            cookie_jar=aiohttp.DummyCookieJar(),
            # We keep only a few KiB of the body for people to read. Decompressing would cost CPU on
            # the hot path and let a small gzip bomb expand in one chunk; ask for identity instead.
            auto_decompress=False,
            headers=dict(session_headers),
            timeout=aiohttp.ClientTimeout(total=timeout_ms_default / 1000),
            # Never take proxies from the environment: a proxy would connect on our behalf, past the guard.
            trust_env=False,
            raise_for_status=False,
        )

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def close(self) -> None:
        await self._session.close()

    async def post(self, url: URL, body: bytes, headers: Mapping[str, str], timeout_ms: int) -> Answer | str:
        """POST body to url; the answer, or the failure's text. timeout_ms is already bounded."""
        try:
            async with self._session.post(
                url, data=body, headers=headers, timeout=self._timeout(timeout_ms), allow_redirects=False
            ) as response:
                return await self._answer_from(response, timeout_ms)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as error:
            return describe_failure(error, timeout_ms)

    def _timeout(self, timeout_ms: int) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(timeout_ms)
        if timeout is None:
            if len(self._timeouts) >= TIMEOUTS_CACHED_MAX:
                self._timeouts.clear()
            # A connect that times out is told apart (ConnectionTimeoutError): it slows the endpoint.
            timeout = self._timeouts[timeout_ms] = aiohttp.ClientTimeout(total=timeout_ms / 1000,
                                                                         sock_connect=timeout_ms / 1000)
        return timeout

    async def _answer_from(self, response: aiohttp.ClientResponse, timeout_ms: int) -> Answer | str:
        status_code = response.status
        if status_code not in send_outcome.STATUS_CODES_STORABLE:
            response.close()
            return send_outcome.invalid_status_text(status_code)
        body_error = None
        chunks: list[bytes] = []
        try:
            complete = await _read_excerpt(response, self._excerpt_bytes_max, chunks)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as error:
            complete = False
            body_error = send_outcome.BODY_ERROR_PREFIX + describe_failure(error, timeout_ms)
        if not complete:
            # Do not wait for (or drain) the rest of a body we will not keep: drop the connection.
            response.close()
        headers = response.headers
        return Answer(status_code, response.reason, headers.get("Retry-After"), headers.get("Date"),
                      b"".join(chunks), body_error)


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
    # TimeoutError is an OSError in Python 3.11, so it is tested first; a connect's before any other.
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return send_outcome.connect_timeout_text(timeout_ms)
    if isinstance(error, asyncio.TimeoutError):
        return send_outcome.timeout_text(timeout_ms)
    refused = _find_cause(error, AddressRefusedError)
    if refused is not None:
        return send_outcome.refusal_text(refused)  # type: ignore[arg-type]
    if isinstance(error, aiohttp.ClientConnectorDNSError):
        return send_outcome.dns_text(error.os_error.strerror or error.os_error, error.host)
    if isinstance(error, (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError)):
        return send_outcome.tls_text(error)
    if _has_errno(error, errno.ECONNREFUSED):
        return send_outcome.CONNECTION_REFUSED
    if isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)) or _has_errno(
        error, errno.ECONNRESET
    ):
        return send_outcome.CONNECTION_RESET
    if isinstance(error, aiohttp.InvalidURL):
        return send_outcome.bounded(f"invalid url: {error}")
    return send_outcome.connection_error_text(error)
