"""The platform of one chaos run as real processes: servers, API processes, workers, and their faults.

PostgreSQL: with DATABASE_URL unset, an embedded server of the run's own (in a temporary
directory, deleted at exit), which is what lets the run restart it. With DATABASE_URL set, a
fresh database on that server, dropped at the end when the run passed; such a server is only
restarted when the caller allows it and names its data directory (it must be embedded).
Redis: with REDIS_URL unset, a redis-server process of the run's own (services.RedisProcess),
flushed with FLUSHALL and stopped and started again for the Redis outages. With REDIS_URL set, a
database number of the run's own on that server, flushed with FLUSHDB (FLUSHALL there would
empty other people's databases too), and never stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import redis.asyncio as redis_asyncio

from delivery.platform import migrate, services
from delivery.platform.run import free_port
from signing import Keyring, format_keyring, generate_at_rest_key

READY_SECONDS_MAX = 60
STOP_SECONDS_MAX = 15


@dataclass
class Servers:
    """Where PostgreSQL and Redis are, and whether this run may restart / flush all of them."""

    database_url: str
    redis_url: str
    pg_data_dir: Path | None  # set: the run may restart PostgreSQL with pg_ctl
    redis_flushall: bool
    server_url: str | None = None  # DATABASE_URL's server, when the run made a database on it
    database_name: str | None = None
    notes: list[str] = field(default_factory=list)
    redis_process: services.RedisProcess | None = None  # set: the run may stop and start Redis
    redis_frozen: bool = False  # SIGSTOPped by the run (the process is still running)

    @property
    def redis_down(self) -> bool:
        return self.redis_process is not None and not self.redis_process.running

    def freeze_redis(self) -> None:
        assert self.redis_process is not None, "this run may not freeze Redis"
        self.redis_process.pause()
        self.redis_frozen = True

    def thaw_redis(self) -> None:
        self.redis_process.resume()
        self.redis_frozen = False

    async def stop_redis(self) -> None:
        assert self.redis_process is not None, "this run may not stop Redis"
        await asyncio.to_thread(self.redis_process.stop)

    async def start_redis(self) -> None:
        assert self.redis_process is not None, "this run may not start Redis"
        await asyncio.to_thread(self.redis_process.start)

    async def flush_redis(self) -> str:
        client = redis_asyncio.Redis.from_url(self.redis_url)
        try:
            if self.redis_flushall:
                await client.flushall()
                return "FLUSHALL"
            await client.flushdb()
            return "FLUSHDB"
        finally:
            await client.aclose()

    async def restart_postgres(self) -> None:
        assert self.pg_data_dir is not None, "this run may not restart PostgreSQL"
        await asyncio.to_thread(services.restart_embedded_postgres, self.pg_data_dir)

    async def drop(self) -> None:
        """Drop the run's database on a configured server (nothing to do for an embedded one)."""
        if self.server_url and self.database_name:
            connection = await asyncpg.connect(self.server_url)
            try:
                await connection.execute(f"DROP DATABASE IF EXISTS {self.database_name} WITH (FORCE)")
            finally:
                await connection.close()


async def start_servers(work_dir: Path, *, allow_pg_restart: bool, pg_data_dir: Path | None,
                        redis_db: int) -> Servers:
    environ_database, environ_redis = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    notes: list[str] = []
    server_url = database_name = None
    if environ_database:
        server_url, database_name = environ_database, f"hookledger_chaos_{uuid.uuid4().hex[:12]}"
        connection = await asyncpg.connect(server_url)
        try:
            await connection.execute(f"CREATE DATABASE {database_name}")
        finally:
            await connection.close()
        database_url = services.with_database(server_url, database_name)
        restartable = pg_data_dir if allow_pg_restart and pg_data_dir is not None else None
        if restartable is None:
            notes.append("DATABASE_URL is set: the 'restart PostgreSQL' fault is skipped (it needs"
                         " --allow-pg-restart and --pg-data-dir of an embedded server, or DATABASE_URL unset)")
    else:
        restartable = work_dir / "postgres"
        database_url = await asyncio.to_thread(services.start_embedded_postgres, restartable, delete_on_exit=True)
    await migrate.upgrade_async(database_url)
    redis_process = None
    if environ_redis:
        redis_url = _with_redis_db(environ_redis, redis_db)
        notes.append(f"REDIS_URL is set: the run uses database {redis_db} there and flushes it with FLUSHDB;"
                     " the 'Redis outage' fault is skipped")
    else:
        redis_process = services.RedisProcess(work_dir / "redis")
        await asyncio.to_thread(redis_process.start)
        redis_url = redis_process.url
    servers = Servers(database_url, redis_url, restartable, not environ_redis, server_url, database_name, notes,
                      redis_process)
    await servers.flush_redis()  # start empty
    return servers


def _with_redis_db(url: str, number: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{number}"))


def platform_environment(servers: Servers, overrides: dict[str, str]) -> dict[str, str]:
    """The environment every API and worker process of the run shares."""
    return {
        "DATABASE_URL": servers.database_url,
        "REDIS_URL": servers.redis_url,
        "HOOKLEDGER_DEV": "1",
        "HOOKLEDGER_OPERATOR_KEY": "hl_op_chaos_" + uuid.uuid4().hex,
        "HOOKLEDGER_SECRET_KEYS": format_keyring(Keyring({"chaos1": generate_at_rest_key()}, "chaos1")),
        "HOOKLEDGER_RETRY_SCHEDULE": "0,1,2,3",
        "HOOKLEDGER_SEND_TIMEOUT_MS": "1000",
        "HOOKLEDGER_SEND_TIMEOUT_MS_MAX": "2000",
        "HOOKLEDGER_LEASE_MS": "5000",
        "HOOKLEDGER_SWEEP_SECONDS": "1",
        "HOOKLEDGER_SHUTDOWN_GRACE_SECONDS": "3",
        "HOOKLEDGER_AUDIT_MINUTES": "0",
        "HOOKLEDGER_DB_POOL_MAX": "8",
        "HOOKLEDGER_LOG_LEVEL": "warning",
        "PYTHONUNBUFFERED": "1",
        **overrides,
    }


@dataclass
class Process:
    name: str
    kind: str  # api | worker
    popen: subprocess.Popen
    port: int | None = None


@dataclass
class Cluster:
    """The API and worker processes of the run; every process this run started, to stop them all."""

    environment: dict[str, str]
    log_dir: Path
    apis: list[Process] = field(default_factory=list)
    workers: list[Process] = field(default_factory=list)
    retired: list[Process] = field(default_factory=list)  # signalled; reaped at the end
    _started: int = 0

    @property
    def operator_key(self) -> str:
        return self.environment["HOOKLEDGER_OPERATOR_KEY"]

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{process.port}" for process in self.apis]

    def _spawn(self, kind: str, port: int | None = None) -> Process:
        self._started += 1
        name = f"{kind}-{self._started}"
        extra = {"HOOKLEDGER_API_PORT": str(port)} if port is not None else {}
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until it exits
        popen = subprocess.Popen([sys.executable, "-m", "delivery", kind],
                                 env={**os.environ, **self.environment, **extra},
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return Process(name, kind, popen, port)

    def start_api(self, port: int | None = None) -> Process:
        process = self._spawn("api", port or free_port())
        self.apis.append(process)
        return process

    def start_worker(self) -> Process:
        process = self._spawn("worker")
        self.workers.append(process)
        return process

    async def wait_ready(self, process: Process) -> None:
        deadline = time.monotonic() + READY_SECONDS_MAX
        async with httpx.AsyncClient(timeout=1) as client:
            while time.monotonic() < deadline:
                if process.popen.poll() is not None:
                    raise RuntimeError(f"{process.name} exited with {process.popen.returncode};"
                                       f" see {self.log_dir / process.name}.log")
                try:
                    if (await client.get(f"http://127.0.0.1:{process.port}/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{process.name} was not ready within {READY_SECONDS_MAX} s")

    def signal_worker(self, index: int, signal_number: int) -> Process:
        """Signal one worker and start its replacement at once. Returns the signalled worker."""
        victim = self.workers.pop(index)
        victim.popen.send_signal(signal_number)
        self.retired.append(victim)
        self.start_worker()
        return victim

    async def restart_api(self, index: int, signal_number: int) -> Process:
        """Stop one API process and start another on the same port once the old one is gone."""
        victim = self.apis.pop(index)
        victim.popen.send_signal(signal_number)
        await asyncio.to_thread(_wait_or_kill, victim.popen)
        self.retired.append(victim)
        replacement = self.start_api(victim.port)
        await self.wait_ready(replacement)
        return victim

    def exited_unexpectedly(self) -> list[str]:
        """Running processes (not ones we signalled) that exited by themselves."""
        return [f"{p.name} exited with {p.popen.returncode}" for p in self.apis + self.workers
                if p.popen.poll() is not None]

    def stop(self) -> None:
        everyone = self.apis + self.workers + self.retired
        for process in everyone:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in everyone:
            _wait_or_kill(process.popen)


def _wait_or_kill(popen: subprocess.Popen) -> None:
    try:
        popen.wait(STOP_SECONDS_MAX)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def work_directory() -> Path:
    return Path(tempfile.mkdtemp(prefix="hookledger-chaos-"))
