"""The SSRF guard: URL validation, the address policy in every spelling, and connect-time refusal.

The last tests run a real aiohttp server on 127.0.0.1 that counts connections and requests,
send to forbidden spellings of its address, and check that nothing ever reached it.
"""

from __future__ import annotations

import ipaddress
import socket

import aiohttp
import pytest
from aiohttp import web

from delivery.engine import ssrf
from delivery.errors import AddressRefusedError, InvalidEndpointUrlError
from delivery.engine.sender import Sender, SenderSettings, SendRequest

STRICT = ssrf.AddressPolicy()
DEV = ssrf.AddressPolicy(allow_loopback=True)

# Every one of these must be refused under the default policy, with the category named.
FORBIDDEN_URLS = [
    ("http://localhost/", "loopback"),
    ("http://LOCALHOST./", "loopback"),
    ("http://api.localhost/", "loopback"),
    ("http://127.0.0.1/", "loopback"),
    ("http://127.255.255.254/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback, as ipv4-mapped"),
    ("http://[::ffff:7f00:1]/", "loopback, as ipv4-mapped"),
    ("http://[::127.0.0.1]/", "loopback, as ipv4-compatible"),
    ("http://[2002:7f00:1::]/", "loopback, as 6to4"),
    ("http://[64:ff9b::7f00:1]/", "loopback, as nat64"),
    ("http://[::ffff:0:7f00:1]/", "loopback, as ipv4-translated"),
    ("http://2130706433/", "loopback"),  # decimal
    ("http://0177.0.0.1/", "loopback"),  # octal
    ("http://017700000001/", "loopback"),  # octal, one part
    ("http://0x7f.1/", "loopback"),  # hex, short
    ("http://0x7f000001/", "loopback"),  # hex, one part
    ("http://0X7F.0.0.1/", "loopback"),
    ("http://127.1/", "loopback"),  # short
    ("http://127.0.1/", "loopback"),
    ("http://127.0.0.1./", "loopback"),  # trailing dot
    ("http://169.254.169.254/", "cloud metadata"),
    ("http://[fd00:ec2::254]/", "cloud metadata"),
    ("http://[::ffff:169.254.169.254]/", "cloud metadata, as ipv4-mapped"),
    ("http://0xa9fea9fe/", "cloud metadata"),  # 169.254.169.254 in hex
    ("http://2852039166/", "cloud metadata"),  # 169.254.169.254 in decimal
    ("http://0.0.0.0/", "unspecified"),
    ("http://0/", "unspecified"),
    ("http://[::]/", "unspecified"),
    ("http://10.1.2.3/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://[::ffff:10.0.0.1]/", "private, as ipv4-mapped"),
    ("http://100.64.0.1/", "shared address space"),
    ("http://169.254.1.1/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[fe80::1%25eth0]/", "link-local"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://255.255.255.255/", "reserved"),
    ("http://192.0.0.8/", "reserved"),
    ("http://198.18.0.1/", "benchmarking"),
    ("http://192.0.2.1/", "documentation"),
    ("http://[2001:db8::1]/", "documentation"),
    ("http://[fc00::1]/", "unique local"),
    ("http://[fd12:3456::1]/", "unique local"),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "teredo"),
    ("http://[64:ff9b:1::1]/", "nat64 local-use"),
    ("http://[100::1]/", "discard-only"),
    ("http://[::8.8.8.8]/", "ipv4-compatible (deprecated)"),
]


@pytest.mark.parametrize(("url", "category"), FORBIDDEN_URLS)
def test_forbidden_targets_are_refused_at_creation(url: str, category: str) -> None:
    """Each forbidden target, in every spelling, is refused when an endpoint is created, naming why."""
    with pytest.raises(InvalidEndpointUrlError) as caught:
        ssrf.validate_endpoint_url(url, STRICT)
    assert category in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hooks",
        "http://example.com:8080/a?b=c",
        "https://8.8.8.8/",
        "https://[2606:4700:4700::1111]/",
        "https://[::ffff:8.8.8.8]/",  # mapped public address: reaches 8.8.8.8
        "https://[64:ff9b::808:808]/",  # NAT64 of a public address
        "https://xn--exmple-cua.com/",
        "https://ex\u00e4mple.com/",
    ],
)
def test_public_targets_are_accepted(url: str) -> None:
    """Ordinary public URLs pass validation unchanged in meaning."""
    assert ssrf.validate_endpoint_url(url, STRICT).raw_host


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://example.com/", "scheme must be http or https"),
        ("file:///etc/passwd", "scheme must be http or https"),
        ("gopher://example.com/", "scheme must be http or https"),
        ("example.com/hooks", "scheme must be http or https"),
        ("http:///path", "has no host"),
        ("http://user:secret@example.com/", "user information"),
        ("http://user@example.com/", "user information"),
        ("http://example.com:0/", "port must be 1 to 65535"),
        ("http://example.com:65536/", "cannot be parsed"),
        ("http://example.com:-1/", "cannot be parsed"),
        ("http://example.com/" + "a" * 2048, "longer than 2048 characters"),
        ("http://exa mple.com/", "whitespace or control characters"),
        ("http://example.com/\n", "whitespace or control characters"),
        ("http://1.2.3.4.5/", "not an IPv4 address"),
        ("http://256.1.1.1/", "out of range"),
        ("http://1.2.3.256/", "out of range"),
        ("http://[::g]/", "not an IPv6 address"),
    ],
)
def test_malformed_urls_are_refused_clearly(url: str, fragment: str) -> None:
    """Each malformed URL raises InvalidEndpointUrlError whose message names the problem."""
    with pytest.raises(InvalidEndpointUrlError) as caught:
        ssrf.validate_endpoint_url(url, STRICT)
    assert fragment in str(caught.value)


def test_legacy_spellings_are_refused_even_when_the_address_is_allowed() -> None:
    """With loopback allowed, 0x7f.1 is still refused at creation: aiohttp would never send to it."""
    with pytest.raises(InvalidEndpointUrlError, match="legacy spelling; write 127.0.0.1"):
        ssrf.validate_endpoint_url("http://0x7f.1:8080/", DEV)
    assert ssrf.validate_endpoint_url("http://127.0.0.1:8080/", DEV).port == 8080


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f.0x0.0x0.0x1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("1.2.3.4", "1.2.3.4"),
        ("0x", "0.0.0.0"),
        ("4294967295", "255.255.255.255"),
        ("example.com", None),
        ("1.example", None),
        ("0x7g.1.example", None),
    ],
)
def test_hosts_are_read_as_inet_aton_reads_them(host: str, address: str | None) -> None:
    """Numeric hosts in decimal, octal, hex and short forms denote the address a browser would use."""
    expected = None if address is None else ipaddress.IPv4Address(address)
    assert ssrf.interpret_ipv4(host) == expected
    if address is not None and "x" not in host:
        # The system's own reading agrees (inet_aton does not take every hex form on every libc).
        assert socket.inet_ntoa(socket.inet_aton(host)) == address


@pytest.mark.parametrize("host", ["1_0.0.0.1", "1.2.٣.4", "4294967296", "08.0.0.1"])
def test_numbers_that_int_would_accept_are_not_addresses(host: str) -> None:
    """Underscores, non-ASCII digits, signs, overflow and bad octal are not quietly read as addresses."""
    with pytest.raises(InvalidEndpointUrlError):
        ssrf.interpret_ipv4(host)


def test_allowlist_opens_a_network_but_not_the_metadata_address() -> None:
    """An allowed network opens its addresses; a broad one does not open cloud metadata, a /32 does."""
    policy = ssrf.AddressPolicy.from_strings(["10.0.0.0/8", "169.254.0.0/16", "0.0.0.0/0"])
    assert policy.refusal(ipaddress.ip_address("10.1.2.3")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:10.1.2.3")) is None
    assert policy.refusal(ipaddress.ip_address("169.254.1.1")) is None
    assert policy.refusal(ipaddress.ip_address("169.254.169.254")) == "cloud metadata"
    exact = ssrf.AddressPolicy.from_strings(["169.254.169.254/32"])
    assert exact.refusal(ipaddress.ip_address("169.254.169.254")) is None


@pytest.mark.parametrize("network", ["::/0", "::ffff:0:0/96", "64:ff9b::/96", "2002::/16"])
def test_a_broad_ipv6_allowlist_does_not_open_ipv4_through_its_ipv6_forms(network: str) -> None:
    """IPv6 spellings of IPv4 addresses are judged as the IPv4 address, whatever IPv6 network is allowed."""
    policy = ssrf.AddressPolicy.from_strings([network])
    for form in ("::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1"):
        assert policy.refusal(ipaddress.ip_address(form)).startswith("cloud metadata"), form
    for form in ("::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::1"):
        assert policy.refusal(ipaddress.ip_address(form)).startswith("private"), form
    assert policy.refusal(ipaddress.ip_address("::ffff:8.8.8.8")) is None
    # One IPv6 address named on its own is still the operator's explicit choice.
    assert ssrf.AddressPolicy.from_strings(["::ffff:10.0.0.1/128"]).refusal(ipaddress.ip_address("::ffff:10.0.0.1")) is None


def test_dev_mode_allows_loopback_only() -> None:
    """allow_loopback opens 127/8, ::1 and their IPv6 spellings, and nothing else private."""
    assert DEV.refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert DEV.refusal(ipaddress.ip_address("::1")) is None
    assert DEV.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert DEV.refusal(ipaddress.ip_address("10.0.0.1")) == "private"
    assert DEV.refusal(ipaddress.ip_address("169.254.169.254")) == "cloud metadata"


def test_bad_allowlist_entries_are_refused() -> None:
    """An allowlist entry that is not a network (or has host bits set) fails loudly at startup."""
    for text in ["10.0.0.1/8", "not-a-network", "10.0.0.0/33"]:
        with pytest.raises(ValueError, match="is not a network"):
            ssrf.AddressPolicy.from_strings([text])


# Connect time, against a real server on loopback.


class CountingServer:
    """A real aiohttp server on 127.0.0.1 that counts TCP connections and HTTP requests."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0

    async def start(self) -> None:
        async def handle(request: web.Request) -> web.Response:
            self.requests += 1
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        server = self.runner.server
        original_connection_made = server.connection_made

        def counting_connection_made(handler, transport) -> None:
            # Counted at accept, so a connection that never sent a request still counts.
            self.connections += 1
            original_connection_made(handler, transport)

        server.connection_made = counting_connection_made
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
async def counting_server() -> CountingServer:
    server = CountingServer()
    await server.start()
    yield server
    await server.stop()


def send_request(url: str) -> SendRequest:
    return SendRequest(
        delivery_id="msg_1", attempt=1, url=url, body=b"{}", headers={}, timeout_ms=2000, endpoint_id="ep_1"
    )


LOOPBACK_SPELLINGS = [
    "http://127.0.0.1:{port}/",
    "http://2130706433:{port}/",
    "http://0177.0.0.1:{port}/",
    "http://0x7f.1:{port}/",
    "http://127.1:{port}/",
    "http://127.0.0.1.:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://localhost:{port}/",
    "http://LocalHost.:{port}/",
]


async def test_sender_never_connects_to_forbidden_spellings_of_loopback(counting_server: CountingServer) -> None:
    """Through the real sender with loopback not allowed, every spelling is refused and the server sees nothing."""
    async with Sender(SenderSettings()) as sender:
        for template in LOOPBACK_SPELLINGS:
            result = await sender.send(send_request(template.format(port=counting_server.port)))
            assert not result.success and result.status_code is None
            assert result.error is not None and result.error.startswith("ssrf: address "), (template, result.error)
            assert "loopback" in result.error
    assert counting_server.connections == 0
    assert counting_server.requests == 0


async def test_connect_time_guards_alone_refuse_loopback(counting_server: CountingServer) -> None:
    """Without the sender's pre-check, the resolver and socket factory still refuse, and nothing connects.

    A literal address skips any resolver in aiohttp; the socket factory refuses it. A name goes
    through the resolver, which refuses what it resolves to (the DNS rebinding case).
    """
    connector = aiohttp.TCPConnector(
        resolver=ssrf.GuardedResolver(STRICT), socket_factory=ssrf.guarded_socket_factory(STRICT)
    )
    async with aiohttp.ClientSession(connector=connector) as session:
        for host in ["127.0.0.1", "localhost", "0x7f.1", "[::ffff:127.0.0.1]"]:
            with pytest.raises(aiohttp.ClientConnectorError) as caught:
                await session.get(f"http://{host}:{counting_server.port}/")
            assert isinstance(caught.value.os_error, AddressRefusedError), (host, caught.value)
    assert counting_server.connections == 0


async def test_resolver_refuses_names_that_resolve_to_loopback() -> None:
    """GuardedResolver refuses localhost before asking the system, and filters any answer it is given."""
    resolver = ssrf.GuardedResolver(STRICT)
    with pytest.raises(AddressRefusedError, match="loopback"):
        await resolver.resolve("localhost", 80)
    # 0x7f.1 is not a DNS name anyone registers, but the system resolver reads it as 127.0.0.1.
    with pytest.raises(AddressRefusedError, match="loopback"):
        await resolver.resolve("0x7f.1", 80)
    await resolver.close()


async def test_allowlisted_loopback_is_delivered(counting_server: CountingServer) -> None:
    """With loopback on the allowlist, a send to the same server arrives, by address and by name."""
    settings = SenderSettings(allowed_networks=("127.0.0.0/8",))
    async with Sender(settings) as sender:
        for host in ["127.0.0.1", "localhost"]:
            result = await sender.send(send_request(f"http://{host}:{counting_server.port}/"))
            assert result.success, result
    assert counting_server.requests == 2
