"""Fixtures and steps shared by the browser tests (see conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from dashboard_helpers import OPERATOR_KEY, Dashboard
from delivery.platform import config
from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app
from engine_helpers import fast_environment

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
TIMEOUT_MS = 15_000


@pytest.fixture
async def platform(database_url, redis_url, pool, keyring):
    """The API with its dashboard on loopback; settings shared with the worker (same keyring, fast retries)."""
    environment = fast_environment(database_url, redis_url, keyring, HOOKLEDGER_OPERATOR_KEY=OPERATOR_KEY,
                                   HOOKLEDGER_ATTEMPTS_MAX="3", HOOKLEDGER_AUDIT_MINUTES="0")
    settings = config.load(environment)
    redis = await job_queue.connect(redis_url)
    server = TestServer(create_app(settings, pool, job_queue.Queue(redis)), host="127.0.0.1")
    await server.start_server()
    base_url = str(server.make_url("")).rstrip("/")
    client = Dashboard(base_url, pool)
    try:
        yield base_url, settings, client
    finally:
        await client.close()
        await server.close()
        await redis.aclose()


@pytest.fixture
async def browser_page():
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 860})
            context.set_default_timeout(TIMEOUT_MS)
            yield await context.new_page()
        finally:
            await browser.close()


async def screenshot(page, name: str) -> None:
    """A full-page PNG for a person to look at (test-artifacts/screenshots/<name>.png)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


async def sign_in(page, base_url: str, key: str) -> None:
    await page.goto(f"{base_url}/dashboard/sign-in")
    await page.fill("input[name=key]", key)
    async with page.expect_navigation():
        await page.click("main button[type=submit]")


async def wait_for_state(page, state: str, *, timeout_seconds: float = 20) -> None:
    """Wait on a delivery page while its own script reloads it (every 2 s while in flight)."""
    deadline = time.monotonic() + timeout_seconds
    while not await page.locator(f"#state .state-{state}").count():
        assert time.monotonic() < deadline, f"the delivery did not turn {state}: {await page.inner_text('#state')}"
        await page.wait_for_timeout(250)
