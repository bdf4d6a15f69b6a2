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

from billing import shards
from delivery import event_loop, gc_tuning
from delivery.api import group_commit
from delivery.engine.pipeline import EngineSettings
from delivery.engine.retry import RetrySchedule, RetrySettings
from delivery.engine.sender import CLIENTS as SENDER_CLIENTS, SenderSettings


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
    """Redis, arq's queue. url None means: start an embedded server of this process's own."""

    url: str | None
    start_wait_seconds: int = 30  # how long the API or a worker waits for Redis to answer at start


@dataclass(frozen=True)
class LedgerSettings:
    """Defaults for new accounts and deliveries."""

    price_per_delivery_default: int = 1
    attempts_max: int = 8


@dataclass(frozen=True)
class WorkerSettings:
    """The delivery worker: arq job limits, sweeps, shutdown, and the engine's pacing."""

    jobs_max: int = 20
    # How often a worker reads the queue without a wake-up: a job due now wakes the workers at once
    # (delivery.engine.queue.WAKE_CHANNEL), so this bounds only how late a retry's deferred job, or a
    # lost wake-up, is read.
    poll_ms: int = 250
    sweep_interval_seconds: int = 5
    shutdown_grace_seconds: int = 10
    metrics_port: int = 0  # serve the worker's Prometheus metrics on 127.0.0.1:port; 0: off
    metrics_share_seconds: int = 5  # how often the worker's metrics go to Redis for the API's /metrics; 0: never
    audit_interval_minutes: int = 10  # the audit cron's period; 0 turns it off
    gc_gen0_threshold: int = 50_000  # delivery.gc_tuning; 0 keeps Python's collector settings
    engine: EngineSettings = field(default_factory=EngineSettings)
    sender: SenderSettings = field(default_factory=SenderSettings)

    def __post_init__(self) -> None:
        # A lease shorter than a send would let a second worker claim a delivery still in flight.
        if self.engine.lease_ms <= self.sender.timeout_ms_max + 1000:
            raise ConfigError(
                f"the lease ({self.engine.lease_ms} ms) must exceed the longest send timeout"
                f" ({self.sender.timeout_ms_max} ms) by at least a second"
            )


@dataclass(frozen=True)
class ApiSettings:
    """The HTTP API: where it listens, its operator key, body limits, SSRF policy and group commit.

    operator_key (and Settings.secret_keyring) None are allowed only in dev mode, where `hookledger api`
    generates them and prints them once.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    operator_key: str | None = None
    payload_bytes_max: int = 262_144
    dev_mode: bool = False
    allowed_networks: tuple[str, ...] = ()
    group_commit_batch_max: int = group_commit.BATCH_MAX
    group_commit_concurrency: int = group_commit.CONCURRENCY
    group_commit_parallel_waiting_min: int = group_commit.PARALLEL_WAITING_MIN
    group_commit_stall_ms: int = round(group_commit.STALL_SECONDS * 1000)
    group_commit_queue_max: int = group_commit.QUEUE_MAX
    # A create whose COMMIT answer was lost asks the database this long whether it was written
    # (billing.messages.resolve_outcome) before it answers 503 write-outcome-unknown.
    commit_outcome_wait_seconds: int = 10
    auth_cache_ttl_ms: int = 30_000
    secret_rotation_overlap_seconds: int = 86_400
    log_level: str = "info"
    gc_gen0_threshold: int = 50_000  # delivery.gc_tuning, in `hookledger api`; 0 keeps Python's settings
    # HOOKLEDGER_ACCOUNT_SHARDS, read for the worker's engine too: above 1, a group-commit
    # transaction carries the accounts of one shard only (delivery.api.group_commit).
    account_shards: int = 1
    account_shard_hash: str = "postgres"  # HOOKLEDGER_ACCOUNT_SHARD_HASH: postgres or citus


@dataclass(frozen=True)
class Settings:
    database: DatabaseSettings
    redis: RedisSettings
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    # The at-rest keyring that seals endpoint secrets (signing.parse_keyring format): the API
    # seals with it, the worker opens with it, so both read this one setting.
    secret_keyring: str | None = None
    # The API's and the worker's event loop (delivery.event_loop): auto, uvloop or asyncio.
    event_loop: str = "auto"


def load(environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    data_dir = Path(environ.get("HOOKLEDGER_DATA_DIR") or default_data_dir())
    return Settings(
        database=DatabaseSettings(
            url=environ.get("DATABASE_URL") or None,
            data_dir=data_dir / "postgres",
            pool_size_min=_integer(environ, "HOOKLEDGER_DB_POOL_MIN", DatabaseSettings.pool_size_min, 1, 100),
            pool_size_max=_integer(environ, "HOOKLEDGER_DB_POOL_MAX", DatabaseSettings.pool_size_max, 1, 500),
        ),
        redis=RedisSettings(url=environ.get("REDIS_URL") or None,
                            start_wait_seconds=_integer(environ, "HOOKLEDGER_REDIS_START_WAIT_SECONDS",
                                                        RedisSettings.start_wait_seconds, 0, 3600)),
        ledger=LedgerSettings(
            price_per_delivery_default=_integer(environ, "HOOKLEDGER_PRICE_PER_DELIVERY",
                                                LedgerSettings.price_per_delivery_default, 0, 10**12),
            attempts_max=_attempts_max(environ),
        ),
        worker=_worker(environ),
        secret_keyring=environ.get("HOOKLEDGER_SECRET_KEYS") or None,
        api=_api(environ),
        event_loop=_event_loop(environ),
    )


def _event_loop(environ: Mapping[str, str]) -> str:
    choice = (environ.get("HOOKLEDGER_EVENT_LOOP") or "auto").strip().lower()
    if choice not in event_loop.CHOICES:
        raise ConfigError(f"HOOKLEDGER_EVENT_LOOP must be {', '.join(event_loop.CHOICES)}, got {choice!r}")
    return choice


def _flag(environ: Mapping[str, str], name: str) -> bool:
    raw = (environ.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _schedule(environ: Mapping[str, str]) -> RetrySchedule:
    raw = environ.get("HOOKLEDGER_RETRY_SCHEDULE")
    return RetrySchedule.from_string(raw) if raw else RetrySchedule()


def _attempts_max(environ: Mapping[str, str]) -> int:
    """The attempt limit is the retry schedule's length unless set on its own."""
    return _integer(environ, "HOOKLEDGER_ATTEMPTS_MAX", _schedule(environ).attempts_max, 1, 50)


def _networks(environ: Mapping[str, str]) -> tuple[str, ...]:
    """HOOKLEDGER_ALLOWED_NETWORKS: comma-separated networks the SSRF guard lets through (API and worker)."""
    raw = environ.get("HOOKLEDGER_ALLOWED_NETWORKS") or ""
    return tuple(network.strip() for network in raw.split(",") if network.strip())


def _sender_client(environ: Mapping[str, str]) -> str:
    """HOOKLEDGER_SENDER_CLIENT: the sender's HTTP client, wire (the default) or aiohttp (the fallback)."""
    raw = (environ.get("HOOKLEDGER_SENDER_CLIENT") or SenderSettings.client).strip().lower()
    if raw not in SENDER_CLIENTS:
        raise ConfigError(f"HOOKLEDGER_SENDER_CLIENT must be one of {', '.join(SENDER_CLIENTS)}, got {raw!r}")
    return raw


def _worker(environ: Mapping[str, str]) -> WorkerSettings:
    sender = SenderSettings(
        timeout_ms_default=_integer(environ, "HOOKLEDGER_SEND_TIMEOUT_MS",
                                    SenderSettings.timeout_ms_default, 1000, 60_000),
        timeout_ms_max=_integer(environ, "HOOKLEDGER_SEND_TIMEOUT_MS_MAX", SenderSettings.timeout_ms_max, 1000, 60_000),
        connections_max=_integer(environ, "HOOKLEDGER_CONNECTIONS_MAX", SenderSettings.connections_max, 1, 100_000),
        connections_per_host_max=_integer(environ, "HOOKLEDGER_CONNECTIONS_PER_HOST_MAX",
                                          SenderSettings.connections_per_host_max, 1, 100_000),
        sends_per_endpoint_max=_integer(environ, "HOOKLEDGER_SENDS_PER_ENDPOINT_MAX",
                                        SenderSettings.sends_per_endpoint_max, 1, 100_000),
        allowed_networks=_networks(environ),
        allow_loopback=_flag(environ, "HOOKLEDGER_DEV"),
        client=_sender_client(environ),
    )
    engine = EngineSettings(
        batch_size=_integer(environ, "HOOKLEDGER_CLAIM_BATCH", EngineSettings.batch_size, 1, 1000),
        lease_ms=_integer(environ, "HOOKLEDGER_LEASE_MS", EngineSettings.lease_ms, 1000, 3_600_000),
        sweep_lanes=_integer(environ, "HOOKLEDGER_SWEEP_LANES", EngineSettings.sweep_lanes, 1, 64),
        retry=RetrySettings(schedule=_schedule(environ)),
        account_shards=_account_shards(environ),
        account_shard_hash=_account_shard_hash(environ),
    )
    return WorkerSettings(
        jobs_max=_integer(environ, "HOOKLEDGER_WORKER_JOBS", WorkerSettings.jobs_max, 1, 1000),
        poll_ms=_integer(environ, "HOOKLEDGER_WORKER_POLL_MS", WorkerSettings.poll_ms, 1, 1000),
        sweep_interval_seconds=_integer(environ, "HOOKLEDGER_SWEEP_SECONDS",
                                        WorkerSettings.sweep_interval_seconds, 1, 60),
        shutdown_grace_seconds=_integer(environ, "HOOKLEDGER_SHUTDOWN_GRACE_SECONDS",
                                        WorkerSettings.shutdown_grace_seconds, 0, 300),
        audit_interval_minutes=_integer(environ, "HOOKLEDGER_AUDIT_MINUTES",
                                        WorkerSettings.audit_interval_minutes, 0, 60),
        metrics_port=_integer(environ, "HOOKLEDGER_WORKER_METRICS_PORT", WorkerSettings.metrics_port, 0, 65535),
        metrics_share_seconds=_integer(environ, "HOOKLEDGER_WORKER_METRICS_SHARE_SECONDS",
                                       WorkerSettings.metrics_share_seconds, 0, 300),
        gc_gen0_threshold=_gc_threshold(environ, "HOOKLEDGER_WORKER_GC_GEN0", WorkerSettings.gc_gen0_threshold),
        engine=engine,
        sender=sender,
    )


def _account_shards(environ: Mapping[str, str]) -> int:
    """HOOKLEDGER_ACCOUNT_SHARDS: how many shards the account-scoped tables are split into (the
    partition count, or the Citus shard count); the API's group commit and the worker's claims then
    write one shard's accounts per statement. 1: one server, one statement as ever."""
    return _integer(environ, "HOOKLEDGER_ACCOUNT_SHARDS", 1, 1, shards.PARTITIONS_MAX)


def _account_shard_hash(environ: Mapping[str, str]) -> str:
    """HOOKLEDGER_ACCOUNT_SHARD_HASH: which hash places an account in a shard: `postgres` (the
    tables hash-partitioned by PostgreSQL, HOOKLEDGER_ACCOUNT_PARTITIONS) or `citus` (distributed
    tables; HOOKLEDGER_ACCOUNT_SHARDS is then the Citus shard count)."""
    choice = (environ.get("HOOKLEDGER_ACCOUNT_SHARD_HASH") or "postgres").strip().lower()
    if choice not in shards.SHARD_HASHES:
        raise ConfigError(f"HOOKLEDGER_ACCOUNT_SHARD_HASH must be {' or '.join(shards.SHARD_HASHES)}, got {choice!r}")
    return choice


def _gc_threshold(environ: Mapping[str, str], name: str, default: int) -> int:
    value = _integer(environ, name, default, 0, gc_tuning.GEN0_MAX)
    if 0 < value < gc_tuning.GEN0_MIN:
        raise ConfigError(f"{name} must be 0 (Python's defaults) or"
                          f" {gc_tuning.GEN0_MIN} to {gc_tuning.GEN0_MAX}, got {value}")
    return value


def _api(environ: Mapping[str, str]) -> ApiSettings:
    log_level = (environ.get("HOOKLEDGER_LOG_LEVEL") or "info").strip().lower()
    if log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"HOOKLEDGER_LOG_LEVEL must be debug, info, warning or error, got {log_level!r}")
    return ApiSettings(
        host=environ.get("HOOKLEDGER_API_HOST") or "127.0.0.1",
        port=_integer(environ, "HOOKLEDGER_API_PORT", ApiSettings.port, 0, 65535),
        operator_key=environ.get("HOOKLEDGER_OPERATOR_KEY") or None,
        payload_bytes_max=_integer(environ, "HOOKLEDGER_PAYLOAD_BYTES_MAX",
                                   ApiSettings.payload_bytes_max, 1, 1_048_576),
        dev_mode=_flag(environ, "HOOKLEDGER_DEV"),
        allowed_networks=_networks(environ),
        group_commit_batch_max=_integer(environ, "HOOKLEDGER_GROUP_COMMIT_BATCH_MAX",
                                        ApiSettings.group_commit_batch_max, 1, group_commit.BATCH_MAX_LIMIT),
        group_commit_concurrency=_integer(environ, "HOOKLEDGER_GROUP_COMMIT_CONCURRENCY",
                                          ApiSettings.group_commit_concurrency, 1, group_commit.CONCURRENCY_LIMIT),
        group_commit_parallel_waiting_min=_integer(environ, "HOOKLEDGER_GROUP_COMMIT_PARALLEL_WAITING_MIN",
                                                   ApiSettings.group_commit_parallel_waiting_min, 1, 10_000),
        group_commit_stall_ms=_integer(environ, "HOOKLEDGER_GROUP_COMMIT_STALL_MS",
                                       ApiSettings.group_commit_stall_ms, 0, 60_000),
        group_commit_queue_max=_integer(environ, "HOOKLEDGER_GROUP_COMMIT_QUEUE_MAX",
                                        ApiSettings.group_commit_queue_max, 1, 1_000_000),
        commit_outcome_wait_seconds=_integer(environ, "HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS",
                                             ApiSettings.commit_outcome_wait_seconds, 1, 300),
        auth_cache_ttl_ms=_integer(environ, "HOOKLEDGER_AUTH_CACHE_TTL_MS", ApiSettings.auth_cache_ttl_ms, 0, 600_000),
        secret_rotation_overlap_seconds=_integer(environ, "HOOKLEDGER_SECRET_ROTATION_OVERLAP_SECONDS",
                                                 ApiSettings.secret_rotation_overlap_seconds, 0, 604_800),
        log_level=log_level,
        gc_gen0_threshold=_gc_threshold(environ, "HOOKLEDGER_API_GC_GEN0", ApiSettings.gc_gen0_threshold),
        account_shards=_account_shards(environ),
        account_shard_hash=_account_shard_hash(environ),
    )
