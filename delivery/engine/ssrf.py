"""The SSRF guard: which endpoint URLs and addresses the platform may send webhooks to.

Endpoint URLs come from customers, so a URL is an attempt to make our workers connect
somewhere. We refuse private, loopback, link-local, multicast, reserved, shared and cloud
metadata addresses, in every spelling, unless the operator allows them. The guard runs in
three places, each catching what the one before cannot see:

1. `validate_endpoint_url` at endpoint creation: a clear 4xx for an obviously bad URL.
2. `host_refusal` in the sender before each send: literal addresses in any spelling (decimal,
   octal, hex, short, IPv6 forms embedding IPv4), which aiohttp never passes to a resolver.
3. At connect time: names that resolve to a forbidden address (DNS rebinding), and, last, the
   exact address a socket is about to reach. The sender's wire client (delivery.engine.wire_pool)
   judges every address of its one lookup and connects to an allowed one itself; with the
   aiohttp client, `GuardedResolver` and `guarded_socket_factory` do it inside aiohttp.

URLs are parsed with yarl, the parser aiohttp itself uses and the one the wire client connects
by, so the host we check is the host it connects to; two parsers that disagree about a URL are a
classic SSRF hole.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import SocketFactoryType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from delivery.errors import AddressRefusedError, InvalidEndpointUrlError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

URL_CHARS_MAX = 2048
ALLOWED_NETWORKS_MAX = 256
ALLOWED_SCHEMES = frozenset({"http", "https"})
IPV4_PARTS_MAX = 4

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

CLOUD_METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {ipaddress.IPv4Address("169.254.169.254"), ipaddress.IPv6Address("fd00:ec2::254")}
)
LOOPBACK_NETWORKS: tuple[IPNetwork, ...] = (_V4("127.0.0.0/8"), _V6("::1/128"))

# First match wins, so the specific categories come before the broad ones that contain them.
FORBIDDEN_IPV4_NETWORKS: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("169.254.169.254/32"), "cloud metadata"),
    (_V4("0.0.0.0/8"), "unspecified"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared address space"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "reserved"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "reserved"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),
)
FORBIDDEN_IPV6_NETWORKS: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("fd00:ec2::254/128"), "cloud metadata"),
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("64:ff9b:1::/48"), "nat64 local-use"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001::/32"), "teredo"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("2001::/23"), "reserved"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("fc00::/7"), "unique local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)
GLOBAL_UNICAST_IPV6 = _V6("2000::/3")

# IPv6 forms that carry an IPv4 address inside them, and where.
_IPV4_MAPPED = _V6("::ffff:0:0/96")
# The two IPv6 addresses refused by name. Compared exactly: what ipaddress's is_loopback and
# is_unspecified say of an IPv4-mapped address changed in Python 3.13 (and in some patch
# releases before it), and the mapped forms must be judged by the IPv4 address they carry.
_IPV6_LOOPBACK = ipaddress.IPv6Address("::1")
_IPV6_UNSPECIFIED = ipaddress.IPv6Address("::")
_IPV4_TRANSLATED = _V6("::ffff:0:0:0/96")
_IPV4_COMPATIBLE = _V6("::/96")
_NAT64_WELL_KNOWN = _V6("64:ff9b::/96")


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses are allowed despite being in a forbidden range.

    allowed_networks is the operator's allowlist. allow_loopback is the dev mode switch.
    Cloud metadata addresses are special: a broad allowed network (say 169.254.0.0/16 or
    0.0.0.0/0) does not open them; only a network of that single address does.
    """

    allowed_networks: tuple[IPNetwork, ...] = ()
    allow_loopback: bool = False

    def __post_init__(self) -> None:
        if len(self.allowed_networks) > ALLOWED_NETWORKS_MAX:
            raise ValueError(f"at most {ALLOWED_NETWORKS_MAX} allowed networks, got {len(self.allowed_networks)}")

    @classmethod
    def from_strings(cls, networks: Iterable[str], allow_loopback: bool = False) -> AddressPolicy:
        """Build from text like ["10.1.0.0/16", "fd12::/16"], as an environment variable holds it."""
        parsed: list[IPNetwork] = []
        for text in networks:
            text = text.strip()
            if text:
                try:
                    parsed.append(ipaddress.ip_network(text, strict=True))
                except ValueError as error:
                    raise ValueError(f"allowed network {text!r} is not a network: {error}") from None
        return cls(tuple(parsed), allow_loopback)

    def is_allowed_explicitly(self, address: IPAddress) -> bool:
        if self.allow_loopback and any(address in network for network in LOOPBACK_NETWORKS if network.version == address.version):
            return True
        # An IPv6 form of an IPv4 address (mapped, NAT64, 6to4...) reaches that IPv4 address, so
        # only a network of that one IPv6 address opens it here; any other is judged as its IPv4
        # address (refusal recurses), or a broad IPv6 network such as ::/0 would open
        # ::ffff:169.254.169.254 and every private IPv4 network with it.
        embeds_ipv4 = isinstance(address, ipaddress.IPv6Address) and embedded_ipv4(address) is not None
        for network in self.allowed_networks:
            if network.version != address.version or address not in network:
                continue
            if (embeds_ipv4 or address in CLOUD_METADATA_ADDRESSES) and network.num_addresses != 1:
                continue
            return True
        return False

    def refusal(self, address: IPAddress) -> str | None:
        """The category that forbids this address ("loopback", ...), or None if it may be reached."""
        if self.is_allowed_explicitly(address):
            return None
        if isinstance(address, ipaddress.IPv4Address):
            return _ipv4_refusal(address)
        return self._ipv6_refusal(address)

    def _ipv6_refusal(self, address: ipaddress.IPv6Address) -> str | None:
        if address == _IPV6_UNSPECIFIED:
            return "unspecified"
        if address == _IPV6_LOOPBACK:
            return "loopback"
        embedded = embedded_ipv4(address)
        if embedded is not None:
            form, inner = embedded
            inner_refusal = self.refusal(inner)
            if inner_refusal is not None:
                return f"{inner_refusal}, as {form} {inner}"
            if form in ("ipv4-mapped", "nat64"):
                # These reach exactly the embedded IPv4 address, which is allowed.
                return None
            if form in ("ipv4-compatible", "ipv4-translated"):
                return f"{form} (deprecated)"
        for network, category in FORBIDDEN_IPV6_NETWORKS:
            if address in network:
                return category
        if address not in GLOBAL_UNICAST_IPV6 or not address.is_global:
            return "reserved"
        return None


def _ipv4_refusal(address: ipaddress.IPv4Address) -> str | None:
    for network, category in FORBIDDEN_IPV4_NETWORKS:
        if address in network:
            return category
    # Belt and braces: anything the standard library knows is not global, we refuse too.
    if not address.is_global or address.is_multicast:
        return "reserved"
    return None


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 form carries (mapped, translated, compatible, NAT64, 6to4), with the form's name."""
    low_bits = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _IPV4_MAPPED:
        return "ipv4-mapped", low_bits
    if address in _IPV4_TRANSLATED:
        return "ipv4-translated", low_bits
    if address in _IPV4_COMPATIBLE:
        return "ipv4-compatible", low_bits
    if address in _NAT64_WELL_KNOWN:
        return "nat64", low_bits
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    return None


# Reading hosts the way browsers and inet_aton do.


_DECIMAL_DIGITS = frozenset("0123456789")
_OCTAL_DIGITS = frozenset("01234567")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _ipv4_number(part: str) -> int | None:
    """One dot-separated part as the WHATWG URL standard reads it: 0x.. hex, 0.. octal, else decimal."""
    if not part:
        return None
    if part[:2] in ("0x", "0X"):
        digits, alphabet, radix = part[2:], _HEX_DIGITS, 16
    elif len(part) > 1 and part[0] == "0":
        digits, alphabet, radix = part[1:], _OCTAL_DIGITS, 8
    else:
        digits, alphabet, radix = part, _DECIMAL_DIGITS, 10
    if not digits:
        return 0
    # Checked by hand because int() also accepts underscores, signs and non-ASCII digits.
    if not all(character in alphabet for character in digits):
        return None
    return int(digits, radix)


def interpret_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host denotes in any legacy spelling ("2130706433", "0177.0.0.1", "0x7f.1", "127.1").

    None when the host is a name. Raises InvalidEndpointUrlError for a host that ends in a
    number but is no valid address (browsers refuse those too, e.g. "1.2.3.4.5", "256.1.1.1").
    """
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # A trailing dot ("127.0.0.1.") names the same thing.
    if _ipv4_number(parts[-1]) is None:
        return None
    numbers = [_ipv4_number(part) for part in parts]
    if len(parts) > IPV4_PARTS_MAX or any(number is None for number in numbers):
        raise InvalidEndpointUrlError(f"host {host!r} ends in a number but is not an IPv4 address")
    *leading, last = numbers
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(numbers)):
        raise InvalidEndpointUrlError(f"host {host!r} is an IPv4 address out of range")
    value = last
    for position, number in enumerate(leading):
        value += number << (8 * (3 - position))
    return ipaddress.IPv4Address(value)


def interpret_host(host: str) -> IPAddress | None:
    """The address a URL host denotes (IPv6 without brackets or zone), or None for a DNS name."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise InvalidEndpointUrlError(f"host {host!r} is not an IPv6 address") from None
    return interpret_ipv4(host)


_LOOPBACK_IPV4 = ipaddress.IPv4Address("127.0.0.1")


def _is_localhost_name(host: str) -> bool:
    # RFC 6761: "localhost" and every name under it are loopback, whatever DNS says.
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def host_refusal(host: str, policy: AddressPolicy) -> AddressRefusedError | None:
    """The refusal for a URL host known before any DNS lookup: literal addresses and localhost.

    Returns (does not raise) so the sender's hot path pays no exception cost. Other names
    return None here; the resolver checks what they resolve to.
    """
    address = interpret_host(host)
    if address is None:
        if _is_localhost_name(host):
            category = policy.refusal(_LOOPBACK_IPV4)
            return None if category is None else AddressRefusedError(str(_LOOPBACK_IPV4), f"{category}, as name {host}")
        return None
    category = policy.refusal(address)
    return None if category is None else AddressRefusedError(str(address), category)


def validate_endpoint_url(url: str, policy: AddressPolicy) -> URL:
    """Check an endpoint URL at creation; return it parsed. Raises InvalidEndpointUrlError naming the problem."""
    if len(url) > URL_CHARS_MAX:
        raise InvalidEndpointUrlError(f"longer than {URL_CHARS_MAX} characters")
    if any(character <= " " or character == "\x7f" for character in url):
        raise InvalidEndpointUrlError("contains whitespace or control characters")
    try:
        parsed = URL(url)
    except ValueError as error:
        raise InvalidEndpointUrlError(f"cannot be parsed: {error}") from None
    if parsed.scheme not in ALLOWED_SCHEMES:
        raise InvalidEndpointUrlError(f"scheme must be http or https, got {parsed.scheme!r}")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise InvalidEndpointUrlError("must not contain user information (user:password@)")
    if not parsed.raw_host:
        raise InvalidEndpointUrlError("has no host")
    if parsed.explicit_port is not None and not 1 <= parsed.explicit_port <= 65535:
        raise InvalidEndpointUrlError(f"port must be 1 to 65535, got {parsed.explicit_port}")
    refused = host_refusal(parsed.raw_host, policy)
    if refused is not None:
        raise InvalidEndpointUrlError(f"host {parsed.raw_host!r} is {refused.address}, which is {refused.category}")
    address = interpret_host(parsed.raw_host)
    if isinstance(address, ipaddress.IPv4Address) and parsed.raw_host != str(address):
        # aiohttp refuses legacy spellings at send time, so accepting one would store an
        # endpoint that can never receive anything.
        raise InvalidEndpointUrlError(f"host {parsed.raw_host!r} is a legacy spelling; write {address}")
    return parsed


# Connect time.


class GuardedResolver(AbstractResolver):
    """aiohttp resolver that drops forbidden addresses from every answer, and refuses if none is left.

    This is what stops DNS rebinding: a name that resolved to a public address when the
    endpoint was created and resolves to 127.0.0.1 now is checked now, on the answer that the
    connection will use.
    """

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if _is_localhost_name(host):
            refused = host_refusal(host, self._policy)
            if refused is not None:
                # Refuse before asking the system: /etc/hosts may map localhost anywhere.
                raise refused
        answers = await self._inner.resolve(host, port, family)
        kept: list[ResolveResult] = []
        first_refusal: AddressRefusedError | None = None
        for answer in answers:
            address = ipaddress.ip_address(answer["host"].split("%", 1)[0])
            category = self._policy.refusal(address)
            if category is None:
                kept.append(answer)
            elif first_refusal is None:
                first_refusal = AddressRefusedError(str(address), category)
        if not kept and first_refusal is not None:
            raise first_refusal
        return kept

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket_factory(policy: AddressPolicy) -> SocketFactoryType:
    """An aiohttp socket_factory that refuses to create a socket for a forbidden address.

    The last check, on the exact address about to be connected to, whatever path led there.
    """

    def create_socket(address_info: tuple) -> socket.socket:  # type: ignore[type-arg]
        family, socket_type, protocol, _, socket_address = address_info
        address = ipaddress.ip_address(socket_address[0].split("%", 1)[0])
        category = policy.refusal(address)
        if category is not None:
            raise AddressRefusedError(str(address), category)
        return socket.socket(family=family, type=socket_type, proto=protocol)

    return create_socket
