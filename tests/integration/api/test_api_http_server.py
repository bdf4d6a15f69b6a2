"""What the HTTP server says about itself: `Server: hookledger` on every answer (the API's, the
dashboard's, aiohttp's own 400s), one quiet log line for a request it cannot parse, and the
dashboard's security headers on /dashboard itself."""

from __future__ import annotations

import asyncio
import re
import logging

from delivery.dashboard.pages import SECURITY_HEADERS

GARBAGE = (
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage-tls-hello\r\n\r\n",  # TLS sent to a plain port
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    b"NOT A REQUEST LINE AT ALL\r\n\r\n",
    b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # past the request line's limit
)


async def _raw_exchange(host: str, port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_malformed_http_is_answered_400_and_logged_as_one_line_without_a_traceback(client, caplog):
    """aiohttp logged each at ERROR with its traceback (the client's fault, paged like ours)."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    for data in GARBAGE:
        caplog.clear()
        answer = await _raw_exchange(client.server.host, client.server.port, data)
        assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
        assert b"\r\nServer: hookledger\r\n" in answer and b"aiohttp" not in answer, answer[:400]
        records = [record for record in caplog.records if record.name.startswith("aiohttp")]
        assert all(record.exc_info is None and record.levelno < logging.WARNING for record in records), [
            (record.levelname, record.getMessage()) for record in records]
        lines = [record for record in records if "malformed HTTP request" in record.getMessage()]
        assert len(lines) == 1, [record.getMessage() for record in records]
        assert "\n" not in lines[0].getMessage() and "400" in lines[0].getMessage()
    # A handler's own failure is still an error, with its traceback (our middleware logs it).
    assert (await client.get("/healthz")).status == 200


async def test_every_answer_says_server_hookledger_and_no_versions(api):
    _, headers = await api.account(balance=10)
    answers = [
        await api.client.get("/healthz"),
        await api.client.get("/v1/balance", headers=headers),
        await api.client.get("/v1/balance"),  # 401
        await api.client.get("/v1/nothing-here"),  # 404
        await api.client.put("/v1/balance", headers=headers),  # 405
        await api.client.get("/openapi.json"),
        await api.client.get("/docs"),
        await api.client.get("/dashboard", allow_redirects=False),
        await api.client.get("/dashboard/sign-in"),
        await api.client.get("/dashboard/static/dashboard.css"),
        await api.client.get("/dashboard/overview", allow_redirects=False),
        await api.client.get("/dashboard/no-such-page"),
    ]
    for response in answers:
        assert response.headers.get("Server") == "hookledger", (response.url, response.headers.get("Server"))


async def test_the_dashboard_redirect_carries_the_pages_security_headers(api):
    """/dashboard (no slash) answered its redirect from the API app, without the dashboard's headers."""
    for method in ("GET", "HEAD", "POST"):
        response = await api.client.request(method, "/dashboard", allow_redirects=False)
        assert response.status == (303 if method != "POST" else 405), (method, response.status)
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (method, name)
        assert response.headers.get("Cache-Control") == "no-store"
        if method != "POST":
            assert response.headers["Location"] == "/dashboard/"
