"""CLI commands for apps and operators that go through the SDK (the HTTP API), never the database.

    hookledger endpoints create|list|show|update|delete|rotate-secret|secret
    hookledger endpoints disable ENDPOINT_ID          (operator key)
    hookledger send EVENT_TYPE PAYLOAD_JSON [--idempotency-key KEY]
    hookledger deliveries list          (beside the operator's deliveries dead|show|replay)
    hookledger balance | ledger
    hookledger accounts create|topup|reverse-topup|show   (operator key; beside accounts delete|repair|update)
    hookledger listen [--port 9000] [--secret whsec_...|--secret-from-endpoint ENDPOINT_ID] [--forward-to URL]

They talk to HOOKLEDGER_API_URL (default http://127.0.0.1:8000, where `hookledger api` listens)
with HOOKLEDGER_API_KEY or --api-key; the operator commands also read HOOKLEDGER_OPERATOR_KEY.
Human output is tables; --json prints the API's answer for scripts (errors go to stderr, as
problem+json with --json). Exit codes: 0 done, 1 the API refused (4xx), 2 usage error,
3 the API failed or could not be reached (5xx, connection).
"""

from __future__ import annotations

import errno
import math
import socket
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, Optional

import msgspec
import typer
from rich.console import Console

from delivery.cli import output
from delivery.cli.common import (
    API_URL_DEFAULT,
    AccountId,
    ApiKey,
    ApiUrl,
    AsJson,
    Cursor,
    EndpointId,
    Limit,
    OperatorKey,
    accounts_app,
    api,
    check_ids,
    deliveries_app,
    parse_time,
)

if TYPE_CHECKING:
    # The SDK (httpx) is imported by the commands that call the API, when they run: see delivery.cli.main.
    from delivery.client import models

PAYLOAD_FROM_STDIN = "-"
_BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})
OPERATOR_KEY_NAMES = "HOOKLEDGER_OPERATOR_KEY"

endpoints_app = typer.Typer(no_args_is_help=True, help="Endpoints: where your webhooks are delivered.")


def emit(value: Any, as_json: bool, render: Callable[[Console], None]) -> None:
    if as_json:
        output.print_json(value)
    else:
        render(output.out())


def shown_time(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def next_page(console: Console, cursor: str | None) -> None:
    if cursor:
        console.print(f"next page: --cursor {cursor}", markup=False, soft_wrap=True)


# ---- endpoints -------------------------------------------------------------------------------------

ENDPOINT_COLUMNS = (*output.ids("id", "url"), *output.texts("event types", "enabled", "timeout ms", "rate limit /s",
                                                               "signing", "headers", "description"))
HeaderOption = Annotated[Optional[list[str]], typer.Option(
    "--header", "-H", metavar="'NAME: VALUE'", help="A custom header sent with every request, outside the signature (repeat).")]
RateLimitOption = Annotated[Optional[int], typer.Option(
    "--rate-limit", metavar="PER_SECOND", help="The most requests a second all workers together send it (1 to 10000).")]
KeyTypeOption = Annotated[Optional[str], typer.Option(
    "--signing-key-type", metavar="hmac|ed25519", help="hmac (a whsec_ secret) or ed25519 (receivers verify with a whpk_ key).")]


def endpoint_rows(endpoints) -> list[tuple]:
    return [(e.id, e.url, ", ".join(e.event_types) if e.event_types else "(all)",
             "yes" if e.enabled else f"no ({e.disabled_reason or 'by you'})", e.timeout_ms,
             e.rate_limit_per_second if e.rate_limit_per_second is not None else "-", e.signing_key_type,
             ", ".join(e.headers) if e.headers else "-", e.description)
            for e in endpoints]


def _headers(given: list[str] | None) -> dict[str, str] | None:
    """--header 'Name: value' options as a mapping (None when none was given); the API checks names and values."""
    if not given:
        return None
    headers: dict[str, str] = {}
    for item in given:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            raise output.usage(f"--header {item!r}: give it as 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


def _print_endpoint(endpoint: models.Endpoint) -> Callable[[Console], None]:
    return lambda console: output.print_rows(console, "endpoint", ENDPOINT_COLUMNS, endpoint_rows([endpoint]))


@endpoints_app.command("create")
def endpoints_create(
    url: Annotated[str, typer.Argument(metavar="URL", show_default=False, help="Where to POST webhooks (http or https).")],
    event_type: Annotated[Optional[list[str]], typer.Option("--event-type", "-e", metavar="EVENT_TYPE",
                                                            help="Subscribe to this event type (repeat; none: all).")] = None,
    description: Annotated[str, typer.Option(metavar="TEXT", help="A note for you.")] = "",
    timeout_ms: Annotated[Optional[int], typer.Option(metavar="MS", help="Per-attempt timeout in milliseconds.")] = None,
    disabled: Annotated[bool, typer.Option("--disabled", help="Create it disabled.")] = False,
    secret: Annotated[Optional[str], typer.Option("--secret", metavar="SECRET", help="Use this whsec_ secret (default: generated).")] = None,
    signing_key_type: KeyTypeOption = None, header: HeaderOption = None, rate_limit: RateLimitOption = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Create an endpoint and print its signing secret (an Ed25519 endpoint's whpk_ public key), which your
    receiver verifies with."""
    headers = _headers(header)
    with api(api_url, api_key, as_json) as client:
        endpoint = client.endpoints.create(url, description=description, event_types=event_type or None,
                                           timeout_ms=timeout_ms, enabled=not disabled, secret=secret,
                                           signing_key_type=signing_key_type, headers=headers,
                                           rate_limit_per_second=rate_limit)
        signing_secret = secret or client.endpoints.get_secret(endpoint.id)

    def render(console: Console) -> None:
        _print_endpoint(endpoint)(console)
        console.print(f"signing secret: {signing_secret}", markup=False, soft_wrap=True)
        console.print(f"(again: hookledger endpoints secret {endpoint.id})", markup=False, soft_wrap=True)

    emit({**msgspec.structs.asdict(endpoint), "secret": signing_secret}, as_json, render)


@endpoints_app.command("list")
def endpoints_list(api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """List your endpoints."""
    with api(api_url, api_key, as_json) as client:
        endpoints = client.endpoints.list()
    emit({"data": endpoints}, as_json, lambda console: output.print_rows(
        console, f"{len(endpoints)} endpoints", ENDPOINT_COLUMNS, endpoint_rows(endpoints)))


@endpoints_app.command("show")
def endpoints_show(endpoint_id: EndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
                   as_json: AsJson = False) -> None:
    """Show one endpoint."""
    check_ids((endpoint_id, "endpoint"))
    with api(api_url, api_key, as_json) as client:
        endpoint = client.endpoints.get(endpoint_id)
    emit(endpoint, as_json, _print_endpoint(endpoint))


@endpoints_app.command("update")
def endpoints_update(
    endpoint_id: EndpointId,
    url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="A new URL.")] = None,
    event_type: Annotated[Optional[list[str]], typer.Option("--event-type", "-e", metavar="EVENT_TYPE",
                                                            help="Subscribe to exactly these (repeat).")] = None,
    all_events: Annotated[bool, typer.Option("--all-events", help="Subscribe to every event type.")] = False,
    description: Annotated[Optional[str], typer.Option(metavar="TEXT", help="A new note.")] = None,
    enabled: Annotated[Optional[bool], typer.Option("--enable/--disable", help="Turn deliveries on or off.",
                                                    show_default=False)] = None,
    timeout_ms: Annotated[Optional[int], typer.Option(metavar="MS", help="Per-attempt timeout in milliseconds.")] = None,
    header: Annotated[Optional[list[str]], typer.Option(
        "--header", "-H", metavar="'NAME: VALUE'", help="Replace the custom headers with these (repeat).")] = None,
    clear_headers: Annotated[bool, typer.Option("--clear-headers", help="Send no custom headers.")] = False,
    rate_limit: RateLimitOption = None,
    no_rate_limit: Annotated[bool, typer.Option("--no-rate-limit", help="Remove the rate limit.")] = False,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Change an endpoint; only the options given change."""
    check_ids((endpoint_id, "endpoint"))
    if event_type and all_events:
        raise output.usage("give --event-type or --all-events, not both")
    if header and clear_headers:
        raise output.usage("give --header or --clear-headers, not both")
    if rate_limit is not None and no_rate_limit:
        raise output.usage("give --rate-limit or --no-rate-limit, not both")
    changes: dict[str, Any] = {name: value for name, value in
                               (("url", url), ("description", description), ("enabled", enabled),
                                ("timeout_ms", timeout_ms), ("event_types", event_type or None)) if value is not None}
    if all_events:
        changes["event_types"] = None
    if header or clear_headers:
        changes["headers"] = _headers(header)
    if rate_limit is not None or no_rate_limit:
        changes["rate_limit_per_second"] = rate_limit
    if not changes:
        raise output.usage("nothing to change: give at least one option (see --help)")
    with api(api_url, api_key, as_json) as client:
        endpoint = client.endpoints.update(endpoint_id, **changes)
    emit(endpoint, as_json, _print_endpoint(endpoint))


@endpoints_app.command("delete")
def endpoints_delete(endpoint_id: EndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
                     as_json: AsJson = False) -> None:
    """Delete an endpoint; its pending deliveries are refunded."""
    check_ids((endpoint_id, "endpoint"))
    with api(api_url, api_key, as_json) as client:
        deleted = client.endpoints.delete(endpoint_id)
    emit(deleted, as_json, lambda console: console.print(
        f"deleted endpoint {deleted.id}; {deleted.refunded_now} pending deliveries refunded now", markup=False,
        soft_wrap=True))


@endpoints_app.command("disable")
def endpoints_disable(endpoint_id: EndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None,
                      as_json: AsJson = False) -> None:
    """Switch any account's endpoint off (operator): disabled_reason operator, its account is told
    (endpoint.disabled) and its pending deliveries are refunded. Again: nothing more."""
    check_ids((endpoint_id, "endpoint"))
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        endpoint = client.endpoints.disable_as_operator(endpoint_id)
    emit(endpoint, as_json, _print_endpoint(endpoint))


@endpoints_app.command("rotate-secret")
def endpoints_rotate_secret(
    endpoint_id: EndpointId,
    secret: Annotated[Optional[str], typer.Option("--secret", metavar="SECRET", help="Rotate to this whsec_ secret (default: generated).")] = None,
    signing_key_type: KeyTypeOption = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Rotate the signing secret; the old one keeps signing beside it for the overlap (24 h by default).

    With --secret the rotation is safe to retry: rotating to the secret already current changes nothing.
    """
    check_ids((endpoint_id, "endpoint"))
    with api(api_url, api_key, as_json) as client:
        new_secret = client.endpoints.rotate_secret(endpoint_id, secret=secret, signing_key_type=signing_key_type)
    emit({"secret": new_secret}, as_json, lambda console: console.print(new_secret, markup=False, soft_wrap=True))


@endpoints_app.command("secret")
def endpoints_secret(endpoint_id: EndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
                     as_json: AsJson = False) -> None:
    """Print the endpoint's signing secret (whsec_...)."""
    check_ids((endpoint_id, "endpoint"))
    with api(api_url, api_key, as_json) as client:
        secret = client.endpoints.get_secret(endpoint_id)
    emit({"secret": secret}, as_json, lambda console: console.print(secret, markup=False, soft_wrap=True))


# ---- send, balance, ledger -------------------------------------------------------------------------

def payload_of(text: str) -> msgspec.Raw:
    """The payload exactly as written (it is what the receiver gets, byte for byte), once checked to be JSON."""
    raw = (sys.stdin.read() if text == PAYLOAD_FROM_STDIN else text).strip().encode()
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        raise output.usage(f"PAYLOAD_JSON is not JSON: {error}") from None
    return msgspec.Raw(raw)


def send(
    event_type: Annotated[str, typer.Argument(metavar="EVENT_TYPE", show_default=False, help="Like invoice.paid.")],
    payload_json: Annotated[str, typer.Argument(metavar="PAYLOAD_JSON", show_default=False,
                                                help="The payload as JSON, sent byte for byte; - reads stdin.")],
    idempotency_key: Annotated[Optional[str], typer.Option(
        metavar="KEY", help="Sending again with the same key charges nothing more (default: a new key per run).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Send an event to your subscribed endpoints; each delivery is charged."""
    payload = payload_of(payload_json)
    with api(api_url, api_key, as_json) as client:
        message = client.send(event_type, payload, idempotency_key=idempotency_key)

    def render(console: Console) -> None:
        replayed = " (already accepted under this key: nothing more charged)" if message.replayed else ""
        console.print(f"message {message.id}: {len(message.deliveries)} deliveries, {message.total_charged}"
                      f" credits charged{replayed}", markup=False, soft_wrap=True)
        console.print(f"idempotency key {message.idempotency_key}", markup=False, soft_wrap=True)
        if message.deliveries:
            output.print_rows(console, "deliveries", (*output.ids("delivery", "endpoint"), *output.texts("price")),
                              [(d.id, d.endpoint_id, d.price) for d in message.deliveries])

    emit(message, as_json, render)


def balance(api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Your balance, and the credits charged for deliveries still in flight."""
    with api(api_url, api_key, as_json) as client:
        result = client.balance()
    emit(result, as_json, lambda console: console.print(
        f"balance {result.balance} credits ({result.in_flight} in flight)", markup=False))


def ledger(
    limit: Limit = None, cursor: Cursor = None,
    delivery: Annotated[Optional[str], typer.Option(metavar="DELIVERY_ID", help="Only this delivery's entries.")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Your ledger, oldest first: top-ups, charges, refunds, reclaims."""
    check_ids((delivery, "delivery"))
    with api(api_url, api_key, as_json) as client:
        page = client.ledger(limit=limit, cursor=cursor, delivery_id=delivery)

    def render(console: Console) -> None:
        output.print_rows(console, f"{len(page)} ledger entries",
                          (*output.texts("seq"), *output.ids("entry"), *output.texts("kind", "amount"),
                           *output.ids("delivery"), *output.texts("at")),
                          [(e.seq, e.id, e.kind, e.amount, e.delivery_id, shown_time(e.created_at)) for e in page])
        next_page(console, page.next_cursor)

    emit(page, as_json, render)


# ---- deliveries list (beside the operator's dead/show/replay) ---------------------------------------

@deliveries_app.command("list")
def deliveries_list(
    state: Annotated[Optional[str], typer.Option("--state", metavar="STATE", help="pending, sending, delivered or dead.")] = None,
    endpoint: Annotated[Optional[str], typer.Option(metavar="ENDPOINT_ID", help="Only this endpoint's.")] = None,
    message: Annotated[Optional[str], typer.Option(metavar="MESSAGE_ID", help="Only this message's.")] = None,
    created_after: Annotated[Optional[str], typer.Option(metavar="TIME", help="Created after this ISO 8601 time.")] = None,
    created_before: Annotated[Optional[str], typer.Option(metavar="TIME", help="Created before this ISO 8601 time.")] = None,
    limit: Limit = None, cursor: Cursor = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Your deliveries, newest first, one page at a time."""
    after, before = parse_time(created_after, "--created-after"), parse_time(created_before, "--created-before")
    check_ids((endpoint, "endpoint"), (message, "message"))
    with api(api_url, api_key, as_json) as client:
        page = client.deliveries.list(limit=limit, cursor=cursor, state=state, endpoint_id=endpoint,
                                      message_id=message, created_after=after, created_before=before)

    def render(console: Console) -> None:
        rows = [(d.id, d.event_type, d.state + (f" ({d.dead_reason})" if d.dead_reason else ""),
                 f"{d.attempt}/{d.attempts_max}", d.price, d.endpoint_id, shown_time(d.created_at)) for d in page]
        output.print_rows(console, f"{len(page)} deliveries",
                          (*output.ids("delivery"), *output.texts("event", "state", "attempts", "price"),
                           *output.ids("endpoint"), *output.texts("created")), rows)
        next_page(console, page.next_cursor)

    emit(page, as_json, render)


# ---- accounts create / topup / reverse-topup / show (operator, beside delete/repair) ---------------

def print_account(account: models.Account) -> Callable[[Console], None]:
    return lambda console: output.print_rows(
        console, "account", (*output.ids("id"), *output.texts("name", "status", "balance", "price per delivery",
                                                               "retention days")),
        [(account.id, account.name, account.status, account.balance, account.price_per_delivery,
          account.payload_retention_days)])


@accounts_app.command("create")
def accounts_create(
    name: Annotated[str, typer.Argument(metavar="NAME", show_default=False, help="The account's name.")],
    price: Annotated[Optional[int], typer.Option(metavar="CREDITS", help="Credits per delivery (default: the server's).")] = None,
    payload_retention_days: Annotated[Optional[int], typer.Option(
        min=1, max=3650, metavar="DAYS", help="Days finished payloads are kept, 1-3650 (default 30).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Create an account and its first API key (shown once: keep it)."""
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        created = client.accounts.create(name, price_per_delivery=price, payload_retention_days=payload_retention_days)

    def render(console: Console) -> None:
        print_account(created.account)(console)
        console.print(f"API key (shown once): {created.api_key.key}", markup=False, soft_wrap=True)

    emit(created, as_json, render)


@accounts_app.command("topup")
def accounts_topup(
    account_id: AccountId,
    order_id: Annotated[str, typer.Argument(metavar="ORDER_ID", show_default=False,
                                            help="Your payment's id: the same order is applied once.")],
    amount: Annotated[int, typer.Argument(min=1, metavar="CREDITS", show_default=False, help="Credits to add.")],
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Add credits to an account, once per order id."""
    check_ids((account_id, "account"))
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        topup = client.accounts.top_up(account_id, order_id, amount)
    emit(topup, as_json, lambda console: console.print(
        (f"topped up {topup.amount} credits" if topup.applied else f"order {topup.order_id} was already applied;"
         " nothing added") + f"; balance {topup.balance}", markup=False, soft_wrap=True))


@accounts_app.command("reverse-topup")
def accounts_reverse_topup(
    account_id: AccountId,
    order_id: Annotated[str, typer.Argument(metavar="ORDER_ID", show_default=False, help="The order to reverse.")],
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Reverse a top-up (a refund to the customer), once per order id."""
    check_ids((account_id, "account"))
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        topup = client.accounts.reverse_top_up(account_id, order_id)
    emit(topup, as_json, lambda console: console.print(
        (f"reversed {-topup.amount} credits" if topup.applied else f"order {topup.order_id} was already reversed;"
         " nothing changed") + f"; balance {topup.balance}", markup=False, soft_wrap=True))


@accounts_app.command("show")
def accounts_show(account_id: AccountId, api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None,
                  as_json: AsJson = False) -> None:
    """Show an account: status, balance, price, payload retention."""
    check_ids((account_id, "account"))
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        account = client.accounts.get(account_id)
    emit(account, as_json, print_account(account))


# ---- listen -----------------------------------------------------------------------------------------

def listen(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, metavar="PORT", help="Port to listen on (0: any free one).")] = 9000,
    host: Annotated[str, typer.Option("--host", metavar="HOST", help="Address to listen on.")] = "127.0.0.1",
    secret: Annotated[Optional[list[str]], typer.Option(
        "--secret", metavar="SECRET", help="A whsec_ secret (or whpk_ key) to verify with; repeat during a rotation.")] = None,
    secret_from_endpoint: Annotated[Optional[str], typer.Option(
        metavar="ENDPOINT_ID", help="Fetch the secret of this endpoint from the API.")] = None,
    forward_to: Annotated[Optional[str], typer.Option(
        "--forward-to", metavar="URL", help="Forward each verified webhook (body and headers) to your app at this URL, and print"
        " its status.")] = None,
    tolerance_seconds: Annotated[Optional[float], typer.Option(
        metavar="SECONDS", help="Accepted clock skew in seconds, above 0 (default 300).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Receive webhooks locally: verify each, print it (or why it was refused), and forward it. Ctrl-C stops."""
    from delivery.cli import listen as listener
    from signing import SigningError, Verifier

    # NaN or a negative tolerance would refuse every webhook, and infinity would accept replays.
    if tolerance_seconds is not None and not (math.isfinite(tolerance_seconds) and tolerance_seconds > 0):
        raise output.usage(f"--tolerance-seconds must be a finite number of seconds above 0, not {tolerance_seconds}")
    if forward_to is not None:
        listener.check_forward_url(forward_to)
    keys = list(secret or [])
    if secret_from_endpoint:
        check_ids((secret_from_endpoint, "--secret-from-endpoint"))
        with api(api_url, api_key, as_json) as client:
            keys.append(client.endpoints.get_secret(secret_from_endpoint))
    if not keys:
        raise output.usage("give --secret whsec_... or --secret-from-endpoint ENDPOINT_ID: unsigned webhooks cannot"
                           " be verified")
    try:
        Verifier.of(keys)
    except SigningError as error:
        raise output.usage(f"--secret: {error}") from None
    try:
        listener.run(keys, host, port, tolerance_seconds=tolerance_seconds, forward_to=forward_to, as_json=as_json)
    except OSError as error:
        # The address cannot be bound (taken, not this machine's, privileged, unknown host): a
        # configuration error, said in one line with exit 2 as `hookledger api` does, not a traceback.
        if not (isinstance(error, socket.gaierror) or error.errno in _BIND_ERRNOS):
            raise
        from delivery.platform.config import ConfigError  # only here: the settings cost more to import than listen

        raise ConfigError(
            f"cannot listen on {host}:{port} ({error.strerror or error}); pass a free --port (0: any) or another --host"
        ) from None
