"""The pure rules behind endpoint controls: which custom headers may be set and sent, and what of
a signing key is ever shown."""

from __future__ import annotations

import json

import pytest

from delivery.store import endpoint_headers, signing_keys
from signing import Signer, parse_verifying_key, verify


@pytest.mark.parametrize("name", ["X-Tenant", "authorization", "X_Weird!#$%&'*+.^`|~1", "a" * 64])
def test_a_token_name_with_a_printable_value_may_be_set(name):
    assert endpoint_headers.refusals({name: "a value; with = signs \"and\" quotes"}) == []


@pytest.mark.parametrize("name", [
    "webhook-id", "Webhook-Signature", "WEBHOOK-TIMESTAMP", "webhook-anything", "svix-id", "Svix-Signature",
    "connection", "Keep-Alive", "TE", "trailer", "transfer-encoding", "upgrade", "proxy-authorization",
    "host", "Content-Length", "content-type", "content-encoding", "expect", "user-agent", "accept-encoding",
    "with space", "colon:", "", "a" * 65, "é",
])
def test_reserved_and_malformed_names_are_refused_by_name(name):
    assert [field for field, _ in endpoint_headers.refusals({name: "v"})] == [f"headers.{name[:64]}"]


@pytest.mark.parametrize("value", ["", " lead", "trail ", "a\r\nb", "a\nb", "tab\tinside", "\x00", "é", "x" * 1025])
def test_values_that_would_not_arrive_as_given_are_refused(value):
    assert [field for field, _ in endpoint_headers.refusals({"X-A": value})] == ["headers.X-A"]


def test_bounds_on_count_case_and_total_size():
    assert ("headers", "at most 20 headers") in endpoint_headers.refusals({f"X-{n}": "v" for n in range(21)})
    assert [f for f, _ in endpoint_headers.refusals({"X-A": "1", "x-a": "2"})] == ["headers.x-a"]
    four_kib = {f"X-{n}": "v" * 1000 for n in range(4)}  # 4,016 bytes with the names and ": "
    assert endpoint_headers.refusals(four_kib) == []
    assert [f for f, _ in endpoint_headers.refusals({**four_kib, "X-9": "v" * 100})] == ["headers"]


def test_stored_headers_round_trip_and_none_is_null():
    headers = {"X-Tenant": "acme", "Authorization": "Bearer t"}
    assert endpoint_headers.stored(None) is None and endpoint_headers.stored({}) is None
    assert endpoint_headers.loaded(endpoint_headers.stored(headers)) == headers
    assert endpoint_headers.for_sending(endpoint_headers.stored(headers)) == headers


def test_a_stored_header_that_input_would_refuse_is_not_sent():
    """Written past the API (by hand): a signature header or a CR/LF is left out, the rest sent."""
    column = json.dumps({"X-Ok": "1", "webhook-id": "forged", "X-Split": "a\r\nInjected: 1", "Host": "elsewhere"})
    assert endpoint_headers.for_sending(column) == {"X-Ok": "1"}
    assert endpoint_headers.for_sending("[1, 2]") == {}
    assert endpoint_headers.for_sending(None) is None


def test_only_the_public_half_of_an_ed25519_key_is_ever_shown():
    private_key = signing_keys.new_key(signing_keys.ED25519)
    public_key = signing_keys.shown(private_key)
    assert private_key.startswith("whsk_") and public_key.startswith("whpk_")
    assert public_key == parse_verifying_key(private_key).serialize()
    assert signing_keys.key_type_of(private_key) == signing_keys.shown_key_type(public_key) == "ed25519"
    secret = signing_keys.new_key(signing_keys.HMAC)
    assert signing_keys.shown(secret) == secret and signing_keys.key_type_of(secret) == "hmac"
    headers = Signer([secret, private_key]).headers("msg_1", 1_700_000_000, b"{}")
    for key in (secret, public_key):  # a rotation across kinds: either key verifies
        assert verify(headers, b"{}", key, now=1_700_000_000).id == "msg_1"
    with pytest.raises(AssertionError):
        signing_keys.new_key("rsa")
