"""Connection pools. Every billing operation takes a pool or connection and runs its own transaction."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import TypeVar

import asyncpg

T = TypeVar("T")
logger = logging.getLogger(__name__)

OUTCOME_WAIT_SECONDS = 10.0  # how long a lost COMMIT answer is asked after before "cannot tell"
_OUTCOME_POLL_SECONDS = 0.05
# What asking the database may fail with while it restarts or is unreachable.
_ASKING_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
_TRANSACTION_STATUS = "SELECT pg_xact_status($1::xid8)"
# Ask the backend `pid` that was alive at $2 to end, if it still runs; no row: it has exited. A
# backend_start this role may not see (NULL) counts as that backend: better ask again than guess.
_END_BACKEND = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE pid = $1 AND (backend_start IS NULL OR backend_start <= $2)"
)


# Every pool's session settings (JIT off: see create_pool); a test's own pool takes them too.
SERVER_SETTINGS = {"application_name": "hookledger", "jit": "off"}


async def create_pool(database_url: str, *, size_min: int = 2, size_max: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        database_url,
        min_size=size_min,
        max_size=size_max,
        # Statements are prepared per connection and reused: most of our traffic is the same
        # few statements, so this saves a parse and plan on every call.
        statement_cache_size=256,
        # No JIT: every statement here is short, and compiling one costs seconds. It is what the
        # planner picks once its estimates swell, as they do on hash-partitioned tables not yet
        # analyzed (HOOKLEDGER_ACCOUNT_PARTITIONS): a claim took 20 s there, nearly all compiling.
        server_settings=SERVER_SETTINGS,
    )


RELISTEN_DELAY_SECONDS = 1.0  # between a lost LISTEN connection and the next try


async def listen_forever(pool: asyncpg.Pool, listeners: Mapping[str, Callable], *, on_unheard: Callable[[], None],
                         what: str) -> None:
    """Hold one pooled connection LISTENing on every channel of `listeners` until cancelled, calling
    each channel's asyncpg listener; listen again when the connection drops. `on_unheard()` runs
    whenever listening starts or stops: a notice sent while nobody listened was not heard, so the
    caller makes up for it (runs its work, empties its cache). `what` names the listener in the logs.

    Several channels share the one connection, so a process that keeps several caches holds one
    connection for all their notices, not one each."""
    assert listeners, "listen to at least one channel"
    while True:
        connection = None
        lost = asyncio.Event()

        def on_lost(_connection, lost: asyncio.Event = lost) -> None:
            lost.set()

        try:
            connection = await pool.acquire()
            connection.add_termination_listener(on_lost)
            for channel, on_notice in listeners.items():
                await connection.add_listener(channel, on_notice)
            on_unheard()
            await lost.wait()
            logger.warning("the %s listener lost its connection; listening again", what)
        except Exception as error:  # noqa: BLE001 - the caller has a fallback (a cron, a TTL); cancelling is not caught
            logger.warning("cannot listen for %s (%r); retrying", what, error)
        finally:
            on_unheard()
            if connection is not None:
                await _release_listener(pool, connection, listeners, on_lost, what)
        await asyncio.sleep(RELISTEN_DELAY_SECONDS)


async def _release_listener(pool: asyncpg.Pool, connection, listeners: Mapping[str, Callable], on_lost,
                            what: str) -> None:
    """Give the listening connection back. A connection that died was already taken back by the
    pool, and every call on it then raises InterfaceError: expected, not worth a warning."""
    with contextlib.suppress(asyncpg.InterfaceError):
        connection.remove_termination_listener(on_lost)
    for channel, on_notice in listeners.items():
        with contextlib.suppress(asyncpg.InterfaceError):
            await connection.remove_listener(channel, on_notice)
    try:
        await pool.release(connection)
    except asyncpg.InterfaceError:
        pass
    except Exception as error:  # noqa: BLE001 - the pool discards a connection it cannot reset
        logger.warning("releasing the %s listener's connection failed: %r", what, error)


Executor = asyncpg.Pool | asyncpg.Connection


def runs_alone(executor: Executor) -> bool:
    """Whether a statement on `executor` is its own transaction: a pool, or a connection outside
    any transaction (not a caller's, where it is part of theirs)."""
    return isinstance(executor, asyncpg.Pool) or not executor.is_in_transaction()


@contextlib.asynccontextmanager
async def connection_of(executor: Executor) -> AsyncIterator[asyncpg.Connection]:
    """A connection from the pool for the block, or the given connection."""
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection:
            yield connection
    else:
        yield executor


@contextlib.asynccontextmanager
async def transaction(executor: Executor) -> AsyncIterator[asyncpg.Connection]:
    """One transaction on a connection from the pool, or on the given connection.

    On a connection already inside a transaction this is a savepoint, so an operation called
    from a caller's transaction still rolls back alone when it raises.
    """
    async with connection_of(executor) as connection, connection.transaction():
        yield connection


class OutcomeUnknown(Exception):
    """The connection broke while a transaction's COMMIT was in flight, and the database could not
    be asked in time whether it took effect: it did wholly or not at all.

    `look_for` says what to look for to find out (the caller may make it more precise)."""

    def __init__(self, message: str, transaction_id: int, look_for: str = "it") -> None:
        super().__init__(message)
        self.transaction_id = transaction_id
        self.look_for = look_for


class NotWritten(Exception):
    """The connection broke while a transaction's COMMIT was in flight, and the database says it
    did not take effect: nothing of it was written. The connection's error is the cause."""


async def ask_within(asking: Awaitable[T], seconds: float) -> T:
    """`asking`'s answer, or asyncio.TimeoutError after `seconds`, then for certain.

    Unlike asyncio.wait_for, this does not wait for the cancelled call to finish: a pooled
    connection's cleanup on a server that stopped answering (a network partition) can wait as long
    as the server does, and the deadline of the one asking would not hold."""
    task = asyncio.ensure_future(asking)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise asyncio.TimeoutError()
    return task.result()


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an error of an abandoned call is not "never retrieved"


async def transaction_status(pool: asyncpg.Pool, transaction_id: int, *, wait_seconds: float) -> bool | None:
    """Whether a transaction committed (True) or not (False), asked with `pg_xact_status`, which
    PostgreSQL provides for exactly this: a client that lost its connection while COMMIT was in
    flight. None when it cannot tell within `wait_seconds`: unreachable all that time, or the
    transaction still in progress (its backend may outlive our side of the connection, or not
    have read the COMMIT yet), which is asked again until then. A transaction cut off by a crash
    reads as aborted once the server is back.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while (remaining := deadline - loop.time()) > 0:
        try:
            status = await ask_within(pool.fetchval(_TRANSACTION_STATUS, transaction_id), remaining)
        except _ASKING_ERRORS:
            status = "unreachable"  # restarting, or a pooled connection the restart broke: ask again
        if status == "committed":
            return True
        if status == "aborted":
            return False
        if status is None:  # older than the commit log kept: cannot happen within seconds, but say so
            return None
        await asyncio.sleep(min(_OUTCOME_POLL_SECONDS, max(0.0, deadline - loop.time())))
    return None


# Connections whose backend was seen alive, remembered for backend_alive_at: keyed by asyncpg's
# settings object, of which each connection has one for its life (a pool hands out a new proxy on
# every acquire, and neither proxies nor settings take weak references). Bounded: a forgotten
# connection costs one round trip more, once.
_ALIVE_AT_REMEMBERED_MAX = 1024
_alive_at: dict[object, datetime] = {}


async def backend_alive_at(connection: asyncpg.Connection) -> datetime:
    """A moment (PostgreSQL's clock) at which this connection's backend was alive, which tells it
    from a later backend given the same pid (`outcome_after_backend_ends`). Asked once per
    connection, one round trip, and remembered: a connection keeps its backend for its life."""
    key = connection.get_settings()
    alive_at = _alive_at.get(key)
    if alive_at is None:
        alive_at = await connection.fetchval("SELECT statement_timestamp()")
        if len(_alive_at) >= _ALIVE_AT_REMEMBERED_MAX:
            del _alive_at[next(iter(_alive_at))]  # the oldest: dicts keep insertion order
        _alive_at[key] = alive_at
    return alive_at


async def outcome_after_backend_ends(pool: asyncpg.Pool, pid: int, alive_at: datetime, written: str, *args,
                                     wait_seconds: float) -> bool | None:
    """Whether an autocommit statement whose answer was lost took effect: True or False, or None
    when that cannot be told within `wait_seconds` (the database unreachable all that time).

    Such a statement has no transaction id to ask about before it runs, and its backend may still
    be about to run it (over a half-open connection its bytes can arrive later). So this ends the
    backend that ran it (`pid`, alive at `alive_at`, which tells it from a later backend given the
    same pid) and waits until it has exited: from then on the statement has taken effect or never
    will. Then it asks `written`, a query answering one boolean: is what the statement wrote there?
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    gone = False
    while (remaining := deadline - loop.time()) > 0:
        try:
            if not gone:
                gone = not await ask_within(pool.fetch(_END_BACKEND, pid, alive_at), remaining)
            if gone:
                return bool(await ask_within(pool.fetchval(written, *args), remaining))
        except _ASKING_ERRORS:
            pass  # restarting, or a pooled connection the restart broke: ask again
        await asyncio.sleep(min(_OUTCOME_POLL_SECONDS, max(0.0, deadline - loop.time())))
    return None


@contextlib.asynccontextmanager
async def resolved_transaction(executor: Executor, *,
                               wait_seconds: float = OUTCOME_WAIT_SECONDS) -> AsyncIterator[asyncpg.Connection]:
    """A transaction on a pooled connection whose COMMIT, if its answer is lost, is resolved
    instead of guessed: written, the block's results stand and this returns normally; not
    written, NotWritten; no answer within `wait_seconds`, OutcomeUnknown.

    For writes that are not idempotent and show something once (an account's first key, a new
    key, an endpoint): a client told "failed" that retries would otherwise make a second one, or
    lose the one shown. It costs one round trip more than `transaction`: the transaction's id.

    Given a connection inside a caller's transaction, this is a savepoint of it, as `transaction`
    is: there is no COMMIT of its own, and the caller's transaction, itself a resolved one (the
    API's keyed creates, delivery.api.idempotency), is the one whose lost answer is resolved.
    """
    if not isinstance(executor, asyncpg.Pool):
        # Asking about a lost COMMIT needs another connection, which only a pool gives.
        assert executor.is_in_transaction(), "a resolved transaction needs a pool or a caller's transaction"
        async with transaction(executor) as connection:
            yield connection
        return
    async with executor.acquire() as connection:
        handle = connection.transaction()
        await handle.start()
        try:
            transaction_id = await connection.fetchval("SELECT pg_current_xact_id()")
            yield connection
        except BaseException:
            with contextlib.suppress(Exception):  # a broken connection cannot roll back: it is gone anyway
                await handle.rollback()
            raise
        try:
            await handle.commit()
        except Exception as error:
            committed = await transaction_status(executor, transaction_id, wait_seconds=wait_seconds)
            if committed:
                return
            if committed is None:
                raise OutcomeUnknown(f"the answer to COMMIT was lost (transaction {transaction_id})",
                                     transaction_id) from error
            raise NotWritten(f"the connection broke at COMMIT and nothing was written: {error!r}") from error
