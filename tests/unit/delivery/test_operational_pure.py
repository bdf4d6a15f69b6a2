"""The pure parts of operational webhooks: half of the auto-disable policy warns, each event type
reads as a sentence on the dashboard, and each event type's OpenAPI webhook example is what the
outbox writes (its data keys)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from billing.tables import OPERATIONAL_EVENT_TYPES
from delivery.api import openapi, openapi_operational
from delivery.dashboard.operational_notices import sentence
from delivery.engine.retry import AutoDisablePolicy, FailureStreak, disable_reason, warning_policy
from delivery.store.operational import OperationalEvent

_START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("failures", "span_hours", "warned", "disabled"), [
    (1, 0, False, False),  # one failure: neither (half of 2 failures is 1, but the span is short)
    (2, 30, False, False),  # under half of 5 days
    (2, 61, True, False),  # past half of 5 days (60 h), short of 5 days
    (3, 5 * 24, True, True),  # the whole policy
])
def test_half_the_policy_warns_before_the_whole_disables(failures, span_hours, warned, disabled):
    streak = FailureStreak(_START, _START + timedelta(hours=span_hours), failures, False)
    policy = AutoDisablePolicy()
    assert (disable_reason(streak, warning_policy(policy)) is not None) is warned
    assert (disable_reason(streak, policy) is not None) is disabled


@pytest.mark.parametrize("event_type", OPERATIONAL_EVENT_TYPES)
def test_every_event_type_reads_as_a_sentence(event_type):
    event = OperationalEvent(uuid.uuid4(), 1, event_type, _START, openapi_operational.EVENT_DATA[event_type])
    text = sentence(event)
    assert text.endswith(".") and event_type not in text and "None" not in text


def test_the_document_has_a_webhook_with_an_example_for_every_event_type():
    webhooks = openapi.document()["webhooks"]
    assert set(webhooks) == set(OPERATIONAL_EVENT_TYPES)
    for event_type, entry in webhooks.items():
        example = entry["post"]["requestBody"]["content"]["application/json"]["example"]
        assert set(example) == {"type", "timestamp", "data"} and example["type"] == event_type
