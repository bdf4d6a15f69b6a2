"""`hookledger run`: the whole platform on one machine, as real processes, with a demo.

Starts (or reuses) PostgreSQL and Redis — embedded ones when DATABASE_URL / REDIS_URL are
unset —, applies the migrations, then runs `hookledger api`, `hookledger worker` and a local
`hookledger listen` receiver as child processes, exactly as they run in production. Dev
secrets (the operator key and the at-rest keyring) are generated once and kept in the data
directory, so endpoint secrets sealed in one run still open in the next.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from delivery.platform import config, migrate, parent_death, services
from signing import Keyring, format_keyring, generate_at_rest_key

STARTUP_SECONDS_MAX = 60
DEMO_RETRY_SCHEDULE = "0,2,2"  # a dev platform: failing deliveries die (and are refunded) in seconds


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """ConfigError when host:port cannot be listened on (as the API would: SO_REUSEADDR on).

    Checked before anything starts: otherwise the API exits at once, and a server already on
    that port (another `hookledger run`, say) could answer the readiness check in its place.
    """
    try:
        # The first address the host resolves to (an IPv6 host needs an IPv6 socket).
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        raise config.ConfigError(
            f"cannot listen on {host}:{port} ({error.strerror or error}); pass --port N (--port 0: any free"
            " port), or set HOOKLEDGER_API_HOST"
        ) from None


def dev_secrets(data_dir: Path) -> dict[str, str]:
    """The operator key and at-rest keyring of this data directory, created on first use (mode 0600)."""
    path = data_dir / "dev-secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    data_dir.mkdir(parents=True, exist_ok=True)
    values = {
        "HOOKLEDGER_OPERATOR_KEY": "hl_op_" + secrets.token_urlsafe(32),
        "HOOKLEDGER_SECRET_KEYS": format_keyring(Keyring({"dev1": generate_at_rest_key()}, "dev1")),
    }
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(values, file)
    return values


@dataclass
class Platform:
    """The child processes of a running platform and how to reach them."""

    environment: dict[str, str]
    api_url: str
    operator_key: str
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    embedded_postgres_dir: Path | None = None  # its data directory, when PostgreSQL is ours (DATABASE_URL unset)
    embedded_redis: bool = False
    _reported: set[str] = field(default_factory=set)  # what health_changes() said is wrong now

    @property
    def dashboard_url(self) -> str:
        return f"{self.api_url}/dashboard"

    def servers(self) -> str:
        """What this platform runs, for the lines that say what started and what stopped."""
        names = [name for name in self.processes]
        embedded = [name for name, ours in (("PostgreSQL", self.embedded_postgres_dir is not None),
                                            ("Redis", self.embedded_redis)) if ours]
        words = {"api": "the API", "worker": "the worker", "listen": "the demo receiver (hookledger listen)"}
        listed = [words.get(name, name) for name in names] + [f"the embedded {name}" for name in embedded]
        return ", ".join(listed[:-1]) + (" and " if len(listed) > 1 else "") + listed[-1] if listed else "nothing"

    def health_changes(self) -> list[str]:
        """One line for each part that stopped since the last call (and for PostgreSQL, when it is back):
        the loop that serves calls it every second or so, so that a death is said, once."""
        lines = []
        for name, process in self.processes.items():
            if process.poll() is not None and name not in self._reported:
                self._reported.add(name)
                lines.append(f"{name} exited with code {process.returncode}; see {self.log_dir / name}.log")
        alive = self.postgres_alive()
        if alive is False and "postgres" not in self._reported:
            self._reported.add("postgres")
            lines.append("PostgreSQL stopped: the API answers 503 and deliveries wait until it is back"
                         + (f" (its data and log: {self.embedded_postgres_dir})" if self.embedded_postgres_dir else ""))
        elif alive and "postgres" in self._reported:
            self._reported.discard("postgres")
            lines.append("PostgreSQL answers again")
        return lines

    def postgres_alive(self) -> bool | None:
        """Whether PostgreSQL runs: for an embedded one, its postmaster; for another, its port answers
        a connection. None when that cannot be told (a DATABASE_URL naming no host and port)."""
        if self.embedded_postgres_dir is not None:
            try:
                pid = int((self.embedded_postgres_dir / "postmaster.pid").read_text().split()[0])
                os.kill(pid, 0)
            except (OSError, ValueError, IndexError):
                return False
            return True
        from urllib.parse import urlsplit

        parts = urlsplit(self.environment.get("DATABASE_URL", ""))
        if not parts.hostname:
            return None
        try:
            with socket.create_connection((parts.hostname, parts.port or 5432), timeout=1):
                return True
        except OSError:
            return False

    def start(self, name: str, *arguments: str, environment: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until it exits
        process = subprocess.Popen(
            [sys.executable, "-m", "delivery", *arguments],
            env={**os.environ, **self.environment, **(environment or {})},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=parent_death.preexec(),  # SIGTERM when this process dies, even by SIGKILL
        )
        self.processes[name] = process
        return process

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS_MAX
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}; see {self.log_dir / name}.log")
            try:
                if httpx.get(f"{self.api_url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the API was not ready within {STARTUP_SECONDS_MAX} s; see {self.log_dir}/api.log")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start(settings: config.Settings, *, api_port: int | None = None) -> Platform:
    """Bring up the servers, migrate, and start the API and one worker."""
    if api_port:
        check_port_free(settings.api.host, api_port)
    database_url = services.database_url(settings.database)
    redis_url = services.redis_url(settings.redis)
    migrate.upgrade(database_url)
    data_dir = settings.database.data_dir.parent
    values = dev_secrets(data_dir)
    port = api_port or free_port()
    environment = {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "HOOKLEDGER_DEV": "1",
        "HOOKLEDGER_API_PORT": str(port),
        "HOOKLEDGER_RETRY_SCHEDULE": os.environ.get("HOOKLEDGER_RETRY_SCHEDULE", DEMO_RETRY_SCHEDULE),
        "HOOKLEDGER_SWEEP_SECONDS": os.environ.get("HOOKLEDGER_SWEEP_SECONDS", "1"),
        "HOOKLEDGER_WORKER_METRICS_PORT": str(free_port()),
        **{name: os.environ.get(name) or value for name, value in values.items()},
    }
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    platform = Platform(environment, f"http://127.0.0.1:{port}", environment["HOOKLEDGER_OPERATOR_KEY"], log_dir,
                        embedded_postgres_dir=None if settings.database.url else settings.database.data_dir,
                        embedded_redis=not settings.redis.url)
    try:
        platform.start("api", "api")
        platform.start("worker", "worker")
        platform.wait_until_ready()
    except BaseException:
        platform.stop()
        raise
    return platform
