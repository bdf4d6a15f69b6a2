"""The lean HTTP/1.1 client (delivery.engine.wire, wire_pool) against real servers on loopback.

What it must do beyond what test_sender.py asks of both clients: keep connections alive and
reuse them only when the answer allows it, read chunked bodies, keep only the excerpt of a long
body and close the connection instead of draining it, bound the head, time a trickling answer
out, refuse a header that would inject another, check TLS certificates, run the SSRF guard on
what a name resolves to, and keep its idle connections within their bounds. Servers that must
misbehave below HTTP are plain asyncio servers writing raw bytes.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from yarl import URL

from delivery.engine import ssrf, wire, wire_pool
from delivery.engine.sender import SESSION_HEADERS, Sender, SenderSettings, SendRequest
from delivery.engine.wire_pool import WireClient

LOOPBACK = ("127.0.0.0/8",)
BODY = b'{"type":"invoice.paid"}'
HEADERS = {"webhook-id": "msg_1", "webhook-timestamp": "1700000000", "webhook-signature": "v1,abc="}
# How long a test waits for a send that must end well before it: a hang fails the test, not the run.
SEND_WAIT_SECONDS = 30


def wire_settings(**fields) -> SenderSettings:
    return SenderSettings(client="wire", **{"allowed_networks": LOOPBACK, **fields})


def request_to(url: str, timeout_ms: int = 5000, headers: dict[str, str] | None = None,
               endpoint_id: str = "ep_1") -> SendRequest:
    return SendRequest("msg_1", 1, url, BODY, HEADERS if headers is None else headers, timeout_ms, endpoint_id)


async def send(sender: Sender, request: SendRequest):
    return await asyncio.wait_for(sender.send(request), SEND_WAIT_SECONDS)


class CountingApp:
    """An aiohttp server that counts the connections its requests arrived on."""

    def __init__(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        self.peers: list[tuple] = []
        self.app = web.Application()

        async def counted(request: web.Request) -> web.StreamResponse:
            self.peers.append(request.transport.get_extra_info("peername"))
            return await handler(request)

        self.app.router.add_post("/hook", counted)
        self.server = TestServer(self.app, host="127.0.0.1")

    @property
    def connections(self) -> int:
        return len(set(self.peers))

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.server.port}/hook"


@pytest.fixture
async def served() -> AsyncIterator[Callable]:
    started: list[CountingApp] = []

    async def start(handler, ssl: ssl.SSLContext | None = None) -> CountingApp:
        app = CountingApp(handler)
        await app.server.start_server(ssl=ssl)
        started.append(app)
        return app

    yield start
    for app in started:
        await app.server.close()


class RawServer:
    """A TCP server on loopback that runs handle(reader, writer) per connection and counts them."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.connections = 0

    async def __aenter__(self) -> RawServer:
        async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handle(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(counted, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exception_info: object) -> None:
        self.server.close()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (the body by its Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    return head + await reader.readexactly(length)


def ok(text: str = "ok", **headers: str):
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text=text, headers=headers)

    return handler


async def test_sequential_sends_reuse_one_kept_alive_connection(served) -> None:
    """Ten sends one after another to one host travel on a single connection (keep-alive),
    and the request carries the session headers, the caller's, and the body intact."""
    app = await served(ok())
    async with Sender(wire_settings()) as sender:
        results = [await send(sender, request_to(app.url())) for _ in range(10)]
    assert all(result.success and result.response_excerpt == "ok" for result in results), results
    assert app.connections == 1, app.peers


async def test_the_request_is_exactly_the_post_the_sender_means() -> None:
    """The bytes on the wire: the request line with the path and query, Host with its port, the
    session headers, the caller's headers, Content-Length, and the body, nothing else."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_request(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url() + "?tenant=a%20b&x=1"))
    assert result.success and result.status_code == 204
    session = "".join(f"{name}: {value}\r\n" for name, value in SESSION_HEADERS.items())
    caller = "".join(f"{name}: {value}\r\n" for name, value in HEADERS.items())
    assert received == [(f"POST /hook?tenant=a%20b&x=1 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n{session}{caller}"
                         f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY]


@pytest.mark.parametrize(("url", "request_line", "host"), [
    ("http://example.com/a", "POST /a HTTP/1.1", "example.com"),
    ("http://example.com:80/a", "POST /a HTTP/1.1", "example.com"),
    ("https://example.com:443", "POST / HTTP/1.1", "example.com"),
    ("https://example.com:8443/a/b?c=d#fragment", "POST /a/b?c=d HTTP/1.1", "example.com:8443"),
    ("http://[2001:db8::1]:8080/", "POST / HTTP/1.1", "[2001:db8::1]:8080"),
    ("http://\u00e9xample.com/\u00e9", "POST /%C3%A9 HTTP/1.1", "xn--xample-9ua.com"),
])
def test_the_host_line_has_the_port_only_when_it_is_not_the_schemes(url: str, request_line: str, host: str) -> None:
    """Host carries the port only when it is not the scheme's default; IPv6 in brackets, names in
    their ASCII form; the fragment is never sent."""
    client = WireClient(connections_max=1, connections_per_host_max=1, excerpt_bytes_max=0,
                        policy=ssrf.AddressPolicy(), session_headers={})
    assert client._prefix(URL(url)) == f"{request_line}\r\nHost: {host}\r\n".encode()


async def test_connection_close_is_honoured(served) -> None:
    """An answer saying `Connection: close` is never followed by a request on its connection: three
    sends, three connections, all delivered."""
    app = await served(ok(Connection="close"))
    async with Sender(wire_settings()) as sender:
        results = [await send(sender, request_to(app.url())) for _ in range(3)]
    assert all(result.success for result in results), results
    assert app.connections == 3, app.peers


async def test_a_chunked_body_is_read_and_the_connection_reused(served) -> None:
    """A chunked answer in several chunks gives the whole excerpt, and, read to its end, leaves
    its connection fit for the next send."""

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=500)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"first ", b"second ", b"third"):
            await response.write(part)
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    app = await served(chunked)
    async with Sender(wire_settings()) as sender:
        first = await send(sender, request_to(app.url()))
        second = await send(sender, request_to(app.url()))
    for result in (first, second):
        assert result.status_code == 500 and result.response_excerpt == "first second third", result
        assert result.error == "http 500 Internal Server Error"
    assert app.connections == 1, app.peers


async def test_a_10_mib_body_is_cut_at_the_excerpt_and_its_connection_closed() -> None:
    """A 10 MiB answer: the send ends with only the excerpt kept, without reading the rest (the
    server still holds most of the body when the client closes the connection), and the
    connection is closed, not kept."""
    body_bytes = 10 * 1024 * 1024
    sent_before_close = {"bytes": 0}
    closed_by_client = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body_bytes)
        part = b"x" * 65536
        writer.write(part)
        sent_before_close["bytes"] = len(part)
        await writer.drain()
        # The rest waits until the client has hung up: a client that read on would wait for it.
        if await reader.read() == b"":
            closed_by_client.set()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url(), timeout_ms=60_000))
        await asyncio.wait_for(closed_by_client.wait(), SEND_WAIT_SECONDS)
        assert sender._client.open_connections == 0
    assert result.success and result.status_code == 200 and result.error is None
    assert result.response_excerpt == "x" * 4096
    assert sent_before_close["bytes"] < body_bytes


async def test_headers_trickling_past_the_timeout_time_out() -> None:
    """A server that sends its head one byte at a time, never finishing: the send times out at
    its own timeout ("timeout after 1000 ms"), however steadily bytes keep arriving."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(600):
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url(), timeout_ms=1000))
    assert result.status_code is None and result.error == "timeout after 1000 ms"


async def test_a_head_larger_than_the_bound_fails_the_send() -> None:
    """A head of more than 64 KiB (many long headers) fails the send: the client does not hold
    a receiver's head of any size."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for number in range(100):
            writer.write(b"X-Filler-%d: %s\r\n" % (number, b"y" * 1000))
        writer.write(b"Content-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url()))
    assert result.status_code is None and not result.success
    assert result.error == f"response head too large (over {wire.HEAD_BYTES_MAX} bytes)"


@pytest.mark.parametrize(("answer", "error"), [
    (b"hello, this is not http\r\n\r\n", "connection error: HttpParserError: "),
    (b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", "connection error: HttpParserInvalidStatusError: "),
    (b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", "invalid http status 999"),
    (b"HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n", "invalid http status 99"),
])
async def test_a_malformed_or_non_http_answer_is_a_failed_attempt(answer: bytes, error: str) -> None:
    """A non-HTTP answer, a malformed status line, or a status outside 100-599 is a failed
    attempt without a status, its error saying which."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url()))
    assert result.status_code is None and not result.success
    assert result.error is not None and result.error.startswith(error), result.error


async def test_a_2xx_whose_body_breaks_off_is_a_success_with_the_break_noted() -> None:
    """A 200 promising 1000 bytes, of which 10 arrive before the peer closes: a success (the
    receiver accepted the webhook), the 10 bytes kept, the break in error."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
        await writer.drain()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url()))
    assert result.success and result.status_code == 200
    assert result.response_excerpt == "0123456789"
    assert result.error == "response body: connection reset"


async def test_a_body_that_ends_with_the_connection_is_complete() -> None:
    """An answer with neither Content-Length nor chunking ends where the connection does: read
    whole, no break noted, and the connection not kept."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        await writer.drain()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url()))
        again = await send(sender, request_to(server.url()))
    assert result.success and result.error is None and result.response_excerpt == "until the end"
    assert again.success and server.connections == 2


async def test_bytes_after_the_answer_keep_the_answer_and_drop_the_connection() -> None:
    """A server that follows its answer with a second, unasked one: the first answer stands, and
    the connection is not kept (its next answer could belong to no request of ours)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                     b"HTTP/1.1 500 Unasked\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        first = await send(sender, request_to(server.url()))
        second = await send(sender, request_to(server.url()))
    assert first.success and first.response_excerpt == "ok" and first.error is None, first
    assert second.success and server.connections == 2


@pytest.mark.parametrize("headers", [
    {**HEADERS, "x-tenant": "acme\r\nX-Injected: 1"},
    {**HEADERS, "x-tenant": "acme\nX-Injected: 1"},
    {**HEADERS, "x-tenant": "acme\x00"},
    {**HEADERS, "x-tenant\r\nX-Injected": "1"},
    {**HEADERS, "x tenant": "1"},
    {**HEADERS, "Content-Length": "0"},
    {**HEADERS, "Transfer-Encoding": "chunked"},
])
async def test_a_header_that_could_inject_is_refused_and_nothing_sent(headers: dict[str, str]) -> None:
    """A header name or value with CR, LF or NUL, a name that is no HTTP token, or a caller's
    framing header is refused: a failed attempt saying why, and the server sees no connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        result = await send(sender, request_to(server.url(), headers=headers))
        await asyncio.sleep(0.05)
    assert result.status_code is None and not result.success and result.sent_at > 0
    assert result.error is not None and result.error.startswith("not sent: header "), result.error
    assert server.connections == 0


@pytest.mark.parametrize("host", ["exa mple.com", "ex\x00ample.com", "ex\x7fample.com"])
async def test_a_host_that_would_split_the_request_line_is_refused(host: str) -> None:
    """yarl passes some hosts through as written; one holding a space or a control character is
    refused before any lookup or connection ("invalid url: ..."), never written into the Host line."""
    async with Sender(wire_settings()) as sender:
        result = await send(sender, request_to(f"http://{host}/hook"))
    assert result.status_code is None and result.error is not None
    assert result.error.startswith("invalid url: space or control character"), result.error


def _certificates(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A self-signed CA (its PEM file) and a server context with a certificate it signed for
    localhost and 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hookledger test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                         x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))])
    certificate = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
                   .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(names, critical=False)
                   # Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a
                   # certificate without its issuer's key identifier is refused.
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                   .sign(ca_key, hashes.SHA256()))
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain_file, key_file = directory / "server.pem", directory / "server.key"
    chain_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain_file, key_file)
    return ca_file, context


async def test_an_ipv6_endpoint_is_reached_with_its_host_bracketed() -> None:
    """An endpoint on an IPv6 address ([::1], its network allowed): connected to over IPv6, its
    Host line bracketed with the port, and its connection kept for the next send."""
    heads: list[bytes] = []
    connections: list[object] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while True:
            heads.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    try:
        server = await asyncio.start_server(answer, "::1", 0)
    except OSError as error:  # a host without IPv6 on loopback
        pytest.skip(f"no IPv6 loopback here: {error}")
    port = server.sockets[0].getsockname()[1]
    try:
        async with Sender(wire_settings(allowed_networks=("::1/128",))) as sender:
            first = await send(sender, request_to(f"http://[::1]:{port}/hook"))
            second = await send(sender, request_to(f"http://[::1]:{port}/hook"))
    finally:
        server.close()
    assert first.success and second.success and first.response_excerpt == "ok", (first, second)
    assert len(heads) == 2 and f"\r\nHost: [::1]:{port}\r\n".encode() in heads[0], heads
    assert len(connections) == 1


async def test_a_tls_handshake_that_never_ends_is_a_connect_timeout() -> None:
    """An https endpoint that accepts the TCP connection and then says nothing: the send ends at
    its timeout as a connect timeout (the handshake is part of connecting, and a stalled one
    slows the endpoint down as a stalled TCP connect does), and nothing was sent."""
    received: list[bytes] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))  # the ClientHello, never answered
        await asyncio.sleep(5)

    async with RawServer(silent) as server, Sender(wire_settings()) as sender:
        url = server.url().replace("http://", "https://")
        result = await send(sender, request_to(url, timeout_ms=1000))
    assert result.status_code is None and result.error == "connect timeout after 1000 ms", result.error
    assert received and not received[0].startswith(b"POST"), received  # a handshake began; no request left


async def test_https_to_an_untrusted_ca_is_refused(served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An https endpoint whose certificate a CA we do not trust signed: a failed attempt, "tls: ...",
    and no request reaches the server."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    _, server_context = _certificates(tmp_path)
    app = await served(ok(), ssl=server_context)
    async with Sender(wire_settings()) as sender:
        result = await send(sender, request_to(app.url("https", "localhost")))
    assert result.status_code is None and result.error is not None and result.error.startswith("tls: "), result.error
    assert "CERTIFICATE_VERIFY_FAILED" in result.error
    assert app.peers == []


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_https_with_a_trusted_ca_is_sent(served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               host: str) -> None:
    """With the CA trusted (SSL_CERT_FILE, read at the client's first https connect), the same endpoint is
    reached, by name (checked against the certificate's DNS name) and by address (its IP name)."""
    ca_file, server_context = _certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    app = await served(ok("secure"), ssl=server_context)
    async with Sender(wire_settings()) as sender:
        first = await send(sender, request_to(app.url("https", host)))
        second = await send(sender, request_to(app.url("https", host)))
    assert first.success and first.response_excerpt == "secure", first
    assert second.success and app.connections == 1


async def test_https_to_a_name_the_certificate_does_not_hold_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host name is checked: a trusted certificate for localhost does not vouch for this
    machine's own name, which resolves to the same server."""
    name = socket.gethostname()
    if not _resolves_to_loopback(name):
        pytest.skip(f"{name} does not resolve to loopback here")
    ca_file, server_context = _certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        async with Sender(wire_settings()) as sender:
            result = await send(sender, request_to(f"https://{name}:{port}/hook"))
    finally:
        server.close()
    assert result.error is not None and result.error.startswith("tls: ") and "match" in result.error, result.error


def _resolves_to_loopback(name: str) -> bool:
    try:
        answers = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(answers) and all(ipaddress.ip_address(answer[4][0]).is_loopback for answer in answers)


async def test_a_name_resolving_to_loopback_is_refused_unless_allowed(served) -> None:
    """This machine's own name resolves to loopback (a DNS answer, not a literal the pre-check
    sees): refused at connect time with loopback not allowed, and the server sees nothing; an
    allowed network of loopback lets the same send through."""
    name = socket.gethostname()
    if not _resolves_to_loopback(name) or ssrf.host_refusal(name, ssrf.AddressPolicy()) is not None:
        pytest.skip(f"{name} does not resolve to loopback by DNS here")
    app = await served(ok())
    async with Sender(wire_settings(allowed_networks=())) as sender:
        refused = await send(sender, request_to(app.url(host=name)))
    assert refused.status_code is None and refused.error is not None
    assert refused.error.startswith("ssrf: address 127.") and refused.error.endswith("refused (loopback)"), refused.error
    assert app.peers == []
    async with Sender(wire_settings(allowed_networks=LOOPBACK)) as sender:
        allowed = await send(sender, request_to(app.url(host=name)))
    assert allowed.success, allowed
    assert app.connections == 1


async def test_a_closed_port_is_connection_refused() -> None:
    """Nobody listening: "connection refused", at once."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    async with Sender(wire_settings()) as sender:
        result = await send(sender, request_to(f"http://127.0.0.1:{port}/hook", timeout_ms=60_000))
    assert result.status_code is None and result.error == "connection refused"


async def test_an_unknown_name_is_a_dns_failure() -> None:
    """A name that does not resolve: "dns: <the resolver's words> (host <name>)"."""
    async with Sender(wire_settings()) as sender:
        result = await send(sender, request_to("http://does-not-exist.invalid/hook"))
    assert result.status_code is None and result.error is not None
    assert result.error.startswith("dns: ") and result.error.endswith("(host does-not-exist.invalid)"), result.error


async def test_an_idle_connection_closed_by_the_server_is_not_reused() -> None:
    """A server that closes its kept-alive connection between two sends: the next send opens a
    fresh connection and is delivered, without a hang and without a failure."""
    answered = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        answered.set()
        # Keep-alive promised, then the connection closed while idle (as a server's idle timeout does).

    async with RawServer(handle) as server, Sender(wire_settings()) as sender:
        first = await send(sender, request_to(server.url()))
        client = sender._client
        for _ in range(500):  # until the client has seen the close
            if client.idle_connections == 0:
                break
            await asyncio.sleep(0.01)
        second = await send(sender, request_to(server.url()))
    assert first.success and second.success, (first, second)
    assert server.connections == 2


async def test_idle_connections_stay_within_their_bounds(served) -> None:
    """Many concurrent sends to three hosts, with at most 2 idle per host and 3 open in all: once
    they end, no host keeps more than 2 idle and the client no more than 3 open."""
    apps = [await served(ok()) for _ in range(3)]
    settings = wire_settings(connections_per_host_max=2, connections_max=3)
    async with Sender(settings) as sender:
        for _ in range(3):
            results = await asyncio.wait_for(asyncio.gather(*(
                sender.send(request_to(app.url(), endpoint_id=f"ep_{number}"))
                for number in range(12) for app in apps)), SEND_WAIT_SECONDS)
            assert all(result.success for result in results)
            client: WireClient = sender._client
            assert client.open_connections <= 3 and client.idle_connections <= 3
            assert all(len(kept) <= 2 for kept in client._idle.values())
            assert sum(len(kept) for kept in client._idle.values()) == client.idle_connections


async def test_the_client_alone_keeps_its_idle_bounds(served) -> None:
    """Without the sender's lanes in front (which never run more sends than the bounds), the
    client still keeps at most connections_per_host_max idle per host and connections_max in
    all: more concurrent posts than that open more connections, and the extra ones are closed
    as they finish, not kept. Six posts to one host keep 2; five to each of three keep 4 in all."""
    apps = [await served(ok()) for _ in range(3)]

    async def post_all(client: WireClient, posts_per_host: int, hosts: list[CountingApp]) -> None:
        outcomes = await asyncio.wait_for(asyncio.gather(*(
            client.post(URL(app.url()), BODY, HEADERS, 5000) for _ in range(posts_per_host) for app in hosts)),
            SEND_WAIT_SECONDS)
        assert all(outcome.status_code == 200 for outcome in outcomes), outcomes

    for connections_max, posts_per_host, hosts, idle_kept in ((10, 6, apps[:1], 2), (4, 5, apps, 4)):
        client = WireClient(connections_max=connections_max, connections_per_host_max=2, excerpt_bytes_max=4096,
                            policy=ssrf.AddressPolicy.from_strings(LOOPBACK), session_headers=SESSION_HEADERS)
        try:
            await post_all(client, posts_per_host, hosts)
            assert client.idle_connections == idle_kept and client.open_connections == idle_kept
            assert all(len(kept) <= 2 for kept in client._idle.values())
        finally:
            await client.close()
    assert sum(app.connections for app in apps) == 6 + 15


async def test_connections_idle_too_long_are_closed(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection idle longer than IDLE_SECONDS_MAX (shortened here) is closed by the sweep,
    and the next send opens a new one rather than reusing a stale one."""
    monkeypatch.setattr(wire_pool, "IDLE_SECONDS_MAX", 0.2)
    monkeypatch.setattr(wire_pool, "IDLE_SWEEP_SECONDS", 0.1)
    app = await served(ok())
    async with Sender(wire_settings()) as sender:
        assert (await send(sender, request_to(app.url()))).success
        client: WireClient = sender._client
        assert client.idle_connections == 1
        for _ in range(300):
            if client.open_connections == 0:
                break
            await asyncio.sleep(0.02)
        assert client.open_connections == 0 and client.idle_connections == 0
        assert (await send(sender, request_to(app.url()))).success
    assert app.connections == 2


async def test_a_connection_idle_too_long_is_not_taken_before_the_sweep(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two sweeps, a send does not take a connection idle longer than IDLE_SECONDS_MAX
    (shortened here, the sweep put off): it closes it and opens a new one."""
    monkeypatch.setattr(wire_pool, "IDLE_SECONDS_MAX", 0.1)
    monkeypatch.setattr(wire_pool, "IDLE_SWEEP_SECONDS", 3600)
    app = await served(ok())
    async with Sender(wire_settings()) as sender:
        assert (await send(sender, request_to(app.url()))).success
        await asyncio.sleep(0.3)
        assert sender._client.idle_connections == 1  # not swept
        assert (await send(sender, request_to(app.url()))).success
        assert sender._client.open_connections == 1
    assert app.connections == 2


async def test_a_client_closed_with_a_send_on_the_wire_leaves_nothing_open() -> None:
    """Closing the client while a send waits for its answer closes every connection, and the
    send ends at once ("connection reset") rather than at its 60 s timeout."""
    arrived = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        arrived.set()
        await reader.read()

    async with RawServer(handle) as server:
        client = WireClient(connections_max=4, connections_per_host_max=2, excerpt_bytes_max=4096,
                            policy=ssrf.AddressPolicy.from_strings(LOOPBACK), session_headers=SESSION_HEADERS)
        pending = client.post(URL(server.url()), BODY, HEADERS, 60_000)
        await asyncio.wait_for(arrived.wait(), SEND_WAIT_SECONDS)
        await client.close()
        for _ in range(100):
            if pending.done():
                break
            await asyncio.sleep(0.01)
    assert pending.done() and pending.result() == "connection reset"
    assert client.open_connections == 0 and client.closed
