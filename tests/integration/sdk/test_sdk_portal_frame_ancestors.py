"""The SDK sets and clears the origins allowed to embed the customer portal; a bad one raises
ValidationError naming it and changes nothing; another setting leaves them as they were."""

from __future__ import annotations

import pytest

from delivery.client import ValidationError


async def test_update_account_sets_and_clears_the_portals_frame_ancestors(sdk):
    assert (await sdk.account()).portal_frame_ancestors == []
    own = await sdk.update_account(portal_frame_ancestors=("https://app.example.com",))
    assert own.portal_frame_ancestors == ["https://app.example.com"]
    own = await sdk.update_account(payload_retention_days=7)
    assert (own.payload_retention_days, own.portal_frame_ancestors) == (7, ["https://app.example.com"])
    with pytest.raises(ValidationError) as refused:
        await sdk.update_account(portal_frame_ancestors=["https://app.example.com/embed"])
    assert "portal_frame_ancestors[0]" in str(refused.value.errors)
    assert (await sdk.account()).portal_frame_ancestors == ["https://app.example.com"]
    assert (await sdk.update_account(portal_frame_ancestors=None)).portal_frame_ancestors == []
