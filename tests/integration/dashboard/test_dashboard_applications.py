"""The dashboard's applications page: every application of the account (paged), its endpoints and
what its deliveries cost, as the ledger sums them; another account's applications never show."""

from __future__ import annotations

import re
import uuid

from billing import usage
from delivery.dashboard import routes_applications


async def _api(dash, method: str, path: str, key: str, **kwargs):
    """An API call with the account's key (not the dashboard's session)."""
    async with dash.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kwargs) as response:
        assert response.status < 300, await response.text()
        return await response.json()


async def test_applications_page_lists_them_with_usage_from_the_ledger(dash, pool):
    """Globex's row: its two endpoints and its three messages' six charges, as billing.usage sums them."""
    account_id, key = await dash.account(balance=100, price=2)
    _, other_key = await dash.account(balance=10)
    await _api(dash, "POST", "/v1/applications", other_key, json={"name": "Not Yours"})
    globex = await _api(dash, "POST", "/v1/applications", key, json={"name": "Globex", "uid": "g-1"})
    await _api(dash, "POST", "/v1/applications/g-1/endpoints", key, json={"url": "https://example.com/g"})
    await _api(dash, "POST", "/v1/applications/g-1/endpoints", key, json={"url": "https://example.com/g2"})
    for _ in range(3):
        await _api(dash, "POST", "/v1/applications/g-1/messages", key, json={"event_type": "a", "payload": {}})
    await dash.sign_in(key)
    html = await dash.page("/dashboard/applications")
    assert "Globex" in html and "g-1" in html and "(default)" in html and "Not Yours" not in html
    row = re.search(r"<tr>\s*<td>Globex</td>(.*?)</tr>", html, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    expected = await usage.application_usage(pool, account_id, uuid.UUID(globex["id"]))
    assert cells[2:] == ["2", f"{expected.charges} ({expected.charged})", "0 (0)", "0 (0)", str(expected.net)]
    assert expected.net == 12


async def test_applications_page_pages_by_cursor(dash, pool, monkeypatch):
    """Past a page, a link to the next page; the next page starts after the last one shown."""
    monkeypatch.setattr(routes_applications, "PAGE_SIZE", 2)
    account_id, key = await dash.account(balance=0)
    names = [f"customer {number}" for number in range(3)]
    for name in names:
        await _api(dash, "POST", "/v1/applications", key, json={"name": name})
    await dash.sign_in(key)
    first = await dash.page("/dashboard/applications")
    link = re.search(r'href="/dashboard/applications\?cursor=([0-9a-f-]+)"', first)
    assert link and "customer 0" in first and "customer 1" not in first
    second = await dash.page(f"/dashboard/applications?cursor={link.group(1)}")
    assert "customer 1" in second and "customer 2" in second and "customer 0" not in second
    assert "?cursor=" not in second
