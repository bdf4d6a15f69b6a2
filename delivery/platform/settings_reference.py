"""Every setting the platform reads from the environment, with its meaning and default, in one
table: `hookledger settings` prints it with this machine's values, and the README names the few a
deployment must set. tests/unit/test_settings_reference.py keeps it equal to what the code reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str
    secret: bool = False  # printed as set / unset, never the value


SETTINGS: tuple[Setting, ...] = (
    Setting("DATABASE_URL", "embedded", "PostgreSQL; unset: an embedded server under the data directory", secret=True),
    Setting("REDIS_URL", "embedded", "Redis; unset: an embedded server of the process's own", secret=True),
    Setting("HOOKLEDGER_DATA_DIR", "user data dir", "embedded PostgreSQL's data, run's logs, dev keys"),
    Setting("HOOKLEDGER_OPERATOR_KEY", "required", "the operator key (generated in dev mode)", secret=True),
    Setting("HOOKLEDGER_SECRET_KEYS", "required", "at-rest keyring `id:base64key,...`, the first current", secret=True),
    Setting("HOOKLEDGER_DEV", "off", "dev mode: loopback receivers allowed, keys generated"),
    Setting("HOOKLEDGER_ALLOWED_NETWORKS", "none", "networks the SSRF guard lets through, comma-separated"),
    Setting("HOOKLEDGER_API_HOST", "127.0.0.1", "the API's address"),
    Setting("HOOKLEDGER_API_PORT", "8000", "the API's port"),
    Setting("HOOKLEDGER_API_URL", "http://127.0.0.1:8000", "the API the CLI talks to"),
    Setting("HOOKLEDGER_API_KEY", "none", "the CLI's account key", secret=True),
    Setting("HOOKLEDGER_ACCOUNT_PARTITIONS", "unset", "read by `hookledger migrate`: hash partitions per"
            " account-scoped table (2..64); unset, 0 or 1: plain tables"),
    Setting("HOOKLEDGER_LOG_LEVEL", "info", "debug, info, warning or error"),
    Setting("HOOKLEDGER_DB_POOL_MIN", "2", "PostgreSQL connections per process, at least"),
    Setting("HOOKLEDGER_DB_POOL_MAX", "10", "PostgreSQL connections per process, at most"),
    Setting("HOOKLEDGER_REDIS_START_WAIT_SECONDS", "30", "how long a process waits for Redis at start"),
    Setting("HOOKLEDGER_PRICE_PER_DELIVERY", "1", "new accounts' price per delivery, in credits"),
    Setting("HOOKLEDGER_RETRY_SCHEDULE", "0,5,300,1800,7200,18000,36000,36000",
            "seconds before each attempt, ±20%"),
    Setting("HOOKLEDGER_ATTEMPTS_MAX", "the schedule's length", "attempts per delivery"),
    Setting("HOOKLEDGER_SEND_TIMEOUT_MS", "15000", "an attempt's timeout when its endpoint sets none"),
    Setting("HOOKLEDGER_SEND_TIMEOUT_MS_MAX", "60000", "the largest timeout an endpoint may set"),
    Setting("HOOKLEDGER_CONNECTIONS_MAX", "256", "a worker's open connections"),
    Setting("HOOKLEDGER_CONNECTIONS_PER_HOST_MAX", "64", "a worker's open connections to one host"),
    Setting("HOOKLEDGER_SENDS_PER_ENDPOINT_MAX", "16", "a worker's concurrent sends to one endpoint"),
    Setting("HOOKLEDGER_SENDER_CLIENT", "wire", "the worker's HTTP client: wire (lean HTTP/1.1, httptools) or aiohttp"),
    Setting("HOOKLEDGER_CLAIM_BATCH", "200", "deliveries per claim"),
    Setting("HOOKLEDGER_LEASE_MS", "90000", "a claim's lease; must exceed the longest timeout"),
    Setting("HOOKLEDGER_SWEEP_SECONDS", "5", "how often a worker sweeps PostgreSQL for due deliveries"),
    Setting("HOOKLEDGER_ACCOUNT_SHARDS", "1", "shards of the account tables (partitions or Citus shards): "
            "claims and group commits write one shard's accounts per statement"),
    Setting("HOOKLEDGER_ACCOUNT_SHARD_HASH", "postgres", "the shards' hash: postgres (hash partitions) or citus"),
    Setting("HOOKLEDGER_SWEEP_LANES", "4", "claimed batches a worker has in flight"),
    Setting("HOOKLEDGER_WORKER_JOBS", "20", "a worker's delivery jobs at once (2 more kept for operator jobs)"),
    Setting("HOOKLEDGER_WORKER_POLL_MS", "250", "how often a worker reads the queue without a wake-up"),
    Setting("HOOKLEDGER_SHUTDOWN_GRACE_SECONDS", "10", "a worker's grace on SIGTERM"),
    Setting("HOOKLEDGER_AUDIT_MINUTES", "10", "the worker's audit period; 0 off"),
    Setting("HOOKLEDGER_WORKER_METRICS_PORT", "0", "a worker's own /metrics port; 0 off"),
    Setting("HOOKLEDGER_WORKER_METRICS_SHARE_SECONDS", "5", "how often a worker's metrics reach the API's; 0 never"),
    Setting("HOOKLEDGER_WORKER_GC_GEN0", "50000", "the worker's young-generation GC threshold; 0 Python's"),
    Setting("HOOKLEDGER_API_GC_GEN0", "50000", "the API's young-generation GC threshold; 0 Python's"),
    Setting("HOOKLEDGER_EVENT_LOOP", "auto", "auto, uvloop or asyncio"),
    Setting("HOOKLEDGER_PAYLOAD_BYTES_MAX", "262144", "the largest payload"),
    Setting("HOOKLEDGER_GROUP_COMMIT_BATCH_MAX", "500", "creates per group-commit transaction"),
    Setting("HOOKLEDGER_GROUP_COMMIT_CONCURRENCY", "2", "group-commit transactions at once"),
    Setting("HOOKLEDGER_GROUP_COMMIT_PARALLEL_WAITING_MIN", "80", "deliveries waiting before a batch starts beside a running one"),
    Setting("HOOKLEDGER_GROUP_COMMIT_STALL_MS", "50", "or how long the running batch has run before one starts beside it"),
    Setting("HOOKLEDGER_GROUP_COMMIT_QUEUE_MAX", "10000", "waiting creates before the API answers 503"),
    Setting("HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS", "10", "how long a lost COMMIT's outcome is asked for"),
    Setting("HOOKLEDGER_AUTH_CACHE_TTL_MS", "30000", "the API-key cache; revocations apply at once"),
    Setting("HOOKLEDGER_SECRET_ROTATION_OVERLAP_SECONDS", "86400", "how long a rotated key still signs"),
)


def current(setting: Setting, environ: Mapping[str, str]) -> str:
    """What this environment sets, as it may be printed: a secret shows only that it is set."""
    raw = environ.get(setting.name)
    if raw is None or raw == "":
        return f"({setting.default})"
    return "set" if setting.secret else raw
