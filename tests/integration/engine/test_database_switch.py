"""The switch the outage tests put in front of PostgreSQL reaches the server either way a run names
it: DATABASE_URL's host and port, or the embedded server's unix socket (`?host=/dir`, no host), which
is what `./scripts/test` uses on a machine without DATABASE_URL. An echo server stands in for
PostgreSQL: the switch only carries bytes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from database_switch import DatabaseSwitch


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):  # the switch's cut aborts its side
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.fixture(params=["tcp", "unix"])
async def upstream_url(request) -> AsyncIterator[str]:
    if request.param == "tcp":
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        url = f"postgresql://postgres@127.0.0.1:{server.sockets[0].getsockname()[1]}/db"
        directory = None
    else:
        # A short directory of its own: a unix socket's path must stay under about 100 bytes.
        directory = Path(tempfile.mkdtemp(prefix="hl-switch-"))
        server = await asyncio.start_unix_server(_echo, str(directory / ".s.PGSQL.6543"))
        url = f"postgresql://postgres:@/db?host={directory}&port=6543"
    try:
        yield url
    finally:
        server.close()
        await server.wait_closed()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


async def _round_trip(switch: DatabaseSwitch, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", switch.port)
    writer.write(data)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(len(data)), 10) == data
    return reader, writer


async def test_the_switch_carries_bytes_cuts_them_and_carries_them_again(upstream_url: str) -> None:
    switch = await DatabaseSwitch(upstream_url).start()
    try:
        assert f"@127.0.0.1:{switch.port}/db?" in switch.url()
        reader, writer = await _round_trip(switch, b"startup")

        await switch.off()
        assert await asyncio.wait_for(reader.read(), 10) == b"", "an open connection survived the cut"
        writer.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", switch.port)

        await switch.on()
        _, writer = await _round_trip(switch, b"again")
        writer.close()
        assert switch.cuts == 1
    finally:
        await switch.close()


def test_a_url_with_neither_host_nor_socket_directory_is_refused_naming_it() -> None:
    with pytest.raises(AssertionError, match="no-host-here"):
        DatabaseSwitch("postgresql://postgres@/no-host-here")
