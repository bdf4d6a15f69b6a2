"""delivery.event_loop: which loop each HOOKLEDGER_EVENT_LOOP choice gives, and that code runs on it."""

from __future__ import annotations

import asyncio
import sys

import pytest

from delivery import event_loop
from delivery.platform import config


def test_auto_and_uvloop_give_uvloop_where_it_is_installed():
    pytest.importorskip("uvloop")
    assert event_loop.chosen("auto") == "uvloop"
    assert event_loop.chosen("uvloop") == "uvloop"


def test_asyncio_gives_pythons_own_loop():
    assert event_loop.chosen("asyncio") == "asyncio"
    loop = event_loop.new_event_loop("asyncio")
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_without_uvloop_auto_falls_back_and_uvloop_by_name_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert event_loop.chosen("auto") == "asyncio"
    with pytest.raises(event_loop.EventLoopUnavailable, match="uvloop cannot be imported"):
        event_loop.new_event_loop("uvloop")


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="auto, uvloop, asyncio"):
        event_loop.new_event_loop("trio")


@pytest.mark.parametrize("choice", event_loop.CHOICES)
def test_run_runs_the_coroutine_on_the_chosen_loop(choice):
    async def which() -> str:
        await asyncio.sleep(0)
        return event_loop.name(asyncio.get_running_loop())

    expected = "asyncio" if choice == "asyncio" else event_loop.chosen(choice)
    assert event_loop.run(which(), choice) == expected


def test_configuration_reads_and_checks_the_choice():
    assert config.load({}).event_loop == "auto"
    assert config.load({"HOOKLEDGER_EVENT_LOOP": " AsyncIO "}).event_loop == "asyncio"
    with pytest.raises(config.ConfigError, match="HOOKLEDGER_EVENT_LOOP must be auto, uvloop, asyncio, got 'trio'"):
        config.load({"HOOKLEDGER_EVENT_LOOP": "trio"})


def test_running_loop_is_the_loop_it_was_first_called_on():
    """RunningLoop answers get_running_loop() once asked inside a loop; outside one it refuses as
    that function does, and it never binds to a loop it was not called on."""
    running = event_loop.RunningLoop()
    with pytest.raises(RuntimeError):
        running()  # no loop runs here, and nothing is remembered

    async def ask() -> tuple:
        return running(), running(), asyncio.get_running_loop()

    for choice in ("asyncio", "auto"):
        fresh = event_loop.RunningLoop()

        async def ask_fresh() -> tuple:
            return fresh(), asyncio.get_running_loop()

        first, actual = event_loop.run(ask_fresh(), choice)
        assert first is actual
    first, second, actual = event_loop.run(ask())
    assert first is second is actual
