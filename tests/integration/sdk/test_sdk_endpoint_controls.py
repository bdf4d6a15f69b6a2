"""The SDK, async and blocking, sets an endpoint's rate limit, custom headers and signing key kind
on create, update and rotate, against the real API; a refused value raises the API's 422 naming
the field and changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from delivery.client import Client, errors


async def test_async_client_sets_rate_limit_headers_and_key_type(sdk):
    endpoint = await sdk.endpoints.create("https://example.com/hooks", rate_limit_per_second=50,
                                          headers={"X-Tenant": "acme"}, signing_key_type="ed25519")
    assert (endpoint.rate_limit_per_second, endpoint.headers, endpoint.signing_key_type) == (50, {"X-Tenant": "acme"},
                                                                                             "ed25519")
    assert (await sdk.endpoints.get_secret(endpoint.id)).startswith("whpk_")
    updated = await sdk.endpoints.update(endpoint.id, rate_limit_per_second=7, headers={"X-One": "1"})
    assert (updated.rate_limit_per_second, updated.headers) == (7, {"X-One": "1"})
    untouched = await sdk.endpoints.update(endpoint.id, description="only this")
    assert (untouched.rate_limit_per_second, untouched.headers) == (7, {"X-One": "1"})
    cleared = await sdk.endpoints.update(endpoint.id, rate_limit_per_second=None, headers=None)
    assert (cleared.rate_limit_per_second, cleared.headers) == (None, None)
    assert (await sdk.endpoints.rotate_secret(endpoint.id, signing_key_type="hmac")).startswith("whsec_")
    assert (await sdk.endpoints.get(endpoint.id)).signing_key_type == "hmac"
    with pytest.raises(errors.ValidationError) as refused:
        await sdk.endpoints.update(endpoint.id, rate_limit_per_second=0)
    assert refused.value.status == 422 and [error.field for error in refused.value.errors] == ["rate_limit_per_second"]
    assert (await sdk.endpoints.get(endpoint.id)).rate_limit_per_second is None


async def test_blocking_client_sets_them_too(base_url, account):
    def work():
        with Client(base_url, account[1], retries=0) as client:
            made = client.endpoints.create("https://example.com/h", rate_limit_per_second=10_000,
                                           headers={"X-A": "a"}, signing_key_type="hmac")
            changed = client.endpoints.update(made.id, rate_limit_per_second=1)
            return made, changed, client.endpoints.rotate_secret(made.id, signing_key_type="ed25519")

    made, changed, public_key = await asyncio.to_thread(work)
    assert (made.rate_limit_per_second, made.headers, changed.rate_limit_per_second) == (10_000, {"X-A": "a"}, 1)
    assert public_key.startswith("whpk_")
