"""The planned create's filters (billing.message_plan): which endpoints a message's type and
channels reach. The direct write decides the same in SQL; tests/integration/api/test_api_event_catalog.py
checks the two agree."""

from __future__ import annotations

import pytest

from billing.message_plan import in_channels, subscribed


@pytest.mark.parametrize("event_type, event_types, prefixes, expected", [
    ("invoice.paid", None, None, True),  # no subscription list: every type
    ("invoice.paid", ["invoice.paid"], None, True),
    ("invoice.paid", ["invoice.failed"], None, False),
    ("invoice.paid", ["invoice.*"], ["invoice."], True),
    ("invoice.refund.issued", ["invoice.*"], ["invoice."], True),
    ("invoicex", ["invoice.*"], ["invoice."], False),
    ("invoice", ["invoice.*"], ["invoice."], False),  # the family, not the bare prefix
    ("user.created", ["invoice.*", "user.created"], ["invoice."], True),
])
def test_subscribed(event_type, event_types, prefixes, expected):
    assert subscribed(event_type, event_types, prefixes) is expected


@pytest.mark.parametrize("message_channels, endpoint_channels, expected", [
    (None, None, True),  # an endpoint without a filter takes everything
    (("eu",), None, True),
    (None, ["eu"], False),  # a filtering endpoint takes only messages with one of its channels
    (("us",), ["eu"], False),
    (("us", "eu"), ["eu", "global"], True),
])
def test_in_channels(message_channels, endpoint_channels, expected):
    assert in_channels(message_channels, endpoint_channels) is expected
