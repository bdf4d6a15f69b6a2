#!/usr/bin/env python3
"""The ingest load from a lean Python client: C keep-alive connections, one request in flight on each.

`bench_ingest.py`'s aiohttp client spends 77 to 119 µs of CPU a request, more than either server
it measures, on the same two cores; wrk spends 9 to 16 (wrk_load.py) but is a Debian package
that a fresh machine may not have. This client is the middle way that needs nothing installed:
it runs in a process of its own on uvloop, writes requests built once (one per key), and reads
each answer with no more parsing than its status and Content-Length. Like wrk it keeps C
connections each with one request in flight, the keys round-robin across all of them, and
counts the answers finished within the run's seconds (the ones still in flight then are not).

It reads only what a server that answers every request with a Content-Length sends (aiohttp's
JSON responses, the API's and the trivial handler's); an answer without one is an error.

Usage (as bench_ingest.py runs it): raw_load.py, with a JSON object on stdin holding url, keys,
body (text), seconds and concurrency; it prints the answers finished in time, {status: count}.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from urllib.parse import urlsplit

from delivery import event_loop

_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
CONNECT_SECONDS = 10.0


def requests_for(url: str, keys: list[str], body: bytes, paths: list[str] | None = None) -> list[bytes]:
    """One whole POST of the body per key, to the URL's path, or to the path beside each key."""
    if not keys:
        raise ValueError("at least one key")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"an http URL with a host and a port, got {url!r}")
    for key in keys:
        if not re.fullmatch(r"[A-Za-z0-9_\-.~+/=]+", key):
            raise ValueError(f"a key that cannot go in a header as it is: {key[:20]!r}")
    if paths is not None and (len(paths) != len(keys) or not all(re.fullmatch(r"/[A-Za-z0-9_\-./]*", p) for p in paths)):
        raise ValueError("one plain path per key")
    head = (f" HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
    paths = paths or [parts.path or "/"] * len(keys)
    return [(f"POST {path}" + head + f"Authorization: Bearer {key}\r\n\r\n").encode() + body
            for key, path in zip(keys, paths, strict=True)]


def answer_length(buffer: bytes | bytearray) -> tuple[int, int] | None:
    """(status, length of the whole answer) once its head is in the buffer; None before."""
    end = buffer.find(_HEAD_END)
    if end < 0:
        return None
    head = bytes(buffer[:end])
    if not head.startswith(b"HTTP/1.1 "):
        raise ValueError(f"not an HTTP/1.1 answer: {head[:40]!r}")
    length = _CONTENT_LENGTH.search(head)
    if length is None:
        raise ValueError(f"an answer without Content-Length: {head[:200]!r}")
    return int(head[9:12]), end + len(_HEAD_END) + int(length.group(1))


class _Run:
    """What the connections share: the requests in turn, the deadline and the count."""

    def __init__(self, requests: list[bytes]) -> None:
        self.requests = requests
        self.turn = 0
        self.deadline = float("inf")
        self.answered: dict[int, int] = {}
        self.failure: BaseException | None = None

    def next_request(self) -> bytes:
        request = self.requests[self.turn % len(self.requests)]
        self.turn += 1
        return request


class _Connection(asyncio.Protocol):
    def __init__(self, run: _Run) -> None:
        self.run = run
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.expected: tuple[int, int] | None = None
        self.closing = False
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self) -> None:
        self.transport.write(self.run.next_request())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            if self.expected is None:
                self.expected = answer_length(self.buffer)
                if self.expected is None:
                    return
        except ValueError as error:
            self.run.failure = error
            self.close()
            return
        status, length = self.expected
        if len(self.buffer) < length:
            return
        if len(self.buffer) > length:
            self.run.failure = ValueError("an answer with more bytes than its Content-Length")
            self.close()
            return
        self.buffer.clear()
        self.expected = None
        if time.perf_counter() >= self.run.deadline:
            self.close()
            return
        self.run.answered[status] = self.run.answered.get(status, 0) + 1
        self.send()

    def close(self) -> None:
        self.closing = True
        self.transport.close()

    def connection_lost(self, error) -> None:
        if not self.closing and self.run.failure is None and time.perf_counter() < self.run.deadline:
            self.run.failure = ConnectionError(f"the server closed a connection during the run ({error!r})")
        if not self.lost.done():
            self.lost.set_result(error)


async def run(url: str, keys: list[str], body: bytes, seconds: float, concurrency: int,
              paths: list[str] | None = None) -> dict[int, int]:
    """Connect `concurrency` connections, then send for `seconds`: the answers finished in that time,
    by status."""
    parts = urlsplit(url)
    this = _Run(requests_for(url, keys, body, paths))
    loop = asyncio.get_running_loop()
    connections = []
    for _ in range(concurrency):
        _, connection = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(this), parts.hostname, parts.port), CONNECT_SECONDS)
        connections.append(connection)
    started = time.perf_counter()
    this.deadline = started + seconds
    for connection in connections:
        connection.send()
    await asyncio.sleep(seconds)
    for connection in connections:
        connection.close()
    await asyncio.gather(*(connection.lost for connection in connections))
    if this.failure is not None:
        raise this.failure
    return this.answered


async def load(base_url: str, keys: list[str], body: bytes, seconds: float, concurrency: int,
               paths: list[str] | None = None) -> tuple[float, dict]:
    """POST body to base_url/v1/messages (or to the path beside each key) round-robin over the keys
    for `seconds` from `concurrency` connections, from a process of its own: 202 answers per
    second, and the counts by status."""
    spec = json.dumps({"url": f"{base_url}/v1/messages", "keys": keys, "body": body.decode(), "seconds": seconds,
                       "concurrency": concurrency, "paths": paths}).encode()
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    output, errors = await process.communicate(spec)
    if process.returncode != 0:
        raise RuntimeError(f"raw_load.py exited with {process.returncode}: {errors.decode()[-500:]}")
    statuses = {int(status): count for status, count in json.loads(output).items()}
    return statuses.get(202, 0) / seconds, statuses


if __name__ == "__main__":
    spec = json.load(sys.stdin)
    # The platform's loop (uvloop where installed), as the servers run.
    answered = event_loop.run(run(spec["url"], spec["keys"], spec["body"].encode(), spec["seconds"],
                                  spec["concurrency"], spec.get("paths")))
    print(json.dumps(answered))
