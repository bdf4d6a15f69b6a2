"""A TCP proxy in front of PostgreSQL that the test switches off and on: what a worker sees when
PostgreSQL restarts, without restarting the server other tests share.

`off()` aborts every connection through it (the client's reads and writes fail mid-statement,
as when a backend is terminated) and stops listening, so new connections are refused, as while
a server restarts. `on()` listens again on the same port. `url()` is the database URL through it.

The server behind it is DATABASE_URL's host and port, or, with no host in the URL (the embedded
PostgreSQL a run starts when DATABASE_URL is unset), the unix socket in its `host=` directory.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qs, urlsplit, urlunsplit


class DatabaseSwitch:
    def __init__(self, database_url: str) -> None:
        parts = urlsplit(database_url)
        query = parse_qs(parts.query)
        host = parts.hostname or query.get("host", [""])[0]
        port = parts.port or int(query.get("port", ["5432"])[0])
        assert host, f"the switch needs a host or a host= socket directory in {database_url!r}"
        self._database_url = database_url
        if host.startswith("/"):
            socket_path = f"{host}/.s.PGSQL.{port}"
            self._open_upstream = lambda: asyncio.open_unix_connection(socket_path)
        else:
            self._open_upstream = lambda: asyncio.open_connection(host, port)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self.port = 0
        self.cuts = 0

    async def start(self) -> DatabaseSwitch:
        await self.on()
        return self

    def url(self) -> str:
        parts = urlsplit(self._database_url)
        user = parts.username or "postgres"
        credentials = user if parts.password is None else f"{user}:{parts.password}"
        return urlunsplit(("postgresql", f"{credentials}@127.0.0.1:{self.port}", parts.path, "sslmode=disable", ""))

    async def on(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]

    async def off(self) -> None:
        """Refuse new connections and abort every open one."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.cuts += 1
        for writer in list(self._connections):
            writer.transport.abort()
        self._connections.clear()

    async def close(self) -> None:
        await self.off()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            server_reader, server_writer = await self._open_upstream()
        except OSError:
            client_writer.transport.abort()
            self._tasks.discard(task)
            return
        self._connections.update((client_writer, server_writer))
        try:
            await asyncio.gather(self._pump(client_reader, server_writer), self._pump(server_reader, client_writer))
        finally:
            for writer in (client_writer, server_writer):
                writer.transport.abort()
                self._connections.discard(writer)
            self._tasks.discard(task)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
