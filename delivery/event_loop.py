"""The event loop the API and the worker run on: uvloop where it is installed, asyncio's own otherwise.

uvloop runs the same asyncio code on libuv, with the loop, its sockets and its callbacks in
Cython instead of Python. On the ingest path that is a measurable share of the API's CPU (README,
Performance). HOOKLEDGER_EVENT_LOOP picks one: `auto` (the default: uvloop when it can be
imported, which it cannot on Windows), `uvloop` (fail at start when it is missing), or `asyncio`
(Python's own loop, to debug with its tools or to compare).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

CHOICES = ("auto", "uvloop", "asyncio")
_T = TypeVar("_T")


class EventLoopUnavailable(Exception):
    """uvloop was asked for by name and cannot be imported."""


class RunningLoop:
    """The running loop, asked for once: call it where asyncio.get_running_loop() would be called
    on a hot path. On Python 3.11 that function makes a getpid system call every time (a fork
    check, dropped in 3.12); per request and per send it took 2% to 3.5% of the API's and the
    worker's CPU in native profiles. An object that moves to another loop must not use this."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop


def new_event_loop(choice: str = "auto") -> asyncio.AbstractEventLoop:
    if choice not in CHOICES:
        raise ValueError(f"event loop must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError as error:
        if choice == "uvloop":
            raise EventLoopUnavailable(f"HOOKLEDGER_EVENT_LOOP=uvloop, but uvloop cannot be imported: {error}") from None
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`, for logs and benchmark output."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def chosen(choice: str = "auto") -> str:
    """The name of the loop a choice gives here (`auto` depends on whether uvloop imports)."""
    loop = new_event_loop(choice)
    try:
        return name(loop)
    finally:
        loop.close()


def run(coroutine: Coroutine[Any, Any, _T], choice: str = "auto") -> _T:
    """asyncio.run on the chosen loop."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(choice)) as runner:
        return runner.run(coroutine)
