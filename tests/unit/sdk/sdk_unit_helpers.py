"""Helpers for the SDK unit tests: the fake API's address, problem bodies, recorded sleeps, a pinned retry policy."""

from __future__ import annotations

from delivery.client import RetryPolicy

BASE_URL = "http://hookledger.test"
API_KEY = "hl_live_test"
PROBLEM = "application/problem+json"


class Sleeps(list):
    """A fake sleep: remembers each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class AsyncSleeps(Sleeps):
    async def __call__(self, seconds: float) -> None:  # type: ignore[override]
        self.append(seconds)


def problem(status: int, slug: str, detail: str = "why", **extra) -> dict:
    return {"type": f"https://hookledger.dev/problems/{slug}", "title": "Title", "status": status,
            "detail": detail, **extra}


# Jitter pinned to its top (random() -> 1.0) so backoff waits are exact: 0.5, 1.0, 2.0, ...
POLICY = RetryPolicy(retries=3, random=lambda: 1.0)


