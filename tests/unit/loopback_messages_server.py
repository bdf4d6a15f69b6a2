"""A loopback aiohttp server for the benchmark load generators' tests (test_wrk_load.py,
test_raw_load.py): it answers POST /v1/messages with the given handler, and the checks that a
load sent the body with each key in turn."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

BODY = b'{"event_type":"t","payload":{}}'
KEYS = ["k1", "k2", "k3"]


@asynccontextmanager
async def serving(port: int, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """The server's base URL while it runs."""
    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def counting_handler(seen: list[tuple[str, bytes, str]]):
    """Records each request's key, body and content type; every seventh answer is a 500."""
    async def handler(request: web.Request) -> web.Response:
        seen.append((request.headers["Authorization"], await request.read(), request.content_type))
        return web.json_response({"n": len(seen)}, status=500 if len(seen) % 7 == 0 else 202)
    return handler


def assert_each_key_in_turn(seen: list[tuple[str, bytes, str]], spread: int) -> None:
    """Every request carried BODY as JSON, and the keys came about equally often (within spread)."""
    assert len(seen) > 30
    assert {body for _, body, _ in seen} == {BODY}
    assert {content_type for _, _, content_type in seen} == {"application/json"}
    keys = [authorization for authorization, _, _ in seen]
    assert set(keys) == {f"Bearer {key}" for key in KEYS}
    assert max(keys.count(key) for key in set(keys)) - min(keys.count(key) for key in set(keys)) <= spread
