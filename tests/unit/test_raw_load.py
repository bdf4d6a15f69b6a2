"""scripts/raw_load.py, the ingest benchmark's lean Python load: its requests are whole and keyed
in turn, an answer is read by its Content-Length and nothing else, and a real run against a
loopback server sends the body with each key in turn and counts what the server answered."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from aiohttp import web

from loopback_messages_server import BODY, KEYS, assert_each_key_in_turn, counting_handler, serving

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import raw_load  # noqa: E402  (scripts/ is not a package)


def test_each_key_has_its_whole_request():
    first, second = raw_load.requests_for("http://127.0.0.1:8080/v1/messages", ["k1", "k2"], b'{"a":1}')
    assert first == (b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 7\r\nAuthorization: Bearer k1\r\n\r\n{\"a\":1}")
    assert second.endswith(b"Authorization: Bearer k2\r\n\r\n{\"a\":1}")


@pytest.mark.parametrize(("url", "keys", "message"), [
    ("http://127.0.0.1:8080/v1/messages", [], "at least one key"),
    ("https://127.0.0.1:8080/v1/messages", ["k"], "an http URL"),
    ("http://127.0.0.1/v1/messages", ["k"], "an http URL"),
    ("http://127.0.0.1:8080/v1/messages", ["k\r\nX-Evil: 1"], "cannot go in a header"),
])
def test_what_cannot_be_sent_as_it_is_is_refused(url, keys, message):
    with pytest.raises(ValueError, match=message):
        raw_load.requests_for(url, keys, b"{}")


def test_an_answer_is_complete_at_its_content_length():
    answer = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\ncontent-LENGTH: 5\r\n\r\n{\"a\"}"
    assert raw_load.answer_length(answer[:20]) is None  # the head is not in yet
    assert raw_load.answer_length(answer[:-3]) == (202, len(answer))
    with pytest.raises(ValueError, match="without Content-Length"):
        raw_load.answer_length(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(ValueError, match="not an HTTP/1.1 answer"):
        raw_load.answer_length(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")


async def test_a_real_run_sends_the_body_with_each_key_in_turn(unused_tcp_port):
    seen: list[tuple[str, bytes, str]] = []
    async with serving(unused_tcp_port, counting_handler(seen)) as url:
        rate, statuses = await raw_load.load(url, KEYS, BODY, 1, 4)
    assert_each_key_in_turn(seen, spread=1)
    failed = len(seen) // 7
    # It counts what finished in its time; the server saw the requests in flight at the end too.
    assert 0 <= failed - statuses.get(500, 0) <= 4
    assert 0 <= (len(seen) - failed) - statuses[202] <= 4
    assert rate == pytest.approx(statuses[202] / 1)


async def test_a_server_that_hangs_up_fails_the_run(unused_tcp_port):
    async def hang_up(request: web.Request) -> web.Response:
        request.transport.close()
        return web.Response()

    async with serving(unused_tcp_port, hang_up) as url:
        with pytest.raises(RuntimeError, match="closed a connection"):
            await raw_load.load(url, ["k"], b"{}", 1, 2)
