"""The lean HTTP/1.1 client: opens guarded connections, keeps the idle ones, times each send out.

`WireClient.post` returns a future of a send_outcome.Answer, or of a failure's text, the same as
the aiohttp client's. A send takes an idle connection to its host when one is fit, else opens one
in a task of its own (the only task it may cost); either way one loop.call_later bounds the whole
send, connect included, as aiohttp's total timeout does.

Opening a connection is where the SSRF guard runs (delivery.engine.ssrf): a name is resolved
once with loop.getaddrinfo, every address is judged by the AddressPolicy, and the socket
connects to an allowed address itself, so nothing resolves the name a second time (DNS
rebinding). No proxy, no redirect, no cookie, no decompression: none is implemented.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Mapping

from yarl import URL

from delivery import event_loop
from delivery.engine import send_outcome, ssrf
from delivery.engine.send_outcome import Answer
from delivery.engine.wire import Connection, Exchange, RequestEncoder, describe_os_error
from delivery.errors import AddressRefusedError, InvalidEndpointUrlError

# A connection idle longer than this is closed, as aiohttp's keepalive_timeout does (15 s):
# receivers close theirs after a while, and one closed under a send fails that send.
IDLE_SECONDS_MAX = 15.0
# How often idle connections are looked over while some are kept.
IDLE_SWEEP_SECONDS = 5.0
# The addresses of one lookup that are judged and tried, at most.
ADDRESSES_TRIED_MAX = 16
# Request heads' URL-dependent prefixes kept for the hot path; emptied when full.
PREFIXES_CACHED_MAX = 4096


class WireClient:
    """POSTs over kept-alive connections: at most connections_per_host_max idle per host and
    connections_max open in all (the sender's lanes bound those in use to the same numbers)."""

    def __init__(self, *, connections_max: int, connections_per_host_max: int, excerpt_bytes_max: int,
                 policy: ssrf.AddressPolicy, session_headers: Mapping[str, str]) -> None:
        self._connections_max = connections_max
        self._connections_per_host_max = connections_per_host_max
        self._excerpt_bytes_max = excerpt_bytes_max
        self._policy = policy
        self._encoder = RequestEncoder(session_headers)
        # Made at the first https connect, then kept: loading the trust store costs about 20 ms of
        # CPU, which a client that only ever sends over http (or is made per send) should not pay.
        self._tls: ssl.SSLContext | None = None
        self._running_loop = event_loop.RunningLoop()
        self._prefixes: dict[URL, bytes | str] = {}
        self._open: set[Connection] = set()
        self._idle: dict[tuple, list[Connection]] = {}  # per host, the most recently used last
        self._idle_order: dict[Connection, None] = {}  # every idle connection, the longest idle first
        self._connects: set[asyncio.Task] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def idle_connections(self) -> int:
        return len(self._idle_order)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._connects):
            task.cancel()
        await asyncio.gather(*self._connects, return_exceptions=True)
        for connection in list(self._open):
            connection.close()

    def post(self, url: URL, body: bytes, headers: Mapping[str, str], timeout_ms: int) -> asyncio.Future[Answer | str]:
        """POST body to url; a future of the Answer, or of the failure's text. timeout_ms is already bounded."""
        loop = self._running_loop()
        future: asyncio.Future[Answer | str] = loop.create_future()
        prefix = self._prefixes.get(url)
        if prefix is None:
            prefix = self._prefix(url)
        head = prefix if isinstance(prefix, str) else self._encoder.head(prefix, headers, len(body))
        if isinstance(head, str):
            future.set_result(head)
            return future
        exchange = Exchange(future, timeout_ms)
        exchange.timer = loop.call_later(timeout_ms / 1000, exchange.expire)
        key = (url.scheme, url.raw_host, url.port)
        connection = self._take(key, loop.time())
        if connection is not None:
            connection.send(exchange, head, body)
        else:
            task = exchange.task = loop.create_task(self._open_and_send(exchange, url, key, head, body))
            self._connects.add(task)
            task.add_done_callback(self._connects.discard)
        return future

    def _prefix(self, url: URL) -> bytes | str:
        if len(self._prefixes) >= PREFIXES_CACHED_MAX:
            self._prefixes.clear()
        prefix = self._prefixes[url] = self._encoder.prefix(url.raw_path_qs, url.host_port_subcomponent)
        return prefix

    # Idle connections.

    def _take(self, key: tuple, now: float) -> Connection | None:
        kept = self._idle.get(key)
        while kept:
            connection = kept.pop()
            del self._idle_order[connection]
            if not kept:
                del self._idle[key]
            if connection.is_reusable() and now - connection.idle_since <= IDLE_SECONDS_MAX:
                return connection
            connection.close()
        return None

    def _release(self, connection: Connection) -> None:
        """A connection whose answer was read whole and that may be kept: kept idle, within the bounds."""
        if self._closed:
            connection.close()
            return
        kept = self._idle.setdefault(connection.key, [])
        if len(kept) >= self._connections_per_host_max:
            kept[0].close()  # the host's longest idle goes (close forgets it)
        if len(self._idle_order) >= self._connections_max:
            next(iter(self._idle_order)).close()
        kept = self._idle.setdefault(connection.key, [])
        loop = self._running_loop()
        connection.idle_since = loop.time()
        kept.append(connection)
        self._idle_order[connection] = None
        if self._sweeper is None:
            self._sweeper = loop.call_later(IDLE_SWEEP_SECONDS, self._sweep)
        assert len(kept) <= self._connections_per_host_max and len(self._idle_order) <= self._connections_max

    def _forget(self, connection: Connection) -> None:
        """A connection closed (by us or the peer): no longer open, no longer idle."""
        self._open.discard(connection)
        if connection in self._idle_order:
            del self._idle_order[connection]
            kept = self._idle[connection.key]
            kept.remove(connection)
            if not kept:
                del self._idle[connection.key]

    def _sweep(self) -> None:
        """Close the connections idle longer than IDLE_SECONDS_MAX; look again later while any is kept."""
        self._sweeper = None
        loop = self._running_loop()
        oldest_kept = loop.time() - IDLE_SECONDS_MAX
        for _ in range(len(self._idle_order)):
            connection = next(iter(self._idle_order))
            if connection.idle_since >= oldest_kept:
                break
            connection.close()
        if self._idle_order and not self._closed:
            self._sweeper = loop.call_later(IDLE_SWEEP_SECONDS, self._sweep)

    # New connections.

    async def _open_and_send(self, exchange: Exchange, url: URL, key: tuple, head: bytes, body: bytes) -> None:
        try:
            opened = await self._connect(exchange, url, key)
        except asyncio.CancelledError:
            # The send timed out (its future already says so) or the client is closing.
            exchange.task = None
            if not exchange.future.done():
                exchange.timer.cancel()
                exchange.future.cancel()
            raise
        except Exception as error:  # a bug, not a network failure: the sender reports it as one
            exchange.task = None
            exchange.timer.cancel()
            if not exchange.future.done():
                exchange.future.set_exception(error)
            return
        exchange.task = None
        if isinstance(opened, str):
            exchange.settle(opened)
        elif exchange.future.done():
            opened.close()  # the caller went away meanwhile (the client closing)
        else:
            opened.send(exchange, head, body)

    async def _connect(self, exchange: Exchange, url: URL, key: tuple) -> Connection | str:
        """A connection to an allowed address of the URL's host, or the failure's text."""
        loop = self._running_loop()
        host, port = url.raw_host, url.port
        candidates = await self._allowed_addresses(loop, host, port)
        if isinstance(candidates, str):
            return candidates
        if len(self._open) >= self._connections_max and self._idle_order:
            next(iter(self._idle_order)).close()  # room for this one: the longest idle goes
        exchange.connecting = True
        tls = None
        if url.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()  # checks the certificate and the host name
            tls = self._tls
        server_hostname = None
        if tls is not None:
            # An IP literal is matched against the certificate's addresses (Python sends no SNI for it).
            literal = ssrf.interpret_host(host)
            server_hostname = host.rstrip(".") if literal is None else str(literal)
        error: BaseException | None = None
        for family, socket_type, protocol, socket_address in candidates:
            sock = socket.socket(family, socket_type, protocol)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, socket_address)
            except OSError as failure:
                sock.close()
                error = failure
                continue
            except BaseException:
                sock.close()
                raise
            try:
                # From here the transport owns the socket, and closes it if this fails.
                _, connection = await loop.create_connection(
                    lambda: Connection(key, self._excerpt_bytes_max, self._release, self._forget),
                    sock=sock, ssl=tls, server_hostname=server_hostname)
            except (ssl.SSLError, ssl.CertificateError) as failure:
                return send_outcome.tls_text(failure)
            except OSError as failure:
                error = failure
                continue
            self._open.add(connection)
            return connection
        if isinstance(error, TimeoutError):  # the system's own connect timeout, shorter than ours
            return send_outcome.connect_timeout_text(exchange.timeout_ms)
        return describe_os_error(error)

    async def _allowed_addresses(self, loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[tuple] | str:
        """The addresses the policy allows of those the host denotes or resolves to, or the failure's text.

        Every address is judged with the rules ssrf.GuardedResolver and ssrf.guarded_socket_factory
        apply; a refused one is never tried, and none left is the refusal of the first.
        """
        try:
            literal = ssrf.interpret_host(host)
        except InvalidEndpointUrlError as error:
            return send_outcome.bounded(f"invalid url: {error}")
        if literal is not None:
            family = socket.AF_INET if literal.version == 4 else socket.AF_INET6
            answers = [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (str(literal), port))]
        else:
            refused = ssrf.host_refusal(host, self._policy)
            if refused is not None:  # localhost: refused before asking the system, as GuardedResolver does
                return send_outcome.refusal_text(refused)
            try:
                answers = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
            except socket.gaierror as error:
                return send_outcome.dns_text(error.strerror or error, host)
            except (OSError, UnicodeError) as error:
                return send_outcome.dns_text(error, host)
        allowed: list[tuple] = []
        first_refusal: AddressRefusedError | None = None
        for family, socket_type, protocol, _, socket_address in answers[:ADDRESSES_TRIED_MAX]:
            address = ipaddress.ip_address(socket_address[0].split("%", 1)[0])
            category = self._policy.refusal(address)
            if category is None:
                allowed.append((family, socket_type, protocol, socket_address))
            elif first_refusal is None:
                first_refusal = AddressRefusedError(str(address), category)
        if allowed:
            return allowed
        if first_refusal is not None:
            return send_outcome.refusal_text(first_refusal)
        return send_outcome.dns_text("no address", host)

