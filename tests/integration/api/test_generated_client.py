"""A client generated from /openapi.json by openapi-python-client works: it has a call named for
each operation (create_message, list_deliveries, ...), and through it an operator creates an
account and tops it up, the account creates an endpoint and sends a message, and reads the delivery
back. The API runs in this test's loop (TestServer); the client is the generated async one.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid

PACKAGE = "hookledger_generated_client"


async def _generate(client, tmp_path):
    response = await client.get("/openapi.json")
    assert response.status == 200
    spec = tmp_path / "openapi.json"
    spec.write_bytes(await response.read())
    config = tmp_path / "config.yaml"
    config.write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\n")
    output = tmp_path / PACKAGE
    executable = [sys.executable, "-m", "openapi_python_client"]
    completed = subprocess.run([*executable, "generate", "--path", str(spec), "--output-path", str(output),
                                "--meta", "none", "--config", str(config)], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # Warnings mean an operation or schema the generator could not turn into code.
    assert "Warning" not in completed.stdout + completed.stderr, completed.stdout + completed.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))


async def test_a_generated_client_sends_a_message(client, api, tmp_path):
    package = await _generate(client, tmp_path)
    models = importlib.import_module(f"{PACKAGE}.models")
    calls = {name: importlib.import_module(f"{PACKAGE}.api.{tag}.{name}")
             for tag, name in (("accounts", "create_account"), ("billing", "create_topup"),
                               ("endpoints", "create_endpoint"), ("messages", "create_message"),
                               ("deliveries", "list_deliveries"), ("deliveries", "get_delivery"),
                               ("billing", "get_balance"))}
    base_url = str(client.make_url("")).rstrip("/")

    operator_key = api.operator["Authorization"].removeprefix("Bearer ")
    operator = package.AuthenticatedClient(base_url=base_url, token=operator_key)
    created = await calls["create_account"].asyncio(client=operator, body=models.AccountCreate(name="generated"))
    assert isinstance(created, models.AccountCreated), created
    account_id = uuid.UUID(str(created.account.id))
    topup = await calls["create_topup"].asyncio(
        id=account_id, client=operator, body=models.TopupCreate(order_id="generated-1", amount=10))
    assert isinstance(topup, models.Topup) and topup.balance == 10, topup

    account = package.AuthenticatedClient(base_url=base_url, token=created.api_key.key)
    endpoint = await calls["create_endpoint"].asyncio(
        client=account, body=models.EndpointCreate(url="https://example.com/generated"))
    assert isinstance(endpoint, models.Endpoint), endpoint
    accepted = await calls["create_message"].asyncio(
        client=account, body=models.MessageCreate(event_type="invoice.paid", payload={"invoice": 7}),
        idempotency_key="generated-message-1")
    assert isinstance(accepted, models.MessageAccepted), accepted
    assert accepted.total_charged == 1 and len(accepted.deliveries) == 1
    assert str(accepted.deliveries[0].endpoint_id) == str(endpoint.id)

    page = await calls["list_deliveries"].asyncio(client=account)
    assert isinstance(page, models.DeliveryPage) and [str(d.id) for d in page.data] == [str(accepted.deliveries[0].id)]
    detail = await calls["get_delivery"].asyncio(id=accepted.deliveries[0].id, client=account)
    assert isinstance(detail, models.DeliveryDetail), detail
    assert [entry.id for entry in detail.ledger_entries] == [f"charge:{accepted.deliveries[0].id}"]
    balance = await calls["get_balance"].asyncio(client=account)
    assert isinstance(balance, models.Balance) and balance.balance == 9

    # An error answer comes back as the document's problem body, through the same client.
    refused = await calls["create_topup"].asyncio(
        id=account_id, client=account, body=models.TopupCreate(order_id="generated-2", amount=10))
    assert isinstance(refused, models.ProblemBody) and refused.status == 403
