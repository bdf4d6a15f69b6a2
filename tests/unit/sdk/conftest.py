"""Fixtures for the SDK unit tests: a client against a respx-mocked API whose sleeps are recorded, not slept."""

from __future__ import annotations

import pytest
from sdk_unit_helpers import API_KEY, BASE_URL, POLICY, AsyncSleeps, Sleeps

from delivery.client import AsyncClient, Client


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def client(sleeps):
    with Client(BASE_URL, API_KEY, retry_policy=POLICY, sleep=sleeps) as sdk:
        yield sdk


@pytest.fixture
def async_sleeps() -> AsyncSleeps:
    return AsyncSleeps()


@pytest.fixture
async def async_client(async_sleeps):
    async with AsyncClient(BASE_URL, API_KEY, retry_policy=POLICY, sleep=async_sleeps) as sdk:
        yield sdk
