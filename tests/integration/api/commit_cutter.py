"""A TCP proxy to PostgreSQL that breaks a connection at its COMMIT, the one moment when a client
cannot know what happened: the server may commit after the client has lost the connection.

Armed with a mode, it cuts the next connection that sends COMMIT (asyncpg's simple-protocol
`COMMIT;`), always closing the client's side first so that no answer reaches it. Then:

- "after": COMMIT goes on to the server and the server's side is closed: the server commits.
- "before": COMMIT is dropped and the server's side closed: the server rolls back.
- "late": COMMIT goes on only after `delay` seconds, the server's side held open till then: the
  server commits, but only well after the client has given up on the connection.
- "hold": COMMIT is held until `release()`, the server's side open: the transaction stays open
  (in progress) for as long as the test likes, then commits.
- "linger": COMMIT goes on and the server's side stays open until `release()`: the server has
  committed, but its backend lingers, as over a half-open connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
from urllib.parse import parse_qs, urlsplit, urlunsplit

COMMIT = b"Q\x00\x00\x00\x0cCOMMIT;\x00"  # 'Q', length 12, the query text with its NUL


class CommitCutter:
    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._mode: str | None = None
        self._delay = 0.0
        self._released = asyncio.Event()
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> CommitCutter:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self) -> str:
        """The database URL through this proxy (plain TCP: the proxy must see the COMMIT)."""
        parts = urlsplit(self._database_url)
        user = parts.username or "postgres"
        credentials = user if parts.password is None else f"{user}:{parts.password}"
        return urlunsplit(("postgresql", f"{credentials}@127.0.0.1:{self.port}", parts.path, "sslmode=disable", ""))

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        parts = urlsplit(self._database_url)
        if parts.hostname:
            return await asyncio.open_connection(parts.hostname, parts.port or 5432)
        query = parse_qs(parts.query)
        directory = query["host"][0]
        port = (query.get("port") or [parts.port or 5432])[0]
        sockets = glob.glob(f"{directory}/.s.PGSQL.{port}") or glob.glob(f"{directory}/.s.PGSQL.*[0-9]")
        return await asyncio.open_unix_connection(sockets[0])

    def arm(self, mode: str, delay: float = 0.0) -> None:
        assert mode in ("after", "before", "late", "hold", "linger")
        self._mode, self._delay = mode, delay
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def close(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.close()
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
        back = asyncio.create_task(self._pump(server_reader, client_writer))
        self._tasks.add(back)
        try:
            while data := await client_reader.read(65536):
                if self._mode is not None and COMMIT in data:
                    mode, self._mode = self._mode, None
                    self.cuts += 1
                    client_writer.transport.abort()  # first: no answer may reach the client
                    back.cancel()
                    await asyncio.gather(back, return_exceptions=True)
                    await self._cut(mode, data, server_reader, server_writer)
                    return
                server_writer.write(data)
                await server_writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            client_writer.transport.abort()
            server_writer.transport.abort()
            back.cancel()
            self._tasks.discard(back)
            self._tasks.discard(task)

    async def _cut(self, mode: str, data: bytes, server_reader: asyncio.StreamReader,
                   server_writer: asyncio.StreamWriter) -> None:
        if mode == "before":
            return
        if mode == "late":
            await asyncio.sleep(self._delay)
        if mode == "hold":
            await self._released.wait()
        server_writer.write(data)
        await server_writer.drain()
        if mode == "linger":
            await self._released.wait()
        # End the stream gracefully and wait for the server to end it too (the backend has read the
        # COMMIT and exited): an abort here would be a reset, which may discard the unread COMMIT.
        server_writer.write_eof()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            async with asyncio.timeout(10):
                while await server_reader.read(65536):
                    pass

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()  # the server ended the connection: so does the client's side
