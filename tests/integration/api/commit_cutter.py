"""A TCP proxy to PostgreSQL that breaks a connection at its COMMIT, the one moment when a client
cannot know what happened: the server may commit after the client has lost the connection.

Armed with a mode, it cuts the next connection that sends COMMIT (asyncpg's simple-protocol
`COMMIT;`) or executes one of the `statements` it was given (an autocommit write, which commits
as it runs: the create's unlocked write), never letting an answer reach the client. It reads the client's protocol messages to tell which prepared statement an
Execute runs. Then:

- "after": COMMIT goes on to the server, which runs it; its answer is dropped, and only then is the
  client's side closed and the server's after it: the server has committed before the client
  learns anything, so asking at once must find it committed.
- "before": COMMIT is dropped and the server's side closed: the server rolls back.
- "late": COMMIT goes on only after `delay` seconds, the server's side held open till then: the
  server commits, but only well after the client has given up on the connection.
- "hold": COMMIT is held until `release()`, the server's side open: the transaction stays open
  (in progress) for as long as the test likes, then commits.
- "linger": as "after", but the server's side stays open until `release()`: the server has
  committed, but its backend lingers, as over a half-open connection.
- "blackout": as "hold", and every other connection through the proxy, new ones too, is held
  until `release()`: the database is unreachable for the client meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
from urllib.parse import parse_qs, urlsplit, urlunsplit

_SSL_OR_GSS_REQUESTS = (80877103, 80877104)  # untyped requests a client may send before its startup message


class _Messages:
    """The client's side of the protocol, message by message: whether a chunk holds a cut point."""

    def __init__(self, statements: tuple[str, ...]) -> None:
        self._statements = {statement.encode() for statement in statements}
        self._buffer = b""
        self._started = False
        self._prepared: dict[bytes, bytes] = {}  # statement name -> its text
        self._bound: bytes | None = None  # the text of the statement the last Bind named

    def cut_point(self, data: bytes) -> bool:
        self._buffer += data
        found = False
        while True:
            buffer = self._buffer
            if not self._started:  # untyped: length, then the protocol version or a request code
                if len(buffer) < 8 or len(buffer) < (size := int.from_bytes(buffer[:4], "big")):
                    return found
                self._started = int.from_bytes(buffer[4:8], "big") not in _SSL_OR_GSS_REQUESTS
                self._buffer = buffer[size:]
                continue
            if len(buffer) < 5 or len(buffer) < 1 + (size := int.from_bytes(buffer[1:5], "big")):
                return found
            kind, body, self._buffer = buffer[:1], buffer[5:1 + size], buffer[1 + size:]
            if kind == b"Q":
                found |= body.rstrip(b"\0").rstrip(b";").strip() == b"COMMIT"
            elif kind == b"P":
                name, text = body.split(b"\0", 2)[:2]
                self._prepared[name] = text
            elif kind == b"B":
                self._bound = self._prepared.get(body.split(b"\0", 2)[1])
            elif kind == b"E":
                found |= self._bound in self._statements


async def _answered(server_reader: asyncio.StreamReader) -> None:
    """Read the server's messages up to its ReadyForQuery: the statement has been run."""
    buffer = b""
    async with asyncio.timeout(10):
        while True:
            while len(buffer) >= 5 and len(buffer) >= 1 + (size := int.from_bytes(buffer[1:5], "big")):
                if buffer[:1] == b"Z":
                    return
                buffer = buffer[1 + size:]
            if not (data := await server_reader.read(65536)):
                return
            buffer += data


class CommitCutter:
    def __init__(self, database_url: str, statements: tuple[str, ...] = ()) -> None:
        self._database_url = database_url
        self._statements = statements
        self._blackout = False
        self._mode: str | None = None
        self._delay = 0.0
        self._released = asyncio.Event()
        self.cuts = 0
        self.cuts_done = 0  # cuts whose COMMIT (or write) went on, or was dropped, and whose server side ended
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
        assert mode in ("after", "before", "late", "hold", "linger", "blackout")
        self._mode, self._delay = mode, delay
        self._released.clear()

    def release(self) -> None:
        self._blackout = False
        self._released.set()

    async def until_cuts_done(self, seconds: float = 30) -> None:
        """Every cut so far has played out: what it held back reached the server (or was dropped), and
        the server ended that connection. A test that asks the database afterwards sees the end state,
        on a loaded machine too, instead of guessing how long a delayed COMMIT takes."""
        async with asyncio.timeout(seconds):
            while self.cuts_done < self.cuts:
                await asyncio.sleep(0.01)

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
        if self._blackout:
            await self._released.wait()
        try:
            server_reader, server_writer = await self._open_upstream()
        except OSError:
            client_writer.transport.abort()
            self._tasks.discard(task)
            return
        back = asyncio.create_task(self._pump(server_reader, client_writer))
        self._tasks.add(back)
        messages = _Messages(self._statements)
        try:
            while data := await client_reader.read(65536):
                if messages.cut_point(data) and self._mode is not None:
                    mode, self._mode = self._mode, None
                    self.cuts += 1
                    self._blackout = mode == "blackout"
                    back.cancel()  # first: no answer may reach the client
                    await asyncio.gather(back, return_exceptions=True)
                    if mode in ("after", "linger"):
                        # The server runs it before the client can notice the cut and ask: else an
                        # answer that ends the backend could end it first, and truly find nothing.
                        server_writer.write(data)
                        await server_writer.drain()
                        await _answered(server_reader)
                    client_writer.transport.abort()
                    try:
                        await self._cut(mode, data, server_reader, server_writer)
                    finally:
                        self.cuts_done += 1
                    return
                if self._blackout:
                    await self._released.wait()
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
        if mode in ("hold", "blackout"):
            await self._released.wait()
        if mode not in ("after", "linger"):  # those went on already
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
