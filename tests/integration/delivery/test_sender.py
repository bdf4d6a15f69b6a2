"""The sender against real receivers on 127.0.0.1 (loopback allowed through the allowlist).

Every outcome the worker must tell apart: success, failure, gone, Retry-After, redirects not
followed, timeout, reset, refused, a huge body cut short, and one stalled endpoint not
delaying another. Every test runs with each HTTP client the sender can use (CLIENTS): the
outcomes and their texts are the same from both.
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from delivery import metrics
from delivery.errors import SenderOverloadedError, SenderSettingsError
from delivery.engine.sender import CLIENTS, EXCERPT_BYTES_MAX_LIMIT, USER_AGENT, Sender, SenderSettings, SendRequest

CLIENT = "wire"  # set by the client fixture, for every test in turn
BODY = b'{"type":"invoice.paid","data":{"id":"in_1","amount":1200}}'
WEBHOOK_HEADERS = {
    "webhook-id": "msg_2Lh9KqXcV1",
    "webhook-timestamp": "1700000000",
    "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
}


@pytest.fixture(autouse=True, params=CLIENTS)
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once per HTTP client: sender_settings() builds SenderSettings with it."""
    monkeypatch.setattr(sys.modules[__name__], "CLIENT", request.param)
    return request.param


def sender_settings(**fields) -> SenderSettings:
    return SenderSettings(client=CLIENT, **fields)


class Receiver:
    """A real aiohttp server with one handler per path, counting hits per path."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.hits: dict[str, int] = {}
        self.requests: list[tuple[dict[str, str], bytes]] = []

    def route(self, path: str, handler) -> None:
        async def counted(request: web.Request) -> web.StreamResponse:
            self.hits[path] = self.hits.get(path, 0) + 1
            self.requests.append((dict(request.headers), await request.read()))
            return await handler(request)

        self.app.router.add_route("*", path, counted)

    async def start(self) -> None:
        self.server = TestServer(self.app, host="127.0.0.1")
        await self.server.start_server()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    yield receiver
    await receiver.server.close()


@pytest.fixture
async def sender(client: str) -> AsyncIterator[Sender]:
    async with Sender(sender_settings(allowed_networks=("127.0.0.0/8",))) as sender:
        yield sender


def request_to(url: str, timeout_ms: int = 5000, endpoint_id: str = "ep_1") -> SendRequest:
    return SendRequest(
        delivery_id="msg_2Lh9KqXcV1",
        attempt=1,
        url=url,
        body=BODY,
        headers=WEBHOOK_HEADERS,
        timeout_ms=timeout_ms,
        endpoint_id=endpoint_id,
    )


def held_until(release: asyncio.Event):
    """A handler that answers 200 once release is set."""

    async def handler(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    return handler


def answer(status: int, text: str = "", headers: dict[str, str] | None = None):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, text=text, headers=headers)

    return handler


async def test_success_delivers_headers_and_body_intact(receiver: Receiver, sender: Sender) -> None:
    """A 200 is a success, and the receiver sees our exact body, the caller's headers and ours."""
    receiver.route("/hook", answer(200, "thanks"))
    await receiver.start()
    result = await sender.send(request_to(receiver.url("/hook")))
    assert result.success and result.status_code == 200 and result.error is None
    assert result.response_excerpt == "thanks" and not result.gone and result.retry_after_seconds is None
    headers, body = receiver.requests[0]
    assert body == BODY
    for name, value in WEBHOOK_HEADERS.items():
        assert headers[name] == value
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == USER_AGENT and USER_AGENT.startswith("hookledger/")
    assert "Cookie" not in headers


async def test_server_error_is_a_failure_with_the_body_excerpt(receiver: Receiver, sender: Sender) -> None:
    """A 500 is a failed attempt; the error names the status and the excerpt keeps the receiver's words."""
    receiver.route("/hook", answer(500, "database is down"))
    await receiver.start()
    result = await sender.send(request_to(receiver.url("/hook")))
    assert not result.success and result.status_code == 500 and not result.gone
    assert result.error == "http 500 Internal Server Error"
    assert result.response_excerpt == "database is down"


async def test_gone_says_disable_the_endpoint(receiver: Receiver, sender: Sender) -> None:
    """A 410 is a failed attempt flagged gone, so the worker disables the endpoint."""
    receiver.route("/hook", answer(410))
    await receiver.start()
    result = await sender.send(request_to(receiver.url("/hook")))
    assert result.gone and not result.success and result.status_code == 410


async def test_retry_after_is_parsed_on_429_and_503_and_ignored_on_500(receiver: Receiver, sender: Sender) -> None:
    """Retry-After is honoured on 429 (seconds) and 503 (HTTP-date), and ignored on a 500. Each is
    its own endpoint: a Retry-After pauses the endpoint that answered it (delivery.engine.backpressure),
    and a send to that endpoint then comes back held, never sent, for what is left of the pause."""
    receiver.route("/busy", answer(429, headers={"Retry-After": "120"}))
    receiver.route("/down", answer(503, headers={"Retry-After": "Fri, 01 Jan 2100 00:00:00 GMT"}))
    receiver.route("/broken", answer(500, headers={"Retry-After": "120"}))
    await receiver.start()
    busy = await sender.send(request_to(receiver.url("/busy"), endpoint_id="ep_busy"))
    assert busy.status_code == 429 and busy.retry_after_seconds == 120.0 and not busy.success
    down = await sender.send(request_to(receiver.url("/down"), endpoint_id="ep_down"))
    assert down.retry_after_seconds is not None and down.retry_after_seconds > 365 * 86400
    broken = await sender.send(request_to(receiver.url("/broken"), endpoint_id="ep_broken"))
    assert broken.retry_after_seconds is None
    held = await sender.send(request_to(receiver.url("/busy"), endpoint_id="ep_busy"))
    assert held.status_code is None and held.sent_at == 0.0 and 0 < held.retry_after_seconds <= 120.0
    assert receiver.hits["/busy"] == 1, "the paused endpoint's send never left"


@pytest.mark.parametrize("status_code", [502, 504])
async def test_a_retry_after_on_a_gateway_error_pauses_the_endpoint(
        receiver: Receiver, sender: Sender, status_code: int) -> None:
    """A 502 or 504 with Retry-After is read like a 429's: the wait is kept on the result and the
    endpoint is paused, so its next send comes back held (counted as given back, paused) and
    never reaches the receiver."""
    receiver.route("/gateway", answer(status_code, headers={"Retry-After": "90"}))
    await receiver.start()
    given_back = metrics.REGISTRY.get_sample_value("hookledger_held_deliveries_given_back_total", {"reason": "paused"})
    first = await sender.send(request_to(receiver.url("/gateway"), endpoint_id="ep_gateway"))
    assert first.status_code == status_code and first.retry_after_seconds == 90.0 and not first.success
    held = await sender.send(request_to(receiver.url("/gateway"), endpoint_id="ep_gateway"))
    assert held.status_code is None and held.sent_at == 0.0 and 0 < held.retry_after_seconds <= 90.0
    assert receiver.hits["/gateway"] == 1, "the paused endpoint's send never left"
    assert metrics.REGISTRY.get_sample_value("hookledger_held_deliveries_given_back_total",
                                             {"reason": "paused"}) == (given_back or 0.0) + 1


async def test_an_http_date_retry_after_is_measured_against_the_receivers_date(receiver: Receiver, sender: Sender) -> None:
    """Retry-After two minutes after the receiver's own Date header waits two minutes, however far
    the receiver's clock (here 2001) is from ours."""
    receiver.route("/skewed", answer(503, headers={"Date": "Mon, 01 Jan 2001 00:00:00 GMT",
                                                   "Retry-After": "Mon, 01 Jan 2001 00:02:00 GMT"}))
    await receiver.start()
    skewed = await sender.send(request_to(receiver.url("/skewed")))
    assert skewed.status_code == 503 and skewed.retry_after_seconds == 120.0


async def test_redirects_are_not_followed(receiver: Receiver, sender: Sender) -> None:
    """A 302 is a failed attempt and the redirect target is never requested."""

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(receiver.url("/target"))

    receiver.route("/hook", redirect)
    receiver.route("/target", answer(200))
    await receiver.start()
    result = await sender.send(request_to(receiver.url("/hook")))
    assert result.status_code == 302 and not result.success
    assert result.error is not None and "redirects are not followed" in result.error
    assert receiver.hits.get("/target", 0) == 0


# What a send that must time out at the 1 s floor may take beyond it on a loaded machine. Well under
# the 15 s default timeout it would wait if the floor were not applied, and under the receiver's 30 s.
TIMEOUT_OVERRUN_SECONDS_MAX = 8


async def test_slow_receiver_times_out_at_the_bounded_timeout(receiver: Receiver, sender: Sender) -> None:
    """An endpoint timeout below the 1 s floor is raised to 1 s; a receiver slower than that times out.

    The lower bound is the floor itself (load only lengthens a wait). The upper bound tells the floor
    from the 15 s default and from waiting for the receiver, with room for a loaded machine."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    receiver.route("/hook", slow)
    await receiver.start()
    started = time.monotonic()
    result = await sender.send(request_to(receiver.url("/hook"), timeout_ms=10))
    elapsed_seconds = time.monotonic() - started
    assert result.status_code is None and not result.success
    assert result.error == "timeout after 1000 ms"
    assert 0.99 <= elapsed_seconds < 1 + TIMEOUT_OVERRUN_SECONDS_MAX, elapsed_seconds
    assert 990 <= result.latency_ms < 1000 * (1 + TIMEOUT_OVERRUN_SECONDS_MAX), result.latency_ms


async def raw_server(handle) -> tuple[asyncio.Server, int]:
    """A plain TCP server on loopback, for receivers that misbehave below HTTP."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def reset(writer: asyncio.StreamWriter) -> None:
    # SO_LINGER with a zero timeout makes close() send a TCP RST rather than a FIN.
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


async def test_connection_reset_before_the_response(sender: Sender) -> None:
    """A receiver that reads the request and resets the connection gives a failed attempt, 'connection reset'."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        reset(writer)

    server, port = await raw_server(handle)
    async with server:
        result = await sender.send(request_to(f"http://127.0.0.1:{port}/hook"))
    assert result.status_code is None and not result.success
    assert result.error == "connection reset"


async def test_connection_closed_mid_body(sender: Sender) -> None:
    """A receiver that promises 1000 bytes, sends 10 and resets: the status and the 10 bytes are kept, the break noted."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1000\r\n\r\n0123456789")
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    server, port = await raw_server(handle)
    async with server:
        result = await sender.send(request_to(f"http://127.0.0.1:{port}/hook"))
    assert result.status_code == 500 and not result.success
    assert result.error is not None and result.error.startswith("response body: ")
    assert result.response_excerpt == "0123456789"


async def test_connection_refused_on_a_closed_port(sender: Sender) -> None:
    """Sending to a port nobody listens on gives a failed attempt, 'connection refused', at once:
    not after waiting out its 60 s timeout (the bound leaves a loaded machine 20 s)."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    result = await sender.send(request_to(f"http://127.0.0.1:{port}/hook", timeout_ms=60_000))
    assert result.status_code is None and result.error == "connection refused"
    assert result.latency_ms < 20_000, result.latency_ms


async def test_a_connect_that_times_out_is_told_apart(client: str, request: pytest.FixtureRequest) -> None:
    """A receiver whose listen queue is full never completes the connect: the attempt fails as
    "connect timeout after N ms", the text backpressure slows the endpoint down on.

    The aiohttp client says "timeout after N ms" instead: its total timeout, started before the
    connect's own (both the attempt's timeout), fires first, so aiohttp never raises its
    ConnectionTimeoutError here. Marked as a strict xfail, so that a change on either side shows."""
    if client == "aiohttp":
        request.applymarker(pytest.mark.xfail(strict=True, reason="aiohttp's total timeout fires before sock_connect"))
    with socket.socket() as listening, socket.socket() as queued:
        listening.bind(("127.0.0.1", 0))
        listening.listen(0)
        queued.connect(listening.getsockname())  # the one connection the queue holds; later ones wait
        async with Sender(sender_settings(allowed_networks=("127.0.0.0/8",))) as sender:
            result = await sender.send(request_to(f"http://127.0.0.1:{listening.getsockname()[1]}/hook",
                                                  timeout_ms=1000))
    assert result.status_code is None and result.error == "connect timeout after 1000 ms", result.error


async def test_dns_failure_is_reported_as_dns() -> None:
    """A name that does not resolve gives a failed attempt whose error starts with 'dns: '."""
    async with Sender(sender_settings()) as sender:
        result = await sender.send(request_to("http://does-not-exist.invalid/hook"))
    assert result.status_code is None and result.error is not None and result.error.startswith("dns: ")


async def test_huge_body_is_cut_at_the_bound_without_waiting(receiver: Receiver, sender: Sender) -> None:
    """A receiver streaming an endless body: we keep 4 KiB, close the connection and return at once:
    a success, so neither after reading on to the send's 60 s timeout nor cut off by it (the bound
    leaves a loaded machine 20 s)."""

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 65536
        for _ in range(100_000):  # 6.5 GB: far more than anyone could wait for.
            await response.write(chunk)
        return response

    receiver.route("/hook", endless)
    await receiver.start()
    started = time.monotonic()
    result = await sender.send(request_to(receiver.url("/hook"), timeout_ms=60_000))
    assert time.monotonic() - started < 20, time.monotonic() - started
    assert result.success and result.status_code == 200
    assert result.response_excerpt == "x" * 4096


async def test_excerpt_is_decoded_with_replacement(receiver: Receiver, sender: Sender) -> None:
    """Invalid UTF-8 in the response does not raise; it is kept with replacement characters."""

    async def binary(request: web.Request) -> web.Response:
        return web.Response(status=400, body=b"bad \xff\xfe input")

    receiver.route("/hook", binary)
    await receiver.start()
    result = await sender.send(request_to(receiver.url("/hook")))
    assert result.response_excerpt == "bad \ufffd\ufffd input"


async def test_cookies_are_never_sent_back(receiver: Receiver, sender: Sender) -> None:
    """A receiver's Set-Cookie is dropped: the next send carries no Cookie header."""
    receiver.route("/hook", answer(200, headers={"Set-Cookie": "session=abc; Path=/"}))
    await receiver.start()
    await sender.send(request_to(receiver.url("/hook")))
    await sender.send(request_to(receiver.url("/hook")))
    assert all("Cookie" not in headers for headers, _ in receiver.requests)


async def test_a_stalled_endpoint_does_not_delay_another() -> None:
    """With endpoint A's receiver stalled and more sends queued for A than connections exist,
    a send to endpoint B still completes, and A never holds more than its bound.

    A's receiver answers only once B's send has ended, so B cannot have waited for any of A's
    sends: had it queued behind them, the two would wait for each other until wait_for fails."""
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), connections_max=8, sends_per_endpoint_max=4)
    release = asyncio.Event()
    in_flight = {"now": 0, "peak": 0}

    async def stalled(request: web.Request) -> web.Response:
        in_flight["now"] += 1
        in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
        await release.wait()
        in_flight["now"] -= 1
        return web.Response()

    stalled_receiver, healthy_receiver = Receiver(), Receiver()
    stalled_receiver.route("/a", stalled)
    healthy_receiver.route("/b", answer(200))
    await stalled_receiver.start()
    await healthy_receiver.start()
    try:
        async with Sender(settings) as sender:
            stalled_sends = [
                asyncio.create_task(sender.send(request_to(stalled_receiver.url("/a"), endpoint_id="ep_a")))
                for _ in range(20)
            ]
            while in_flight["now"] < 4:
                await asyncio.sleep(0.01)
            healthy = await asyncio.wait_for(
                sender.send(request_to(healthy_receiver.url("/b"), endpoint_id="ep_b")), 30)
            assert healthy.success and not release.is_set()
            assert in_flight["now"] == 4 and not any(send.done() for send in stalled_sends)
            assert in_flight["peak"] == 4
            release.set()
            results = await asyncio.gather(*stalled_sends)
            assert all(result.success for result in results)
            assert in_flight["peak"] == 4
    finally:
        release.set()
        await stalled_receiver.server.close()
        await healthy_receiver.server.close()


async def test_idle_endpoints_are_forgotten(receiver: Receiver) -> None:
    """The sender keeps per-endpoint bookkeeping only while an endpoint has a send queued or out."""
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), sends_pending_max=3)
    receiver.route("/hook", answer(200))
    await receiver.start()
    async with Sender(settings) as sender:
        for number in range(10):
            pending = sender.submit(request_to(receiver.url("/hook"), endpoint_id=f"ep_{number}"))
            assert sender.endpoints_pending == 1 and sender.pending == 1
            assert (await pending).success
            assert sender.endpoints_pending == 0 and sender.pending == 0


async def test_too_many_concurrent_sends_is_a_caller_bug(receiver: Receiver) -> None:
    """Starting more concurrent sends than sends_pending_max raises: the worker must bound its concurrency."""
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), sends_pending_max=2)
    release = asyncio.Event()
    receiver.route("/hook", held_until(release))
    await receiver.start()
    async with Sender(settings) as sender:
        pending = [asyncio.create_task(sender.send(request_to(receiver.url("/hook")))) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(SenderOverloadedError):
            await sender.send(request_to(receiver.url("/hook")))
        release.set()
        assert all(result.success for result in await asyncio.gather(*pending))


async def test_waiting_for_a_connection_does_not_count_against_the_timeout(receiver: Receiver) -> None:
    """With one connection per host, five concurrent 0.8 s sends with a 2.5 s timeout all succeed: they
    queue on the sender's own per-host bound, not inside the connector where the wait would time out.

    The receiver never has two at once, so the last waited 3.2 s for its connection: counted against
    its timeout, it (and the fourth) would fail. Each send's own 0.8 s leaves 1.7 s to a loaded machine."""
    answering = {"now": 0, "peak": 0}

    async def slow(request: web.Request) -> web.Response:
        answering["now"] += 1
        answering["peak"] = max(answering["peak"], answering["now"])
        await asyncio.sleep(0.8)
        answering["now"] -= 1
        return web.Response(text="ok")

    receiver.route("/slow", slow)
    await receiver.start()
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), connections_per_host_max=1)
    async with Sender(settings) as sender:
        results = await asyncio.gather(*(
            sender.send(request_to(receiver.url("/slow"), timeout_ms=2500, endpoint_id=f"ep_{n}")) for n in range(5)))
    assert [r.success for r in results] == [True] * 5, [r.error for r in results]
    assert answering["peak"] == 1 and receiver.hits["/slow"] == 5
    # The latency is the time on the wire, not in the queue: the last would show 4 s.
    assert all(r.latency_ms < 2500 for r in results), [r.latency_ms for r in results]


async def test_a_queued_send_whose_caller_gave_up_is_never_sent(receiver: Receiver) -> None:
    """One send per endpoint at a time: the second waits; cancelling it before the first ends
    means it never reaches the receiver, and the third still goes in its turn."""
    release = asyncio.Event()
    receiver.route("/hook", held_until(release))
    await receiver.start()
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), sends_per_endpoint_max=1)
    async with Sender(settings) as sender:
        first = sender.submit(request_to(receiver.url("/hook")))
        second = sender.submit(request_to(receiver.url("/hook")))
        third = sender.submit(request_to(receiver.url("/hook")))
        while receiver.hits.get("/hook", 0) < 1:
            await asyncio.sleep(0.01)
        assert sender.pending == 3
        second.cancel()
        release.set()
        assert (await first).success and (await third).success
        assert receiver.hits["/hook"] == 2
        assert sender.pending == 0 and sender.endpoints_pending == 0


async def test_closing_cancels_every_send_on_the_wire_and_queued(receiver: Receiver) -> None:
    """close() does not wait for a stalled receiver: the sends out and those queued behind them
    end cancelled, and nothing is left pending."""

    async def stalled(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    receiver.route("/hook", stalled)
    await receiver.start()
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), connections_per_host_max=2)
    sender = Sender(settings)
    sends = [sender.submit(request_to(receiver.url("/hook"), endpoint_id=f"ep_{n % 3}")) for n in range(7)]
    while receiver.hits.get("/hook", 0) < 2:
        await asyncio.sleep(0.01)
    assert sender.pending == 7
    started = time.monotonic()
    await sender.close()
    assert time.monotonic() - started < 15  # not the receiver's 30 s; room for a loaded machine
    assert all(send.cancelled() for send in sends)
    assert receiver.hits["/hook"] == 2
    assert sender.pending == 0 and sender.endpoints_pending == 0 and sender.closed
    with pytest.raises(RuntimeError):
        sender.submit(request_to(receiver.url("/hook")))


async def test_closing_before_any_runner_ran_cancels_every_send(receiver: Receiver) -> None:
    """Sends submitted and the sender closed at once, before the event loop ran a runner: every
    future ends cancelled, none is left pending, and nothing reaches the receiver."""
    receiver.route("/hook", answer(200))
    await receiver.start()
    sender = Sender(sender_settings(allowed_networks=("127.0.0.0/8",), connections_per_host_max=2))
    sends = [sender.submit(request_to(receiver.url("/hook"), endpoint_id=f"ep_{n}")) for n in range(5)]
    assert sender.pending == 5
    await sender.close()
    assert all(send.cancelled() for send in sends)
    assert sender.pending == 0 and sender.endpoints_pending == 0
    assert receiver.hits.get("/hook", 0) == 0


@pytest.mark.parametrize("round_number", range(5))
async def test_many_concurrent_sends_keep_every_bound_and_each_endpoints_order(round_number: int) -> None:
    """300 sends over 6 endpoints on two receivers (two hosts), with random short stalls: at no
    moment does an endpoint, a host or the sender have more requests open than its bound; each
    endpoint's sends start in the order they were submitted (with up to 3 open at once, the i-th
    to arrive is one of the first i + 3 submitted); every send succeeds."""

    rng = random.Random(round_number)
    bounds = {"endpoint": 3, "host": 4, "total": 6}
    open_now = {"total": 0}
    peaks: dict[str, int] = {}
    arrivals: dict[str, list[int]] = {}
    submitted: dict[str, list[int]] = {}

    def bump(key: str, step: int) -> None:
        open_now[key] = open_now.get(key, 0) + step
        peaks[key] = max(peaks.get(key, 0), open_now[key])

    def handler(host: str):
        async def handle(request: web.Request) -> web.Response:
            endpoint, number = request.headers["x-endpoint"], int(request.headers["x-number"])
            arrivals.setdefault(endpoint, []).append(number)
            for key in ("total", host, endpoint):
                bump(key, 1)
            await asyncio.sleep(rng.choice((0, 0, 0.001, 0.003, 0.01)))  # 0.01: enough overlap on a slow machine
            for key in ("total", host, endpoint):
                bump(key, -1)
            return web.Response()
        return handle

    receivers = [Receiver(), Receiver()]
    for index, receiver in enumerate(receivers):
        receiver.route("/hook", handler(f"host{index}"))
        await receiver.start()
    settings = sender_settings(allowed_networks=("127.0.0.0/8",), sends_per_endpoint_max=bounds["endpoint"],
                              connections_per_host_max=bounds["host"], connections_max=bounds["total"])
    try:
        async with Sender(settings) as sender:
            sends = []
            for number in range(300):
                endpoint = f"ep_{rng.randrange(6)}"
                receiver = receivers[int(endpoint[-1]) % 2]
                request = request_to(receiver.url("/hook"), endpoint_id=endpoint)._replace(
                    headers={**WEBHOOK_HEADERS, "x-endpoint": endpoint, "x-number": str(number)})
                sends.append(sender.submit(request))
                submitted.setdefault(endpoint, []).append(number)
                if rng.random() < 0.1:
                    await asyncio.sleep(0)
            results = await asyncio.gather(*sends)
            assert sender.pending == 0 and sender.endpoints_pending == 0
    finally:
        for receiver in receivers:
            await receiver.server.close()
    assert all(result.success for result in results)
    assert sum(len(numbers) for numbers in arrivals.values()) == 300
    assert peaks["total"] <= bounds["total"]
    assert max(peaks[f"host{index}"] for index in range(2)) <= bounds["host"]
    assert max(peaks[endpoint] for endpoint in arrivals) <= bounds["endpoint"]
    assert peaks["total"] == bounds["total"], "the total bound was never reached: the test did not load the sender"
    for endpoint, numbers in arrivals.items():
        position = {number: index for index, number in enumerate(submitted[endpoint])}
        late = [(index, number) for index, number in enumerate(numbers)
                if position[number] > index + bounds["endpoint"] - 1]
        assert not late, f"{endpoint}'s sends started out of order: {late[:3]}"


def test_an_excerpt_longer_than_the_database_keeps_is_refused() -> None:
    """delivery_attempts keeps 4,096 characters of a response: a larger excerpt setting would
    fail the record of every batch holding a long answer, so it is refused at start."""
    assert SenderSettings(excerpt_bytes_max=EXCERPT_BYTES_MAX_LIMIT).excerpt_bytes_max == 4096
    with pytest.raises(SenderSettingsError, match="excerpt_bytes_max must be 0 to 4096"):
        SenderSettings(excerpt_bytes_max=EXCERPT_BYTES_MAX_LIMIT + 1)
