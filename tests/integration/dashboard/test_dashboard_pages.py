"""Dashboard pages over HTTP: what each shows, what each form writes, through the platform's own functions."""

from __future__ import annotations

import csv
import io
import re
import uuid

from billing import accounts as billing_accounts
from billing.messages import MessageRequest, create_message
from billing.settle import DeadReason, settle
from dashboard_helpers import OPERATOR_KEY
from delivery.operations import deletion


async def _dead_delivery(pool, account_id) -> uuid.UUID:
    created = await create_message(pool, MessageRequest(account_id, "invoice.failed", b'{"n": 2}'), attempts_max=3)
    delivery_id = created.deliveries[0].id
    await settle(pool, delivery_id, DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)
    return delivery_id


def _rows(html: str, table_id: str) -> list[str]:
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr[ >].*?</tr>", body, re.S)[1:]  # without the header row


async def test_overview_shows_balance_in_flight_chart_and_endpoint_health(dash, pool):
    """Balance and in-flight credits match billing.get_balance; the chart draws today's deliveries."""
    account_id, key = await dash.account(balance=100, price=2)
    await dash.endpoint(key)
    for _ in range(3):
        await dash.send(key)
    await dash.sign_in(key)
    html = await dash.page("/dashboard/overview")
    assert re.search(r'id="balance">94<', html) and re.search(r'id="in-flight">6<', html)
    assert "<svg" in html and html.count('class="bar bar-live"') == 1 and "3 live" in html
    assert "https://example.com/hooks" in html and "no attempts" in html


async def test_overview_of_a_new_account_says_what_to_do(dash):
    _, key = await dash.account(balance=0)
    await dash.sign_in(key)
    html = await dash.page("/dashboard/overview")
    assert "Create your first endpoint" in html and "No deliveries in the last 24 hours" in html
    assert "does not cover one more delivery" in html


async def test_endpoint_create_edit_disable_reveal_and_rotate(dash, pool):
    """Every endpoint form writes through delivery.store.endpoints with the API's checks."""
    account_id, key = await dash.account()
    await dash.sign_in(key)
    await dash.page("/dashboard/endpoints")
    response, html = await dash.post("/dashboard/endpoints", {"url": "ftp://example.com/x", "event_types": ""})
    assert response.status == 422 and "http" in html and await pool.fetchval("SELECT count(*) FROM endpoints") == 0
    response, html = await dash.post("/dashboard/endpoints", {"url": "https://example.com/x", "event_types": "bad type!"})
    assert response.status == 422 and "event_types" in html
    response, _ = await dash.post("/dashboard/endpoints", {"url": "https://example.com/x", "description": "main",
                                                          "event_types": "invoice.paid, invoice.failed invoice.paid"})
    assert response.status == 303
    location = response.headers["Location"]
    endpoint_id = uuid.UUID(location.split("/")[-1].split("?")[0])
    row = await pool.fetchrow("SELECT account_id, event_types, description, enabled FROM endpoints WHERE id = $1", endpoint_id)
    assert (row["account_id"], row["event_types"], row["description"]) == (account_id, ["invoice.paid", "invoice.failed"], "main")
    assert "Endpoint created" in await dash.page(location)

    response, _ = await dash.post(f"/dashboard/endpoints/{endpoint_id}", {"description": "main", "event_types": ""})
    assert response.status == 303
    assert await pool.fetchval("SELECT event_types FROM endpoints WHERE id = $1", endpoint_id) is None
    await dash.page(f"/dashboard/endpoints/{endpoint_id}")
    response, _ = await dash.post(f"/dashboard/endpoints/{endpoint_id}/enabled", {"enabled": "false"})
    assert response.status == 303 and not await pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1", endpoint_id)
    assert "disabled by you" in await dash.page(response.headers["Location"])
    response, _ = await dash.post(f"/dashboard/endpoints/{endpoint_id}/enabled", {"enabled": "true"})
    assert await pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1", endpoint_id)

    confirm = await dash.page(f"/dashboard/endpoints/{endpoint_id}/secret/reveal")
    assert "Reveal the signing secret?" in confirm and "whsec_" not in confirm
    async with dash.http.get(f"/v1/endpoints/{endpoint_id}/secret", headers={"Authorization": f"Bearer {key}"}) as api:
        secret = (await api.json())["secret"]
    response, html = await dash.post(f"/dashboard/endpoints/{endpoint_id}/secret/reveal", {})
    assert response.status == 200 and secret in html and response.headers["Cache-Control"] == "no-store"
    await dash.page(f"/dashboard/endpoints/{endpoint_id}/secret/rotate")
    response, html = await dash.post(f"/dashboard/endpoints/{endpoint_id}/secret/rotate", {})
    rotated = re.search(r'id="secret">(whsec_[^<]+)<', html).group(1)
    assert rotated != secret
    async with dash.http.get(f"/v1/endpoints/{endpoint_id}/secret", headers={"Authorization": f"Bearer {key}"}) as api:
        assert (await api.json())["secret"] == rotated


async def test_deliveries_filter_and_paginate(dash, pool):
    """Filters by state, endpoint and event type; 55 deliveries make two pages by cursor, none twice."""
    account_id, key = await dash.account(balance=500, price=1)
    await dash.endpoint(key)
    for number in range(55):
        await dash.send(key, "invoice.paid" if number % 5 else "invoice.voided")
    dead_id = await _dead_delivery(pool, account_id)
    await dash.sign_in(key)
    first = await dash.page("/dashboard/deliveries")
    ids = re.findall(r'href="/dashboard/deliveries/([0-9a-f-]{36})"', first)
    assert len(ids) == 50 and 'rel="next"' in first
    next_link = re.search(r'href="([^"]+)" rel="next"', first).group(1).replace("&amp;", "&")
    second = await dash.page(next_link)
    more = re.findall(r'href="/dashboard/deliveries/([0-9a-f-]{36})"', second)
    assert len(more) == 6 and not set(ids) & set(more) and 'rel="next"' not in second
    voided = await dash.page("/dashboard/deliveries?event_type=invoice.voided&state=&endpoint_id=")
    assert len(re.findall(r'href="/dashboard/deliveries/[0-9a-f-]{36}"', voided)) == 11
    dead = await dash.page("/dashboard/deliveries?state=dead")
    assert re.findall(r'href="/dashboard/deliveries/([0-9a-f-]{36})"', dead) == [str(dead_id)]
    none = await dash.page("/dashboard/deliveries?state=delivered")
    assert "No delivery matches these filters" in none
    response, html = await dash.get("/dashboard/deliveries?state=lost")
    assert response.status == 422 and "must be one of" in html


async def test_delivery_detail_and_replay_with_the_cost_confirmed(dash, pool):
    """A dead delivery shows its reason and ledger; replay shows the price, then charges once for a double submit."""
    account_id, key = await dash.account(balance=50, price=3)
    await dash.endpoint(key)
    dead_id = await _dead_delivery(pool, account_id)
    await dash.sign_in(key)
    html = await dash.page(f"/dashboard/deliveries/{dead_id}")
    assert "out_of_retries" in html and f"charge:{dead_id}" in html and f"refund:{dead_id}" in html
    confirm = await dash.page(f"/dashboard/deliveries/{dead_id}/replay")
    assert re.search(r'id="cost"><strong>3 credits', confirm) and "Balance after</dt><dd>47" in confirm
    nonce = re.search(r'name="nonce" value="([0-9a-f]+)"', confirm).group(1)
    response, _ = await dash.post(f"/dashboard/deliveries/{dead_id}/replay", {"price": "3", "nonce": nonce})
    assert response.status == 303
    new_id = uuid.UUID(response.headers["Location"].split("/")[-1].split("?")[0])
    again, _ = await dash.post(f"/dashboard/deliveries/{dead_id}/replay", {"price": "3", "nonce": nonce})
    assert again.headers["Location"] == response.headers["Location"]  # the same new delivery, charged once
    assert (await billing_accounts.get_balance(pool, account_id)).balance == 47
    assert await pool.fetchval("SELECT amount FROM ledger_entries WHERE id = $1", f"charge:{new_id}") == -3
    page = await dash.page(response.headers["Location"])
    assert "Replayed from" in page and str(dead_id) in page


async def test_replay_refuses_a_price_that_changed_after_the_confirmation(dash, pool):
    account_id, key = await dash.account(balance=50, price=3)
    await dash.endpoint(key)
    dead_id = await _dead_delivery(pool, account_id)
    await dash.sign_in(key)
    await dash.page(f"/dashboard/deliveries/{dead_id}/replay")
    await pool.execute("UPDATE accounts SET price_per_delivery = 4 WHERE id = $1", account_id)
    response, html = await dash.post(f"/dashboard/deliveries/{dead_id}/replay", {"price": "3", "nonce": "0" * 32})
    assert response.status == 409 and "The price is now 4 credits" in html
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1", account_id) == 1


async def test_ledger_running_balance_pages_and_csv(dash, pool):
    """Entries oldest first, as GET /v1/ledger lists them, each with the balance right after it: the page opens
    on the latest 50, the earlier page and the CSV continue the same running balance."""
    account_id, key = await dash.account(balance=0, price=1)
    for number in range(1, 61):
        await billing_accounts.top_up(pool, account_id, f"order-{number}", number)
    await dash.endpoint(key)
    await dash.send(key)
    await dash.sign_in(key)
    total = sum(range(1, 61)) - 1
    entries = await pool.fetch("SELECT id, amount FROM ledger_entries WHERE account_id = $1 ORDER BY seq", account_id)
    expected, running = [], 0
    for entry in entries:
        running += entry["amount"]
        expected.append((entry["id"], running))
    assert running == total and len(expected) == 61
    latest = await dash.page("/dashboard/ledger")
    rows = _rows(latest, "ledger")
    shown = [(re.search(r"<code>([^<]+)</code>", row).group(1), int(re.findall(r'class="num">([^<]+)<', row)[-1].replace("\u202f", "")))
             for row in rows]
    assert shown == expected[-50:]
    earlier_link = re.search(r'href="([^"]+)" rel="prev"', latest).group(1).replace("&amp;", "&")
    earlier = await dash.page(earlier_link)
    assert [re.search(r"<code>([^<]+)</code>", row).group(1) for row in _rows(earlier, "ledger")] == [
        entry_id for entry_id, _ in expected[:11]]
    assert 'rel="prev"' not in earlier and "Latest entries" in earlier

    response, body = await dash.get("/dashboard/ledger.csv")
    assert response.status == 200 and "attachment" in response.headers["Content-Disposition"]
    records = list(csv.DictReader(io.StringIO(body)))
    assert [(r["id"], int(r["balance_after"])) for r in records] == expected
    response, body = await dash.get("/dashboard/ledger.csv?kind=charge")
    assert [(r["kind"], int(r["balance_after"])) for r in csv.DictReader(io.StringIO(body))] == [("charge", total)]
    charges = await dash.page("/dashboard/ledger?kind=charge")
    assert len(_rows(charges, "ledger")) == 1 and f'class="num">{total:,}<'.replace(",", "\u202f") in charges
    for cursor in ("9223372036854775808", "9999999999999999999"):  # past bigint: refused, not a 500
        response, html = await dash.get(f"/dashboard/ledger?cursor={cursor}")
        assert response.status == 422 and "cursor" in html


async def test_ledger_csv_pages_carry_the_balance_on(dash, pool, monkeypatch):
    """An export longer than one page of the query continues the running balance across pages, filters or not."""
    from delivery.dashboard import routes_account

    monkeypatch.setattr(routes_account, "CSV_PAGE_SIZE", 7)
    account_id, key = await dash.account(balance=0, price=1)
    for number in range(1, 21):
        await billing_accounts.top_up(pool, account_id, f"order-{number}", number)
        if number % 4 == 0:
            await billing_accounts.reverse_top_up(pool, account_id, f"order-{number}")
    await dash.sign_in(key)
    entries = await pool.fetch("SELECT id, kind, amount FROM ledger_entries WHERE account_id = $1 ORDER BY seq",
                               account_id)
    running, expected = 0, []
    for entry in entries:
        running += entry["amount"]
        expected.append((entry["id"], entry["kind"], running))
    _, body = await dash.get("/dashboard/ledger.csv")
    assert [(r["id"], r["kind"], int(r["balance_after"])) for r in csv.DictReader(io.StringIO(body))] == expected
    _, body = await dash.get("/dashboard/ledger.csv?kind=topup_reversal")
    assert [(r["id"], r["kind"], int(r["balance_after"])) for r in csv.DictReader(io.StringIO(body))] == [
        row for row in expected if row[1] == "topup_reversal"]


async def test_operator_pages_accounts_dead_letters_audit_and_deletions(dash, pool):
    """The operator sees every account's balance, dead letters across accounts, a clean audit and a deletion report."""
    first_id, first_key = await dash.account(name="first", balance=40)
    second_id, second_key = await dash.account(name="second", balance=10)
    await dash.endpoint(first_key)
    await dash.endpoint(second_key)
    dead = [await _dead_delivery(pool, first_id), await _dead_delivery(pool, second_id)]
    await deletion.start_account_deletion(pool, None, second_id)
    await deletion.run_deletion(pool, second_id)

    await dash.sign_in(OPERATOR_KEY)
    accounts = await dash.page("/dashboard/operator")
    assert "first" in accounts and "second" in accounts and len(_rows(accounts, "accounts")) == 2
    letters = await dash.page("/dashboard/operator/dead-letters")
    assert all(str(delivery_id)[-12:] in letters for delivery_id in dead)
    only_first = await dash.page(f"/dashboard/operator/dead-letters?account_id={first_id}")
    assert str(dead[0])[-12:] in only_first and str(dead[1])[-12:] not in only_first
    inspected = await dash.page(f"/dashboard/operator/deliveries/{dead[0]}")
    assert "out_of_retries" in inspected and f"refund:{dead[0]}" in inspected

    audit_page = await dash.page("/dashboard/operator/audit")
    assert "No audit has run" in audit_page
    response, _ = await dash.post("/dashboard/operator/audit", {})
    assert response.status == 303
    assert ">clean<" in await dash.page("/dashboard/operator/audit")

    deletions = await dash.page("/dashboard/operator/deletions")
    assert "second" in deletions and ">done<" in deletions and 'value="100"' in deletions
    report = await dash.page(f"/dashboard/operator/deletions/{second_id}")
    assert "close_out" in report and "owed_to_customer" in report
    response, _ = await dash.get(f"/dashboard/operator/deletions/{first_id}")
    assert response.status == 404


async def test_replaying_a_delivered_delivery_is_keyed_by_its_confirmation_page(dash, pool):
    """A delivered delivery replays through the API's group commit; the same confirmation posted twice charges once."""
    account_id, key = await dash.account(balance=50, price=5)
    await dash.endpoint(key)
    delivered = (await dash.send(key))["deliveries"][0]["id"]
    await pool.execute("UPDATE deliveries SET state = 'delivered', finished_at = now() WHERE id = $1",
                       uuid.UUID(delivered))
    await dash.sign_in(key)
    confirm = await dash.page(f"/dashboard/deliveries/{delivered}/replay")
    nonce = re.search(r'name="nonce" value="([0-9a-f]+)"', confirm).group(1)
    first, _ = await dash.post(f"/dashboard/deliveries/{delivered}/replay", {"price": "5", "nonce": nonce})
    second, _ = await dash.post(f"/dashboard/deliveries/{delivered}/replay", {"price": "5", "nonce": nonce})
    assert first.status == 303 and first.headers["Location"] == second.headers["Location"]
    assert (await billing_accounts.get_balance(pool, account_id)).balance == 40
    response, _ = await dash.post(f"/dashboard/deliveries/{delivered}/replay", {"price": "5", "nonce": "not-hex"})
    assert response.status == 400
