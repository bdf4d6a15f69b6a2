"""Configuration from the environment: the defaults, and a clear error for each malformed setting."""

from __future__ import annotations

import dataclasses

import pytest

from delivery.platform import config
from delivery.api import group_commit
from delivery.engine.sender import SenderSettings
from delivery.errors import DeliveryError, SenderSettingsError


def test_defaults_without_any_setting() -> None:
    """Nothing set: embedded servers, the default schedule (8 attempts), 15 s sends, a 90 s lease."""
    settings = config.load({})
    assert settings.database.url is None and settings.redis.url is None
    assert settings.ledger.attempts_max == 8
    assert settings.worker.sender.timeout_ms_default == 15_000
    assert settings.worker.engine.lease_ms == 90_000
    assert settings.worker.poll_ms == 250  # a fallback: workers are woken by a message on each job due now
    assert settings.redis.start_wait_seconds == 30
    assert settings.api.commit_outcome_wait_seconds == 10
    assert config.load({"HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS": "3"}).api.commit_outcome_wait_seconds == 3
    assert (settings.api.group_commit_parallel_waiting_min, settings.api.group_commit_stall_ms) == (80, 50)
    tuned = config.load({"HOOKLEDGER_GROUP_COMMIT_PARALLEL_WAITING_MIN": "1", "HOOKLEDGER_GROUP_COMMIT_STALL_MS": "0"})
    assert (tuned.api.group_commit_parallel_waiting_min, tuned.api.group_commit_stall_ms) == (1, 0)
    assert settings.secret_keyring is None and settings.api.operator_key is None


def _defaults_differing(settings, path: str = "") -> list[str]:
    """Every field of these settings (nested ones too) whose value is not its class's default."""
    differing = []
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            differing += _defaults_differing(value, f"{path}{field.name}.")
        elif field.default is not dataclasses.MISSING and value != field.default:
            differing.append(f"{path}{field.name}: {value!r} != {field.default!r}")
    return differing


def test_an_empty_environment_gives_each_settings_class_its_own_defaults() -> None:
    """Each default is written once, on its settings class: load() falls back to it, not to a copy."""
    assert _defaults_differing(config.load({})) == []
    # The guard catches a difference: a setting given in the environment is not its default.
    assert _defaults_differing(config.load({"HOOKLEDGER_WORKER_POLL_MS": "11"})) == ["worker.poll_ms: 11 != 250"]
    assert (config.ApiSettings.group_commit_batch_max, config.ApiSettings.group_commit_queue_max) == (
        group_commit.BATCH_MAX, group_commit.QUEUE_MAX)
    top = str(group_commit.BATCH_MAX_LIMIT)
    assert config.load({"HOOKLEDGER_GROUP_COMMIT_BATCH_MAX": top}).api.group_commit_batch_max == group_commit.BATCH_MAX_LIMIT
    with pytest.raises(config.ConfigError, match="between 1 and 1000"):
        config.load({"HOOKLEDGER_GROUP_COMMIT_BATCH_MAX": str(group_commit.BATCH_MAX_LIMIT + 1)})
    with pytest.raises(config.ConfigError, match="between 1 and 32"):
        config.load({"HOOKLEDGER_GROUP_COMMIT_CONCURRENCY": str(group_commit.CONCURRENCY_LIMIT + 1)})


def test_settings_are_read_from_the_mapping_given() -> None:
    """One mapping feeds every component: the networks reach both the API and the sender."""
    settings = config.load({
        "DATABASE_URL": "postgresql://db/x", "HOOKLEDGER_ALLOWED_NETWORKS": "10.0.0.0/8, 192.168.1.0/24",
        "HOOKLEDGER_RETRY_SCHEDULE": "0,1,2", "HOOKLEDGER_DEV": "yes", "HOOKLEDGER_SECRET_KEYS": "k1:abc",
    })
    assert settings.database.url == "postgresql://db/x"
    assert settings.api.allowed_networks == settings.worker.sender.allowed_networks == ("10.0.0.0/8", "192.168.1.0/24")
    assert settings.ledger.attempts_max == 3  # the schedule's length
    assert settings.api.dev_mode and settings.worker.sender.allow_loopback
    assert settings.secret_keyring == "k1:abc"


@pytest.mark.parametrize(
    "environment, message",
    [
        ({"HOOKLEDGER_API_PORT": "eighty"}, "HOOKLEDGER_API_PORT must be an integer"),
        ({"HOOKLEDGER_API_PORT": "70000"}, "HOOKLEDGER_API_PORT must be between 0 and 65535"),
        ({"HOOKLEDGER_ATTEMPTS_MAX": "0"}, "HOOKLEDGER_ATTEMPTS_MAX must be between 1 and 50"),
        ({"HOOKLEDGER_DEV": "maybe"}, "HOOKLEDGER_DEV must be true or false"),
        ({"HOOKLEDGER_LOG_LEVEL": "loud"}, "HOOKLEDGER_LOG_LEVEL must be debug, info, warning or error"),
        ({"HOOKLEDGER_LEASE_MS": "30000"}, "must exceed the longest send timeout"),
        ({"HOOKLEDGER_WORKER_POLL_MS": "0"}, "HOOKLEDGER_WORKER_POLL_MS must be between 1 and 1000"),
        ({"HOOKLEDGER_REDIS_START_WAIT_SECONDS": "-1"}, "HOOKLEDGER_REDIS_START_WAIT_SECONDS must be between 0 and 3600"),
        ({"HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS": "0"},
         "HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS must be between 1 and 300"),
        ({"HOOKLEDGER_GROUP_COMMIT_STALL_MS": "-1"}, "HOOKLEDGER_GROUP_COMMIT_STALL_MS must be between 0 and 60000"),
        ({"HOOKLEDGER_GROUP_COMMIT_PARALLEL_WAITING_MIN": "0"},
         "HOOKLEDGER_GROUP_COMMIT_PARALLEL_WAITING_MIN must be between 1 and 10000"),
        ({"HOOKLEDGER_WORKER_GC_GEN0": "100"}, "HOOKLEDGER_WORKER_GC_GEN0 must be 0"),
        ({"HOOKLEDGER_API_GC_GEN0": "100"}, "HOOKLEDGER_API_GC_GEN0 must be 0"),
        ({"HOOKLEDGER_SENDER_CLIENT": "curl"}, "HOOKLEDGER_SENDER_CLIENT must be one of wire, aiohttp, got 'curl'"),
    ],
)
def test_a_malformed_setting_is_a_clear_config_error(environment: dict, message: str) -> None:
    """Each malformed value names the variable and what it should be."""
    with pytest.raises(config.ConfigError, match=message):
        config.load(environment)


def test_the_sender_client_is_wire_unless_aiohttp_is_chosen() -> None:
    """HOOKLEDGER_SENDER_CLIENT picks the worker's HTTP client: the lean one by default, aiohttp's
    as the fallback; SenderSettings itself refuses any other name."""
    assert config.load({}).worker.sender.client == "wire"
    assert config.load({"HOOKLEDGER_SENDER_CLIENT": "aiohttp"}).worker.sender.client == "aiohttp"
    assert config.load({"HOOKLEDGER_SENDER_CLIENT": " Wire "}).worker.sender.client == "wire"
    with pytest.raises(SenderSettingsError, match="client must be one of wire, aiohttp"):
        SenderSettings(client="requests")


def test_a_malformed_retry_schedule_says_so() -> None:
    """A schedule that is not a list of delays in seconds is refused with the schedule's own message."""
    with pytest.raises(DeliveryError, match="retry schedule"):
        config.load({"HOOKLEDGER_RETRY_SCHEDULE": "0,five"})
