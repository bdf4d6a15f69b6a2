"""`hookledger listen`: a local webhook receiver for development, like `stripe listen`.

Every POST (on any path) goes through `signing.webhook_handler`, so it is verified, bounded and
deduplicated exactly as a production receiver built on this library would be. Each verified
webhook prints one line (id, event type, signing time, payload excerpt); each refused one prints
its status and reason; a duplicate id prints that it was answered 200 without processing.

With `--forward-to URL`, each verified webhook is then sent on to the developer's own app: the
same body and headers (the signature too, so the app verifies it as it would in production), and
the app's answer goes back to hookledger as the receiver's. An app that fails (non-2xx, or no
answer: 502) leaves the webhook unclaimed, so hookledger's retry is forwarded again. With `--json`
every line is one JSON object (`event`: listening, received, forwarded, refused, duplicate, stopped).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from rich.console import Console
from rich.text import Text

from signing import MemoryDedupeStore, Verifier, WebhookEvent, webhook_handler

EXCERPT_CHARS_MAX = 200
DEDUPE_CAPACITY = 10_000
FORWARD_TIMEOUT_SECONDS = 30.0
FORWARD_RESPONSE_BYTES_MAX = 64 * 1024  # of the app's answer, passed back to hookledger
# The engine sends no event type header (the event type is not in the signed content), so the
# listener shows the one a payload carries, as Standard Webhooks payloads do in `type`.
EVENT_TYPE_FIELDS = ("type", "event_type", "event")
# Not forwarded: they describe this hop (RFC 9110 7.6.1), or aiohttp sets them for the next one.
HOP_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
                         "upgrade", "proxy-authorization", "proxy-connection"})

# (what happened, its fields for --json, its line for people)
Printer = Callable[[str, dict, Text], None]
_request_headers: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("request_headers")
_forwarded: contextvars.ContextVar[bool] = contextvars.ContextVar("forwarded", default=False)  # the app answered


def check_forward_url(url: str) -> None:
    """A usage error (typer.Exit 2, said on stderr) unless `url` is http(s)://host..."""
    from yarl import URL

    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        from delivery.cli import output

        raise output.usage(f"--forward-to must be an http(s) URL like http://localhost:3000/webhooks; got {url!r}")


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


def refusal_reason(body: bytes | None) -> str:
    """The reason in a problem+json refusal: its title, and its detail when that adds something.
    (A verification failure's detail already opens with the title: "reason (which value)".)"""
    try:
        problem = json.loads(bytes(body)) if body else {}
    except (TypeError, ValueError):
        problem = {}
    if not isinstance(problem, dict):
        return ""
    title, detail = str(problem.get("title") or ""), str(problem.get("detail") or "")
    if not detail or detail == title:
        return title
    if detail.startswith(title):
        return detail
    return f"{title} ({detail})"


def _forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in HOP_HEADERS}


class Forwarder:
    """Sends each verified webhook on to the app at `url` and answers with the app's answer."""

    def __init__(self, url: str, printer: Printer) -> None:
        self.url = url
        self._printer = printer
        self._session: ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __call__(self, event: WebhookEvent) -> web.Response:
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=FORWARD_TIMEOUT_SECONDS), auto_decompress=False)
        headers = _forward_headers(_request_headers.get({}))
        _forwarded.set(True)  # what the receiver answers now is the forwarding's, said on its own line
        started = time.monotonic()
        webhook_id = printable(event.id, 128)
        try:
            async with self._session.post(self.url, data=event.body, headers=headers, allow_redirects=False) as answer:
                body = await answer.content.read(FORWARD_RESPONSE_BYTES_MAX)
                status, content_type = answer.status, answer.headers.get("Content-Type")
        except (ClientError, asyncio.TimeoutError, OSError) as error:
            why = printable(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__, 300)
            self._printer("forwarded", {"id": event.id, "url": self.url, "status": None, "error": why},
                          Text.assemble(("forward failed ", "bold red"), f"{webhook_id}  {self.url}  {why}"))
            return web.json_response({"type": "about:blank", "title": "The app did not answer.", "status": 502,
                                      "detail": f"{self.url}: {why}"}, status=502,
                                     content_type="application/problem+json")
        elapsed_ms = round((time.monotonic() - started) * 1000)
        style = "bold green" if 200 <= status < 300 else "bold red"
        self._printer("forwarded", {"id": event.id, "url": self.url, "status": status, "elapsed_ms": elapsed_ms},
                      Text.assemble(("forwarded ", style), f"{webhook_id}  {self.url}  {status}  {elapsed_ms} ms"))
        response = web.Response(status=status, body=body)
        if content_type:
            response.headers["Content-Type"] = content_type
        return response


def create_app(keys: Verifier | Sequence[str], printer: Printer, *, tolerance_seconds: float | None = None,
               forward_to: str | None = None) -> web.Application:
    """The receiver app; `keys` are whsec_ secrets (or whpk_ public keys). Raises SigningError on a bad key."""
    forwarder = Forwarder(forward_to, printer) if forward_to else None

    async def received(event: WebhookEvent) -> web.Response | None:
        signed_at = datetime.fromtimestamp(event.timestamp_seconds, timezone.utc).isoformat(timespec="seconds")
        event_type = event_type_of(event.payload)
        printer("received", {"id": event.id, "event_type": event_type, "signed_at": signed_at,
                             "payload": event.payload},
                Text.assemble(("received ", "bold green"), f"{printable(event.id, 128)}  {printable(event_type, 128)}"
                              f"  signed {signed_at}  {excerpt(event.body)}"))
        return await forwarder(event) if forwarder is not None else None

    options = {} if tolerance_seconds is None else {"tolerance_seconds": tolerance_seconds}
    handle = webhook_handler(received, keys=Verifier.of(keys), dedupe=MemoryDedupeStore(capacity=DEDUPE_CAPACITY),
                             **options)

    async def endpoint(request: web.Request) -> web.StreamResponse:
        raw_id = request.headers.get("webhook-id", "")
        webhook_id = printable(raw_id, 128)
        _request_headers.set(request.headers)
        _forwarded.set(False)
        response = await handle(request)
        body = getattr(response, "body", None)
        if response.status >= 400 and not _forwarded.get():
            reason = refusal_reason(body)
            printer("refused", {"id": raw_id or None, "status": response.status, "reason": reason},
                    Text.assemble(("refused ", "bold red"), f"{response.status} {webhook_id or '(no webhook-id)'}"
                                  f"  {reason}"))
        elif body and b'"duplicate"' in bytes(body):
            printer("duplicate", {"id": raw_id}, Text.assemble(("duplicate ", "yellow"),
                                                               f"{webhook_id}  already received; answered 200"))
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", endpoint)
    if forwarder is not None:
        app.on_cleanup.append(lambda _: forwarder.close())
    return app


async def serve(app: web.Application, host: str, port: int, printer: Printer,
                stop: asyncio.Event | None = None, forward_to: str | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or `stop` is set)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        url = f"http://{bound_host}:{bound_port}/"
        onward = f"; forwarding to {forward_to}" if forward_to else ""
        printer("listening", {"url": url, "forward_to": forward_to},
                Text(f"listening on {url} for signed webhooks{onward} (Ctrl-C to stop)"))
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
    printer("stopped", {}, Text("stopped"))


def console_printer(as_json: bool = False) -> Printer:
    console = Console(highlight=False, soft_wrap=True)

    def write(kind: str, fields: dict, line: Text) -> None:
        if as_json:
            print(json.dumps({"event": kind, **fields}, default=str), flush=True)
        else:
            console.print(line)

    return write


def run(keys: Sequence[str], host: str, port: int, *, tolerance_seconds: float | None = None,
        forward_to: str | None = None, as_json: bool = False) -> None:
    printer = console_printer(as_json)
    app = create_app(keys, printer, tolerance_seconds=tolerance_seconds, forward_to=forward_to)
    asyncio.run(serve(app, host, port, printer, forward_to=forward_to))
