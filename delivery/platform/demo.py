"""The demo `./scripts/run` shows: an app using hookledger through the API, the SDK and the CLI.

An operator creates an account and tops it up; the app adds two endpoints (a local
`hookledger listen` receiver, and an address where nothing listens), sends events with the
CLI and the SDK (one of them twice under one idempotency key), and watches its deliveries
end delivered (charged) or dead (refunded). The ledger audit must come out clean.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import httpx
from rich.console import Console

from delivery.client import Client
from delivery.platform.run import Platform, free_port

DEMO_SECONDS_MAX = 60


@dataclass(frozen=True)
class DemoResult:
    clean: bool  # every delivery ended and the audit is clean
    account_id: uuid.UUID  # the demo account, to sign in to the dashboard with its key
    api_key: str


def _cli(platform: Platform, api_key: str, *arguments: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, **platform.environment, "HOOKLEDGER_API_URL": platform.api_url,
                   "HOOKLEDGER_API_KEY": api_key, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "delivery", *arguments], env=environment,
                          capture_output=True, text=True, timeout=60)


def _show(console: Console, title: str, completed: subprocess.CompletedProcess) -> None:
    console.rule(f"[bold]$ hookledger {title}")
    console.print(completed.stdout.rstrip() or completed.stderr.rstrip(), markup=False, highlight=False, soft_wrap=True)


def _wait_for_port(port: int, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def run(platform: Platform, console: Console) -> DemoResult:
    """Run the demo against a started platform: whether every delivery ended and the audit is clean,
    and the demo account with its key."""
    operator = Client(platform.api_url, platform.operator_key)
    created = operator.accounts.create("demo shop", price_per_delivery=2)
    account_id, api_key = created.account.id, created.api_key.key
    operator.accounts.top_up(account_id, f"demo-order-{account_id}", 100)
    console.print(f"operator: created account {account_id} (2 credits per delivery) and topped it up with 100", soft_wrap=True)

    app = Client(platform.api_url, api_key)
    listen_port = free_port()
    healthy = app.endpoints.create(f"http://127.0.0.1:{listen_port}/webhooks", description="hookledger listen")
    down = app.endpoints.create(f"http://127.0.0.1:{free_port()}/webhooks", description="nothing listens here")
    platform.start("listen", "listen", "--port", str(listen_port), "--secret-from-endpoint", str(healthy.id),
                   environment={"HOOKLEDGER_API_URL": platform.api_url, "HOOKLEDGER_API_KEY": api_key})
    _wait_for_port(listen_port)
    console.print(f"app: endpoint {healthy.id} -> hookledger listen on :{listen_port}; endpoint {down.id} -> nobody", soft_wrap=True)

    _show(console, "send invoice.paid ... (CLI)", _cli(platform, api_key, "send", "invoice.paid", '{"invoice": 1}',
                                                      "--idempotency-key", "demo-invoice-1"))
    _show(console, "send again, same idempotency key", _cli(platform, api_key, "send", "invoice.paid",
                                                             '{"invoice": 1}', "--idempotency-key", "demo-invoice-1"))
    message = app.send("customer.created", {"customer": "ada"})
    console.print(f"SDK: sent customer.created as message {message.id}, {message.total_charged} credits charged", soft_wrap=True)

    ended = _wait_until_all_ended(app)
    _show(console, "deliveries list", _cli(platform, api_key, "deliveries", "list"))
    _show(console, "balance", _cli(platform, api_key, "balance"))
    audit = _cli(platform, api_key, "audit", "--account", str(account_id))
    _show(console, f"audit --account {account_id}", audit)
    _show_worker_metrics(platform, console)
    lines = (platform.log_dir / "listen.log").read_text(errors="replace").splitlines()
    received = sum(line.startswith("received ") for line in lines)
    console.print(f"the local receiver verified and printed {received} webhook(s); logs in {platform.log_dir}", soft_wrap=True)
    return DemoResult(ended and audit.returncode == 0, account_id, api_key)


def _show_worker_metrics(platform: Platform, console: Console) -> None:
    port = platform.environment["HOOKLEDGER_WORKER_METRICS_PORT"]
    console.rule(f"[bold]worker metrics (http://127.0.0.1:{port}/metrics)")
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(("hookledger_deliveries_total", "hookledger_refunds_total",
                            "hookledger_delivery_attempts_total")):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _wait_until_all_ended(app: Client) -> bool:
    deadline = time.monotonic() + DEMO_SECONDS_MAX
    while time.monotonic() < deadline:
        states = [delivery.state for delivery in app.deliveries.iterate()]
        if states and all(state in ("delivered", "dead") for state in states):
            return True
        time.sleep(0.5)
    return False
