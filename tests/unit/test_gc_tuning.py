"""delivery.gc_tuning: rarer young collections, the start-up heap frozen, and 0 leaves Python alone."""

from __future__ import annotations

import gc

import pytest

from delivery import gc_tuning
from delivery.platform import api_server as cli_api, config


@pytest.fixture
def restored_collector():
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def test_tune_freezes_the_heap_and_raises_the_young_threshold(restored_collector) -> None:
    gc.unfreeze()
    gc_tuning.tune(50_000)
    assert gc.get_threshold() == (50_000, *gc_tuning.OLDER_THRESHOLDS)
    assert gc.get_freeze_count() > 1000  # the modules and classes imported so far


def test_zero_changes_nothing(restored_collector) -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    gc_tuning.tune(0)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_cycles_are_still_collected_after_tuning(restored_collector) -> None:
    """Rarer, never off: allocating past the threshold runs a collection by itself and frees cycles."""
    gc_tuning.tune(gc_tuning.GEN0_MIN)
    runs = []

    def count(phase, info):
        if phase == "stop":
            runs.append(info["collected"])

    class Node:
        pass

    gc.callbacks.append(count)
    try:
        for _ in range(5 * gc_tuning.GEN0_MIN):
            node = Node()
            node.self = node  # a cycle only the collector frees
        del node
    finally:
        gc.callbacks.remove(count)
    assert runs and sum(runs) > gc_tuning.GEN0_MIN  # collections ran unprompted and freed the cycles


@pytest.mark.parametrize("value", [-1, 1, 699, 1_000_001])
def test_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="gen0_threshold"):
        gc_tuning.tune(value)


def test_the_worker_setting_defaults_to_50000() -> None:
    assert config.load({}).worker.gc_gen0_threshold == 50_000
    assert config.load({"HOOKLEDGER_WORKER_GC_GEN0": "0"}).worker.gc_gen0_threshold == 0


def test_the_api_has_its_own_setting_and_applies_it(restored_collector) -> None:
    assert config.load({}).api.gc_gen0_threshold == 50_000
    settings = config.load({"HOOKLEDGER_API_GC_GEN0": "20000", "HOOKLEDGER_WORKER_GC_GEN0": "0"})
    assert (settings.api.gc_gen0_threshold, settings.worker.gc_gen0_threshold) == (20_000, 0)
    gc.set_threshold(700, 10, 10)
    cli_api.tune_collector(settings)
    assert gc.get_threshold() == (20_000, *gc_tuning.OLDER_THRESHOLDS)
    gc.set_threshold(700, 10, 10)
    cli_api.tune_collector(config.load({"HOOKLEDGER_API_GC_GEN0": "0"}))
    assert gc.get_threshold() == (700, 10, 10)
