"""`hookledger listen`: a local webhook receiver for development, like `stripe listen`.

Every POST (on any path) goes through `signing.webhook_handler`, so it is verified, bounded and
deduplicated exactly as a production receiver built on this library would be. Each verified
webhook prints one line (id, event type, signing time, payload excerpt); each refused one prints
its status and reason; a duplicate id prints that it was answered 200 without processing.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from aiohttp import web
from rich.console import Console
from rich.text import Text

from signing import MemoryDedupeStore, Verifier, WebhookEvent, webhook_handler

EXCERPT_CHARS_MAX = 200
DEDUPE_CAPACITY = 10_000
# The engine sends no event type header (the event type is not in the signed content), so the
# listener shows the one a payload carries, as Standard Webhooks payloads do in `type`.
EVENT_TYPE_FIELDS = ("type", "event_type", "event")

Printer = Callable[[Text], None]


def event_type_of(payload: object) -> str:
    if isinstance(payload, dict):
        for name in EVENT_TYPE_FIELDS:
            if isinstance(payload.get(name), str):
                return payload[name]
    return "-"


def printable(text: str, chars_max: int = EXCERPT_CHARS_MAX) -> str:
    """`text` safe for a terminal (no escape sequences: a sender controls it), cut to `chars_max`."""
    text = "".join(char if char.isprintable() else " " for char in text[: chars_max + 1])
    return text if len(text) <= chars_max else text[: chars_max - 1] + "…"


def excerpt(body: bytes, chars_max: int = EXCERPT_CHARS_MAX) -> str:
    return printable(body[: chars_max * 4].decode("utf-8", errors="replace"), chars_max)


def _refusal_reason(response: web.StreamResponse) -> str:
    body = getattr(response, "body", None)
    try:
        problem = json.loads(bytes(body)) if body else {}
    except (TypeError, ValueError):
        problem = {}
    if not isinstance(problem, dict):
        return ""
    title, detail = problem.get("title") or "", problem.get("detail") or ""
    return f"{title} ({detail})" if detail and detail != title else title


def create_app(keys: Verifier | Sequence[str], printer: Printer, *, tolerance_seconds: float | None = None) -> web.Application:
    """The receiver app; `keys` are whsec_ secrets (or whpk_ public keys). Raises SigningError on a bad key."""

    async def received(event: WebhookEvent) -> None:
        signed_at = datetime.fromtimestamp(event.timestamp_seconds, timezone.utc).isoformat(timespec="seconds")
        printer(Text.assemble(("received ", "bold green"), f"{printable(event.id, 128)}  {printable(event_type_of(event.payload), 128)}"
                              f"  signed {signed_at}  {excerpt(event.body)}"))

    options = {} if tolerance_seconds is None else {"tolerance_seconds": tolerance_seconds}
    handle = webhook_handler(received, keys=Verifier.of(keys), dedupe=MemoryDedupeStore(capacity=DEDUPE_CAPACITY),
                             **options)

    async def endpoint(request: web.Request) -> web.StreamResponse:
        webhook_id = printable(request.headers.get("webhook-id", ""), 128)
        response = await handle(request)
        if response.status >= 400:
            printer(Text.assemble(("refused ", "bold red"), f"{response.status} {webhook_id or '(no webhook-id)'}"
                                  f"  {_refusal_reason(response)}"))
        elif getattr(response, "body", None) and b'"duplicate"' in bytes(response.body):
            printer(Text.assemble(("duplicate ", "yellow"), f"{webhook_id}  already received; answered 200"))
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", endpoint)
    return app


async def serve(app: web.Application, host: str, port: int, printer: Printer,
                stop: asyncio.Event | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or `stop` is set)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        printer(Text(f"listening on http://{bound_host}:{bound_port}/ for signed webhooks (Ctrl-C to stop)"))
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
    printer(Text("stopped"))


def console_printer() -> Printer:
    console = Console(highlight=False, soft_wrap=True)

    def write(line: Text) -> None:
        console.print(line)

    return write


def run(keys: Sequence[str], host: str, port: int, *, tolerance_seconds: float | None = None) -> None:
    printer = console_printer()
    asyncio.run(serve(create_app(keys, printer, tolerance_seconds=tolerance_seconds), host, port, printer))
